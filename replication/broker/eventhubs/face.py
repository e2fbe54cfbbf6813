"""The broker's Event Hubs face: producer and consumer links on the same AMQP listener.

Producers attach to ``<hub>`` (the broker picks the partition: by the partition key's hash,
else round-robin) or ``<hub>/Partitions/<n>``; a transfer is one event or a batch (message
format 0x80013700, one encoded event per data section), appended whole to one partition
and ``accepted`` only after the broker's commit, like a Service Bus send. Consumers attach
to ``<hub>/ConsumerGroups/<cg>/Partitions/<n>`` with a selector filter naming where to
start and read the log from there on; reading removes nothing. Deliveries go out settled
(the broker answers the attach with snd-settle-mode settled: the Python SDK asks for
unsettled but never settles, and the .NET SDK asks for settled). An owner level
(``com.microsoft:epoch``) takes the partition from receivers with a lower one or none
(``amqp:link:stolen``), as in Event Hubs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...amqp.errors import AMQPError
from ...amqp.link import Delivery, Link
from ...amqp.message import decode_message
from ...amqp.outcomes import Accepted, Rejected, TransactionalState
from ...amqp.performatives import SND_SETTLED
from ...amqp.types import symbol
from .. import wire
from ..errors import error, tracked
from . import management
from .hub import EventHub, EventHubSpec, parse_address
from .log import EventLog, PartitionLog
from .selector import SELECTOR_FILTER, SelectorError, parse_selector
from .wire import delivery_payload, partition_key_of, stored_event

if TYPE_CHECKING:
    from ..server import Broker, Peer

log = logging.getLogger("replication.broker.eventhubs")

MAX_MESSAGE_SIZE = 1024 * 1024
"""Event Hubs Standard's largest event or batch (what the SDKs size batches by)."""
RECEIVE_LIMIT = 4 * 1024 * 1024
"""Larger transfers are still read, and refused with a rejected disposition."""
LINK_CREDIT = 10_000
PUMP_BATCH = 100
PUMP_BYTES = 1024 * 1024
EPOCH = symbol("com.microsoft:epoch")
MANAGEMENT_NODE = "$management"
ARGUMENT_ERROR = "com.microsoft:argument-error"
LINK_STOLEN = "amqp:link:stolen"


@dataclass(slots=True, eq=False)
class EventConsumer:
    """Our sending link to a peer that reads one partition for one consumer group."""

    link: Link
    peer: Peer
    hub: EventHub
    group: str
    partition: PartitionLog
    next_seq: int
    epoch: int | None


@dataclass(slots=True, eq=False)
class EventProducer:
    """A peer's link that sends to a hub, or to one of its partitions."""

    hub: EventHub
    partition: PartitionLog | None
    path: str


@dataclass(slots=True)
class _PeerLinks:
    consumers: dict[int, EventConsumer] = field(default_factory=dict)
    producers: dict[int, EventProducer] = field(default_factory=dict)


class EventHubsFace:
    """Event hubs of one broker; the broker hands it the links and requests that are ours."""

    def __init__(self, broker: Broker, specs: list[EventHubSpec], event_log: EventLog) -> None:
        self.broker = broker
        now = broker.now_ms()
        self.hubs: dict[str, EventHub] = {
            spec.name.lower(): EventHub(spec, event_log, now) for spec in specs
        }
        self._peers: dict[int, _PeerLinks] = {}  # id(peer) -> its links to us
        self._readers: dict[int, list[EventConsumer]] = {}  # id(partition) -> consumers
        self._appended: set[PartitionLog] = set()
        self._publish_pending = False

    # ------------------------------------------------------------------ routing

    def owns(self, path: str) -> bool:
        """Whether a link address (an entity path) names one of our event hubs."""
        return path.partition("/")[0].lower() in self.hubs

    def owns_link(self, peer: Peer, link: Link) -> bool:
        links = self._peers.get(id(peer))
        return links is not None and (id(link) in links.consumers or id(link) in links.producers)

    def _links(self, peer: Peer) -> _PeerLinks:
        links = self._peers.get(id(peer))
        if links is None:
            links = self._peers[id(peer)] = _PeerLinks()
        return links

    # ------------------------------------------------------------------ attach

    def attach(self, peer: Peer, link: Link, path: str) -> None:
        """Answers an attach to one of our hubs (``owns(path)``)."""
        address = parse_address(path)
        hub = self.hubs.get(path.partition("/")[0].lower())
        assert hub is not None
        if address is None:
            link.refuse(error("amqp:not-found", (
                f"The messaging entity '{path}' could not be found: send to '{hub.name}' or "
                f"'{hub.name}/Partitions/<id>', receive from "
                f"'{hub.name}/ConsumerGroups/<group>/Partitions/<id>'."
            )))  # fmt: skip
            return
        partition = None
        if address.partition is not None:
            partition = hub.partition(address.partition)
            if partition is None:
                link.refuse(error("amqp:not-found", (
                    f"The messaging entity '{path}' could not be found: event hub "
                    f"'{hub.name}' has partitions {', '.join(hub.partition_ids)}."
                )))  # fmt: skip
                return
        if link.is_receiver:  # the peer sends
            if address.consumer_group is not None:
                link.refuse(error("amqp:not-allowed", (
                    f"cannot send to '{path}': send to '{hub.name}' or "
                    f"'{hub.name}/Partitions/<id>'"
                )))  # fmt: skip
                return
            if self._refused(peer, link, path, "Send"):
                return
            self._links(peer).producers[id(link)] = EventProducer(hub, partition, path)
            link.accept(max_message_size=MAX_MESSAGE_SIZE)
            link.receive_limit = RECEIVE_LIMIT
            link.flow(LINK_CREDIT)
            return
        if address.consumer_group is None or partition is None:
            link.refuse(error("amqp:not-allowed", (
                f"cannot receive from '{path}': receive from "
                f"'{hub.name}/ConsumerGroups/<group>/Partitions/<id>'"
            )))  # fmt: skip
            return
        group = hub.consumer_groups.get(address.consumer_group.lower())
        if group is None:
            link.refuse(error("amqp:not-found", (
                f"The messaging entity '{path}' could not be found: event hub '{hub.name}' "
                f"has consumer groups {', '.join(sorted(hub.consumer_groups.values()))}."
            )))  # fmt: skip
            return
        if self._refused(peer, link, path, "Listen"):
            return
        self._attach_consumer(peer, link, hub, group, partition)

    def _refused(self, peer: Peer, link: Link, path: str, right: str) -> bool:
        problem = self.broker._authorization_problem(peer, path, right)
        if problem is not None:
            link.refuse(error("amqp:unauthorized-access", problem))
        return problem is not None

    def _attach_consumer(
        self, peer: Peer, link: Link, hub: EventHub, group: str, partition: PartitionLog
    ) -> None:
        filters = getattr(link.remote_source, "filter", None) or {}
        selector = filters.get(SELECTOR_FILTER)
        text = getattr(selector, "value", selector)
        try:
            position = parse_selector(None if text is None else str(text))
        except SelectorError as exc:
            link.refuse(error(ARGUMENT_ERROR, str(exc)))
            return
        raw_epoch = (link.remote_properties or {}).get(EPOCH)
        epoch = None if raw_epoch is None else int(raw_epoch)
        rivals = [c for c in self._readers.get(id(partition), []) if c.group == group]
        stronger = [c for c in rivals if c.epoch is not None and (epoch is None or c.epoch > epoch)]
        if stronger:
            link.refuse(error(LINK_STOLEN, (
                f"Receiver with epoch '{epoch}' cannot be created: a receiver with epoch "
                f"'{stronger[0].epoch}' already reads partition {partition.name} for "
                f"consumer group '{group}'."
            )))  # fmt: skip
            return
        consumer = EventConsumer(
            link, peer, hub, group, partition, partition.start(position), epoch
        )
        if epoch is not None:
            for rival in rivals:
                if rival.link.is_open:
                    rival.link.detach(error(LINK_STOLEN, (
                        f"New receiver with higher epoch of '{epoch}' is created hence the "
                        f"current receiver with epoch '{rival.epoch}' is getting disconnected."
                    )))  # fmt: skip
                self._forget_consumer(rival)
                self.broker._touched.add(rival.peer.driver)
        self._links(peer).consumers[id(link)] = consumer
        self._readers.setdefault(id(partition), []).append(consumer)
        link.accept(snd_settle_mode=SND_SETTLED)
        self._pump(consumer)

    # ------------------------------------------------------------------ sends

    def on_transfer(self, peer: Peer, link: Link, delivery: Delivery) -> None:
        """One event or batch from a producer link (``owns_link``)."""
        if link.link_credit < LINK_CREDIT // 2:
            link.flow(LINK_CREDIT)
        producer = self._links(peer).producers[id(link)]
        problem = self.broker._authorization_problem(peer, producer.path, "Send")
        if problem is not None:
            delivery.update(Rejected(error=error("amqp:unauthorized-access", problem)))
            return
        if isinstance(delivery.state, TransactionalState):
            delivery.update(Rejected(error=error(
                "amqp:not-implemented", "Event Hubs does not support transactions"
            )))  # fmt: skip
            return
        if len(delivery.payload) > MAX_MESSAGE_SIZE:
            delivery.update(Rejected(error=error(
                "amqp:link:message-size-exceeded",
                f"The received message (size {len(delivery.payload)}) exceeds the limit "
                f"({MAX_MESSAGE_SIZE}) of event hub '{producer.hub.name}'.",
            )))  # fmt: skip
            return
        try:
            messages = wire.parse_transfer(delivery.payload, delivery.message_format)
            key = next(filter(None, (partition_key_of(m.annotations) for m in messages)), None)
            if key is None and delivery.message_format == wire.BATCH_FORMAT:
                key = partition_key_of(wire.parse_message(delivery.payload).annotations)
        except AMQPError as exc:
            delivery.update(Rejected(error=error("amqp:decode-error", exc.description)))
            return
        partition = producer.partition or producer.hub.route(key)
        partition.append([stored_event(m, key) for m in messages], self.broker.now_ms())
        self._appended.add(partition)
        then: Callable[[], None] | None = None if delivery.settled else (
            lambda: delivery.update(Accepted())
        )  # fmt: skip
        self._publish_after_commit(then)

    def _publish_after_commit(self, then: Callable[[], None] | None) -> None:
        if not self._publish_pending:
            self._publish_pending = True
            self.broker._commit_soon(self._publish)
        if then is not None:
            self.broker._commit_soon(then)

    def _publish(self) -> None:
        """After the commit: appended events become readable and go to their readers."""
        self._publish_pending = False
        appended, self._appended = self._appended, set()
        for partition in appended:
            if partition.publish():
                for consumer in list(self._readers.get(id(partition), [])):
                    self._pump(consumer)

    # ------------------------------------------------------------------ deliveries

    def _pump(self, consumer: EventConsumer) -> None:
        link = consumer.link
        want = link.link_credit - link.queued
        if want <= 0 or not link.is_open or consumer.peer.driver.paused:
            return
        events = consumer.partition.read(consumer.next_seq, min(want, PUMP_BATCH), PUMP_BYTES)
        if not events:
            return
        for event in events:
            link.send(delivery_payload(event), settled=True)
        consumer.next_seq = events[-1].sequence_number + 1
        self.broker._touched.add(consumer.peer.driver)

    def on_flow(self, peer: Peer, link: Link) -> None:
        consumer = self._links(peer).consumers.get(id(link))
        if consumer is not None:
            self._pump(consumer)

    def resume(self, peer: Peer) -> None:
        """The peer's socket drained: the next batch for each of its readers."""
        links = self._peers.get(id(peer))
        if links is not None:
            for consumer in list(links.consumers.values()):
                self._pump(consumer)

    # ------------------------------------------------------------------ detach, close

    def forget_link(self, peer: Peer, link: Link) -> None:
        links = self._peers.get(id(peer))
        if links is None:
            return
        links.producers.pop(id(link), None)
        consumer = links.consumers.get(id(link))
        if consumer is not None:
            self._forget_consumer(consumer)

    def _forget_consumer(self, consumer: EventConsumer) -> None:
        links = self._peers.get(id(consumer.peer))
        if links is not None:
            links.consumers.pop(id(consumer.link), None)
        readers = self._readers.get(id(consumer.partition), [])
        if consumer in readers:
            readers.remove(consumer)

    def forget_peer(self, peer: Peer) -> None:
        links = self._peers.pop(id(peer), None)
        if links is None:
            return
        for consumer in list(links.consumers.values()):
            readers = self._readers.get(id(consumer.partition), [])
            if consumer in readers:
                readers.remove(consumer)

    # ------------------------------------------------------------------ $management, retention

    def is_management_request(self, path: str, request: Any) -> bool:
        """A request on the namespace's ``$management`` node that reads hub or partition
        properties."""
        props = request.application_properties or {}
        return path.lower() == MANAGEMENT_NODE.lower() and management.is_event_hubs_request(props)

    def on_management(self, peer: Peer, delivery: Delivery) -> None:
        request = decode_message(delivery.payload)
        if not delivery.settled:
            delivery.update(Accepted())
        props = request.application_properties or {}
        name = str(props.get("name", ""))
        try:
            problem = self.broker._authorization_problem(peer, name, "Listen")
            if problem is not None:
                problem = self.broker._authorization_problem(peer, name, "Send")
            if problem is not None:
                raise management.ManagementError(401, problem)
            body = management.read(self.hubs, props)
            status, description = 200, "OK"
        except management.ManagementError as exc:
            body, status, description = None, exc.status, tracked(exc.description)
        answer = {"status-code": status, "status-description": description}
        self.broker._reply(peer, MANAGEMENT_NODE, request, answer, body)

    def sweep(self, now_ms: int) -> int:
        """Retention: drops expired events of every hub; returns how many."""
        return sum(hub.trim(now_ms) for hub in self.hubs.values())
