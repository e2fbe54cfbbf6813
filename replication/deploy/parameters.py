"""infra/main.bicep's pipeline-dependent parameters, derived from the pipeline file itself.

The template must create exactly what the app will use: the entities each pipeline reads and
sends to, on the namespace each connection setting points at, with the rights each
connection needs. Reading the file with the project's own loader (``load_pipelines``) keeps
the two from drifting apart: what is deployed is what ``function_app.py`` will run.

Which namespace a connection setting points at is not in the pipeline file (it holds setting
names, not connection strings), so it is an argument: ``PrimaryServiceBus`` and
``PrimaryEventHubs`` -> primary, ``SecondaryServiceBus`` and ``SecondaryEventHubs`` ->
secondary unless told otherwise. A connection of ``eventhub:`` endpoints is an Event Hubs
namespace's (the template's primary or secondary Event Hubs namespace), any other a Service
Bus namespace's: one connection string cannot reach both services in Azure.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..failover import HOST_MAP_SETTING, NAMESERVER_SETTING
from ..pipeline import ERROR_TARGET_KEY, Endpoint, Pipeline, PipelineConfigError, load_pipelines
from ..pipeline.spec import DEFAULT_CONSUMER_GROUP

NAMESPACES = ("primary", "secondary")
"""The template's two namespaces, in the order the parameters list them."""

DEFAULT_NAMESPACES: Mapping[str, str] = {
    "PrimaryServiceBus": "primary",
    "SecondaryServiceBus": "secondary",
    "PrimaryEventHubs": "primary",
    "SecondaryEventHubs": "secondary",
}
"""Connection setting name -> namespace, as local.settings.sample.json and pipelines.yaml
name them."""

APP_SETTINGS = ("REPLICATION_PIPELINES",)
"""What ``function_app.py`` reads itself (tests/infra checks this against its source)."""

HOST_SETTINGS = ("AzureWebJobsStorage",)
"""What the Functions host needs before any function runs."""

ENVIRONMENT_SETTINGS = frozenset({HOST_MAP_SETTING, NAMESERVER_SETTING})
"""Optional settings the loader looks at for failover: local brokers and a DNS server other
than the system's. Azure's own resolver answers the failover records, so none is required."""

SETTING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""App settings become environment variables on Linux: letters, digits and '_' only."""

PLACEHOLDER = "Endpoint=sb://{host}.placeholder.invalid/;SharedAccessKeyName=k;SharedAccessKey=k"


class DeployConfigError(ValueError):
    """The pipeline file cannot be deployed with infra/main.bicep as it is."""


# ---------------------------------------------------------------------- parameters


def bicep_parameters(
    pipeline_file: Path,
    namespaces: Mapping[str, str] | None = None,
    *,
    app_root: Path | None = None,
) -> dict[str, Any]:
    """The parameters of infra/main.bicep that the pipeline file decides, as plain values:
    ``queues``, ``topics``, ``subscriptions``, ``connections``, ``receivers`` (Service Bus),
    ``eventHubs``, ``consumerGroups``, ``eventHubConnections``, ``eventHubReceivers`` (Event
    Hubs) and ``pipelineFile`` (relative to ``app_root``, default the file's folder), plus
    ``dnsZoneName`` / ``dnsAliasName`` when an endpoint fails over by DNS.

    ``namespaces`` maps connection setting names to 'primary' or 'secondary' (default
    ``DEFAULT_NAMESPACES``). Raises ``PipelineConfigError`` for an invalid file and
    ``DeployConfigError`` for one the template cannot deploy (an unmapped connection, ...).
    """
    pipeline_file = Path(pipeline_file)
    mapping = dict(DEFAULT_NAMESPACES if namespaces is None else namespaces)
    for name, namespace in mapping.items():
        if namespace not in NAMESPACES:
            raise DeployConfigError(
                f"connection {name!r} is mapped to {namespace!r}: the template's namespaces "
                f"are {' and '.join(map(repr, NAMESPACES))}"
            )
    plan = _Plan(mapping)
    for pipeline in load_pipelines(pipeline_file).pipelines:
        plan.add(pipeline)
    parameters: dict[str, Any] = {
        "queues": plan.queues(),
        "topics": plan.topics(),
        "subscriptions": plan.subscriptions(),
        "connections": plan.connections(),
        "receivers": plan.receivers(),
        "eventHubs": plan.event_hubs(),
        "consumerGroups": plan.consumer_groups(),
        "eventHubConnections": plan.event_hub_connections(),
        "eventHubReceivers": plan.event_hub_receivers(),
        "pipelineFile": _relative(pipeline_file, app_root),
    }
    parameters.update(plan.dns())
    return parameters


@dataclass
class _Queue:
    name: str
    reads: dict[bool, str] = field(default_factory=dict)
    """sessions -> a pipeline reading it so."""
    written: bool = False
    session_writers: list[bool] = field(default_factory=list)
    """Per pipeline sending here (error targets aside): do all its sources have sessions?"""


@dataclass
class _Topic:
    name: str
    written: bool = False


@dataclass
class _Subscription:
    topic: str
    name: str
    reads: dict[bool, str] = field(default_factory=dict)


@dataclass
class _Connection:
    namespace: str
    listen: bool = False
    send: bool = False
    failover: bool = False


@dataclass
class _EventHub:
    name: str
    groups: dict[str, str] = field(default_factory=dict)
    """Consumer groups read (lower-case -> as written), ``$Default`` aside (it always exists)."""


@dataclass
class _EventHubConnection:
    namespace: str
    hubs: dict[str, str] = field(default_factory=dict)
    """Event hubs reached (lower-case -> as written)."""
    listen: bool = False
    send: bool = False


class _Plan:
    """What the pipelines use, gathered endpoint by endpoint."""

    def __init__(self, mapping: Mapping[str, str]) -> None:
        self.mapping = mapping
        self._queues: dict[tuple[str, str], _Queue] = {}
        self._topics: dict[tuple[str, str], _Topic] = {}
        self._subscriptions: dict[tuple[str, str, str], _Subscription] = {}
        self._connections: dict[str, _Connection] = {}
        self._receivers: set[tuple[str, str, str, str, str]] = set()
        self._aliases: dict[str, str] = {}
        self._event_hubs: dict[tuple[str, str], _EventHub] = {}
        self._hub_connections: dict[str, _EventHubConnection] = {}
        self._hub_receivers: set[tuple[str, str, str]] = set()
        self._services: dict[str, tuple[bool, str, str]] = {}
        """Connection -> (event hubs?, what, pipeline): the first endpoint that named it."""

    def add(self, pipeline: Pipeline) -> None:
        all_sessions = all(source.sessions for source in pipeline.sources)
        for source in pipeline.sources:
            if source.is_event_hub:
                self.event_hub(source, pipeline, read=True)
                continue
            connection = self.connection(source, pipeline)
            connection.listen = True
            for namespace in self.namespaces(source, connection):
                self.read(pipeline, source, namespace)
        for key, target in pipeline.target_endpoints().items():
            if target.is_event_hub:
                self.event_hub(target, pipeline, read=False)
                continue
            connection = self.connection(target, pipeline)
            connection.send = True
            error_target = key is not None and key.startswith(ERROR_TARGET_KEY)
            for namespace in self.namespaces(target, connection):
                self.write(pipeline, target, namespace, None if error_target else all_sessions)

    def connection(self, endpoint: Endpoint, pipeline: Pipeline) -> _Connection:
        name = self.mapped(endpoint, pipeline)
        connection = self._connections.setdefault(name, _Connection(self.mapping[name]))
        if endpoint.failover is not None:
            connection.failover = True
            if endpoint.failover.dns is not None:
                self._aliases.setdefault(endpoint.failover.dns.alias, pipeline.name)
        return connection

    def mapped(self, endpoint: Endpoint, pipeline: Pipeline) -> str:
        """The endpoint's connection name, checked: mapped to a namespace, a Linux app
        setting name, and of one service only."""
        name = endpoint.connection
        if name not in self.mapping:
            known = ", ".join(f"{k} -> {v}" for k, v in self.mapping.items()) or "none"
            raise DeployConfigError(
                f"pipeline {pipeline.name!r}: connection {name!r} is not mapped to a namespace "
                f"of the template (mapped: {known}); map it to 'primary' or 'secondary'"
            )
        if not SETTING_NAME.fullmatch(name):
            raise DeployConfigError(
                f"pipeline {pipeline.name!r}: connection {name!r} cannot be an app setting on "
                "Linux (letters, digits and '_' only)"
            )
        kind = "event hub" if endpoint.is_event_hub else "Service Bus entity"
        what = f"{kind} {endpoint.entity!r}"
        hubs, first, by = self._services.setdefault(
            name, (endpoint.is_event_hub, what, pipeline.name)
        )
        if hubs != endpoint.is_event_hub:
            raise DeployConfigError(
                f"pipeline {pipeline.name!r}: connection {name!r} is used for {what} and, by "
                f"pipeline {by!r}, for {first}: in Azure an Event Hubs namespace and a Service "
                "Bus namespace have connection strings of their own; use one connection setting "
                "for each"
            )
        return name

    def event_hub(self, endpoint: Endpoint, pipeline: Pipeline, *, read: bool) -> None:
        """An event hub endpoint: the hub (and the consumer group a source reads) on its
        connection's Event Hubs namespace, and the connection's right (Listen or Send)."""
        name = self.mapped(endpoint, pipeline)
        assert endpoint.eventhub is not None
        namespace = self.mapping[name]
        connection = self._hub_connections.setdefault(name, _EventHubConnection(namespace))
        hub = self._event_hubs.setdefault(
            (namespace, endpoint.eventhub.lower()), _EventHub(endpoint.eventhub)
        )
        connection.hubs.setdefault(endpoint.eventhub.lower(), hub.name)
        if read:
            connection.listen = True
            if endpoint.group != DEFAULT_CONSUMER_GROUP:
                hub.groups.setdefault(endpoint.group.lower(), endpoint.group)
            self._hub_receivers.add((name, namespace, hub.name))
        else:
            connection.send = True

    @staticmethod
    def namespaces(endpoint: Endpoint, connection: _Connection) -> tuple[str, ...]:
        """An endpoint that fails over may be on either namespace: its entity goes on both
        (the namespaces of a failover pair are structurally identical)."""
        return NAMESPACES if endpoint.failover is not None else (connection.namespace,)

    def read(self, pipeline: Pipeline, source: Endpoint, namespace: str) -> None:
        if source.topic is not None and source.subscription is not None:
            topic = self.topic(namespace, source.topic, pipeline)
            key = (namespace, topic.name.lower(), source.subscription.lower())
            subscription = self._subscriptions.setdefault(
                key, _Subscription(topic.name, _arm_name(source.subscription, pipeline))
            )
            _read(
                subscription.reads,
                source.sessions,
                pipeline,
                f"subscription {source.subscription!r} of topic {source.topic!r}",
            )
            self._receivers.add((source.connection, namespace, "", topic.name, subscription.name))
        elif source.queue is not None:
            queue = self.queue(namespace, source.queue, pipeline)
            _read(queue.reads, source.sessions, pipeline, f"queue {source.queue!r}")
            self._receivers.add((source.connection, namespace, queue.name, "", ""))

    def write(
        self, pipeline: Pipeline, target: Endpoint, namespace: str, sessions: bool | None
    ) -> None:
        if target.topic is not None:
            self.topic(namespace, target.topic, pipeline).written = True
        elif target.queue is not None:
            queue = self.queue(namespace, target.queue, pipeline)
            queue.written = True
            if sessions is not None:
                queue.session_writers.append(sessions)

    def queue(self, namespace: str, name: str, pipeline: Pipeline) -> _Queue:
        if (namespace, name.lower()) in self._topics:
            raise _same_name(namespace, name, "topic", "queue", pipeline)
        key = (namespace, name.lower())
        return self._queues.setdefault(key, _Queue(_arm_name(name, pipeline)))

    def topic(self, namespace: str, name: str, pipeline: Pipeline) -> _Topic:
        if (namespace, name.lower()) in self._queues:
            raise _same_name(namespace, name, "queue", "topic", pipeline)
        key = (namespace, name.lower())
        return self._topics.setdefault(key, _Topic(_arm_name(name, pipeline)))

    # ------------------------------------------------------------------ the parameters

    def queues(self) -> list[dict[str, Any]]:
        found = []
        for (namespace, _), queue in _ordered(self._queues):
            if queue.reads:
                sessions = True in queue.reads
            else:  # filled by pipelines only: keep their sources' sessions for consumers
                sessions = bool(queue.session_writers) and all(queue.session_writers)
            found.append(
                {
                    "namespace": namespace,
                    "name": queue.name,
                    "requiresSession": sessions,
                    "requiresDuplicateDetection": queue.written,
                }
            )
        return found

    def topics(self) -> list[dict[str, Any]]:
        return [
            {
                "namespace": namespace,
                "name": topic.name,
                "requiresDuplicateDetection": topic.written,
            }
            for (namespace, _), topic in _ordered(self._topics)
        ]

    def subscriptions(self) -> list[dict[str, Any]]:
        return [
            {
                "namespace": namespace,
                "topic": subscription.topic,
                "name": subscription.name,
                "requiresSession": True in subscription.reads,
            }
            for (namespace, *_), subscription in _ordered(self._subscriptions)
        ]

    def connections(self) -> list[dict[str, Any]]:
        return [
            {
                "name": name,
                "namespace": connection.namespace,
                "listen": connection.listen,
                "send": connection.send,
                "failover": connection.failover,
            }
            for name, connection in sorted(self._connections.items())
        ]

    def receivers(self) -> list[dict[str, str]]:
        ordered = sorted(self._receivers, key=lambda r: (r[0], NAMESPACES.index(r[1]), r[2:]))
        return [
            {"connection": c, "namespace": n, "queue": q, "topic": t, "subscription": s}
            for c, n, q, t, s in ordered
        ]

    def event_hubs(self) -> list[dict[str, Any]]:
        return [
            {"namespace": namespace, "name": hub.name}
            for (namespace, _), hub in _ordered(self._event_hubs)
        ]

    def consumer_groups(self) -> list[dict[str, Any]]:
        return [
            {"namespace": namespace, "eventHub": hub.name, "name": hub.groups[group]}
            for (namespace, _), hub in _ordered(self._event_hubs)
            for group in sorted(hub.groups)
        ]

    def event_hub_connections(self) -> list[dict[str, Any]]:
        """One per connection setting of event hubs: its rule is on its event hub when it
        reaches one (Listen for a source, Send for a target), else on the namespace (a
        setting holds one connection string, and a hub's carries EntityPath)."""
        return [
            {
                "name": name,
                "namespace": connection.namespace,
                "eventHub": next(iter(connection.hubs.values()))
                if len(connection.hubs) == 1
                else "",
                "listen": connection.listen,
                "send": connection.send,
            }
            for name, connection in sorted(self._hub_connections.items())
        ]

    def event_hub_receivers(self) -> list[dict[str, str]]:
        ordered = sorted(self._hub_receivers, key=lambda r: (r[0], NAMESPACES.index(r[1]), r[2]))
        return [{"connection": c, "namespace": n, "eventHub": h} for c, n, h in ordered]

    def dns(self) -> dict[str, str]:
        """The zone and alias label of the (one) DNS alias the pipelines fail over with."""
        if not self._aliases:
            return {}
        if len(self._aliases) > 1:
            named = ", ".join(f"{a!r} ({p})" for a, p in sorted(self._aliases.items()))
            raise DeployConfigError(
                f"the pipelines use several failover DNS aliases: {named}; the template makes "
                "one alias (dnsAliasName.dnsZoneName): use one alias for every endpoint"
            )
        alias = next(iter(self._aliases))
        label, _, zone = alias.partition(".")
        if "." not in zone:
            raise DeployConfigError(
                f"failover alias {alias!r}: the template puts the alias into a zone of its own "
                "(e.g. servicebus.test.example.com in test.example.com); give a name with a zone "
                "you can delegate"
            )
        return {"dnsZoneName": zone, "dnsAliasName": label}


def _read(reads: dict[bool, str], sessions: bool, pipeline: Pipeline, what: str) -> None:
    other = reads.get(not sessions)
    if other is not None:
        raise DeployConfigError(
            f"{what} is read with sessions by pipeline "
            f"{(pipeline.name if sessions else other)!r} and without by "
            f"{(other if sessions else pipeline.name)!r}: an entity requires sessions or not"
        )
    reads.setdefault(sessions, pipeline.name)


def _arm_name(name: str, pipeline: Pipeline) -> str:
    if "/" in name:
        raise DeployConfigError(
            f"pipeline {pipeline.name!r}: entity {name!r}: a template cannot create names with "
            "'/' (ARM reads them as child resources); create it another way or rename it"
        )
    return name


def _same_name(namespace: str, name: str, first: str, second: str, pipeline: Pipeline) -> Exception:
    return DeployConfigError(
        f"pipeline {pipeline.name!r}: {name!r} is used as a {first} and as a {second} on the "
        f"{namespace} namespace; queues and topics share one set of names"
    )


def _ordered(items: Mapping[Any, Any]) -> Iterator[tuple[Any, Any]]:
    """Namespace order first (primary, secondary), then by name: stable parameter files."""
    return iter(sorted(items.items(), key=lambda kv: (NAMESPACES.index(kv[0][0]), kv[0][1:])))


def _relative(pipeline_file: Path, app_root: Path | None) -> str:
    """The pipeline file as the deployed app names it: relative to the app root, with '/'."""
    root = (app_root or pipeline_file.parent).resolve()
    try:
        return pipeline_file.resolve().relative_to(root).as_posix()
    except ValueError:
        raise DeployConfigError(
            f"{pipeline_file} is not inside the app root {root}: deploy it with the app"
        ) from None


# ---------------------------------------------------------------------- app settings


def required_app_settings(pipeline_file: Path) -> set[str]:
    """Every app setting the deployed app needs: the Functions host's storage, what
    function_app.py reads, and every setting the pipeline file names (connections, and the
    keys and values steps such as encrypt, sign or enrich read).

    The pipeline settings are the ones ``python -m replication validate --settings`` checks:
    the file is loaded again with a settings mapping that records every name the loader's
    checks (``check_setting``, each step's builder) ask for, and answers with a placeholder a
    step accepts (a connection string for connections, a 256-bit base64 key otherwise).
    """
    loaded = load_pipelines(pipeline_file)  # a broken file is reported as such
    connections = {
        endpoint.connection
        for pipeline in loaded.pipelines
        for endpoint in [*pipeline.sources, *pipeline.target_endpoints().values()]
    }
    asked = _AskedSettings(connections)
    try:
        load_pipelines(pipeline_file, settings=asked)
    except PipelineConfigError as exc:  # a step that refuses the placeholder stops asking
        raise DeployConfigError(
            f"cannot list the settings {pipeline_file} needs (a step refused a placeholder "
            f"value, so later settings of that step may be missing): {exc}"
        ) from exc
    return set(APP_SETTINGS) | set(HOST_SETTINGS) | asked.names


def app_secret_names(pipeline_file: Path) -> list[str]:
    """The settings the template cannot make itself (step keys, enrich values): to be given
    in its ``appSecrets`` parameter. Connections, the pipeline file path and the host's
    storage it makes."""
    made = set(APP_SETTINGS) | set(HOST_SETTINGS)
    loaded = load_pipelines(pipeline_file)
    for pipeline in loaded.pipelines:
        for endpoint in [*pipeline.sources, *pipeline.target_endpoints().values()]:
            made.add(endpoint.connection)
    return sorted(required_app_settings(pipeline_file) - made)


class _AskedSettings(Mapping[str, str]):
    """Settings that have every name but the optional ENVIRONMENT_SETTINGS: each lookup is
    recorded and answered with a placeholder: for connections a connection string to a
    namespace named after the setting (distinct, so no two look like one namespace to the
    loop checks), else a 256-bit key in base64 (what encrypt, decrypt, chain and sign keys
    hold; any text suits enrich)."""

    KEY = base64.b64encode(bytes(range(32))).decode()

    def __init__(self, connections: set[str]) -> None:
        self.connections = connections
        self.names: set[str] = set()

    def __getitem__(self, key: str) -> str:
        if key in ENVIRONMENT_SETTINGS:  # optional: unset, as in Azure
            raise KeyError(key)
        self.names.add(key)
        if key in self.connections:
            return PLACEHOLDER.format(host=re.sub(r"[^a-z0-9-]", "-", key.lower()) or "x")
        return self.KEY

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __bool__(self) -> bool:  # the loader writes ``settings or {}``: not empty, though sized 0
        return True

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key not in ENVIRONMENT_SETTINGS


# ---------------------------------------------------------------------- the parameters file

PARAMETERS_SCHEMA = (
    "https://schema.management.azure.com/schemas/2019-04-01/deploymentParameters.json#"
)


def parameters_file(derived: Mapping[str, Any], base: Mapping[str, Any] | None = None) -> dict:
    """An ARM deployment parameters document: ``base`` (one, e.g. the example file, with the
    parameters the pipeline file does not decide) with ``derived`` put in, in its order."""
    document: dict[str, Any] = dict(base or {})
    document.setdefault("$schema", PARAMETERS_SCHEMA)
    document.setdefault("contentVersion", "1.0.0.0")
    parameters = dict(document.get("parameters") or {})
    for name, value in derived.items():
        parameters[name] = {"value": value}
    document["parameters"] = parameters
    return document
