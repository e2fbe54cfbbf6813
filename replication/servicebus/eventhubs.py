"""An event hub over our own AMQP stack: partition properties and reading a partition range.

What Spark's ``eventhubs`` data source and pipeline runner and the dashboard's Event Hubs
view need of Event Hubs, on the same ``AmqpSource`` connections as everything else (in a
Spark worker ``worker.source_for``; the dashboard's namespace's), as
``azure-eventhub`` 5.15.1 does it on the wire (docs/sdk-wire-notes.md "azure-eventhub"):

- ``$management`` reads: a request to the namespace's ``$management`` node with application
  properties ``operation`` ``READ``, ``name`` (the hub), ``type``
  ``com.microsoft:eventhub`` / ``com.microsoft:partition`` (+ ``partition``) and
  ``security_token``; the answer's ``status-code`` and its amqp-value map (partition ids;
  ``begin_sequence_number``, ``last_enqueued_sequence_number``, ...). The connection puts a
  CBS token for the hub first, as the SDK does.
- Reading: a receiver link from ``<hub>/ConsumerGroups/<group>/Partitions/<id>`` with the
  selector filter ``amqp.annotation.x-opt-sequence-number >= '<n>'``; the service sends the
  events settled (nothing is ever settled or locked), each decoded straight into a
  ``Message`` (``adapters.amqp``: offset, sequence number, enqueued time and partition key
  come from the annotations the table names). Credit never asks for more than the range
  still wants, so a read of ``[start, end)`` takes at most a few events beyond it.

Why not the SDK: reading one partition's 20,000 events (200-byte bodies, the embedded broker
in its own process; ``python bench/spark_eventhubs.py``, two runs of three) took 0.55-0.60 s
and 0.34-0.43 CPU s (33,000-37,000 events/s) against 1.5-2.0 s and 1.1-1.5 CPU s
(10,000-13,000 events/s) with ``azure-eventhub``'s ``receive_batch`` and
``adapters.eventhubs.from_event_data``. The SDK also has no call that reads a bounded
range, only a callback consumer that runs until it is closed.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..adapters.amqp import decode_arrived
from ..amqp.client import Receiver
from ..amqp.errors import AMQPError
from ..amqp.performatives import RCV_FIRST, SND_SETTLED
from ..amqp.types import Described, symbol
from ..messages import Message
from .client import AmqpSource, SourceError, source_error
from .management_link import EVENT_HUBS_STATUS, ManagementLink

log = logging.getLogger("replication.spark")

MANAGEMENT_NODE = "$management"
SELECTOR_FILTER = symbol("apache.org:selector-filter:string")
DEFAULT_CONSUMER_GROUP = "$Default"


class DataLoss(SourceError):
    """Events of a planned range are gone (the hub's retention removed them)."""

    def __init__(self, description: str) -> None:
        super().__init__(description, "replication:data-loss")

    @property
    def retryable(self) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class PartitionProperties:
    """One partition as ``$management`` describes it."""

    id: str
    begin: int
    """The first retained sequence number (-1: nothing was ever written)."""
    last: int
    """The last enqueued sequence number (-1: nothing was ever written)."""
    last_offset: str
    last_enqueued: datetime | None
    empty: bool

    @property
    def end(self) -> int:
        """The sequence number the next event will get."""
        return self.last + 1

    @property
    def earliest(self) -> int:
        """The first sequence number there is to read (``end`` when nothing is retained)."""
        if self.empty or self.begin < 0:
            return self.end
        return self.begin


def selector(sequence_number: int) -> dict[Any, Any]:
    """The source filter of a reader that starts at ``sequence_number`` (inclusive)."""
    text = f"amqp.annotation.x-opt-sequence-number >= '{sequence_number}'"
    return {SELECTOR_FILTER: Described(SELECTOR_FILTER, text)}


def time_selector(moment: datetime, *, inclusive: bool = True) -> dict[Any, Any]:
    """The filter of a reader that starts at the first event enqueued at (``inclusive``)
    or after ``moment``."""
    ms = int(moment.timestamp() * 1000)
    text = f"amqp.annotation.x-opt-enqueued-time {'>=' if inclusive else '>'} '{ms}'"
    return {SELECTOR_FILTER: Described(SELECTOR_FILTER, text)}


def offset_selector(offset: str, inclusive: bool) -> dict[Any, Any]:
    """The filter of a reader that starts at an event's offset."""
    text = f"amqp.annotation.x-opt-offset {'>=' if inclusive else '>'} '{offset}'"
    return {SELECTOR_FILTER: Described(SELECTOR_FILTER, text)}


class EventHubClient:
    """One event hub and consumer group on a shared ``AmqpSource`` (one connection)."""

    def __init__(self, source: AmqpSource, hub: str, group: str = DEFAULT_CONSUMER_GROUP) -> None:
        self.source = source
        self.hub = hub
        self.group = group
        self._management: ManagementLink | None = None

    # ------------------------------------------------------------------ $management

    async def partition_ids(self) -> list[str]:
        body = await self._read({"type": "com.microsoft:eventhub"})
        return [str(p) for p in body.get("partition_ids") or []]

    async def partition(self, partition_id: str) -> PartitionProperties:
        body = await self._read({"type": "com.microsoft:partition", "partition": partition_id})
        moment = body.get("last_enqueued_time_utc")
        return PartitionProperties(
            id=partition_id,
            begin=int(body.get("begin_sequence_number", -1)),
            last=int(body.get("last_enqueued_sequence_number", -1)),
            last_offset=str(body.get("last_enqueued_offset", "-1")),
            last_enqueued=None if not moment else datetime.fromtimestamp(int(moment) / 1000, UTC),
            empty=bool(body.get("is_partition_empty", False)),
        )

    async def partitions(self) -> dict[str, PartitionProperties]:
        """Every partition's properties, read side by side."""
        ids = await self.partition_ids()
        found = await asyncio.gather(*(self.partition(p) for p in ids))
        return {p.id: p for p in found}

    async def _read(self, properties: dict[str, Any]) -> dict[str, Any]:
        link = await self._link()
        endpoint = link.connection.endpoint
        token, _ = await endpoint.token_provider(endpoint.audience(self.hub))
        what = f"reading {properties['type'].split(':')[-1]} properties of {self.hub}"
        request = {"operation": "READ", "name": self.hub, "security_token": token, **properties}
        return await link.request(request, None, what)

    async def _link(self) -> ManagementLink:
        connection = await self.source.connection()
        link = self._management
        if link is None or link.connection is not connection or connection.closed:
            await connection.authorize(self.hub)
            link = await ManagementLink.attach(connection, MANAGEMENT_NODE, EVENT_HUBS_STATUS)
            self._management = link
        return link

    # ------------------------------------------------------------------ reading

    def path(self, partition_id: str) -> str:
        return f"{self.hub}/ConsumerGroups/{self.group}/Partitions/{partition_id}"

    async def receiver(self, partition_id: str, filters: dict[Any, Any], credit: int) -> Receiver:
        """A reader of one partition from the position ``filters`` names."""
        connection = await self.source.connection()
        path = self.path(partition_id)
        await connection.authorize(path)
        try:
            return await connection.client.receiver(
                connection.endpoint.address(path),
                credit=max(1, credit),
                filter=filters,
                target=f"eventhubs-reader-{uuid.uuid4()}",
                snd_settle_mode=SND_SETTLED,
                rcv_settle_mode=RCV_FIRST,
                credit_on_take=True,
                decode=decode_arrived,
                timeout=connection.timeout,
            )
        except (AMQPError, OSError) as exc:
            raise source_error(exc, f"cannot read {path}") from exc

    async def read(
        self,
        partition_id: str,
        start: int,
        end: int,
        *,
        batch: int = 500,
        prefetch: int = 500,
        wait: float = 60.0,
        fail_on_data_loss: bool = True,
    ) -> AsyncIterator[list[Message]]:
        """The events of ``[start, end)`` in batches of up to ``batch``, in order
        (``partition_id`` set on each). ``wait``: seconds to wait for the next event of the
        range before giving up (the range was planned from the hub's own properties, so it
        is there). Events of the range that retention removed raise ``DataLoss``, or are
        skipped (logged by the caller) with ``fail_on_data_loss`` False."""
        if end <= start:
            return
        credit = min(prefetch, end - start)
        link = await self.receiver(partition_id, selector(start), credit)
        path = self.path(partition_id)
        expected = start
        try:
            while expected < end:
                link.credit = max(1, min(prefetch, end - expected - link.queue.qsize()))
                try:
                    items = await link.receive_batch(min(batch, end - expected), wait)
                except (AMQPError, OSError) as exc:
                    raise source_error(exc, f"reading {path} failed") from exc
                if not items:
                    raise SourceError(
                        f"{path}: no event {expected} within {wait:g} s (the range ends "
                        f"before {end})",
                        "com.microsoft:timeout",
                    )
                out: list[Message] = []
                past_end = False
                for item in items:
                    message = item.message
                    if not isinstance(message, Message):
                        raise SourceError(f"{path}: cannot decode event {expected}: {message}")
                    number = message.sequence_number
                    if number is None:
                        raise SourceError(f"{path}: an event without a sequence number")
                    if number >= end:
                        past_end = True
                        break
                    if number > expected:
                        gone = f"{path}: events {expected} to {number - 1} are gone (the event "
                        gone += "hub's retention removed them before they were read)"
                        if fail_on_data_loss:
                            raise DataLoss(
                                f"{gone}; set option failOnDataLoss to false to go on without them"
                            )
                        log.warning("%s; going on without them (failOnDataLoss false)", gone)
                    if number < expected:
                        continue  # read already (cannot happen with an exact selector)
                    message.partition_id = partition_id
                    out.append(message)
                    expected = number + 1
                if out:
                    yield out
                if past_end:
                    return
        finally:
            await link.close()

    async def first_at(self, partition_id: str, filters: dict[Any, Any], wait: float) -> int | None:
        """The sequence number of the first event at the position ``filters`` names (None
        when there is none yet): how an enqueued time or an offset becomes a sequence
        number. Reads one event."""
        link = await self.receiver(partition_id, filters, 1)
        try:
            items = await link.receive_batch(1, wait)
        except (AMQPError, OSError) as exc:
            raise source_error(exc, f"reading {self.path(partition_id)} failed") from exc
        finally:
            await link.close()
        if not items or not isinstance(items[0].message, Message):
            return None
        return items[0].message.sequence_number


def hub_source(connection_string: str) -> tuple[AmqpSource, str | None]:
    """A source for a connection string and its ``EntityPath`` (None without one)."""
    source = AmqpSource.from_connection_string(connection_string)
    return source, source.endpoint.entity
