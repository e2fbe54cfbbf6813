"""The pipeline runner's stream: the driver plans assignments, executors do the work.

``spark.readStream.format("servicebus-pipeline")`` with the pipeline's file text, name,
settings and source index (``runner.SparkPipeline.source_options``) is a stream of counts,
one row per task (``executor.COUNTS_SCHEMA``): each task receives, runs the pipeline, sends
and settles by itself (``executor.run_assignment``), so the query's sink is Spark's
``noop`` and the counts feed the metrics through ``Dataset.observe``.

Driver side (one long-lived Python process next to the driver): offsets are ``{run,
batch}``; ``latestOffset`` resolves the source's namespace (its ``failover`` block, cached
answers and ``recheck_interval`` as everywhere: so a flip moves the next micro-batch) and
advances the batch by one; ``partitions`` plans ``numPartitions`` assignments of
``maxMessagesPerTrigger / numPartitions`` messages each, naming that namespace; a task takes
no new batch after ``maxSecondsPerTrigger`` (default 30), so a micro-batch's length (and
how often progress and metrics move) stays about that whatever the source's speed. Nothing is
received here and nothing waits for ``commit``: the offsets only say how many batches ran,
and a batch replayed after a driver restart receives other messages (nothing unsent was
settled). ``Trigger.AvailableNow``: before each batch the driver peeks the source's head
(one ``$management`` peek, nothing locked); when there is nothing, or the oldest message
came after the query started, the stream ends (``latestOffset`` returns its start).
Executors release messages enqueued after that cutoff untouched.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit
from pyspark.sql.types import StructType

from .assignment import Assignment, plan
from .executor import COUNTS_SCHEMA, PipelineJob
from .options import OptionError, _float, _int
from .streams import Planner, RunStreamReader


@dataclass(frozen=True)
class PipelineSourceOptions:
    job: PipelineJob
    num_partitions: int = 2
    max_messages_per_trigger: int = 5000
    max_concurrent_sessions: int = 8
    receive_wait: float = 1.0
    max_seconds_per_trigger: float = 30.0

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> PipelineSourceOptions:
        options = {str(k).lower(): v for k, v in raw.items()}
        text, name = options.get("pipeline"), options.get("pipelinename")
        if not text or not name:
            raise OptionError("give options 'pipeline' (the file's text) and 'pipelineName'")
        try:
            source = int(options.get("source", 0))
        except ValueError:
            raise OptionError("option 'source' is the index of the pipeline's source") from None
        job = PipelineJob(
            (text, name, options.get("settings", "{}"), options.get("pipelinedir")), source
        )
        return cls(
            job,
            num_partitions=_int(options, "numPartitions", 2),
            max_messages_per_trigger=_int(options, "maxMessagesPerTrigger", 5000),
            max_concurrent_sessions=_int(options, "maxConcurrentSessions", 8),
            receive_wait=_float(options, "receiveWait", 1.0),
            max_seconds_per_trigger=_float(options, "maxSecondsPerTrigger", 30.0),
        )


class PipelineDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "servicebus-pipeline"

    def schema(self) -> str:
        return COUNTS_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return PipelineStreamReader(PipelineSourceOptions.parse(self.options))


class PipelineStreamReader(RunStreamReader[PipelineSourceOptions]):
    def __init__(self, options: PipelineSourceOptions) -> None:
        super().__init__(options)
        self.namespace: str | None = None
        """The source's namespace for the batch being planned (failover: resolved in
        ``latestOffset``)."""
        self.planner = Planner()

    # ------------------------------------------------------------------ driver side

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        self.namespace = self._resolve()
        if self.cutoff is not None and self._drained(self.namespace, self.cutoff):
            return start  # AvailableNow: nothing left from before the query started
        return {"run": self.run, "batch": int(start.get("batch", 0)) + 1}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        namespace = self.namespace if self.namespace is not None else self._resolve()
        job = self.options.job
        sessions = self.options.max_concurrent_sessions if job.sessions() else 0
        cutoff = self.cutoff.timestamp() if self.cutoff is not None else None
        return plan(
            str(end.get("run", self.run)),
            int(end.get("batch", 0)),
            namespace,
            job.path(),
            partitions=self.options.num_partitions,
            total=self.options.max_messages_per_trigger,
            sessions=sessions,
            max_wait=self.options.receive_wait,
            cutoff=cutoff,
            max_seconds=self.options.max_seconds_per_trigger,
        )

    def commit(self, end: dict[str, Any]) -> None:
        pass  # every task settled its own messages before it ended

    def stop(self) -> None:
        self.planner.close()

    def _resolve(self) -> str:
        """Where the source is now: its failover's current host, or the configured one."""
        return self.planner.run(_resolve(self.options.job))

    def _drained(self, namespace: str, cutoff: datetime) -> bool:
        job = self.options.job
        return self.planner.nothing_before(job.connection(namespace), job.path(), cutoff)

    # ------------------------------------------------------------------ executors

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        from .executor import run_assignment
        from .task_lag import TaskLag
        from .worker import run_async

        assert isinstance(partition, Assignment)
        job = self.options.job
        with TaskLag(job.pipeline) as lag:
            counts = run_async(run_assignment(job, partition))
            measured = lag.encoded()
        yield counts.row(partition.slot, measured)


async def _resolve(job: PipelineJob) -> str:
    failover = job.failover()
    if failover is None:
        from ..failover.runtime import endpoint_host

        return endpoint_host(job.configured_connection())
    await failover.connection_string()
    return str(failover.host)
