"""The ``servicebus`` PySpark data source (pyspark 4 Python Data Source API).

::

    from replication.spark import register
    register(spark)
    stream = (spark.readStream.format("servicebus")
              .option("connection", "PrimaryServiceBus").option("queue", "orders").load())

Streaming read, at-least-once, with any sink. By default executors receive (README "(b)",
``holder.py``): offsets are ``{"run": <id of this reader>, "batch": n}``; ``latestOffset``
advances the batch, ``partitions`` plans ``numPartitions`` assignments of a few hundred
bytes (each a share of ``maxMessagesPerTrigger``, or of ``maxConcurrentSessions`` sessions),
and each task receives its share on its Python worker's connection, yields the rows and
leaves the messages locked with a holder in that worker. The driver-side reader runs a
small commit service (``commits.py``) that tells the holders when Spark committed the
micro-batch (``commit``, or ``latestOffset`` asked for the batch after it: Spark calls
``commit`` only when a next batch has data); they complete on their own links then. A
batch that ends without a commit (a driver restart replays it with new assignments, which
receive other messages) gives its messages back. ``Trigger.AvailableNow`` reads until a
peek at the entity's head finds nothing enqueued before the query started (messages
enqueued later are given back untouched). Executors must reach the driver's host on the
service's port (from the OS; option ``commitServiceHost`` names the address). Where they
cannot, option ``receiveOn`` ``driver`` keeps the driver's intake (``intake.py``): the
driver receives and holds the messages and ships their rows inside the tasks (offsets
``{"run", "index"}``), completing them after the commit.

Batch read: ``mode`` ``peek`` (default; nothing changes at the source, up to
``maxMessages``) or ``receive`` (receive-and-delete: the messages are gone from the source
once read, so a failed job loses them; use streaming for at-least-once).

Writes (batch and streaming): each partition sends its rows with the SDK in size-bounded
batches, a session's rows in the order they come (``sink.py``).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from .options import Options
from .rows import SCHEMA, to_row
from .streams import Planner, RunStreamReader

if TYPE_CHECKING:
    from ..messages import Message
    from .commits import CommitService
    from .intake import Intake


class ServiceBusDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "servicebus"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(Options.parse(self.options, reading=True))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = Options.parse(self.options, reading=True)
        if options.receive_on == "driver":
            return DriverStreamReader(options)
        return StreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .sink import BatchWriter

        return BatchWriter(Options.parse(self.options, reading=False))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .sink import StreamWriter

        return StreamWriter(Options.parse(self.options, reading=False))


class RowsPartition(InputPartition):
    """Rows planned on the driver, carried to an executor (Service Bus has no offsets an
    executor could read from by itself)."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        super().__init__(len(rows))
        self.rows = rows


def plan(
    rows_by_key: Sequence[tuple[str | None, tuple[Any, ...]]], partitions: int
) -> list[RowsPartition]:
    """Spreads rows over at most ``partitions`` partitions: rows with a session id by a
    stable hash of it (a session stays in one partition, in order), the others in turn."""
    buckets: list[list[tuple[Any, ...]]] = [[] for _ in range(partitions)]
    turn = 0
    for session_id, row in rows_by_key:
        if session_id is not None:
            index = zlib.crc32(session_id.encode()) % partitions
        else:
            index, turn = turn, (turn + 1) % partitions
        buckets[index].append(row)
    return [RowsPartition(rows) for rows in buckets if rows]


class DriverStreamReader(RunStreamReader[Options]):
    """``receiveOn: driver``: the driver receives, holds and completes; the rows ride in
    the tasks (see the module)."""

    position = "index"

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self._intake: Intake | None = None
        self.index = 0
        self.pending: list[tuple[int, Message]] = []
        """(index, message) received and not yet completed, in index order."""
        self.drained = False

    @property
    def intake(self) -> Intake:
        if self._intake is None:
            from .intake import Intake

            self._intake = Intake(self.options)
        return self._intake

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        # Spark plans one batch at a time: asked for the next one, it has committed the one
        # ending at ``start``. It calls ``commit`` only when a next batch has data, so the
        # last batch of an AvailableNow run would otherwise never be completed.
        self.commit(start)
        if self.drained:
            return self._offset()
        wanted = self.options.max_messages_per_trigger
        if isinstance(limit, ReadMaxRows):
            wanted = limit.max_rows
        elif isinstance(limit, ReadAllAvailable) and self.cutoff is None:
            wanted = max(wanted, 10_000)
        taken = self.intake.take(wanted)
        if self.cutoff is not None:
            late = [m for m in taken if m.enqueued_time and m.enqueued_time > self.cutoff]
            if late:
                self.intake.release(late)
                gone = {id(m) for m in late}
                taken = [m for m in taken if id(m) not in gone]
            if not taken:
                self.drained = True  # AvailableNow: nothing more from before the start
        for message in taken:
            self.index += 1
            self.pending.append((self.index, message))
        return self._offset()

    def reportLatestOffset(self) -> dict[str, Any]:
        return self._offset()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        if end.get("run") != self.run:
            return []  # planned by an earlier run: redelivered by Service Bus instead
        low = int(start.get("index", 0)) if start.get("run") == self.run else 0
        high = int(end.get("index", 0))
        chosen = [(m.session_id, to_row(m)) for i, m in self.pending if low < i <= high]
        return plan(chosen, self.options.num_partitions)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, RowsPartition)
        yield from partition.rows

    def commit(self, end: dict[str, Any]) -> None:
        if end.get("run") != self.run:
            return
        high = int(end.get("index", 0))
        done = [m for i, m in self.pending if i <= high]
        if done:
            self.intake.complete(done)
        self.pending = [(i, m) for i, m in self.pending if i > high]

    def stop(self) -> None:
        if self._intake is not None:
            self._intake.close()  # what was not committed is released: it comes again at once

    def _offset(self) -> dict[str, Any]:
        return {"run": self.run, "index": self.index}


class StreamReader(RunStreamReader[Options]):
    """Executors receive and hold until the commit (see the module, and ``holder.py``)."""

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self.limit = options.max_messages_per_trigger
        self._service: CommitService | None = None
        self.planner = Planner()

    @property
    def service(self) -> CommitService:
        if self._service is None:
            from .commits import CommitService, service_host

            host = service_host(self.options.connection_string, self.options.commit_service_host)
            self._service = CommitService(self.run, host)
        return self._service

    # ------------------------------------------------------------------ driver side

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        # Spark plans one batch at a time: asked for the next one, it has committed the one
        # ending at ``start`` (it calls ``commit`` only when a next batch has data).
        done = _batch(start)
        self.service.committed(done)
        self.limit = self.options.max_messages_per_trigger
        if isinstance(limit, ReadMaxRows):
            self.limit = limit.max_rows
        if self.cutoff is not None and self._drained(self.cutoff):
            self.service.wait_told(done, timeout=10.0)  # before the query ends, and us
            return start
        return {"run": self.run, "batch": done + 1}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        from ..failover.runtime import endpoint_host
        from .assignment import plan

        if start == end:
            return []
        batch = _batch(end)
        self.service.planned(batch)
        options = self.options
        sessions = options.max_concurrent_sessions if options.sessions else 0
        cutoff = self.cutoff.timestamp() if self.cutoff is not None else None
        return plan(
            self.run,
            batch,
            endpoint_host(options.connection_string),
            options.path,
            partitions=options.num_partitions,
            total=self.limit,
            sessions=sessions,
            max_wait=options.receive_wait,
            cutoff=cutoff,
            commit_service=self.service.address,
        )

    def commit(self, end: dict[str, Any]) -> None:
        if self._service is not None:
            self._service.committed(_batch(end))

    def stop(self) -> None:
        if self._service is not None:
            self._service.close()
        self.planner.close()

    def _drained(self, cutoff: datetime) -> bool:
        """True when nothing enqueued before ``cutoff`` is left. Messages held for the
        batch just committed may still show (their completion is on its way): one more
        batch then."""
        options = self.options
        return self.planner.nothing_before(options.connection_string, options.path, cutoff)

    # ------------------------------------------------------------------ executors

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        from .assignment import Assignment
        from .holder import read_assignment

        assert isinstance(partition, Assignment)
        yield from read_assignment(self.options, partition)


def _batch(offset: dict[str, Any]) -> int:
    """The batch number of an offset (0 for one of ``receiveOn: driver``)."""
    return int(offset.get("batch", 0))


class BatchReader(DataSourceReader):
    def __init__(self, options: Options) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        from .sink import run_async
        from .snapshot import read_entity

        yield from (to_row(m) for m in run_async(read_entity(self.options)))
