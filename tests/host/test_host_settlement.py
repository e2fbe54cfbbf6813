"""Issue 18's scenarios through ``python -m replication start``: a poison message among
healthy ones, and a target that is SIGKILLed mid-stream and comes back."""

from __future__ import annotations

import json
import os
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
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue

from tests.broker.conftest import REPO_ROOT, QuickCloseClient, make_config, take_all, write_config
from tests.ports import METRICS, bound_port
from tests.processes import Processes

from .test_host import _metric, project, wait_for_port

pytestmark = pytest.mark.timeout(300)

SCHEMA = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
VALIDATE = """\
pipelines:
  - name: checked
    source: {connection: PrimaryServiceBus, queue: work}
    steps:
      - validate: {json_schema_file: schema.json}
    target: {connection: SecondaryServiceBus, queue: work}
"""


def start(processes: Processes, directory: Path, *args: str) -> subprocess.Popen[str]:
    """``python -m replication start`` with its output in ``host.log`` (a pipe nobody reads
    while the test runs would fill and stall the host)."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    with (directory / "host.log").open("w") as log:
        return processes.start(
            [sys.executable, "-m", "replication", "start", "--dir", str(directory), *args],
            cwd=directory, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip


def stop(process: subprocess.Popen[str], directory: Path) -> str:
    process.send_signal(signal.SIGINT)
    process.wait(timeout=90)
    return (directory / "host.log").read_text()


def metrics(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def receive_all(connection: str, queue: str, sub_queue: Any = None) -> list[Any]:
    with (
        QuickCloseClient.from_connection_string(connection) as client,
        client.get_queue_receiver(queue, sub_queue=sub_queue, prefetch_count=100) as receiver,
    ):
        return take_all(receiver, wait=2)


def test_one_bad_message_in_25_is_dead_lettered_alone(tmp_path: Path, processes: Processes) -> None:
    """The issue's scenario: 500 messages sent in batches of 10, one in 25 fails the schema,
    no error_target. Every good one reaches the target and none of them is dead-lettered;
    every bad one is dead-lettered at the source with the step's reason; /metrics agrees."""
    directory, settings = project(tmp_path, VALIDATE)
    (directory / "schema.json").write_text(json.dumps(SCHEMA))
    process = start(processes, directory, "--metrics-port", "0", "--no-progress")
    try:
        port = bound_port(directory / "host.log", process, METRICS)
        wait_for_port(settings["PrimaryServiceBus"], process)
        bad = {f"m{n}" for n in range(500) if n % 25 == 24}
        with (
            QuickCloseClient.from_connection_string(settings["PrimaryServiceBus"]) as client,
            client.get_queue_sender("work") as sender,
        ):
            for start_at in range(0, 500, 10):
                sender.send_messages([
                    ServiceBusMessage(b"{oops" if f"m{n}" in bad else json.dumps({"n": n}),
                                      message_id=f"m{n}")
                    for n in range(start_at, start_at + 10)
                ])  # fmt: skip
        deadline = time.monotonic() + 120
        while True:
            text = metrics(port)
            done = _metric(text, "replication_forwarded_messages_total", "checked") >= 480
            if done and _metric(text, "replication_dead_lettered_messages_total", "checked") >= 20:
                break
            assert time.monotonic() < deadline, text
            time.sleep(0.2)
        time.sleep(1.0)  # nothing more may happen
        text = metrics(port)
        assert _metric(text, "replication_received_messages_total", "checked") == 500
        assert _metric(text, "replication_forwarded_messages_total", "checked") == 480
        assert _metric(text, "replication_dead_lettered_messages_total", "checked") == 20
        assert _metric(text, "replication_failed_batches_total", "checked") == 0
        arrived = receive_all(settings["SecondaryServiceBus"], "work")
        assert sorted(str(m.message_id) for m in arrived) == sorted(
            f"m{n}" for n in range(500) if f"m{n}" not in bad
        )
        dead = receive_all(settings["PrimaryServiceBus"], "work", ServiceBusSubQueue.DEAD_LETTER)
        assert {str(m.message_id) for m in dead} == bad
        assert all(str(m.dead_letter_reason).startswith("validate:") for m in dead)
        assert receive_all(settings["PrimaryServiceBus"], "work") == []
    finally:
        output = stop(process, directory)
    assert process.returncode == 0, output


# ---------------------------------------------------------------------- a target outage

OUTAGE = """\
pipelines:
  - name: held
    source: {connection: PrimaryServiceBus, queue: work}
    target: {connection: TargetBus, queue: work}
"""
DEDUPE = {"RequiresDuplicateDetection": True, "DuplicateDetectionHistoryTimeWindow": "PT10M"}
TARGET_HOST = "127.0.0.2"
"""The killable target listens here: a local address the host does not start a broker for."""


class Killable:
    """``python -m replication broker`` on 127.0.0.2, SIGKILLed and restarted by the test:
    first on a port from the OS, then again on that port (with its data)."""

    def __init__(
        self, tmp_path: Path, name: str, work: dict[str, Any], processes: Processes
    ) -> None:
        self.processes = processes
        self.port = 0
        self.config = write_config(tmp_path / f"{name}.json", make_config({"work": work}))
        self.data = tmp_path / f"{name}-data"
        self.log = tmp_path / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def connection_string(self) -> str:
        assert self.port, "started once: the OS picked its port"
        return (
            f"Endpoint=sb://{TARGET_HOST}:{self.port};SharedAccessKeyName="
            "RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
        )

    def start(self) -> None:
        """Starts the broker; a restart reuses the port the OS gave the first start (free
        from the kill to the restart: the one window another socket has to take it)."""
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        before = len(self.log.read_text()) if self.log.exists() else 0
        with self.log.open("ab") as log:
            self.process = self.processes.start(
                [sys.executable, "-m", "replication", "broker", "--config", str(self.config),
                 "--host", TARGET_HOST, "--port", str(self.port), "--no-http",
                 "--data-dir", str(self.data)],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        if not self.port:
            self.port = bound_port(self.log, self.process, after=before, timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection((TARGET_HOST, self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(self.log.read_text())

    def kill(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
            self.process = None


def test_a_target_killed_for_many_lock_periods_costs_no_delivery(
    tmp_path: Path, processes: Processes
) -> None:
    """Source LockDuration 5 s (the least Service Bus allows), MaxDeliveryCount 2; the target
    is SIGKILLed while messages stream and stays down for 12 s (two and a half lock periods:
    longer than MaxDeliveryCount x LockDuration, 10 s, after which a batch whose locks lapsed
    would be dead-lettered), then
    comes back on the same port and data. The host holds its batch (the SDK's retries first,
    then the target's breaker, which probes), keeps the locks and takes nothing new
    meanwhile: each message reaches the function once (no lock ran out), nothing is lost,
    nothing is dead-lettered, nothing is left at the source.

    The real-time smoke test of holding a batch through an outage, through the whole host
    (its own process, on the real clock); 20 lock periods, exactly, on a ``ManualClock``:
    ``tests/tasks/test_pump_locks.py::test_target_outage_holds_the_batch``."""
    directory, settings = project(tmp_path, OUTAGE)
    target = Killable(tmp_path, "target", DEDUPE, processes)
    target.start()  # before the settings: they name the port it got
    settings["TargetBus"] = target.connection_string
    (directory / "local.settings.json").write_text(json.dumps({"Values": settings}))
    host_json = json.loads((directory / "host.json").read_text())
    host_json["extensions"]["serviceBus"].update(
        {"maxMessageBatchSize": 20, "prefetchCount": 20, "maxConcurrentCalls": 1}
    )
    (directory / "host.json").write_text(json.dumps(host_json))
    process = start(processes, directory, "--metrics-port", "0", "--no-progress")
    total, outage = 600, 12.0
    try:
        port = bound_port(directory / "host.log", process, METRICS)
        wait_for_port(settings["PrimaryServiceBus"], process)
        # the host made the source from the pipelines: give it the short lock and low count
        _shorten_source_locks(settings["PrimaryServiceBus"], directory)
        with (
            QuickCloseClient.from_connection_string(settings["PrimaryServiceBus"]) as client,
            client.get_queue_sender("work") as sender,
        ):
            for n in range(0, total, 20):
                sender.send_messages(
                    [ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(n, n + 20)]
                )
                if n == 200:
                    target.kill()
                    killed = time.monotonic()
        time.sleep(max(0.0, outage - (time.monotonic() - killed)))
        target.start()
        arrived: Counter[str] = Counter()
        deadline = time.monotonic() + 120
        with (
            QuickCloseClient.from_connection_string(target.connection_string) as client,
            client.get_queue_receiver("work", prefetch_count=100) as receiver,
        ):
            while len(arrived) < total and time.monotonic() < deadline:
                for message in receiver.receive_messages(100, max_wait_time=2):
                    receiver.complete_message(message)
                    arrived[str(message.message_id)] += 1
        missing = {f"m{i}" for i in range(total)} - set(arrived)
        assert not missing, f"{len(missing)} lost, e.g. {sorted(missing)[:5]}"
        dead = receive_all(settings["PrimaryServiceBus"], "work", ServiceBusSubQueue.DEAD_LETTER)
        assert dead == [], [(m.message_id, m.dead_letter_reason) for m in dead]
        assert receive_all(settings["PrimaryServiceBus"], "work") == []
        # each was handed to the function once: no lock ran out during the outage
        assert _metric(metrics(port), "replication_received_messages_total", "held") == total
    finally:
        output = stop(process, directory)
        target.kill()
    assert process.returncode == 0, output
    assert "is unreachable" in output and "reachable again" in output
    assert "abandoned for redelivery" not in output


def _shorten_source_locks(connection: str, directory: Path) -> None:
    """Through the management API, as an operator would."""
    with _admin(connection, directory) as admin:
        queue = admin.get_queue("work")
        queue.lock_duration = "PT5S"
        queue.max_delivery_count = 2
        admin.update_queue(queue)
        updated = admin.get_queue("work")
    assert updated.max_delivery_count == 2


SOURCE_OUTAGE = """\
pipelines:
  - name: reread
    source: {connection: SourceBus, queue: work}
    target: {connection: SecondaryServiceBus, queue: work}
"""


def test_a_source_killed_mid_stream_loses_nothing(tmp_path: Path, processes: Processes) -> None:
    """The source broker (LockDuration 5 s, MaxDeliveryCount 3) is SIGKILLed while the host
    reads it and stays down for 3 s; it comes back with its data. The host reconnects:
    what was locked when it died is delivered again (a duplicate the target's duplicate
    detection removes), nothing is lost, dead-lettered or left at the source.

    A real-time smoke test (a killed process, real reconnects): what it measures is that
    the host's receivers, failing to reconnect every second (``RETRY_PAUSE``) for those
    3 s, read again once the source is back. The broker keeps its locks in memory, so a
    longer outage shows nothing more: the restarted source has none."""
    directory, settings = project(tmp_path, SOURCE_OUTAGE)
    source = Killable(
        tmp_path, "source", {"LockDuration": "PT5S", "MaxDeliveryCount": 3}, processes
    )
    source.start()  # before the settings: they name the port it got
    settings["SourceBus"] = source.connection_string
    (directory / "local.settings.json").write_text(json.dumps({"Values": settings}))
    total = 1_000
    with (
        QuickCloseClient.from_connection_string(source.connection_string) as client,
        client.get_queue_sender("work") as sender,
    ):
        for n in range(0, total, 50):
            sender.send_messages(
                [ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(n, n + 50)]
            )
    process = start(processes, directory, "--metrics-port", "0", "--no-progress")
    try:
        wait_for_port(settings["SecondaryServiceBus"], process)
        deadline = time.monotonic() + 60
        while _count(settings["SecondaryServiceBus"], directory) < 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        source.kill()
        time.sleep(3)
        source.start()
        deadline = time.monotonic() + 120
        while _count(settings["SecondaryServiceBus"], directory) < total:
            assert time.monotonic() < deadline, _count(settings["SecondaryServiceBus"], directory)
            time.sleep(0.5)
        arrived = receive_all(settings["SecondaryServiceBus"], "work")
        assert sorted(str(m.message_id) for m in arrived) == sorted(f"m{i}" for i in range(total))
        dead = receive_all(source.connection_string, "work", ServiceBusSubQueue.DEAD_LETTER)
        assert dead == [], [(m.message_id, m.dead_letter_reason) for m in dead]
        assert receive_all(source.connection_string, "work") == []
    finally:
        output = stop(process, directory)
        source.kill()
    assert process.returncode == 0, output
    assert "cannot connect to" in output, "no reconnect failed: the outage was not seen"


def _count(connection: str, directory: Path) -> int:
    """Messages at the target queue, read through the management API (nothing received)."""
    with _admin(connection, directory) as admin:
        return int(admin.get_queue_runtime_properties("work").total_message_count)


def _admin(connection: str, directory: Path) -> Any:
    """The SDK's management client on a host-embedded broker (HTTPS, its local CA trusted)."""
    from azure.servicebus.management import ServiceBusAdministrationClient

    port = connection.split("localhost:")[1].split(";")[0]
    ca = directory / ".replication" / f"broker-{port}" / "tls" / "ca.pem"
    return ServiceBusAdministrationClient.from_connection_string(
        connection, connection_verify=str(ca)
    )
