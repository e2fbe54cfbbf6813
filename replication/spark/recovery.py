"""The recovery point of a streamed pipeline's sources, probed on the driver.

The executors receive and settle; the driver plans, and it also probes each Service Bus
source (``tasks.recovery_point``: the age and count of what is still at the source) on the
app setting ``REPLICATION_RPO_SCHEDULE`` (``off``: not at all), in an event loop thread of
its own, so ``/metrics`` (``--metrics-port``) shows ``replication_rpo_seconds`` and
``replication_rpo_messages`` as the local host does. The probes peek through
``Management.peek_heads``: each message's place and stamps are kept, its body dropped as the
reply is read, so no body stays on the driver. Event hub sources are not probed (see
``tasks.recovery_point``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..clock import SYSTEM, Clock
from ..ncrontab import Schedule, parse_schedule
from ..tasks.recovery_point import RecoveryPointProbe, schedule_setting
from .intake import LoopThread

if TYPE_CHECKING:
    from ..pipeline import Pipeline

log = logging.getLogger("replication.spark")


class RecoveryPoints:
    """The probes of one pipeline's sources, run on a schedule between ``start`` and
    ``stop``."""

    def __init__(self, probes: list[RecoveryPointProbe], schedule: Schedule) -> None:
        self.probes = probes
        self.schedule = schedule
        self._thread: LoopThread | None = None
        self._stop: asyncio.Event | None = None
        self._runs: list[concurrent.futures.Future[None]] = []

    @classmethod
    def for_pipeline(
        cls, pipeline: Pipeline, settings: Mapping[str, str], clock: Clock = SYSTEM
    ) -> RecoveryPoints | None:
        """None when the settings turn the probes off or no source can be probed."""
        schedule = schedule_setting(settings)
        if schedule is None:
            return None
        probes = [p for p in pipeline.recovery_point_probes(settings, clock) if p is not None]
        return cls(probes, parse_schedule(schedule)) if probes else None

    def start(self) -> None:
        thread = self._thread = LoopThread("recovery-points")
        stop = self._stop = asyncio.Event()
        self._runs = [thread.submit(p.run(stop, self.schedule)) for p in self.probes]
        log.info(
            "probing the recovery point of %s (schedule %s)",
            ", ".join(p.source for p in self.probes),
            self.schedule,
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Ends the probes (their connections closed) and their thread."""
        thread, stop = self._thread, self._stop
        if thread is None or stop is None:
            return
        self._thread = self._stop = None
        thread.loop.call_soon_threadsafe(stop.set)
        concurrent.futures.wait(self._runs, timeout)
        for run in self._runs:
            if run.done() and not run.cancelled() and run.exception() is not None:
                log.warning("a recovery point probe ended with %r", run.exception())
        thread.close()
