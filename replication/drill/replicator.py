"""The pipeline under drill, run in the drill's process: primary -> secondary until stopped.

The task library's pump, as the local host runs a pipeline (its batch size, concurrency and
backend), over the pipeline built with the drill's namespaces as its connections. A source
that fails (the primary was killed) is tried again after a pause, as the host's runners do,
until the drill stops it; what the pump holds when the primary dies is sent, and its
completes are lost with the primary (the copies may come again when it returns).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ..clock import Clock, wait_event
from ..pipeline.model import Pipeline
from ..tasks.pump import PumpStats, Source, pump
from ..tasks.targets import SenderPool
from .options import DrillError

log = logging.getLogger("replication.drill")

RETRY_PAUSE = 1.0
"""Seconds before a source that failed is read again."""
SESSION_WORKERS = 8
"""Sessions read at once when the pipeline says no ``concurrency`` (the host's default)."""


def check_pipeline(pipeline: Pipeline) -> None:
    """A drill measures replication by message-id: a pipeline that copies one queue
    unchanged to the same queue in another namespace (as ``orders-to-secondary``)."""
    source, target = pipeline.sources[0], pipeline.target
    if len(pipeline.sources) != 1 or target is None or pipeline.routes or pipeline.steps:
        raise DrillError(
            f"pipeline {pipeline.name!r} is not a plain replication (one source, one target, "
            "no steps or routes): the drill compares message-ids, pick one like "
            "orders-to-secondary"
        )
    if not source.queue or source.queue != target.queue:
        raise DrillError(
            f"pipeline {pipeline.name!r} must copy a queue to the queue of the same name (the "
            f"producer fails over to it): it reads {source.entity}, writes {target.entity}"
        )
    if source.connection == target.connection:
        raise DrillError(
            f"pipeline {pipeline.name!r} replicates within one namespace "
            f"({source.connection}): a failover drill needs two"
        )


class Replicator:
    def __init__(self, pipeline: Pipeline, primary: str, secondary: str, clock: Clock) -> None:
        check_pipeline(pipeline)
        source = pipeline.sources[0]
        assert pipeline.target is not None
        settings = {source.connection: primary, pipeline.target.connection: secondary}
        built = pipeline.build(settings)
        self.pipeline = pipeline
        self.task = built.task
        self.pool = SenderPool(built.targets, backend=pipeline.backend)
        self.connection_string = primary
        self.source = Source(source.entity, sessions=source.sessions)
        self.clock = clock
        self.stats = PumpStats()
        self.stop = asyncio.Event()
        self._running: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._running = asyncio.get_running_loop().create_task(self._run(), name="drill pump")

    async def _run(self) -> None:
        while not self.stop.is_set():
            try:
                await pump(
                    self.task,
                    self.connection_string,
                    self.source,
                    self.pool,
                    self.stop,
                    max_batch=self.pipeline.batch_size,
                    session_workers=self.pipeline.concurrency or SESSION_WORKERS,
                    stats=self.stats,
                    backend=self.pipeline.backend,
                    clock=self.clock,
                )
            except Exception as exc:
                log.info("drill: the replication's source failed (%s); again soon", exc)
                await wait_event(self.stop, RETRY_PAUSE, self.clock)

    async def close(self, timeout: float = 30.0) -> None:
        """Stops the pump (its batch in flight is finished) and closes its senders."""
        if self.stop.is_set():
            return
        self.stop.set()
        if self._running is not None:
            try:
                await asyncio.wait_for(self._running, timeout)
            except TimeoutError:
                log.warning("drill: the replication did not stop in %g s", timeout)
            with contextlib.suppress(asyncio.CancelledError):
                await self._running
        await self.pool.close()
