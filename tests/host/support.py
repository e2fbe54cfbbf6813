"""Runs function_app-style functions in this process the way the local host does: the real
extension package decodes the binding data and settles through our Settlement service."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import azure.functions as func

from replication.functions import register_pipelines
from replication.host.discovery import service_bus_triggers
from replication.host.trigger import HostOptions, TriggerRunner
from replication.host.worker import Worker
from replication.pipeline import parse_pipelines

FAST = HostOptions(
    prefetch_count=20, max_message_batch_size=10, max_concurrent_calls=1,
    max_concurrent_sessions=2, session_idle_timeout=0.5,
)  # fmt: skip


def pipeline_app(text: str, settings: dict[str, str]) -> func.FunctionApp:
    app = func.FunctionApp()
    register_pipelines(app, parse_pipelines(text), settings)
    return app


async def run_app(
    app: func.FunctionApp,
    settings: dict[str, str],
    until: Callable[[list[TriggerRunner]], bool],
    *,
    options: HostOptions = FAST,
    timeout: float = 60.0,
) -> list[TriggerRunner]:
    """Runs every Service Bus trigger of ``app`` until ``until(runners)`` is true."""
    worker = Worker()
    runners = [
        TriggerRunner(t, settings[t.connection], options.for_trigger(t), worker=worker)
        for t in service_bus_triggers(app, settings)
    ]
    return await run_until(runners, worker, until, timeout)


class Runner(Protocol):
    """What ``run_until`` needs of a trigger runner (Service Bus or Event Hubs)."""

    stats: Any

    async def run(self, stop: asyncio.Event) -> None: ...


R = TypeVar("R", bound=Runner)


async def run_until(
    runners: list[R], worker: Worker, until: Callable[[list[R]], bool], timeout: float
) -> list[R]:
    """Runs ``runners`` until ``until(runners)`` is true (a runner's failure is raised at
    once, a slow run after ``timeout`` s), then stops them and ``worker``."""
    stop = asyncio.Event()
    jobs = [asyncio.create_task(r.run(stop)) for r in runners]
    deadline = time.monotonic() + timeout
    try:
        while not until(runners):
            for job in jobs:
                if job.done():
                    job.result()
            if time.monotonic() > deadline:
                raise AssertionError(f"not done within {timeout} s: {[r.stats for r in runners]}")
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await asyncio.gather(*jobs, return_exceptions=True)
        worker.stop()
    return runners


def stats(runners: list[TriggerRunner]) -> dict[str, int]:
    total: dict[str, int] = {}
    for runner in runners:
        for key in ("received", "completed", "abandoned", "dead_lettered", "deferred"):
            total[key] = total.get(key, 0) + getattr(runner.stats, key)
    return total


def settled(total: int) -> Callable[[list[TriggerRunner]], bool]:
    """True once ``total`` messages were completed or dead-lettered."""
    return lambda runners: sum(
        r.stats.completed + r.stats.dead_lettered for r in runners
    ) >= total  # fmt: skip
