"""``python -m replication broker``: load Config.json, open the data dir, serve until stopped."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from .auth import Authorizer
from .config import BrokerConfig, ConfigError, Rule, load_config
from .queue import QueueSettings
from .rules import RuleSpec
from .server import Broker, TopicSpec
from .topic import TopicSettings

log = logging.getLogger("replication.broker")

DEFAULT_DATA_DIR = Path.home() / ".replication" / "broker"


def queue_settings(config: BrokerConfig) -> dict[str, QueueSettings]:
    """Config.json queue properties as the queue logic needs them."""
    settings = {}
    for queue in config.namespace.queues:
        p = queue.properties
        settings[queue.name] = QueueSettings(
            lock_duration=p.lock_duration,
            max_delivery_count=p.max_delivery_count,
            default_ttl=p.default_message_time_to_live,
            dead_letter_on_expiration=p.dead_lettering_on_message_expiration,
            requires_duplicate_detection=p.requires_duplicate_detection,
            duplicate_detection_window=p.duplicate_detection_history_time_window,
            requires_session=p.requires_session,
            forward_to=p.forward_to,
            forward_dead_lettered_messages_to=p.forward_dead_lettered_messages_to,
        )
    return settings


def topic_specs(config: BrokerConfig) -> dict[str, TopicSpec]:
    """Config.json topics, subscriptions and rules as the broker needs them."""
    specs = {}
    for topic in config.namespace.topics:
        tp = topic.properties
        spec = TopicSpec(TopicSettings(
            default_ttl=tp.default_message_time_to_live,
            requires_duplicate_detection=tp.requires_duplicate_detection,
            duplicate_detection_window=tp.duplicate_detection_history_time_window,
        ))  # fmt: skip
        for sub in topic.subscriptions:
            p = sub.properties
            ttls = [
                ttl for ttl in (tp.default_message_time_to_live, p.default_message_time_to_live)
                if ttl is not None
            ]  # fmt: skip
            settings = QueueSettings(
                lock_duration=p.lock_duration,
                max_delivery_count=p.max_delivery_count,
                default_ttl=min(ttls) if ttls else None,
                dead_letter_on_expiration=p.dead_lettering_on_message_expiration,
                requires_session=p.requires_session,
                forward_to=p.forward_to,
                forward_dead_lettered_messages_to=p.forward_dead_lettered_messages_to,
            )
            spec.subscriptions[sub.name] = (settings, [rule_spec(r) for r in sub.effective_rules()])
        specs[topic.name] = spec
    return specs


def rule_spec(rule: Rule) -> RuleSpec:
    """A Config.json rule as the broker's rule record (``1=1`` / ``1=0`` as true / false)."""
    p = rule.properties
    action = p.action.sql_expression if p.action is not None else None
    if p.filter_type == "Sql":
        assert p.sql_filter is not None
        sql = p.sql_filter.sql_expression
        kind = {"1=1": "true", "1=0": "false"}.get(sql.replace(" ", ""), "sql")
        return RuleSpec(rule.name, kind, sql=sql if kind == "sql" else None, action=action)
    c = p.correlation_filter
    assert c is not None
    fields = {
        "correlation_id": c.correlation_id, "message_id": c.message_id, "to": c.to,
        "reply_to": c.reply_to, "subject": c.label, "session_id": c.session_id,
        "reply_to_session_id": c.reply_to_session_id, "content_type": c.content_type,
    }  # fmt: skip
    correlation: dict[str, Any] = {k: v for k, v in fields.items() if v is not None}
    if c.properties:
        correlation["properties"] = dict(c.properties)
    return RuleSpec(rule.name, "correlation", correlation=correlation, action=action)


def build_broker(
    config: BrokerConfig, data_dir: Path, host: str, port: int, synchronous: str = "NORMAL"
) -> Broker:
    return Broker(
        queue_settings(config), data_dir, Authorizer(config.rules()),
        topics=topic_specs(config), host=host, port=port, synchronous=synchronous,
    )  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="Config.json (emulator schema)")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (127.0.0.1)")
    parser.add_argument("--port", type=int, default=5672, help="AMQP port (5672; 0 = any free)")
    parser.add_argument(
        "--data-dir", type=Path, default=DEFAULT_DATA_DIR,
        help=f"where messages are kept ({DEFAULT_DATA_DIR})",
    )  # fmt: skip
    parser.add_argument(
        "--fsync", action="store_true",
        help="fsync every commit (survives power loss, slower); default survives process crashes",
    )  # fmt: skip
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (INFO)")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )  # fmt: skip
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if config.logging.to_file:
        args.data_dir.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(args.data_dir / "broker.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(handler)  # Logging.Type File: under the data dir
    try:
        broker = build_broker(
            config, args.data_dir, args.host, args.port, "FULL" if args.fsync else "NORMAL"
        )
    except OSError as exc:
        print(f"error: cannot open data dir {args.data_dir}: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(broker))
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


async def _serve(broker: Broker) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await broker.start()
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        await broker.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replication broker", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
