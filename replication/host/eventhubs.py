"""Event Hubs triggers in the local host, run as the Functions host runs them.

``event_hub_triggers`` finds a ``function_app.py``'s ``eventHubTrigger`` functions;
``EventHubTriggerRunner`` runs one with ``azure-eventhub``'s own ``EventHubConsumerClient``
over the host's checkpoint store (``checkpoints.SqliteCheckpointStore``), which balances
the partitions between the host processes sharing it and owns each partition it reads.

As the Event Hubs extension does: each owned partition's events come in batches of at most
``maxEventBatchSize`` (host.json ``extensions.eventHubs``, or the pipeline's ``batch_size``),
one batch of a partition at a time, in order; the function gets the batch
(``cardinality=many``: a list of ``azure.functions.EventHubEvent`` with the trigger
metadata the host builds) and the partition is checkpointed after the function returned
(after every ``batchCheckpointFrequency``-th batch; 1 by default).
A function that raises is run again with the same batch while it has a retry policy
(``@app.retry``; the replication functions have an unlimited exponential one), so the
checkpoint only ever moves past events that went through; without a policy the batch is
checkpointed anyway and logged as lost, which is what Azure does. A partition without a
checkpoint starts at its first retained event (``initialOffsetOptions`` ``fromStart``).

At-least-once: a host that stops lets its batches in flight finish and checkpoint; one that
is killed starts again after each partition's last checkpoint, so the events of a batch
that ran but was not checkpointed yet are replicated a second time (and only those).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import azure.functions as func
import isodate

from ..adapters.eventhubs import to_event_hub_events
from ..generated import pipeline_of
from ..servicebus.connection_string import ConnectionString
from .discovery import _annotations, triggered_by
from .invocation import Invocation, Invoker
from .process import WorkerUnavailable
from .settings import resolve

log = logging.getLogger("replication.host")

DEFAULT_BATCH = 100
"""``maxEventBatchSize``'s default (Event Hubs extension 5.x)."""
DEFAULT_PREFETCH = 300
LOAD_BALANCING_INTERVAL = 2.0
OWNERSHIP_EXPIRATION = 10.0
"""Seconds after which a partition owned by a host that was killed (it could not give it
up) may be taken by another, or by itself restarted; Azure's blob leases take 30 to 60 s."""


@dataclass(slots=True, frozen=True)
class EventHubTrigger:
    """One function with an Event Hubs trigger, its binding resolved against the settings."""

    name: str
    function: Callable[..., Any]
    arg_name: str
    connection: str
    """The app-setting name (the binding's ``connection``)."""
    eventhub: str
    consumer_group: str
    many: bool
    retry: Mapping[str, Any] | None = None
    """The function's retry policy settings (``@app.retry``), None without one."""
    annotation: Any = None

    @property
    def entity(self) -> str:
        return self.eventhub


_RETRY_FIELDS = (
    "strategy",
    "max_retry_count",
    "delay_interval",
    "minimum_interval",
    "maximum_interval",
)


def event_hub_triggers(app: func.FunctionApp, settings: Mapping[str, str]) -> list[EventHubTrigger]:
    found = []
    for function, binding in triggered_by(app, "eventHubTrigger"):
        cardinality = binding.get("cardinality")
        policy = function.get_setting("retry_policy")
        retry = None
        if policy is not None:
            retry = {k: getattr(policy, k) for k in _RETRY_FIELDS if getattr(policy, k, None)}
        user_function = function.get_user_function()
        arg_name = str(binding["name"])
        found.append(
            EventHubTrigger(
                name=str(function.get_function_name()),
                function=user_function,
                arg_name=arg_name,
                connection=str(binding["connection"]),
                eventhub=resolve(str(binding["eventHubName"]), settings),
                consumer_group=resolve(str(binding.get("consumerGroup") or "$Default"), settings),
                many=str(getattr(cardinality, "value", cardinality)).lower() == "many",
                retry=retry,
                annotation=_annotations(user_function).get(arg_name),
            )
        )
    return found


@dataclass(slots=True)
class EventHubOptions:
    """host.json ``extensions.eventHubs`` (what the local host honours)."""

    max_event_batch_size: int = DEFAULT_BATCH
    prefetch_count: int = DEFAULT_PREFETCH
    batch_checkpoint_frequency: int = 1
    """Checkpoint a partition after every n-th batch (more duplicates after a kill)."""

    @classmethod
    def from_host_json(cls, data: Mapping[str, Any]) -> EventHubOptions:
        hubs = dict(data.get("extensions", {}).get("eventHubs", {}))
        return cls(
            max_event_batch_size=int(hubs.get("maxEventBatchSize", DEFAULT_BATCH)),
            prefetch_count=int(hubs.get("prefetchCount", DEFAULT_PREFETCH)),
            batch_checkpoint_frequency=max(1, int(hubs.get("batchCheckpointFrequency", 1))),
        )

    def for_function(self, function: object) -> EventHubOptions:
        pipeline = pipeline_of(function)
        batch = pipeline.batch_size if pipeline is not None else None
        if not batch:
            return self
        return replace(
            self,
            max_event_batch_size=int(batch),
            prefetch_count=max(self.prefetch_count, int(batch)),
        )


@dataclass(slots=True)
class Backoff:
    """A retry policy's waits: ``exponential_backoff`` (minimum doubled up to maximum, with
    jitter) or ``fixed_delay``; ``max_retry_count`` -1: no limit."""

    strategy: str = "exponential_backoff"
    max_retry_count: int = -1
    delay: float = 5.0
    minimum: float = 5.0
    maximum: float = 300.0

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> Backoff:
        def seconds(key: str, default: float) -> float:
            value = settings.get(key)
            if value is None:
                return default
            duration = (
                isodate.parse_duration(str(value))
                if str(value).startswith("P")
                else (_clock_time(str(value)))
            )
            return float(duration.total_seconds())

        return cls(
            strategy=str(settings.get("strategy", "exponential_backoff")).lower(),
            max_retry_count=int(settings.get("max_retry_count", -1)),
            delay=seconds("delay_interval", 5.0),
            minimum=seconds("minimum_interval", 5.0),
            maximum=seconds("maximum_interval", 300.0),
        )

    def wait(self, attempt: int) -> float:
        """Seconds before retry ``attempt`` (1 = the first retry)."""
        if self.strategy == "fixed_delay":
            return self.delay
        ceiling = min(self.maximum, self.minimum * 2 ** (attempt - 1))
        return random.uniform(self.minimum, max(self.minimum, ceiling))

    def gives_up_after(self, attempt: int) -> bool:
        return self.max_retry_count >= 0 and attempt > self.max_retry_count


def _clock_time(text: str) -> timedelta:
    """``hh:mm:ss`` (the retry decorator's interval format)."""
    hours, minutes, seconds = (float(part) for part in text.split(":"))
    return timedelta(hours=hours, minutes=minutes, seconds=seconds)


@dataclass(slots=True)
class EventHubStats:
    batches: int = 0
    events: int = 0
    failed_calls: int = 0
    checkpoints: int = 0


@dataclass
class EventHubTriggerRunner:
    """Runs one Event Hubs trigger until ``stop`` is set (see the module)."""

    trigger: EventHubTrigger
    connection_string: str
    store: Any
    """The ``azure.eventhub.aio.CheckpointStore``."""
    worker: Invoker
    options: EventHubOptions = field(default_factory=EventHubOptions)
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    failover: Any = None
    """Event hub sources do not fail over (the dashboard reads this)."""
    stats: EventHubStats = field(default_factory=EventHubStats)
    _stopping: bool = False
    _in_flight: int = 0
    _stopped: asyncio.Task[Any] | None = None
    """Done once ``run``'s ``stop`` is set (a retry's wait ends with it)."""
    _batches: dict[str, int] = field(default_factory=dict)
    """Batches run per partition (``batchCheckpointFrequency``)."""
    read_up_to: dict[str, int] = field(default_factory=dict)
    """Per partition, the sequence number of the last event run through (or checkpointed
    before this run): what ``backlog`` counts from."""

    def backlog(self, partitions: list[Any]) -> int:
        """Events not run through yet, given the hub's partition logs (the embedded
        broker's ``PartitionLog``s, each with its ``state``), for the host's metrics."""
        total = 0
        for index, partition in enumerate(partitions):
            state = partition.state
            done = max(self.read_up_to.get(str(index), -1), state.begin_sequence_number - 1)
            total += max(0, state.last_sequence_number - done)
        return total

    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, stop: asyncio.Event) -> None:
        from azure.eventhub.aio import EventHubConsumerClient

        trigger = self.trigger
        client = EventHubConsumerClient.from_connection_string(
            self.connection_string,
            consumer_group=trigger.consumer_group,
            eventhub_name=trigger.eventhub,
            checkpoint_store=self.store,
            load_balancing_interval=LOAD_BALANCING_INTERVAL,
            partition_ownership_expiration_interval=OWNERSHIP_EXPIRATION,
        )
        self._idle.set()
        namespace = ConnectionString.parse(self.connection_string).netloc
        for checkpoint in await self.store.list_checkpoints(
            namespace, trigger.eventhub, trigger.consumer_group
        ):
            sequence = checkpoint.get("sequence_number")
            if sequence is not None:
                self.read_up_to[str(checkpoint["partition_id"])] = int(sequence)
        receiving = asyncio.create_task(
            client.receive_batch(
                self._on_batch,
                max_batch_size=self.options.max_event_batch_size,
                prefetch=self.options.prefetch_count,
                starting_position="-1",
                on_error=self._on_error,
            )
        )
        log.info(
            "%s: reading event hub %s (consumer group %s)",
            trigger.name,
            trigger.eventhub,
            trigger.consumer_group,
        )
        stopping = asyncio.create_task(stop.wait())
        self._stopped = stopping
        try:
            await asyncio.wait([receiving, stopping], return_when="FIRST_COMPLETED")
        finally:
            self._stopping = True
            try:
                await self._idle.wait()  # batches in flight finish and checkpoint
            finally:
                await client.close()  # gives up the partitions it owns
                stopping.cancel()
                receiving.cancel()
                results = await asyncio.gather(receiving, stopping, return_exceptions=True)
        failure = results[0]
        if isinstance(failure, Exception):  # the reader itself failed: the host says so
            raise failure

    async def _on_error(self, context: Any, error: Exception) -> None:
        partition = getattr(context, "partition_id", None)
        log.warning(
            "%s: event hub %s partition %s: %r",
            self.trigger.name,
            self.trigger.eventhub,
            partition,
            error,
        )

    async def _on_batch(self, context: Any, events: list[Any]) -> None:
        if not events or self._stopping:
            return  # not checkpointed: read again by whoever owns the partition next
        self._in_flight += 1
        self._idle.clear()
        try:
            if await self._invoke(context.partition_id, events):
                if events[-1].sequence_number is not None:
                    self.read_up_to[context.partition_id] = events[-1].sequence_number
                done = self._batches[context.partition_id] = (
                    self._batches.get(context.partition_id, 0) + 1
                )
                if done % self.options.batch_checkpoint_frequency == 0:
                    await context.update_checkpoint(events[-1])
                    self.stats.checkpoints += 1
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    async def _invoke(self, partition_id: str, events: list[Any]) -> bool:
        """Runs the function on the batch (``cardinality=one``: on each event in turn) until
        it returns (retry policy); True to checkpoint."""
        trigger = self.trigger
        built = to_event_hub_events(
            events, partition_id, trigger.consumer_group, trigger.eventhub, many=trigger.many
        )
        calls: list[Any] = [built] if trigger.many else list(built)
        for argument in calls:
            count = len(argument) if trigger.many else 1
            if not await self._call(partition_id, argument, count):
                return False
        return True

    async def _call(self, partition_id: str, argument: Any, count: int) -> bool:
        trigger = self.trigger
        backoff = Backoff.of(trigger.retry) if trigger.retry is not None else None
        attempt = 0
        while True:
            self.stats.batches += 1
            try:
                await self.worker.invoke(
                    trigger, Invocation(trigger.name, {trigger.arg_name: argument})
                )
            except WorkerUnavailable as exc:  # the function never ran: the same batch again
                log.error(
                    "%s: partition %s: %s; its %d event(s) wait, not checkpointed; the next "
                    "try to start a worker in %.0f s",
                    trigger.name,
                    partition_id,
                    exc,
                    count,
                    exc.retry_in,
                )
                if self._stopping or (self._stopped is not None and self._stopped.done()):
                    return False  # not checkpointed: read again after a restart
                continue  # the worker's next start waits out its pause
            except Exception as exc:
                self.stats.failed_calls += 1
                attempt += 1
                if backoff is None or backoff.gives_up_after(attempt):
                    log.error(
                        "%s: partition %s: the function failed on %d event(s) and has "
                        "no retries left: checkpointed past them (%r)",
                        trigger.name,
                        partition_id,
                        count,
                        exc,
                    )
                    return True
                pause = backoff.wait(attempt)
                log.warning(
                    "%s: partition %s: the function failed (%r); the batch runs again "
                    "in %.1f s, not checkpointed",
                    trigger.name,
                    partition_id,
                    exc,
                    pause,
                )
                waiting: asyncio.Future[Any] = asyncio.ensure_future(self.sleep(pause))
                waits: list[asyncio.Future[Any]] = [waiting]
                if self._stopped is not None:
                    waits.append(self._stopped)
                await asyncio.wait(waits, return_when="FIRST_COMPLETED")  # a stop ends the wait
                waiting.cancel()
                if self._stopping or (self._stopped is not None and self._stopped.done()):
                    return False  # not checkpointed: read again after a restart
                continue
            self.stats.events += count
            return True
