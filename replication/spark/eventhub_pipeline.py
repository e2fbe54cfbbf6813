"""The pipeline runner's stream for an event hub source: ranges planned, executors do the work.

``spark.readStream.format("eventhubs-pipeline")`` with the pipeline's options
(``runner.SparkPipeline.source_options``) is a stream of counts, one row per task
(``executor.COUNTS_SCHEMA``), as ``servicebus-pipeline`` is for queues and subscriptions.
The driver plans as the ``eventhubs`` data source does (``EventHubsStreamReader``: offsets
partition -> next sequence number, each partition's end read through ``$management``, up to
``maxEventsPerTrigger`` a micro-batch), but never cuts a partition's range in two: one task
reads one partition's range in order and runs it through the pipeline, so the events of a
partition key reach the target in the order they were enqueued. A partition without a
checkpoint starts at its first retained event, as the Functions host's trigger does.

The task (``run_range``) reads its range in batches of the pipeline's ``batch_size``
(``EventHubClient.read``), and each batch goes through ``process_batch`` with the worker's
``SenderPool`` (Service Bus and Event Hubs targets alike, ``tasks.targets``), as the local
host's Event Hubs trigger does (``functions.PipelineRuntime.handle_events``): a step's
dead-letter decision goes to the ``error_target`` (an event hub has no dead-letter queue;
without one the event is left behind, logged); a copy a target refused fails the task, so
Spark runs it again, and if it keeps failing the query stops with the offsets of the last
committed batch in its checkpoint. Nothing is settled: at-least-once comes from Spark's
checkpoint (README "Event Hubs").
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from ..tasks.error_target import ERROR_TARGET, divert_to_error_target
from ..tasks.task import Decision, process_batch
from .eventhub_options import EARLIEST, EventHubOptions
from .eventhub_ranges import EventRange
from .eventhub_source import EventHubsStreamReader
from .executor import COUNTS_SCHEMA, Counts, PipelineJob, _CountingSenders
from .options import OptionError, _int

log = logging.getLogger("replication.spark")


class EventsNotSent(RuntimeError):
    """A target refused copies of a range's events: the task fails and Spark runs it again
    (the range is read again from its start; what was sent before goes a second time)."""


def hub_options(job: PipelineJob, max_events_per_trigger: int | None) -> EventHubOptions:
    """The source's hub, consumer group and connection as the ``eventhubs`` source takes
    them; from the first retained event on, as the Functions host starts a partition."""
    endpoint = job.built().sources[job.source]
    return EventHubOptions(
        connection_string=job.configured_connection(),
        event_hub=str(endpoint.eventhub),
        consumer_group=endpoint.group,
        starting=EARLIEST,
        max_events_per_trigger=max_events_per_trigger,
    )


class EventHubPipelineDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "eventhubs-pipeline"

    def schema(self) -> str:
        return COUNTS_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        job, most = _parse(self.options)
        return EventHubPipelineReader(hub_options(job, most), job)


def _parse(raw: Mapping[str, str]) -> tuple[PipelineJob, int | None]:
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
    most = options.get("maxeventspertrigger")
    return job, (_int(options, "maxEventsPerTrigger", 1) if most is not None else None)


class EventHubPipelineReader(EventHubsStreamReader):
    split = False  # a partition's events go out in order, from one task

    def __init__(self, options: EventHubOptions, job: PipelineJob) -> None:
        super().__init__(options)
        self.job = job

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "job": self.job}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"], state["job"])  # type: ignore[misc]  # unpickling: re-initialise

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        from .task_lag import TaskLag
        from .worker import run_async

        assert isinstance(partition, EventRange)
        with TaskLag(self.job.pipeline) as lag:
            counts = run_async(run_range(self.job, self.options, partition))
            measured = lag.encoded()
        slot = int(partition.partition) if partition.partition.isdigit() else 0
        yield counts.row(slot, measured)


async def run_range(job: PipelineJob, options: EventHubOptions, part: EventRange) -> Counts:
    """Reads ``part`` and runs it through the pipeline on this worker (see the module)."""
    from ..servicebus.eventhubs import EventHubClient
    from .worker import pool_for, source_for

    built = job.built()
    task = built.tasks[job.source]
    pool, breakers = pool_for(job.ref, built.targets, built.pipeline.backend)
    senders = _CountingSenders(pool)
    client = EventHubClient(
        source_for(options.connection_string), options.event_hub, options.consumer_group
    )
    counts = Counts()
    batches = client.read(
        part.partition,
        part.start,
        part.end,
        batch=max(1, int(built.pipeline.batch_size)),
        prefetch=options.prefetch,
        wait=options.receiver_timeout,
        fail_on_data_loss=options.fail_on_data_loss,
    )
    async for events in batches:
        counts.received += len(events)
        settlements = await process_batch(task, events, senders, breakers)
        dead = [s for s in settlements if s.decision is Decision.DEAD_LETTER]
        if dead and ERROR_TARGET in built.targets:
            await divert_to_error_target(dead, task, senders, breakers)
        elif dead:
            log.warning(
                "%s: %d event(s) a step dead-lettered are left behind (an event hub "
                "has no dead-letter queue; set error_target to keep them), first: %s %s",
                built.pipeline.name,
                len(dead),
                dead[0].reason,
                dead[0].description,
            )
        failed = [s for s in settlements if s.decision in (Decision.ABANDON, Decision.RELEASE)]
        if failed:
            raise EventsNotSent(
                f"{built.pipeline.name}: partition {part.partition}, events {part.start} to "
                f"{part.end - 1}: {len(failed)} of {len(settlements)} events of a batch not "
                f"sent, first (sequence number {failed[0].message.sequence_number}): "
                f"{failed[0].description}"
            )
        for s in settlements:
            if s.decision is Decision.COMPLETE:
                counts.completed += 1
                counts.filtered += 0 if s.outputs else 1
            elif s.decision is Decision.DEAD_LETTER:
                counts.dead_lettered += 1
    for name, accepted in senders.accepted.items():
        if name is not None and name.startswith(ERROR_TARGET):
            counts.to_error_target += accepted
        else:
            counts.forwarded += accepted
    log.debug(
        "event hub %s partition %s [%d, %d): %s",
        options.event_hub,
        part.partition,
        part.start,
        part.end,
        counts,
    )
    return counts
