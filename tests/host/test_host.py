"""The local host end to end: ``python -m replication start`` over a copy of the project.

Each test copies function_app.py, host.json and a pipelines file into a temporary folder with
a local.settings.json naming free ports (``port_for_settings``: the settings name them
before the host starts), so the host starts its own embedded brokers there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from tests.broker.conftest import REPO_ROOT
from tests.ports import METRICS, bound_port, port_for_settings
from tests.processes import Processes

pytestmark = pytest.mark.timeout(240)

REPLICATE = """\
pipelines:
  - name: copy
    source: {connection: PrimaryServiceBus, queue: work}
    target: {connection: SecondaryServiceBus, queue: work}
"""


def project(tmp_path: Path, pipelines: str | None = None) -> tuple[Path, dict[str, str]]:
    for name in ("function_app.py", "host.json"):
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    if pipelines is None:
        shutil.copy(REPO_ROOT / "pipelines.yaml", tmp_path / "pipelines.yaml")
    else:
        (tmp_path / "pipelines.yaml").write_text(pipelines)
    settings = {
        name: (
            f"Endpoint=sb://localhost:{port_for_settings()};SharedAccessKeyName="
            "RootManageSharedAccessKey;"
            "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
        )
        for name in ("PrimaryServiceBus", "SecondaryServiceBus")
    }
    settings["SecondaryEventHubs"] = settings["SecondaryServiceBus"]  # one broker serves both
    settings["FUNCTIONS_WORKER_RUNTIME"] = "python"
    (tmp_path / "local.settings.json").write_text(json.dumps({"Values": settings}))
    return tmp_path, settings


def start(
    processes: Processes, directory: Path, *args: str, log: Path | None = None
) -> subprocess.Popen[str]:
    """The host, its output on a pipe (read once it ended) or appended to ``log`` (a host
    that runs while the test waits: a pipe nobody reads would fill and stall it)."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    with contextlib.ExitStack() as files:
        out = files.enter_context(log.open("a")) if log is not None else subprocess.PIPE
        return processes.start(
            [sys.executable, "-m", "replication", "start", "--dir", str(directory), *args],
            cwd=directory, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip


def wait_for_port(connection_string: str, process: subprocess.Popen[str]) -> None:
    port = int(connection_string.split("localhost:")[1].split(";")[0])
    import socket

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"port {port} never opened")


def test_demo_moves_and_shows_real_messages(tmp_path: Path, processes: Processes) -> None:
    directory, _ = project(tmp_path)
    process = start(processes, directory, "--demo", "--metrics-port", "0")
    output, _ = process.communicate(timeout=200)
    assert process.returncode == 0, output
    rows = {
        line.split()[0]: [int(n) for n in line.split()[1:]]
        for line in output.splitlines()
        if line.split() and line.split()[0] in {
            "orders-to-secondary", "telemetry-to-json", "events-router",
            "mirror-primary-to-secondary", "mirror-secondary-to-primary", "audit-to-eventhub",
        }
    }  # fmt: skip
    assert rows["orders-to-secondary"] == [200, 200, 0, 0]
    assert rows["telemetry-to-json"] == [50, 50, 0, 0]
    assert rows["events-router"] == [30, 30, 0, 0]
    # each mirror: 5 own messages crossed, 5 copies of the other side's dropped (no loop)
    assert rows["mirror-primary-to-secondary"] == [10, 5, 5, 0]
    assert rows["mirror-secondary-to-primary"] == [10, 5, 5, 0]
    assert rows["audit-to-eventhub"] == [20, 20, 0, 0]
    # one customer's audit trail: one partition, in order, stamped
    trail = [line for line in output.splitlines() if "order-audit-stream partition" in line]
    assert len(trail) == 5 and len({line.split()[2] for line in trail}) == 1, trail
    assert all("key=customer-0" in line and "repl-sequence" in line for line in trail)
    assert "orders #" in output and "repl-sequence" in output
    assert '"device":"sensor-0"' in output  # Avro in, JSON out


def test_ctrl_c_mid_stream_loses_nothing_and_metrics_match(
    tmp_path: Path, processes: Processes
) -> None:
    """SIGINT while 3,000 messages move: the host stops after settling what it had; every
    message is then at the source or the target (none lost), and a second run moves the
    rest. /metrics counted exactly what moved."""
    directory, settings = project(tmp_path, REPLICATE)
    total = 3_000
    log = tmp_path / "host.log"
    process = start(processes, directory, "--metrics-port", "0", "--no-progress", log=log)
    port = bound_port(log, process, METRICS)
    wait_for_port(settings["PrimaryServiceBus"], process)
    with (
        ServiceBusClient.from_connection_string(settings["PrimaryServiceBus"]) as client,
        client.get_queue_sender("work") as sender,
    ):
        for i in range(0, total, 100):
            sender.send_messages(
                [ServiceBusMessage(f"m{j}", message_id=f"m{j}") for j in range(i, i + 100)]
            )
    deadline = time.monotonic() + 60
    forwarded = 0.0
    while forwarded < 300:
        assert time.monotonic() < deadline
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        forwarded = _metric(body.decode(), "replication_forwarded_messages_total", "copy")
        time.sleep(0.05)
    health = urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
    assert health.status == 200
    process.send_signal(signal.SIGINT)
    process.wait(60)
    output = log.read_text()
    assert process.returncode == 0, output
    assert "triggers stopped" in output

    second = start(processes, directory, "--metrics-port", "0", "--no-progress", log=log)
    try:
        wait_for_port(settings["SecondaryServiceBus"], second)
        arrived: Counter[str] = Counter()
        with (
            ServiceBusClient.from_connection_string(settings["SecondaryServiceBus"]) as client,
            client.get_queue_receiver("work", prefetch_count=200) as receiver,
        ):
            deadline = time.monotonic() + 120
            while len(arrived) < total and time.monotonic() < deadline:
                for message in receiver.receive_messages(200, max_wait_time=2):
                    receiver.complete_message(message)
                    arrived[str(message.message_id)] += 1
    finally:
        second.send_signal(signal.SIGINT)
        second.wait(60)
    missing = {f"m{i}" for i in range(total)} - set(arrived)
    assert not missing, f"{len(missing)} lost, e.g. {sorted(missing)[:5]}"
    # the target has duplicate detection: a batch resent after the stop is not doubled
    assert max(arrived.values()) == 1


def _metric(text: str, name: str, pipeline: str) -> float:
    for line in text.splitlines():
        if line.startswith(name) and f'pipeline="{pipeline}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_bad_settings_fail_clearly(tmp_path: Path, processes: Processes) -> None:
    directory, _ = project(tmp_path, REPLICATE)
    (directory / "local.settings.json").write_text("{not json")
    process = start(processes, directory, "--metrics-port", "0")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 2
    assert "local.settings.json:1: not valid JSON" in output


METERED = """\
pipelines:
  - name: metered
    source: {connection: PrimaryServiceBus, queue: work}
    steps:
      - filter: {condition: "keep = 1"}
    target: {connection: SecondaryServiceBus, queue: work}
"""


async def test_metrics_count_what_moved(tmp_path: Path) -> None:
    """In-process host: 300 messages, a third filtered out; /metrics says exactly that, and
    the target holds exactly the forwarded ones."""
    import asyncio

    from azure.servicebus.aio import ServiceBusClient as AsyncClient

    from replication import metrics
    from replication.host.app import Host, HostConfig

    directory, settings = project(tmp_path, METERED)
    total = 300
    host = Host(HostConfig(directory=directory, metrics_port=0, progress=False))

    def moved() -> bool:
        counts = metrics.counts("metered")
        return counts["received"] >= total and counts["backlog"] == 0

    scraped = asyncio.Event()  # the host stops once /metrics was read, not before
    host.config.stop_when = lambda h: scraped.is_set()
    run = asyncio.create_task(host.run())
    while not host.healthy:
        assert not run.done(), run.result()
        await asyncio.sleep(0.05)
    async with (
        AsyncClient.from_connection_string(settings["PrimaryServiceBus"]) as client,
        client.get_queue_sender("work") as sender,
    ):
        await sender.send_messages([
            ServiceBusMessage(f"m{i}", message_id=f"m{i}",
                              application_properties={"keep": int(i % 3 != 0)})
            for i in range(total)
        ])  # fmt: skip
    deadline = asyncio.get_running_loop().time() + 120
    while not moved():
        assert not run.done(), run.result()
        assert asyncio.get_running_loop().time() < deadline, metrics.counts("metered")
        await asyncio.sleep(0.05)
    url = f"http://127.0.0.1:{host.config.metrics_port}/metrics"
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
    scraped.set()
    assert await asyncio.wait_for(run, 120) == 0
    counts = metrics.counts("metered")
    assert (counts["received"], counts["forwarded"], counts["filtered"]) == (300, 200, 100)
    assert "replication_received_messages_total" in body
    # what moved: the target has the 200 kept messages (read through a fresh host broker)
    from replication.host.peek import peek

    peeked = await peek(directory, settings, "SecondaryServiceBus", "work", 500)
    assert len(peeked) == 200
    assert {p["message_id"] for p in peeked} == {f"m{i}" for i in range(total) if i % 3}
