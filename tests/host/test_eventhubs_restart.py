"""A checkpointed host killed mid-stream starts again where it left off:
``python -m replication start`` replicating one event hub into another (both on the host's
embedded broker) is SIGKILLed while events move; the second run replicates the rest.
Nothing is lost, and the only duplicates are events of batches that ran but were not
checkpointed yet (at most one batch per partition)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from azure.eventhub import EventData, EventHubProducerClient
from azure.eventhub.aio import EventHubConsumerClient

from replication.host.embedded import EVENT_HUB_PARTITIONS
from tests.broker.conftest import REPO_ROOT
from tests.ports import METRICS, bound_port, port_for_settings
from tests.processes import Processes

pytestmark = pytest.mark.timeout(240)

BATCH = 50
PIPELINES = f"""\
pipelines:
  - name: copy-hub
    source: {{connection: EventHubs, eventhub: source-hub}}
    target: {{connection: EventHubs, eventhub: target-hub}}
    batch_size: {BATCH}
"""


def project(directory: Path) -> str:
    for name in ("function_app.py", "host.json"):
        shutil.copy(REPO_ROOT / name, directory / name)
    (directory / "pipelines.yaml").write_text(PIPELINES)
    connection = (  # the host's embedded broker, on a port the settings name
        f"Endpoint=sb://localhost:{port_for_settings()};SharedAccessKeyName="
        "RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
    )
    values = {"EventHubs": connection, "FUNCTIONS_WORKER_RUNTIME": "python"}
    (directory / "local.settings.json").write_text(json.dumps({"Values": values}))
    return connection


def start(processes: Processes, directory: Path, log: Path) -> tuple[subprocess.Popen[Any], int]:
    """The host, its output appended to ``log``; and its metrics port (from the OS)."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    before = len(log.read_text()) if log.exists() else 0
    with log.open("a") as out:
        process = processes.start(
            [sys.executable, "-m", "replication", "start", "--dir", str(directory),
             "--metrics-port", "0", "--no-progress", "--no-ui"],
            cwd=directory, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return process, bound_port(log, process, METRICS, after=before)


def forwarded(metrics: int) -> float:
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read()
    except OSError:
        return 0.0
    for line in body.decode().splitlines():
        if line.startswith("replication_forwarded_messages_total") and "copy-hub" in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_for(connection: str, process: subprocess.Popen[Any], log: Path) -> None:
    port = int(connection.split("localhost:")[1].split(";")[0])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"port {port} never opened: {log.read_text()}")


def hub(connection: str, name: str) -> str:
    return f"{connection.rstrip(';')};EntityPath={name}"


async def read_all(connection: str, name: str, count: int, timeout: float = 90.0) -> Counter[str]:
    """Message ids of every event in the hub, counted, once ``count`` distinct arrived (the
    asyncio consumer: the sync one reads this broker at a few events a second per partition
    once its first credit is spent, see the report)."""
    seen: Counter[str] = Counter()
    client = EventHubConsumerClient.from_connection_string(
        hub(connection, name), consumer_group="$Default"
    )

    async def on_event(_context: Any, event: EventData | None) -> None:
        if event is not None:
            seen[str(event.message_id)] += 1

    reader = asyncio.create_task(client.receive(on_event, starting_position="-1"))
    deadline = time.monotonic() + timeout
    try:
        while len(seen) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # what came after the count (duplicates) arrives now
    finally:
        await client.close()
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    return seen


def test_a_killed_host_restarts_at_its_checkpoints(tmp_path: Path, processes: Processes) -> None:
    connection = project(tmp_path)
    log = tmp_path / "host.log"
    first, metrics = start(processes, tmp_path, log)
    wait_for(connection, first, log)
    total = 2_000
    with EventHubProducerClient.from_connection_string(hub(connection, "source-hub")) as producer:
        for start_at in range(0, total, 100):
            events = []
            for i in range(start_at, start_at + 100):
                event = EventData(f"event {i}")
                event.message_id = f"e{i}"
                events.append(event)
            producer.send_batch(events, partition_key=f"k{start_at // 100}")
    deadline = time.monotonic() + 60
    at_kill = 0.0
    while at_kill < 300:
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.02)
        at_kill = forwarded(metrics)
    os.killpg(first.pid, signal.SIGKILL)  # mid-stream: no checkpoint of what is in flight
    first.wait(10)
    assert at_kill < total, "the first run was done before the kill: nothing tested"
    assert forwarded(metrics) == 0.0  # the host is gone

    # the embedded broker comes back on the port the settings name, over its data (the
    # port is free from the kill to this restart: the one window another socket has)
    second, _ = start(processes, tmp_path, log)
    try:
        wait_for(connection, second, log)
        arrived = asyncio.run(read_all(connection, "target-hub", total))
    finally:
        second.send_signal(signal.SIGINT)
        second.wait(60)
    missing = {f"e{i}" for i in range(total)} - set(arrived)
    assert not missing, f"{len(missing)} lost, e.g. {sorted(missing)[:5]}"
    duplicates = sum(n - 1 for n in arrived.values())
    print(f"killed after {at_kill:.0f} of {total} forwarded; {duplicates} duplicates")
    assert duplicates <= BATCH * EVENT_HUB_PARTITIONS, duplicates
    assert "reading event hub source-hub" in log.read_text()
