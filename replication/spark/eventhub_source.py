"""The ``eventhubs`` PySpark data source: events as rows, offsets that are Event Hubs' own.

::

    from replication.spark import register
    register(spark)
    events = (spark.readStream.format("eventhubs").option("connection", "OrdersHub")
              .option("consumerGroup", "spark").option("startingPosition", "earliest").load())

Options: ``eventhub_options.py``. Rows: ``rows.EVENT_SCHEMA`` (the ``servicebus``
source's columns for what an event carries, plus ``offset`` and ``partition``).

Streaming, at-least-once with Spark's checkpoint (README "Event Hubs"): the offset is
partition -> next sequence number (``eventhub_ranges``). On the driver, ``initialOffset``
turns the starting positions into sequence numbers (an enqueued time or an offset by reading
the first event at it); ``latestOffset`` reads every partition's last enqueued sequence
number through ``$management`` and advances by up to ``maxEventsPerTrigger`` events, shared
in proportion to what each partition has waiting; ``partitions`` plans one ``EventRange``
per partition. Executors read their range themselves (``read``: our AMQP reader, on the
Python worker's loop and connection), so no event body passes through the driver. Nothing
is locked or settled: a restarted query resumes from the offsets in its checkpoint, and a
batch Spark replays reads the same range again. ``Trigger.AvailableNow`` reads up to the
partitions' ends as they were when the query started.

Batch (``spark.read``): from the starting positions to ``endingPosition(s)`` (default: the
ends when the job is planned).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from .eventhub_options import EventHubOptions, Position
from .eventhub_ranges import EventRange, Offsets, advance, from_offset, plan, to_offset
from .rows import EVENT_SCHEMA, to_event_row

if TYPE_CHECKING:
    from ..messages import Message
    from ..servicebus.eventhubs import EventHubClient, PartitionProperties
    from .intake import LoopThread

log = logging.getLogger("replication.spark")
T = TypeVar("T")

FIRST_EVENT_WAIT = 5.0
"""Seconds the driver waits for the first event at an enqueued time or offset position
(asked only when the partition's last event is at or after it, so it is there)."""


class EventHubsDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "eventhubs"

    def schema(self) -> str:
        return EVENT_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return EventHubsBatchReader(EventHubOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return EventHubsStreamReader(EventHubOptions.parse(self.options))


# ---------------------------------------------------------------------- the driver's side


class HubPlanner:
    """The driver's reads of the hub (``$management``, and the first event at a position),
    on one loop thread and one connection, opened on first use."""

    def __init__(self, options: EventHubOptions) -> None:
        self.options = options
        self._thread: LoopThread | None = None
        self._client: EventHubClient | None = None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._thread is None:
            from .intake import LoopThread

            self._thread = LoopThread("eventhubs-planner")
        return self._thread.run(coro, timeout=120)

    @property
    def client(self) -> EventHubClient:
        if self._client is None:
            from ..servicebus.client import AmqpSource
            from ..servicebus.eventhubs import EventHubClient

            source = AmqpSource.from_connection_string(self.options.connection_string)
            self._client = EventHubClient(
                source, self.options.event_hub, self.options.consumer_group
            )
        return self._client

    def partitions(self) -> dict[str, PartitionProperties]:
        return self.run(self.client.partitions())

    def positions(
        self, partitions: dict[str, PartitionProperties], *, ending: bool = False
    ) -> Offsets:
        """Each partition's starting (or ending) position as a sequence number."""
        options = self.options
        chosen = {p: options.end_of(p) if ending else options.start_of(p) for p in partitions}
        return self.run(_resolve_all(self.client, partitions, chosen, ending))

    def close(self) -> None:
        if self._thread is None:
            return
        thread, self._thread = self._thread, None
        if self._client is not None:
            try:
                thread.run(self._client.source.close(), timeout=10)
            except Exception:  # stopping: the connection goes with the thread anyway
                log.debug("closing the planner's connection failed", exc_info=True)
            self._client = None
        thread.close()


async def _resolve_all(
    client: EventHubClient,
    partitions: dict[str, PartitionProperties],
    chosen: dict[str, Position],
    ending: bool,
) -> Offsets:
    return {p: await resolve(client, props, chosen[p], ending) for p, props in partitions.items()}


async def resolve(
    client: EventHubClient, props: PartitionProperties, position: Position, ending: bool
) -> int:
    """``position`` in one partition as the sequence number a range starts (``ending``:
    ends, exclusive) at. A position past the partition's end is its end."""
    from ..servicebus.eventhubs import offset_selector, time_selector

    if position.kind == "earliest":
        return props.earliest
    if position.kind == "latest":
        return props.end
    # the first event a start includes, or the first one an end leaves out
    inclusive = position.inclusive != ending
    if position.kind == "sequence":
        assert isinstance(position.value, int)
        number = position.value if inclusive else position.value + 1
        return min(number, props.end) if ending else number
    if props.empty:
        return props.end
    if position.kind == "enqueued":
        assert isinstance(position.value, datetime)
        moment, last = int(position.value.timestamp() * 1000), _ms(props.last_enqueued)
        if last is None or last < moment or (last == moment and not inclusive):
            return props.end  # nothing there yet: no need to wait for it
        filters = time_selector(position.value, inclusive=inclusive)
    else:
        offset, last = int(str(position.value)), int(props.last_offset)
        if last < offset or (last == offset and not inclusive):
            return props.end
        filters = offset_selector(str(position.value), inclusive)
    found = await client.first_at(props.id, filters, FIRST_EVENT_WAIT)
    return props.end if found is None else min(found, props.end)


def _ms(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp() * 1000)


# ---------------------------------------------------------------------- executors


def read_range(
    options: EventHubOptions, part: EventRange, batch: int = 500
) -> Iterator[list[Message]]:
    """The events of ``part`` in batches, read on this Python worker's loop and connection
    (``worker.source_for``), pulled one batch at a time so a big range is never all in
    memory."""
    from .worker import run_async

    batches = run_async(_open_range(options, part, batch))
    try:
        while (events := run_async(_next(batches))) is not None:
            yield events
    finally:
        run_async(_close(batches))


async def _next(batches: AsyncIterator[list[Message]]) -> list[Message] | None:
    return await anext(batches, None)


async def _close(batches: AsyncIterator[list[Message]]) -> None:
    await batches.aclose()  # type: ignore[attr-defined]  # an async generator


async def _open_range(
    options: EventHubOptions, part: EventRange, batch: int
) -> AsyncIterator[list[Message]]:
    from ..servicebus.eventhubs import EventHubClient
    from .worker import source_for

    client = EventHubClient(
        source_for(options.connection_string), options.event_hub, options.consumer_group
    )
    return client.read(
        part.partition,
        part.start,
        part.end,
        batch=batch,
        prefetch=options.prefetch,
        wait=options.receiver_timeout,
        fail_on_data_loss=options.fail_on_data_loss,
    )


def read_rows(options: EventHubOptions, part: EventRange) -> Iterator[tuple[Any, ...]]:
    for events in read_range(options, part):
        yield from (to_event_row(event) for event in events)


# ---------------------------------------------------------------------- streaming


class EventHubsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets ``{"<hub>": {partition: next sequence number}}`` (see the module)."""

    split = True
    """Ranges may be cut for ``minPartitions`` (the pipeline runner's may not: order)."""

    def __init__(self, options: EventHubOptions) -> None:
        self.options = options
        self.planner = HubPlanner(options)
        self.target: Offsets | None = None
        """``Trigger.AvailableNow``: the partitions' ends when the query started."""
        self.latest: Offsets = {}
        """What the partitions held at the last look (``reportLatestOffset``)."""

    def __getstate__(self) -> dict[str, Any]:
        """Executors get the reader for ``read``: options only (connections stay here)."""
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]  # unpickling: re-initialise

    @property
    def hub(self) -> str:
        return self.options.event_hub

    def initialOffset(self) -> dict[str, Any]:
        partitions = self.planner.partitions()
        start = self.planner.positions(partitions)
        log.info(
            "event hub %s: starting at %s (%s)", self.hub, start, self.options.starting.describe()
        )
        return to_offset(self.hub, start)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_events_per_trigger is not None:
            return ReadMaxRows(self.options.max_events_per_trigger)
        return ReadMaxRows(1000 * max(1, len(self.planner.partitions())))

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {p: props.end for p, props in self.planner.partitions().items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begun = from_offset(self.hub, start)
        partitions = self.planner.partitions()
        available = {p: props.end for p, props in partitions.items()}
        if self.target is not None:  # AvailableNow: nothing that came after the start
            available = {p: min(n, self.target.get(p, n)) for p, n in available.items()}
        self.latest = available
        new = {p: partitions[p].earliest for p in partitions if p not in begun}
        if new:  # a partition added to the hub: first into the offsets, read from the next
            log.info("event hub %s: new partition(s) %s, read from %s", self.hub, sorted(new), new)
        most = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if isinstance(limit, ReadAllAvailable):
            most = None
        end = advance({**new, **begun}, available, most)
        end.update(new)
        return to_offset(self.hub, end)

    def reportLatestOffset(self) -> dict[str, Any]:
        return to_offset(self.hub, self.latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        min_partitions = self.options.min_partitions if self.split else None
        return plan(from_offset(self.hub, start), from_offset(self.hub, end), min_partitions)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, EventRange)
        yield from read_rows(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        pass  # nothing to settle: Spark's checkpoint holds the offsets

    def stop(self) -> None:
        self.planner.close()


# ---------------------------------------------------------------------- batch


class EventHubsBatchReader(DataSourceReader):
    """From the starting to the ending positions, as they are when the job is planned."""

    def __init__(self, options: EventHubOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        planner = HubPlanner(self.options)
        try:
            found = planner.partitions()
            start = planner.positions(found)
            end = planner.positions(found, ending=True)
        finally:
            planner.close()
        end = {p: max(n, start[p]) for p, n in end.items()}
        return plan(start, end, self.options.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, EventRange)
        yield from read_rows(self.options, partition)
