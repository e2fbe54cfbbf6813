"""Timer triggers in the local host, run as the Functions host runs them.

``timer_triggers`` finds a ``function_app.py``'s ``timerTrigger`` functions (the schedule's
``%SETTING%`` resolved from the app settings, as the host does); ``TimerRunner`` invokes
one at each occurrence of its schedule (NCRONTAB with seconds, or a TimeSpan:
``ncrontab.py``) on the host's clock, so a test on a ``ManualClock`` fires it by advancing
the clock. As the Functions host does: one invocation at a time (an occurrence that comes
while the function still runs is not started beside it), ``runOnStartup`` invokes once at
start, and occurrences missed meanwhile (a slow invocation, a clock that jumped) make one
late invocation whose ``TimerRequest.past_due`` is true, not one each. The function gets an
``azure.functions.TimerRequest`` with ``schedule_status`` (``Last``, ``Next``,
``LastUpdated``) as the host's binding data has it. An invocation that raises is logged and
the schedule goes on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import azure.functions as func
from azure.functions.timer import TimerRequest

from ..clock import SYSTEM, Clock, wait_event
from ..ncrontab import Schedule, ScheduleError, parse_schedule
from .discovery import DiscoveryError, triggered_by
from .invocation import Invocation, Invoker
from .settings import resolve

log = logging.getLogger("replication.host")


@dataclass(slots=True, frozen=True)
class TimerTrigger:
    """One function with a timer trigger, its schedule resolved against the settings."""

    name: str
    function: Callable[..., Any]
    arg_name: str
    expression: str
    schedule: Schedule
    run_on_startup: bool = False


def timer_triggers(app: func.FunctionApp, settings: Mapping[str, str]) -> list[TimerTrigger]:
    found = []
    for function, binding in triggered_by(app, "timerTrigger"):
        name = str(function.get_function_name())
        expression = resolve(str(binding["schedule"]), settings)
        try:
            schedule = parse_schedule(expression)
        except ScheduleError as exc:
            raise DiscoveryError(f"function {name}: {exc}") from None
        found.append(
            TimerTrigger(
                name=name,
                function=function.get_user_function(),
                arg_name=str(binding["name"]),
                expression=expression,
                schedule=schedule,
                run_on_startup=bool(binding.get("runOnStartup")),
            )
        )
    return found


@dataclass(slots=True)
class TimerStats:
    invocations: int = 0
    failures: int = 0
    past_due: int = 0


@dataclass(slots=True)
class TimerRunner:
    """Invokes one timer function on its schedule until ``stop`` (``run``)."""

    trigger: TimerTrigger
    worker: Invoker
    clock: Clock = SYSTEM
    stats: TimerStats = field(default_factory=TimerStats)
    last: float | None = None
    """When it was last invoked (clock seconds)."""

    async def run(self, stop: asyncio.Event) -> None:
        schedule, clock = self.trigger.schedule, self.clock
        if self.trigger.run_on_startup:
            await self._invoke(past_due=False, next_due=schedule.next_after(clock.time()))
        due = schedule.next_after(clock.time())
        while not stop.is_set():
            if await wait_event(stop, due - clock.time(), clock):
                return
            now = clock.time()
            if now < due:  # woken a hair early (float seconds): wait out the rest
                continue
            late = schedule.next_after(due) <= now  # an occurrence passed unrun
            due = schedule.next_after(now)
            await self._invoke(past_due=late, next_due=due)

    async def _invoke(self, *, past_due: bool, next_due: float) -> None:
        now = self.clock.time()
        status = {"Last": _iso(self.last), "Next": _iso(next_due), "LastUpdated": _iso(now)}
        request = TimerRequest(
            past_due=past_due, schedule_status=status, schedule={"AdjustForDST": True}
        )
        self.last = now
        self.stats.invocations += 1
        self.stats.past_due += past_due
        try:
            await self.worker.invoke(
                self.trigger, Invocation(self.trigger.name, {self.trigger.arg_name: request})
            )
        except asyncio.CancelledError:
            raise
        except Exception:
            self.stats.failures += 1
            log.exception("%s: the timer function failed (the schedule goes on)", self.trigger.name)


def _iso(moment: float | None) -> str | None:
    if moment is None:
        return None
    return datetime.fromtimestamp(moment, UTC).isoformat().replace("+00:00", "Z")
