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

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from ...amqp.errors import AMQPError, MessageSizeExceededError
from ...amqp.link import Delivery, Link
from ...amqp.message import decode_message
from ...amqp.outcomes import Accepted, Rejected, TransactionalState
from ...amqp.performatives import SND_SETTLED
from ...amqp.types import symbol
from .. import wire
from ..cbs import Cbs
from ..clock import Clock, now_ms
from ..commit import GroupCommit
from ..errors import error, tracked
from ..nodes import Node
from ..peer import Peer
from ..store import MessageStore
from . import management
from .hub import EventHub, EventHubSpec, parse_address
from .log import EventLog, PartitionLog
from .selector import SELECTOR_FILTER, SelectorError, parse_selector
from .wire import delivery_payload, partition_key_of, stored_event

log = logging.getLogger("replication.broker.eventhubs")

MAX_MESSAGE_SIZE = 1024 * 1024
"""Event Hubs Standard's largest event or batch (what the SDKs size batches by)."""
RECEIVE_LIMIT = 4 * 1024 * 1024
"""Larger transfers are still read, and refused with a rejected disposition."""
LINK_CREDIT = 10_000
PUMP_BATCH = 100
PUMP_BYTES = 1024 * 1024
EPOCH = symbol("com.microsoft:epoch")
RUNTIME_METRIC = symbol("com.microsoft:enable-receiver-runtime-metric")
MANAGEMENT_NODE = "$management"
ARGUMENT_ERROR = "com.microsoft:argument-error"
LINK_STOLEN = "amqp:link:stolen"


@dataclass(slots=True, eq=False)
class EventConsumer:
    """Our sending link to a peer that reads one partition for one consumer group."""

    link: Link
    peer: Peer
    group: str
    partition: PartitionLog
    next_seq: int
    epoch: int | None
    runtime_metric: bool = False
    """Each delivery says where the partition ends (``track_last_enqueued_event_properties``)."""


@dataclass(slots=True, eq=False)
class EventProducer:
    """A peer's link that sends to a hub, or to one of its partitions."""

    hub: EventHub
    partition: PartitionLog | None
    path: str


_SELECTOR_DESCRIPTORS = (SELECTOR_FILTER, 0x0000468C00000004)
"""The filter's descriptor by name and by code (the AMQP filters registry)."""


def _selector(filters: Any) -> str | None:
    """The selector-filter's text: the SDKs key it by its descriptor's name, other clients
    (proton's ``Selector``) by ``selector``; the descriptor says what it is."""
    for key, value in (filters or {}).items():
        descriptor = getattr(value, "descriptor", None)
        if descriptor in _SELECTOR_DESCRIPTORS or (descriptor is None and key == SELECTOR_FILTER):
            return str(getattr(value, "value", value))
    return None


class EventHubsNode(Node):
    """Links to the event hubs (``<hub>...``) and to the namespace's ``$management``."""

    def __init__(
        self, hubs: dict[str, EventHub], cbs: Cbs, commits: GroupCommit, clock: Clock
    ) -> None:
        self.hubs = hubs
        """Every event hub by lower-case name."""
        self.cbs = cbs
        self.commits = commits
        self.clock = clock
        self._producers: dict[Link, EventProducer] = {}
        self._consumers: dict[Link, EventConsumer] = {}
        self._readers: dict[PartitionLog, list[EventConsumer]] = {}
        self._appended: set[PartitionLog] = set()
        self._publish_pending = False

    @classmethod
    def open(
        cls,
        specs: list[EventHubSpec],
        store: MessageStore,
        cbs: Cbs,
        commits: GroupCommit,
        clock: Clock,
    ) -> EventHubsNode:
        """The node for ``specs``, their logs in ``store``'s database (made on first use)."""
        event_log = EventLog(store.connection, store.begin)
        now = now_ms(clock)
        hubs = {spec.name.lower(): EventHub(spec, event_log, now) for spec in specs}
        return cls(hubs, cbs, commits, clock)

    def accepts(self, link: Link, path: str) -> bool:
        return (
            path.lower() == MANAGEMENT_NODE.lower() or path.partition("/")[0].lower() in self.hubs
        )

    # ------------------------------------------------------------------ attach

    def attach(self, peer: Peer, link: Link, path: str) -> None:
        if path.lower() == MANAGEMENT_NODE.lower():
            link.accept()
            if link.is_receiver:
                link.flow(LINK_CREDIT)
            else:  # answers go to the link the request's reply-to names (one per client)
                peer.add_reply_link(MANAGEMENT_NODE, link)
            return
        hub = self.hubs[path.partition("/")[0].lower()]
        address = parse_address(path)
        if address is None:
            link.refuse(
                error(
                    "amqp:not-found",
                    (
                        f"The messaging entity '{path}' could not be found: send to '{hub.name}' "
                        "or "
                        f"'{hub.name}/Partitions/<id>', receive from "
                        f"'{hub.name}/ConsumerGroups/<group>/Partitions/<id>'."
                    ),
                )
            )
            return
        partition = None
        if address.partition is not None:
            partition = hub.partition(address.partition)
            if partition is None:
                link.refuse(
                    error(
                        "amqp:not-found",
                        (
                            f"The messaging entity '{path}' could not be found: event hub "
                            f"'{hub.name}' has partitions {', '.join(hub.partition_ids)}."
                        ),
                    )
                )
                return
        if link.is_receiver:  # the peer sends
            if address.consumer_group is not None:
                link.refuse(
                    error(
                        "amqp:not-allowed",
                        (
                            f"cannot send to '{path}': send to '{hub.name}' or "
                            f"'{hub.name}/Partitions/<id>'"
                        ),
                    )
                )
                return
            if self._refused(peer, link, path, "Send"):
                return
            self._producers[link] = EventProducer(hub, partition, path)
            link.accept(max_message_size=MAX_MESSAGE_SIZE)
            link.receive_limit = RECEIVE_LIMIT
            link.flow(LINK_CREDIT)
            return
        if address.consumer_group is None or partition is None:
            link.refuse(
                error(
                    "amqp:not-allowed",
                    (
                        f"cannot receive from '{path}': receive from "
                        f"'{hub.name}/ConsumerGroups/<group>/Partitions/<id>'"
                    ),
                )
            )
            return
        group = hub.consumer_groups.get(address.consumer_group.lower())
        if group is None:
            link.refuse(
                error(
                    "amqp:not-found",
                    (
                        f"The messaging entity '{path}' could not be found: event hub '{hub.name}' "
                        f"has consumer groups {', '.join(sorted(hub.consumer_groups.values()))}."
                    ),
                )
            )
            return
        if self._refused(peer, link, path, "Listen"):
            return
        self._attach_consumer(peer, link, group, partition)

    def _refused(self, peer: Peer, link: Link, path: str, right: str) -> bool:
        problem = self.cbs.problem(peer, path, right)
        if problem is not None:
            link.refuse(error("amqp:unauthorized-access", problem))
            return True
        peer.entity_links[link] = path  # its token's expiry detaches it (Cbs.check_tokens)
        return False

    def _attach_consumer(self, peer: Peer, link: Link, group: str, partition: PartitionLog) -> None:
        try:
            position = parse_selector(_selector(getattr(link.remote_source, "filter", None)))
            start = partition.start(position)
        except SelectorError as exc:
            link.refuse(error(ARGUMENT_ERROR, str(exc)))
            return
        raw_epoch = (link.remote_properties or {}).get(EPOCH)
        epoch = None if raw_epoch is None else int(raw_epoch)
        rivals = [c for c in self._readers.get(partition, []) if c.group == group]
        stronger = [c for c in rivals if c.epoch is not None and (epoch is None or c.epoch > epoch)]
        if stronger:
            link.refuse(
                error(
                    LINK_STOLEN,
                    (
                        f"Receiver with epoch '{epoch}' cannot be created: a receiver with epoch "
                        f"'{stronger[0].epoch}' already reads partition {partition.name} for "
                        f"consumer group '{group}'."
                    ),
                )
            )
            return
        if epoch is not None:
            for rival in rivals:
                if rival.link.is_open:
                    rival.link.detach(
                        error(
                            LINK_STOLEN,
                            (
                                f"New receiver with higher epoch of '{epoch}' is created hence the "
                                f"current receiver with epoch '{rival.epoch}' is getting "
                                "disconnected."
                            ),
                        )
                    )
                self._forget_consumer(rival)
                rival.peer.driver.wake()
        wanted = (link.remote.desired_capabilities if link.remote else None) or ()
        metric = RUNTIME_METRIC in (wanted if isinstance(wanted, (list, tuple)) else (wanted,))
        consumer = EventConsumer(link, peer, group, partition, start, epoch, metric)
        self._consumers[link] = consumer
        self._readers.setdefault(partition, []).append(consumer)
        link.accept(
            snd_settle_mode=SND_SETTLED, offered_capabilities=(RUNTIME_METRIC,) if metric else None
        )
        self._pump(consumer)

    # ------------------------------------------------------------------ sends

    def transfer(self, peer: Peer, link: Link, delivery: Delivery) -> None:
        producer = self._producers.get(link)
        if producer is None:  # a request to $management
            self._management(peer, delivery)
            return
        problem = self.cbs.problem(peer, producer.path, "Send")
        if problem is not None:
            delivery.update(Rejected(error=error("amqp:unauthorized-access", problem)))
            return
        if isinstance(delivery.state, TransactionalState):
            delivery.update(
                Rejected(
                    error=error("amqp:not-implemented", "Event Hubs does not support transactions")
                )
            )
            return
        if len(delivery.payload) > MAX_MESSAGE_SIZE:
            delivery.update(
                Rejected(
                    error=error(
                        "amqp:link:message-size-exceeded",
                        f"The received message (size {len(delivery.payload)}) exceeds the limit "
                        f"({MAX_MESSAGE_SIZE}) of event hub '{producer.hub.name}'.",
                    )
                )
            )
            return
        try:
            parts = wire.transfer_parts(delivery.payload, delivery.message_format)
            messages = [wire.parse_message(part) for part in parts]
            key = next(filter(None, (partition_key_of(m.annotations) for m in messages)), None)
            if key is None and delivery.message_format == wire.BATCH_FORMAT:
                key = partition_key_of(wire.parse_message(delivery.payload).annotations)
        except AMQPError as exc:
            delivery.update(Rejected(error=error("amqp:decode-error", exc.description)))
            return
        partition = producer.partition or producer.hub.route(key)
        events = [stored_event(m, key, part) for m, part in zip(messages, parts, strict=True)]
        partition.append(events, now_ms(self.clock))
        self._appended.add(partition)
        if not self._publish_pending:
            self._publish_pending = True
            self.commits.soon(self._publish)
        if not delivery.settled:
            self.commits.soon(lambda: delivery.update(Accepted()))
        self.commits.wake(peer.driver)

    def _publish(self) -> None:
        """After the commit: appended events become readable and go to their readers."""
        self._publish_pending = False
        appended, self._appended = self._appended, set()
        for partition in appended:
            if partition.publish():
                for consumer in list(self._readers.get(partition, [])):
                    self._pump(consumer)

    # ------------------------------------------------------------------ deliveries

    def _pump(self, consumer: EventConsumer) -> None:
        link = consumer.link
        want = link.link_credit - link.queued
        if want <= 0 or not link.is_open or consumer.peer.driver.paused:
            return  # a slow reader holds back only itself (a drained socket flows again)
        events = consumer.partition.read(consumer.next_seq, min(want, PUMP_BATCH), PUMP_BYTES)
        if not events:
            return
        last = consumer.partition.state if consumer.runtime_metric else None
        now = now_ms(self.clock)
        for event in events:
            try:
                link.send(delivery_payload(event, last, now), settled=True)
            except MessageSizeExceededError as exc:  # the reader's max-message-size
                link.detach(
                    error(
                        exc.condition,
                        (
                            f"event {event.sequence_number} of {consumer.partition.name} does not "
                            "fit "
                            f"the link: {exc.description}"
                        ),
                    )
                )
                self._forget_consumer(consumer)
                consumer.peer.driver.wake()
                return
        consumer.next_seq = events[-1].sequence_number + 1
        # written now: they are durable already (``commits.wake`` would wait for a commit
        # that a flow or a drained socket does not ask for)
        consumer.peer.driver.wake()
        if want > len(events) and consumer.next_seq < consumer.partition.visible:
            asyncio.get_running_loop().call_soon(self._pump_more, consumer)  # after this batch

    def _pump_more(self, consumer: EventConsumer) -> None:
        if self._consumers.get(consumer.link) is consumer:
            self._pump(consumer)

    def flow(self, peer: Peer, link: Link) -> None:
        consumer = self._consumers.get(link)
        if consumer is not None:
            self._pump(consumer)

    # ------------------------------------------------------------------ detach

    def detach(self, peer: Peer, link: Link) -> None:
        self._producers.pop(link, None)
        consumer = self._consumers.get(link)
        if consumer is not None:
            self._forget_consumer(consumer)
        peer.forget_reply_link(link)

    def _forget_consumer(self, consumer: EventConsumer) -> None:
        self._consumers.pop(consumer.link, None)
        readers = self._readers.get(consumer.partition, [])
        if consumer in readers:
            readers.remove(consumer)

    # ------------------------------------------------------------------ $management, retention

    def _management(self, peer: Peer, delivery: Delivery) -> None:
        request = decode_message(delivery.payload)
        if not delivery.settled:
            delivery.update(Accepted())
        props = request.application_properties or {}
        name = str(props.get("name", ""))
        try:
            problem = self.cbs.management_problem(peer, name, "Listen")
            if problem is not None:
                problem = self.cbs.management_problem(peer, name, "Send")
            if problem is not None:
                raise management.ManagementError(401, problem)
            body = management.read(self.hubs, props)
            status, description = 200, "OK"
        except management.ManagementError as exc:
            body, status, description = None, exc.status, tracked(exc.description)
        # the SDK reads the description as ``statusDescription`` (it passes the name
        # ``status-description`` under a keyword its management link ignores): both go
        answer = {
            "status-code": status,
            "status-description": description,
            "statusDescription": description,
        }
        peer.reply(MANAGEMENT_NODE, request, answer, body)
        peer.driver.wake()  # a read changes nothing: no commit to wait for

    def sweep(self, now: int) -> bool:
        """Retention: drops expired events of every hub; True when any went."""
        return sum(hub.trim(now) for hub in self.hubs.values()) > 0
