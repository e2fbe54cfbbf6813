"""The benchmarks' "host" figure: one pipeline's generated function run by the local host's
trigger runner, as ``python -m replication start`` runs it (the app's host.json, per-message
settlement over gRPC), timed until a number of messages are completed."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


async def host_seconds(pipeline: str, settings: dict[str, str], count: int, batch: int) -> float:
    """Seconds for the local host to complete ``count`` messages of the one Service Bus
    triggered pipeline in the YAML text ``pipeline`` (``settings``: its connections),
    prefetching two batches of ``batch``."""
    import azure.functions as func

    from replication.functions import register_pipelines
    from replication.host.discovery import service_bus_triggers
    from replication.host.trigger import HostOptions, TriggerRunner
    from replication.host.worker import Worker
    from replication.pipeline import parse_pipelines

    app = func.FunctionApp()
    register_pipelines(app, parse_pipelines(pipeline), settings)
    (trigger,) = service_bus_triggers(app, settings)
    worker = Worker()
    host_json = json.loads((ROOT / "host.json").read_text())
    options = replace(HostOptions.from_host_json(host_json), prefetch_count=2 * batch,
                      max_message_batch_size=batch)  # fmt: skip
    runner = TriggerRunner(
        trigger, settings[trigger.connection], options.for_trigger(trigger), worker=worker
    )
    stop = asyncio.Event()
    started = time.perf_counter()
    job = asyncio.create_task(runner.run(stop))
    try:
        while runner.stats.completed < count:
            if job.done():
                job.result()
            await asyncio.sleep(0.01)
        return time.perf_counter() - started
    finally:
        stop.set()
        await asyncio.gather(job, return_exceptions=True)
        worker.stop()
