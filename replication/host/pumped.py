"""A transactional pipeline's source in the local host: run with the task pump.

``transactional: true`` asks for each batch's copies (sent via the source queue) and its
source completes to be one Service Bus transaction. A generated function cannot do that:
its messages are received and settled by the host (``trigger.TriggerRunner``, over gRPC,
as the Functions host does) on a receiver of its own, which our transaction cannot include.
So ``register_pipelines``, run inside ``functions.pumped_by_host()``, hands such pipelines
to the host, and ``PumpRunner`` runs each of their sources with
``tasks.pump.pump(..., transaction_targets=...)``: our AMQP receiver on the source, the
pipeline's ``batch_size`` and ``concurrency`` over host.json's settings (as for a generated
function), stopped by the host's ``stop``, counted in the same metrics. No timer function
probes such a source's recovery point, so its first pump does (``pump(rpo_schedule=...)``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from .. import metrics
from ..clock import SYSTEM, Clock, wait_event
from ..ncrontab import Schedule, parse_schedule
from ..pipeline.model import Pipeline
from ..servicebus.client import SourceError
from ..tasks.pump import PumpStats, Source, pump
from ..tasks.recovery_point import DEFAULT_PEEK_LIMIT, peek_limit_setting, schedule_setting
from ..tasks.targets import SenderPool
from ..tasks.task import ReplicationTask
from .trigger import BROKEN_PAUSE, HostOptions

log = logging.getLogger("replication.host")


@dataclass(slots=True)
class PumpRunner:
    """One source of a transactional pipeline, pumped until ``stop`` (``run``)."""

    name: str
    """The function name the source would have had (logs)."""
    pipeline: str
    source: Source
    connection_string: str
    task: ReplicationTask
    transaction_targets: dict[str | None, str]
    options: HostOptions
    clock: Clock = SYSTEM
    """What retry pauses and lock renewals wait on (tests pass a ``ManualClock``)."""
    rpo_schedule: Schedule | None = None
    """When the source's recovery point is probed (no timer function does it for a pumped
    source); None: never."""
    rpo_peek_limit: int = DEFAULT_PEEK_LIMIT
    stats: PumpStats = field(default_factory=PumpStats)
    _seen: PumpStats = field(default_factory=PumpStats)

    @classmethod
    def for_pipeline(
        cls,
        pipeline: Pipeline,
        settings: Mapping[str, str],
        options: HostOptions,
        clock: Clock = SYSTEM,
    ) -> list[PumpRunner]:
        """A runner per source; the pipeline is built (namespaces checked) now. Each probes
        its source's recovery point on ``REPLICATION_RPO_SCHEDULE`` (as the timer functions
        of the other pipelines do)."""
        built = pipeline.build(settings)
        targets = built.transaction_targets()
        assert targets is not None, f"{pipeline.name} is not transactional"
        options = options.for_function(pipeline)  # its batch_size, concurrency, backend
        schedule = schedule_setting(settings)
        rpo = None if schedule is None else parse_schedule(schedule)
        limit = peek_limit_setting(settings)
        return [
            cls(
                name,
                pipeline.name,
                Source(endpoint.entity, sessions=endpoint.sessions),
                settings[endpoint.connection],
                task,
                targets,
                options,
                clock,
                rpo,
                limit,
            )
            for name, endpoint, task in zip(
                pipeline.function_names(), pipeline.sources, built.tasks, strict=True
            )
        ]

    @property
    def entity(self) -> str:
        return str(self.source)

    async def run(self, stop: asyncio.Event) -> None:
        """Session sources: one pump, ``max_concurrent_sessions`` sessions at a time; plain
        ones: ``max_concurrent_calls`` pumps, each its own receiver (as the trigger runs)."""
        pumps = 1 if self.source.sessions else self.options.max_concurrent_calls
        await asyncio.gather(*(self._pump(stop, probes=i == 0) for i in range(pumps)))

    async def _pump(self, stop: asyncio.Event, probes: bool = False) -> None:
        """A source that cannot work (wrong key, no such entity) is tried again after a
        pause, as the trigger runner does; a lost connection the pump reopens itself."""
        options = self.options
        while not stop.is_set():
            try:
                await pump(
                    self.task,
                    self.connection_string,
                    self.source,
                    SenderPool({}),
                    stop,
                    max_batch=options.max_message_batch_size,
                    max_wait=options.session_idle_timeout,
                    session_workers=options.max_concurrent_sessions,
                    stats=self.stats,
                    on_batch=self._count,
                    backend="amqp",
                    prefetch=options.prefetch_count,
                    max_lock_renewal=options.max_auto_lock_renewal_duration,
                    transaction_targets=self.transaction_targets,
                    clock=self.clock,
                    rpo_schedule=self.rpo_schedule if probes else None,
                    rpo_peek_limit=self.rpo_peek_limit,
                )
                return
            except SourceError as exc:
                log.warning(
                    "%s: the transactional pump failed: %s; retrying in %g s",
                    self.name,
                    exc,
                    BROKEN_PAUSE,
                )
                await wait_event(stop, BROKEN_PAUSE, self.clock)

    def _count(self, stats: PumpStats) -> None:
        """After each batch (its settlement and the counts are done together): what changed,
        into the metrics a generated function's batch feeds."""
        delta = {
            f.name: getattr(stats, f.name) - getattr(self._seen, f.name) for f in fields(PumpStats)
        }
        self._seen = PumpStats(**{f.name: getattr(stats, f.name) for f in fields(PumpStats)})
        name = self.pipeline
        metrics.RECEIVED.labels(name).inc(delta["received"])
        diverted = delta["to_error_target"]  # counted as dead-lettered, as for a function
        metrics.FORWARDED.labels(name).inc(delta["completed"] - delta["filtered"] - diverted)
        metrics.FILTERED.labels(name).inc(delta["filtered"])
        metrics.DEAD_LETTERED.labels(name).inc(delta["dead_lettered"] + diverted)
        if delta["abandoned"] or delta["released"]:
            metrics.FAILED.labels(name).inc()
