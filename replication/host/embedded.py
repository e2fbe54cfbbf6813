"""Starts the embedded broker for connections that point at this machine's emulator.

A connection string with ``UseDevelopmentEmulator=true`` and an Endpoint on ``localhost``
(or 127.0.0.1) names a namespace we can run ourselves: one broker per distinct port, its
entities made from what the pipelines read and write there (queues, topics, subscriptions,
sessions; event hubs with their consumer groups, on the same listener), its data under
``<project>/.replication/broker-<port>`` so it survives restarts.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..broker.config import parse_config
from ..broker.main import build_broker
from ..broker.server import Broker
from ..clock import SYSTEM, Clock
from ..servicebus.connection_string import ConnectionString

if TYPE_CHECKING:
    from ..pipeline import Endpoint, Pipeline

log = logging.getLogger("replication.host")
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}
EVENT_HUB_PARTITIONS = 4
"""Partitions of an event hub the host makes for a pipeline (the Azure portal's default)."""
EVENT_HUBS_NAMESPACE = "emulatorNs1"
"""The Event Hubs emulator's namespace name."""


def emulator_port(connection_string: str) -> int | None:
    """The port of a local emulator connection string, else None (a real namespace)."""
    try:
        parsed = ConnectionString.parse(connection_string)
    except ValueError:
        return None
    if not parsed.use_development_emulator or parsed.host.lower() not in LOCAL_HOSTS:
        return None
    return parsed.port


@dataclass(slots=True)
class Entities:
    """What one namespace must have: queue -> sessions, topic -> {subscription: sessions}."""

    queues: dict[str, bool] = field(default_factory=dict)
    topics: dict[str, dict[str, bool]] = field(default_factory=dict)
    event_hubs: dict[str, set[str]] = field(default_factory=dict)
    """Event hub -> its consumer groups besides ``$Default``."""

    def add(self, endpoint: Endpoint, sessions: bool) -> None:
        if endpoint.eventhub:
            groups = self.event_hubs.setdefault(endpoint.eventhub, set())
            group = endpoint.consumer_group
            if group and group != "$Default":
                groups.add(group)
        elif endpoint.queue:
            self.queues[endpoint.queue] = self.queues.get(endpoint.queue, False) or sessions
        elif endpoint.topic:
            subs = self.topics.setdefault(endpoint.topic, {})
            if endpoint.subscription:
                subs[endpoint.subscription] = sessions

    def config(self) -> dict[str, Any]:
        """An emulator-schema Config.json for these entities (duplicate detection on, so a
        batch redelivered after a failure does not duplicate at the target)."""
        dedupe = {
            "RequiresDuplicateDetection": True,
            "DuplicateDetectionHistoryTimeWindow": "PT10M",
        }
        return {
            "UserConfig": {
                "Namespaces": [
                    {
                        "Name": "sbemulatorns",
                        "Queues": [
                            {"Name": q, "Properties": {**dedupe, "RequiresSession": sessions}}
                            for q, sessions in sorted(self.queues.items())
                        ],
                        "Topics": [
                            {
                                "Name": t,
                                "Properties": dedupe,
                                "Subscriptions": [
                                    {"Name": s, "Properties": {"RequiresSession": sessions}}
                                    for s, sessions in sorted(subs.items())
                                ],
                            }
                            for t, subs in sorted(self.topics.items())
                        ],
                    }
                ],
                **self._event_hubs_config(),
                "Logging": {"Type": "File"},
            }
        }

    def _event_hubs_config(self) -> dict[str, Any]:
        """The Event Hubs emulator's part of the file (``NamespaceConfig``), if any."""
        if not self.event_hubs:
            return {}
        return {
            "NamespaceConfig": [
                {
                    "Type": "EventHub",
                    "Name": EVENT_HUBS_NAMESPACE,
                    "Entities": [
                        {
                            "Name": hub,
                            "PartitionCount": EVENT_HUB_PARTITIONS,
                            "ConsumerGroups": [{"Name": g} for g in sorted(groups)],
                        }
                        for hub, groups in sorted(self.event_hubs.items())
                    ],
                }
            ]
        }


def plan_brokers(
    pipelines: Iterable[Pipeline],
    settings: Mapping[str, str],
    functions: Iterable[tuple[Endpoint, bool]] = (),
) -> dict[int, Entities]:
    """Port -> entities, for every pipeline endpoint whose connection is a local emulator
    (or, with failover, may resolve to a local broker of ``REPLICATION_FAILOVER_HOSTS``),
    and every entity a function's trigger reads there (``trigger_endpoints``), so a function
    app without pipelines gets the brokers its emulator connection strings name. A port
    something serves already is left to it by ``start_brokers``."""
    from ..failover import HOST_MAP_SETTING, parse_host_map

    hosts = parse_host_map(settings.get(HOST_MAP_SETTING))
    plan: dict[int, Entities] = {}
    for endpoint, needs_sessions in functions:
        port = emulator_port(settings.get(endpoint.connection) or "")
        if port is not None:
            plan.setdefault(port, Entities()).add(endpoint, needs_sessions)
    for pipeline in pipelines:
        # sources in sessions, or event hubs whose keys become sessions
        sessions = any(s.sessions or s.session_id_from for s in pipeline.sources)
        targets = [e for e in (pipeline.target, pipeline.default) if e]
        targets += [route.target for route in pipeline.routes or ()]
        endpoints = [(e, e.sessions) for e in pipeline.sources]
        # a replica of a session entity is a session entity (its messages keep their ids)
        endpoints += [(e, sessions or e.sessions) for e in targets]
        errors = [pipeline.error_target, *pipeline.step_error_targets.values()]
        endpoints += [(e, False) for e in errors if e]
        for endpoint, needs_sessions in endpoints:
            connection = settings.get(endpoint.connection)
            for candidate in _namespaces(endpoint, connection, hosts):
                port = emulator_port(candidate)
                if port is not None:
                    plan.setdefault(port, Entities()).add(endpoint, needs_sessions)
    return plan


def served(port: int) -> bool:
    """Whether something accepts connections on the local port already (the Service Bus
    emulator, a broker started by hand)."""
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def trigger_endpoints(triggers: Iterable[Any]) -> list[tuple[Endpoint, bool]]:
    """What each Service Bus or Event Hubs trigger reads, as pipeline endpoints, with
    whether it needs sessions (``plan_brokers``)."""
    from ..pipeline import Endpoint

    endpoints = []
    for trigger in triggers:
        if hasattr(trigger, "eventhub"):
            fields = {"eventhub": trigger.eventhub, "consumer_group": trigger.consumer_group}
        else:
            fields = {
                "queue": trigger.queue,
                "topic": trigger.topic,
                "subscription": trigger.subscription,
            }
        try:
            endpoint = Endpoint(connection=trigger.connection, **fields)
        except ValueError as exc:  # a name no pipeline could hold: the broker makes none
            log.warning("%s: no embedded entity for it: %s", trigger.name, exc)
            continue
        endpoints.append((endpoint, bool(getattr(trigger, "sessions", False))))
    return endpoints


def _namespaces(endpoint: Endpoint, connection: str | None, hosts: Mapping[str, str]) -> list[str]:
    """The connection strings an endpoint may use: its own, and with failover each namespace
    of the host map (a failover set's namespaces have the same entities)."""
    if not connection:
        return []
    if endpoint.failover is None:
        return [connection]
    from ..failover import connection_for

    return [connection, *(connection_for(connection, host, hosts) for host in hosts)]


async def start_brokers(
    plan: dict[int, Entities], data_root: Path, clock: Clock = SYSTEM
) -> list[Broker]:
    """A broker per port of ``plan``, its data in ``data_root/broker-<port>``, on ``clock``;
    a port something serves already is left to it (its entities are then its business, as
    with the Service Bus emulator's Config.json), where binding it again would fail."""
    brokers = []
    for port, entities in sorted(plan.items()):
        if served(port):
            log.info("localhost:%d is served already: the app uses it", port)
            continue
        config = parse_config(entities.config(), source=f"<entities for localhost:{port}>")
        broker = build_broker(config, data_root / f"broker-{port}", "127.0.0.1", port, clock=clock)
        await broker.start()
        brokers.append(broker)
    return brokers
