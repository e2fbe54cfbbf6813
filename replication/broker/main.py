"""``python -m replication broker``: load Config.json, open the data dir, serve until stopped."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import ssl
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from ..gc_tuning import collect_garbage_for_throughput
from .admin.api import AdminApi
from .auth import Authorizer
from .config import BrokerConfig, ConfigError, Rule, load_config
from .queue import QueueSettings
from .registry import TopicSpec
from .rules import RuleSpec
from .server import Broker
from .tls import local_ca
from .topic import TopicSettings


class Service(Protocol):
    """Something served beside the broker (the dashboard): stopped before the broker is."""

    async def stop(self) -> None: ...


ServiceFor = Callable[[Broker], Service]
"""Starts a service on a started broker (``compose.serve_dashboard``)."""

log = logging.getLogger("replication.broker")

DEFAULT_DATA_DIR = Path.home() / ".replication" / "broker"
DEFAULT_HTTP_PORT = 5300
"""Where the official emulator serves HTTP (its .NET clients' management calls)."""


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
            max_size_mb=p.max_size_in_megabytes,
        )
    return settings


def topic_specs(config: BrokerConfig) -> dict[str, TopicSpec]:
    """Config.json topics, subscriptions and rules as the broker needs them."""
    specs = {}
    for topic in config.namespace.topics:
        tp = topic.properties
        spec = TopicSpec(
            TopicSettings(
                default_ttl=tp.default_message_time_to_live,
                requires_duplicate_detection=tp.requires_duplicate_detection,
                duplicate_detection_window=tp.duplicate_detection_history_time_window,
                max_size_mb=tp.max_size_in_megabytes,
            )
        )
        for sub in topic.subscriptions:
            p = sub.properties
            ttls = [
                ttl
                for ttl in (tp.default_message_time_to_live, p.default_message_time_to_live)
                if ttl is not None
            ]
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
        "correlation_id": c.correlation_id,
        "message_id": c.message_id,
        "to": c.to,
        "reply_to": c.reply_to,
        "subject": c.label,
        "session_id": c.session_id,
        "reply_to_session_id": c.reply_to_session_id,
        "content_type": c.content_type,
    }
    correlation: dict[str, Any] = {k: v for k, v in fields.items() if v is not None}
    if c.properties:
        correlation["properties"] = dict(c.properties)
    return RuleSpec(rule.name, "correlation", correlation=correlation, action=action)


def build_broker(
    config: BrokerConfig,
    data_dir: Path,
    host: str,
    port: int,
    synchronous: str = "NORMAL",
    **options: Any,
) -> Broker:
    """The broker for ``config`` with the management REST API on its HTTP(S) ports;
    ``options`` are ``Broker``'s other keywords (TLS, HTTP)."""
    broker = Broker(
        queue_settings(config),
        data_dir,
        Authorizer(config.rules()),
        topics=topic_specs(config),
        host=host,
        port=port,
        synchronous=synchronous,
        namespace=config.namespace.name,
        event_hubs=config.event_hubs,
        **options,
    )
    broker.http_app = AdminApi(broker, namespace=config.namespace.name).handle
    return broker


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="Config.json (emulator schema); required to serve")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (127.0.0.1)")
    parser.add_argument(
        "--port",
        type=int,
        default=5672,
        help="AMQP port, also serving AMQPS, HTTPS and WSS (5672; 0 = any free)",
    )
    parser.add_argument(
        "--tls-port",
        type=int,
        default=None,
        help="a TLS-only port as well: AMQPS, HTTPS, WSS (5671 by convention; default none)",
    )
    http = parser.add_mutually_exclusive_group()
    http.add_argument(
        "--http-port",
        type=int,
        default=None,
        help=f"plain HTTP port: management API, GET /health ({DEFAULT_HTTP_PORT}, skipped with "
        "a warning when taken; 0 = any free)",
    )
    http.add_argument("--no-http", action="store_true", help="serve no plain HTTP port")
    parser.add_argument(
        "--tls-cert",
        type=Path,
        help="server certificate (PEM, may include the chain) instead of the local CA's",
    )
    parser.add_argument("--tls-key", type=Path, help="its private key (PEM; default: --tls-cert)")
    parser.add_argument(
        "--print-ca",
        action="store_true",
        help="print the local CA certificate clients should trust (made if missing) and exit",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        help=f"where messages are kept ({DEFAULT_DATA_DIR})",
    )
    parser.add_argument(
        "--fsync",
        action="store_true",
        help="fsync every commit (survives power loss, slower); default survives process crashes",
    )
    parser.add_argument(
        "--ui",
        action="store_true",
        help="serve the dashboard (entities, messages, dead letters, event hubs) on the HTTP "
        "port, at /; bound off loopback (--host), the page asks for a SAS token or mints one "
        "from a key name and key pasted into it",
    )
    parser.add_argument(
        "--ui-token",
        metavar="TOKEN",
        help="with --ui off loopback: open the page with this token, a 'SharedAccessSignature "
        "sr=...' token or a connection string whose SharedAccessKeyName/SharedAccessKey mint "
        "one (valid 24 h); the logged URL carries it after '#sas=' (a fragment: never sent to "
        "the server)",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (INFO)")


def run(args: argparse.Namespace, services: Sequence[ServiceFor] = ()) -> int:
    """The broker of ``args`` until SIGINT or SIGTERM, with ``services`` started beside it
    once it listens (composed above the broker: ``cli.py``)."""
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.print_ca:
        return print_ca(args.data_dir)
    if args.config is None:
        print("error: --config is required", file=sys.stderr)
        return 2
    if args.tls_key is not None and args.tls_cert is None:
        print("error: --tls-key needs --tls-cert", file=sys.stderr)
        return 2
    for path in (args.tls_cert, args.tls_key):
        if path is not None and not path.is_file():
            print(f"error: no such file: {path}", file=sys.stderr)
            return 2
    try:
        config = load_config(args.config)
    except ConfigError as problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if config.logging.to_file:
        args.data_dir.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(args.data_dir / "broker.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(handler)  # Logging.Type File: under the data dir
    try:
        broker = build_broker(
            config,
            args.data_dir,
            args.host,
            args.port,
            "FULL" if args.fsync else "NORMAL",
            tls_port=args.tls_port,
            http_port=http_port(args),
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            http_optional=args.http_port is None,
        )
        broker.open()  # the store and the entities, before the loop
        collect_garbage_for_throughput()
    except OSError as exc:
        print(f"error: cannot open data dir {args.data_dir}: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(broker, services))
    except ssl.SSLError as tls_error:  # a certificate or key that does not load
        print(f"error: TLS certificate {args.tls_cert}: {tls_error}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot listen on {args.host}: {exc}", file=sys.stderr)
        return 1
    return 0


def print_ca(data_dir: Path) -> int:
    """``--print-ca``: the certificate to trust (``connection_verify=``, NODE_EXTRA_CA_CERTS)."""
    try:
        files = local_ca(data_dir / "tls")
    except OSError as exc:
        print(f"error: cannot make the CA under {data_dir}: {exc}", file=sys.stderr)
        return 2
    assert files.ca is not None
    sys.stdout.write(files.ca.read_text())
    return 0


def http_port(args: argparse.Namespace) -> int | None:
    """The plain HTTP port: as given, none, or the default one unless something has it (a
    broker that loses the default port to another between this look and its bind goes on
    without it: ``Broker(http_optional=True)``)."""
    if args.no_http:
        return None
    if args.http_port is not None:
        return int(args.http_port)
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((args.host, DEFAULT_HTTP_PORT))
        except OSError:
            log.warning(
                "port %d is taken: no plain HTTP port (--http-port picks one)", DEFAULT_HTTP_PORT
            )
            return None
    return DEFAULT_HTTP_PORT


async def _serve(broker: Broker, services: Sequence[ServiceFor] = ()) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await broker.start()
    started = [start(broker) for start in services]
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        for service in reversed(started):
            await service.stop()
        await broker.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replication broker", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
