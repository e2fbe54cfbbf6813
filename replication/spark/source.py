"""The ``servicebus`` PySpark data source (pyspark 4 Python Data Source API).

::

    from replication.spark import register
    register(spark)
    stream = (spark.readStream.format("servicebus")
              .option("connection", "PrimaryServiceBus").option("queue", "orders").load())

Streaming read, at-least-once. The receivers are the driver's (``intake.Intake``); offsets are
``{"run": <id of this reader>, "index": <messages received so far>}``. ``latestOffset``
receives (up to ``maxMessagesPerTrigger``) and holds the messages locked; ``partitions``
hands a range of them to executors inside the partitions (a session's messages in one
partition, in order); they are completed once Spark has committed the micro-batch (after
the sink wrote it): in ``commit``, or when ``latestOffset`` is asked for the batch after it
(Spark calls ``commit`` only when a next batch has data). An offset range of another run
(a restart replaying the batch it had planned before a crash) is empty: those messages were
never completed, so Service Bus delivers them again when their locks lapse, and they get
new offsets in this run. Locks of
held messages are renewed every ``lockRenewInterval`` seconds. ``Trigger.AvailableNow``
reads until the entity has nothing more (messages enqueued after the query started are
given back untouched).

Batch read: ``mode`` ``peek`` (default; nothing changes at the source, up to
``maxMessages``) or ``receive`` (receive-and-delete: the messages are gone from the source
once read, so a failed job loses them; use streaming for at-least-once).

Writes (batch and streaming): each partition sends its rows with the SDK in size-bounded
batches, a session's rows in the order they come (``sink.py``).
"""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from .options import Options
from .rows import SCHEMA, to_row


class ServiceBusDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "servicebus"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(Options.parse(self.options, reading=True))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(Options.parse(self.options, reading=True))

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


def plan(rows_by_key: Sequence[tuple[str | None, tuple[Any, ...]]],
         partitions: int) -> list[RowsPartition]:  # fmt: skip
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


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Options) -> None:
        self.options = options
        self.run = uuid.uuid4().hex
        self._intake: Any = None
        self.index = 0
        self.pending: list[tuple[int, Any]] = []
        """(index, message) received and not yet completed, in index order."""
        self.cutoff: datetime | None = None
        self.drained = False

    def __getstate__(self) -> dict[str, Any]:
        """Executors get the reader for ``read``: options only (receivers stay here)."""
        return {"options": self.options, "run": self.run}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]
        self.run = state["run"]

    @property
    def intake(self) -> Any:
        if self._intake is None:
            from .intake import Intake

            self._intake = Intake(self.options)
        return self._intake

    def initialOffset(self) -> dict[str, Any]:
        return {"run": self.run, "index": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_messages_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        self.cutoff = datetime.now(UTC)

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


class BatchReader(DataSourceReader):
    def __init__(self, options: Options) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        from .sink import run_async
        from .snapshot import read_entity

        yield from (to_row(m) for m in run_async(read_entity(self.options)))
