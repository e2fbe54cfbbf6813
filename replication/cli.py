"""The ``python -m replication`` command line; each subcommand imports its layer lazily."""

from __future__ import annotations

import argparse
import sys

from . import __version__


def _start(args: argparse.Namespace, rest: list[str]) -> int:
    from .demo import main as demo_main

    return demo_main(rest)


def _broker(args: argparse.Namespace, rest: list[str]) -> int:
    from .broker.main import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m replication",
        description="Service Bus replication app with an embedded AMQP 1.0 core.",
    )
    parser.add_argument("--version", action="version", version=f"replication {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    start = commands.add_parser(
        "start",
        help="run the quick-start job (like `func start`)",
        add_help=False,
        description="Runs the quick-start job; see `start --help`.",
    )
    start.set_defaults(handler=_start)
    broker = commands.add_parser(
        "broker",
        help="run the embedded Service Bus broker",
        description="Runs the embedded Service Bus-compatible broker (emulator Config.json).",
    )
    from .broker.main import add_arguments

    add_arguments(broker)
    broker.set_defaults(handler=_broker)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.handler(args, rest))
