"""``python -m replication start`` and ``peek``: argument parsing and console output."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .. import metrics
from ..gc_tuning import collect_garbage_for_throughput

if TYPE_CHECKING:
    from .app import Host


def add_start_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path.cwd(),
        help="the function app folder (function_app.py, host.json, settings)",
    )
    parser.add_argument("--settings", type=Path, help="local.settings.json to use")
    parser.add_argument(
        "--demo",
        action="store_true",
        help="feed the sample pipelines, stop when everything moved, show it",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=9464,
        help="port of /metrics and /health (0: any free port)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no live progress table")
    parser.add_argument(
        "--no-ui", action="store_true", help="no dashboard on the metrics port (default: at /)"
    )
    parser.add_argument("--log-level", default="INFO")


def run_start(args: argparse.Namespace) -> int:
    from .app import Host, HostConfig
    from .process import WorkerUnavailable
    from .settings import SettingsError

    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("azure").setLevel(logging.WARNING)
    # uamqp (the extension's decoder) logs at INFO for every optional header field absent
    logging.getLogger("uamqp").setLevel(logging.WARNING)
    config = HostConfig(
        directory=args.dir,
        settings_file=args.settings,
        metrics_port=args.metrics_port,
        progress=not args.no_progress,
        ui=not args.no_ui,
    )
    if args.demo:  # a fresh namespace each time: what the demo shows is what this run moved
        import shutil

        config.data_dir = args.dir / ".replication" / "demo"
        shutil.rmtree(config.data_dir, ignore_errors=True)
    try:
        host = Host(config)
    except (SettingsError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    collect_garbage_for_throughput()  # the host is set up: its triggers move the messages
    try:
        return asyncio.run(_start(host, args.demo))
    except (OSError, WorkerUnavailable) as exc:  # a broker port in use; an app the worker
        print(f"error: {exc}", file=sys.stderr)  # cannot import (its traceback above)
        return 1
    except SettingsError as exc:  # a %Name% in a binding that no setting defines
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        metrics.export(host.settings).shutdown()  # what is still pending goes out


async def _start(host: Host, demo: bool) -> int:
    if not demo:
        return await host.run()
    from ..pipeline import load_pipelines
    from .demo import produce

    expected = 0

    def done(running: Host) -> bool:
        received = sum(metrics.counts(name)["received"] for name in _pipelines(running))
        backlog = sum(metrics.counts(name)["backlog"] for name in _pipelines(running))
        return expected > 0 and received >= expected and backlog == 0

    host.config.stop_when = done
    host.config.before_stop = _report
    run = asyncio.create_task(host.run())
    while not host.healthy and not run.done():
        await asyncio.sleep(0.1)
    if run.done():
        return run.result()
    pipelines = load_pipelines(
        host.config.directory / host.settings.get("REPLICATION_PIPELINES", "pipelines.yaml"),
        settings=host.settings,
    )
    expected = await produce(pipelines, host.settings)
    return await run


async def _report(host: Host) -> None:
    """The demo's ending, while the brokers still run: the counts and what arrived."""
    _summary(host)
    await _show_arrivals(host)


def _pipelines(host: Host) -> list[str]:
    return host.pipelines()


def _summary(host: Host) -> None:
    print("\npipeline                        received  forwarded  filtered  dead-lettered")
    for name in _pipelines(host):
        c = metrics.counts(name)
        print(
            f"{name:<30} {c['received']:>9.0f} {c['forwarded']:>10.0f} {c['filtered']:>9.0f} "
            f"{c['dead_lettered']:>14.0f}"
        )


async def _show_arrivals(host: Host) -> None:
    from .peek import peek

    directory = host.config.directory
    settings = host.settings
    print("\nwhat arrived on the secondary in this run (its state: .replication/demo):")
    for entity, session, count in (
        ("orders", "customer-0", 4),
        ("telemetry-json", None, 2),
        ("events-eu", None, 2),
    ):
        try:
            peeked = await peek(directory, settings, "SecondaryServiceBus", entity, count, session)
        except Exception as exc:  # a sample pipeline file without that entity
            print(f"  {entity}: {exc}")
            continue
        for item in peeked:
            props = {k: v for k, v in item["properties"].items() if k.startswith("repl-")}
            print(
                f"  {entity} #{item['sequence_number']} session={item['session_id']} "
                f"{item['body'][:60]!r} {props}"
            )
    await _show_events(settings)


async def _show_events(settings: dict[str, str], hub: str = "order-audit-stream") -> None:
    """The sample's event hub: one customer's audit trail, all in one partition, in order."""
    from .peek import peek_events

    connection = settings.get("SecondaryEventHubs")
    if not connection:
        return
    try:
        events = await peek_events(connection, hub)
    except Exception as exc:  # a sample pipeline file without that event hub
        print(f"  {hub}: {exc}")
        return
    for partition, key, item in [e for e in events if e[1] == "customer-0"]:
        props = {k: v for k, v in item["properties"].items() if k.startswith("repl-")}
        print(
            f"  {hub} partition {partition} #{item['sequence_number']} key={key} "
            f"{item['body'][:60]!r} {props}"
        )


def add_peek_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "entity",
        help="queue, or topic/Subscriptions/name; "
        "append /$DeadLetterQueue for its dead-letter queue",
    )
    parser.add_argument(
        "--connection",
        default="SecondaryServiceBus",
        help="app setting with the connection string (SecondaryServiceBus)",
    )
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--dir", type=Path, default=Path.cwd())
    parser.add_argument("--settings", type=Path)
    parser.add_argument("--session", help="the session to peek into (session entities)")
    parser.add_argument("--json", action="store_true", help="one JSON object per message")


def run_peek(args: argparse.Namespace) -> int:
    from ..servicebus.client import SourceError
    from .peek import peek
    from .settings import SettingsError, load_settings

    try:
        settings, _ = load_settings(args.dir, args.settings)
        messages = asyncio.run(
            peek(args.dir, settings, args.connection, args.entity, args.count, args.session)
        )
    except (SettingsError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SourceError as exc:  # no such entity, refused token, namespace not answering
        print(f"error: cannot peek at {args.entity}: {exc}", file=sys.stderr)
        return 1
    for item in messages:
        print(
            json.dumps(item)
            if args.json
            else f"#{item['sequence_number']} id={item['message_id']} session={item['session_id']} "
            f"{item['body'][:80]!r} {item['properties']}"
        )
    if not messages:
        print(f"{args.entity}: no messages")
    return 0
