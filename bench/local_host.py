"""The benchmarks' "host" figure: one pipeline's generated function run by the local host's
trigger runner, as ``python -m replication start`` runs it (the repository's
``function_app.py`` and host.json, the function in a worker process of its own, per-message
settlement over gRPC), timed until a number of messages are completed."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


async def host_seconds(
    pipeline: str,
    settings: dict[str, str],
    count: int,
    batch: int,
    *,
    in_process: bool = False,
    workers: int = 1,
) -> float:
    """Seconds for the local host to complete ``count`` messages of the one Service Bus
    triggered pipeline in the YAML text ``pipeline`` (``settings``: its connections),
    prefetching two batches of ``batch``; the worker process is up before the clock starts
    (``workers``: ``FUNCTIONS_WORKER_PROCESS_COUNT``; ``in_process``: the function on a
    worker thread of this process instead)."""
    from replication.gc_tuning import collect_garbage_for_throughput
    from replication.host.discovery import load_app, service_bus_triggers
    from replication.host.invocation import Invoker
    from replication.host.process import WorkerPool
    from replication.host.settlement import SettlementService
    from replication.host.trigger import HostOptions, TriggerRunner
    from replication.host.worker import Worker

    before = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)  # the app settings, as the host puts them
    with tempfile.TemporaryDirectory(prefix="bench-host-") as folder:
        app_path = Path(folder) / "function_app.py"
        shutil.copy(ROOT / "function_app.py", app_path)
        (Path(folder) / "pipelines.yaml").write_text(pipeline)
        (trigger,) = service_bus_triggers(load_app(app_path), settings)
        worker: Invoker
        if in_process:
            worker = Worker()
        else:
            settlement = SettlementService.shared().worker_arguments()
            worker = WorkerPool(app_path, settlement, workers)
            await worker.start()
        collect_garbage_for_throughput()  # as ``start`` does once the host is set up
        host_json = json.loads((ROOT / "host.json").read_text())
        options = replace(
            HostOptions.from_host_json(host_json),
            prefetch_count=2 * batch,
            max_message_batch_size=batch,
        )
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
            for key, value in before.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
