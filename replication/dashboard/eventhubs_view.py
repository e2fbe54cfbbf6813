"""The dashboard's Event Hubs view: hubs, their partitions and consumer groups, events read
from a position, and an event sent with a partition key or to a partition.

Partitions and events go through the namespace's AMQP connection as the SDKs do it
(``servicebus.eventhubs``: ``$management`` READs, a reader link with a selector filter;
``servicebus.sender``: a send to ``<hub>`` or ``<hub>/Partitions/<id>``, so the broker puts
a keyed event where the key hashes). Which hubs there are and their consumer groups is not
on the data plane (Azure keeps it in the resource manager): a namespace's ``Catalog``,
given by what composes the dashboard (``compose.py``: the broker's configured hubs), says.

Paths under ``/$dashboard/api/``: ``GET eventhubs?namespace=`` (hubs with their partitions'
properties and consumer groups; Listen over the namespace), ``GET eventhubs/events?namespace=
&hub=&partition=&consumer_group=&position=sequence|offset|time&value=&count=`` (Listen over
the hub), ``POST eventhubs/send?namespace=&hub=`` with ``{body, application_properties,
content_type, message_id, correlation_id, partition_key | partition_id}`` (Send over the hub).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from ..amqp.errors import AMQPError
from ..broker.auth import LISTEN, SEND
from ..broker.httpapi import Request
from ..messages import Message
from ..servicebus.client import source_error
from ..servicebus.eventhubs import (
    DEFAULT_CONSUMER_GROUP,
    EventHubClient,
    PartitionProperties,
    offset_selector,
    selector,
    time_selector,
)
from ..servicebus.sender import AmqpSender
from . import send_form
from .namespace import DashboardError, Namespace, describe

if TYPE_CHECKING:
    from ..broker.server import Broker

Catalog = Callable[[], Mapping[str, list[str]]]
"""A namespace's event hubs: each hub's name and its consumer groups."""
MAX_EVENTS = 500
READ_WAIT = 1.0
"""Seconds a read waits for the first event at its position (there may be none)."""
EVENT_FIELDS = ("message_id", "correlation_id", "content_type", "subject")
"""What of the send form an event takes (an event has no session, TTL or schedule)."""


class Authorize(Protocol):
    def __call__(
        self, request: Request, namespace: Namespace | None, entity: str, right: str
    ) -> None: ...


def catalog_of(broker: Broker) -> Catalog:
    """An embedded broker's catalog: the hubs of its config and their consumer groups."""
    return lambda: {
        hub.name: list(hub.consumer_groups.values()) for hub in broker.event_hubs.hubs.values()
    }


def partition(properties: PartitionProperties) -> dict[str, Any]:
    """A partition as ``get_partition_properties`` names its fields."""
    moment = properties.last_enqueued
    return {
        "id": properties.id,
        "beginning_sequence_number": properties.begin,
        "last_enqueued_sequence_number": properties.last,
        "last_enqueued_offset": properties.last_offset,
        "last_enqueued_time_utc": None if moment is None else moment.isoformat(),
        "is_empty": properties.empty,
    }


def event(message: Message) -> dict[str, Any]:
    """An event read: what ``describe`` shows of a message, with its offset and partition."""
    return {**describe(message), "offset": message.offset, "partition_id": message.partition_id}


def start_filter(position: str, value: str) -> dict[Any, Any]:
    """The selector of a read from a sequence number, an offset or an enqueued time
    (inclusive: the event at the position is the first one shown)."""
    value = value.strip()
    if position == "sequence":
        try:
            return selector(max(0, int(value)))
        except ValueError:
            raise DashboardError(f"value: a sequence number, not {value!r}") from None
    if position == "offset":
        if not value.lstrip("-").isdigit():
            raise DashboardError(f"value: an offset (a whole number), not {value!r}")
        return offset_selector(value, inclusive=True)
    if position == "time":
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise DashboardError(f"value: an ISO 8601 time, not {value!r}") from None
        return time_selector(moment if moment.tzinfo else moment.replace(tzinfo=UTC))
    raise DashboardError("position: sequence, offset or time")


class EventHubsView:
    """The Event Hubs paths of the dashboard, over each namespace's ``Catalog``."""

    def __init__(self, catalogs: Mapping[str, Catalog]) -> None:
        self.catalogs = dict(catalogs)
        self._clients: dict[tuple[str, str, str], EventHubClient] = {}

    def client(
        self, namespace: Namespace, hub: str, group: str = DEFAULT_CONSUMER_GROUP
    ) -> EventHubClient:
        """One client per hub and consumer group, so each keeps one ``$management`` link
        (a new one for the namespace's next connection)."""
        key = (namespace.name, hub, group)
        client = self._clients.get(key)
        if client is None or client.source is not namespace.source:
            client = self._clients[key] = EventHubClient(namespace.source, hub, group)
        return client

    def hubs(self, namespace: Namespace) -> Mapping[str, list[str]]:
        catalog = self.catalogs.get(namespace.name)
        return {} if catalog is None else catalog()

    def _hub(self, namespace: Namespace, query: Mapping[str, str]) -> str:
        name = query.get("hub", "")
        for hub in self.hubs(namespace):
            if hub.lower() == name.lower():
                return hub
        raise DashboardError(f"no event hub {name!r} in {namespace.name}", 404)

    async def handle(
        self,
        request: Request,
        route: str,
        namespace: Namespace,
        authorize: Authorize,
        body: dict[str, Any],
    ) -> dict[str, Any]:
        """The answer to ``eventhubs``, ``eventhubs/events`` or ``eventhubs/send`` (``body``:
        a POST's JSON object)."""
        query = request.query
        get = request.method in ("GET", "HEAD")
        if route == "eventhubs" and get:
            authorize(request, namespace, "", LISTEN)
            return {"namespace": namespace.name, "hubs": await self.overview(namespace)}
        hub = self._hub(namespace, query)
        if route == "eventhubs/events" and get:
            authorize(request, namespace, hub, LISTEN)
            return await self.read(namespace, hub, query)
        if route == "eventhubs/send" and request.method == "POST":
            authorize(request, namespace, hub, SEND)
            return await self.send(namespace, hub, body)
        raise DashboardError(f"no such endpoint: {request.method} {route}", 404)

    async def overview(self, namespace: Namespace) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        catalog = self.hubs(namespace)
        for hub in sorted(catalog, key=str.lower):
            client = self.client(namespace, hub)
            partitions = await client.partitions()
            found.append(
                {
                    "name": hub,
                    "consumer_groups": sorted(catalog[hub], key=str.lower),
                    "partitions": [partition(p) for p in partitions.values()],
                }
            )
        return found

    async def read(
        self, namespace: Namespace, hub: str, query: Mapping[str, str]
    ) -> dict[str, Any]:
        """Up to ``count`` events of one partition from a position, in order; stops at the
        partition's last event (read first), so a read at the end does not wait."""
        partition_id = query.get("partition", "")
        group = query.get("consumer_group") or DEFAULT_CONSUMER_GROUP
        try:
            count = int(query.get("count", "20"))
        except ValueError:
            count = 0
        if not 1 <= count <= MAX_EVENTS:
            raise DashboardError(f"count: a whole number from 1 to {MAX_EVENTS}")
        filters = start_filter(query.get("position", "sequence"), query.get("value", "0"))
        client = self.client(namespace, hub, group)
        ids = await client.partition_ids()
        if partition_id not in ids:
            raise DashboardError(
                f"no partition {partition_id!r} in {hub} (it has {', '.join(ids)})", 404
            )
        last = (await client.partition(partition_id)).last
        events: list[Message] = []
        if last >= 0:
            link = await client.receiver(partition_id, filters, count)
            try:
                while len(events) < count:
                    batch = await link.receive_batch(count - len(events), READ_WAIT)
                    arrived = [b.message for b in batch if isinstance(b.message, Message)]
                    events += arrived
                    if not arrived or (events[-1].sequence_number or 0) >= last:
                        break
            except (AMQPError, OSError) as exc:
                raise source_error(exc, f"reading {client.path(partition_id)} failed") from exc
            finally:
                await link.close()
        for item in events:
            item.partition_id = partition_id
        return {
            "hub": hub,
            "partition": partition_id,
            "consumer_group": group,
            "events": [event(m) for m in events[:count]],
            "last_enqueued_sequence_number": last,
        }

    async def send(self, namespace: Namespace, hub: str, body: dict[str, Any]) -> dict[str, Any]:
        """One event to the hub: with a partition key (the hub hashes it to a partition),
        to a partition by id, or with neither (the hub spreads events round-robin)."""
        key = body.get("partition_key") or None
        partition_id = body.get("partition_id")
        partition_id = None if partition_id in (None, "") else str(partition_id)
        if key is not None and partition_id is not None:
            raise DashboardError("a partition key or a partition id, not both")
        unknown = sorted(
            set(body)
            - {"body", "application_properties", *EVENT_FIELDS}
            - {"partition_key", "partition_id"}
        )
        if unknown:
            raise DashboardError(f"an event has no {', '.join(unknown)}")
        made = send_form.message({k: v for k, v in body.items() if k != "partition_id"})
        made.message_id = body.get("message_id") or None  # an event has none unless given
        if partition_id is not None:
            ids = await self.client(namespace, hub).partition_ids()
            if partition_id not in ids:
                raise DashboardError(f"no partition {partition_id!r} in {hub}", 404)
        path = hub if partition_id is None else f"{hub}/Partitions/{partition_id}"
        sender = AmqpSender(namespace.source, path, timeout=15.0, event_hub=True)
        try:
            await sender.send_messages([made])
        finally:
            await sender.close()
        return {
            "sent": made.message_id,
            "hub": hub,
            "partition_key": key,
            "partition_id": partition_id,
        }
