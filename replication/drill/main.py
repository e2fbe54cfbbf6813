"""``python -m replication drill``: its arguments, and running it from the command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path

from .options import DEFAULT_PIPELINE, DEFAULT_RECHECK_INTERVAL, DrillError, DrillOptions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mode",
        choices=("kill", "flip"),
        default="kill",
        help="kill: SIGKILL the primary's broker, then flip (embedded only); flip: flip the "
        "alias or file while the primary stays up (default: kill)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=20.0,
        metavar="MSGS_PER_S",
        help="messages a second the producer sends (default: 20)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="seconds of producing (default: 30)",
    )
    parser.add_argument(
        "--flip-after",
        type=float,
        default=12.0,
        metavar="SECONDS",
        help="seconds from the start to the flip or kill (default: 12); a flip is seen at "
        "the producer's next re-check, every --recheck-interval s from the start",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures here")
    parser.add_argument(
        "--pipelines",
        type=Path,
        metavar="FILE",
        help="the pipeline file (default: REPLICATION_PIPELINES, else pipelines.yaml)",
    )
    parser.add_argument(
        "--pipeline",
        default=DEFAULT_PIPELINE,
        help=f"the pipeline to drill (default: {DEFAULT_PIPELINE})",
    )
    embedded = parser.add_argument_group("embedded brokers (the default)")
    embedded.add_argument(
        "--via",
        choices=("dns", "file"),
        default="dns",
        help="how the producer finds the namespace: an alias the drill "
        "serves (CNAME -> SRV) or a file it writes (default: dns)",
    )
    embedded.add_argument(
        "--dns-ttl",
        type=int,
        default=1,
        metavar="SECONDS",
        help="TTL of the drill's DNS records (default: 1)",
    )
    embedded.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help="keep the brokers' data here (default: a temporary folder)",
    )
    given = parser.add_argument_group("namespaces of your own")
    given.add_argument(
        "--primary",
        metavar="CONNECTION",
        help="the primary's connection string, or the name of an environment variable holding it",
    )
    given.add_argument("--secondary", metavar="CONNECTION", help="the secondary's, likewise")
    given.add_argument("--alias", help="the CNAME alias the producer resolves")
    given.add_argument("--nameserver", metavar="HOST[:PORT]", help="the DNS server to ask")
    given.add_argument(
        "--file",
        metavar="PATH|URL",
        help="the failover file (the drill writes it unless --flip-command)",
    )
    given.add_argument(
        "--flip-command",
        metavar="COMMAND",
        help="a shell command that points the alias or file at the secondary",
    )
    client = parser.add_argument_group("the producer's failover client and the replication")
    client.add_argument(
        "--recheck-interval",
        type=float,
        default=DEFAULT_RECHECK_INTERVAL,
        metavar="SECONDS",
        help="seconds between re-checks without errors "
        f"(default: {DEFAULT_RECHECK_INTERVAL:g}; the pipelines' is 30)",
    )
    client.add_argument(
        "--failures",
        type=int,
        default=3,
        help="failed sends in a row that make it resolve again (default: 3)",
    )
    client.add_argument(
        "--settle",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="seconds at most to wait for the secondary after producing (default: 15)",
    )
    client.add_argument(
        "--no-replicate",
        action="store_true",
        help="do not run the pipeline: something else replicates (your deployed app)",
    )
    parser.add_argument("--log-level", default="WARNING", help="(default: WARNING)")


def options_from(args: argparse.Namespace) -> DrillOptions:
    pipelines = args.pipelines or Path(os.environ.get("REPLICATION_PIPELINES", "pipelines.yaml"))
    return DrillOptions(
        mode=args.mode,
        rate=args.rate,
        duration=args.duration,
        flip_after=args.flip_after,
        pipelines_file=pipelines,
        pipeline=args.pipeline,
        via=args.via,
        primary=_connection(args.primary, "--primary"),
        secondary=_connection(args.secondary, "--secondary"),
        alias=args.alias,
        nameserver=args.nameserver,
        file=args.file,
        flip_command=args.flip_command,
        recheck_interval=args.recheck_interval,
        failures=args.failures,
        dns_ttl=args.dns_ttl,
        settle=args.settle,
        replicate=not args.no_replicate,
        data_dir=args.data_dir,
    )


def _connection(value: str | None, option: str) -> str | None:
    """A connection string as given, or read from the environment variable it names (so it
    need not be on the command line, where other users of the machine can read it)."""
    if value is None or "=" in value:
        return value
    found = os.environ.get(value)
    if not found:
        raise DrillError(f"{option}: no environment variable {value!r} (nor a connection string)")
    return found


def run(args: argparse.Namespace) -> int:
    from .report import as_json, print_table
    from .run import run_drill

    try:
        options = options_from(args).check()
    except DrillError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("azure").setLevel(logging.WARNING)
    if logging.getLogger().level >= logging.WARNING:
        # after a kill every session worker of the replication warns, each second, that the
        # primary refuses it: expected, and the report says what it cost
        logging.getLogger("replication.tasks.pump").setLevel(logging.ERROR)
    try:
        result = asyncio.run(run_drill(options))
    except DrillError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (RuntimeError, OSError) as exc:  # a broker that did not start, a port, a file
        print(f"error: the drill stopped: {exc}", file=sys.stderr)
        return 1
    print_table(result)
    if args.json is not None:
        args.json.write_text(json.dumps(as_json(result), indent=2) + "\n", encoding="utf-8")
    return 0
