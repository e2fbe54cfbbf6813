"""``transactional: true`` where functions cannot run it: the local host pumps such a
pipeline's sources itself (one transaction per batch), and Azure Functions, ``package``
and Spark refuse it with a reason instead of replicating it outside its transaction."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections import Counter
from pathlib import Path

import azure.functions as func
import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue

from replication import metrics
from replication.functions import pumped_by_host, register_pipelines
from replication.pipeline import PipelineConfigError, parse_pipelines
from tests.broker.conftest import REPO_ROOT, QuickCloseClient, make_config, take_all, write_config
from tests.ports import METRICS, bound_port
from tests.processes import Processes

from .test_host import project

pytestmark = pytest.mark.timeout(240)

MIXED = """\
pipelines:
  - name: plain-copy
    source: {connection: Bus, queue: a}
    target: {connection: Bus, queue: b}
  - name: tx-copy
    source: {connection: Bus, queue: c}
    target: {connection: Bus, queue: d}
    transactional: true
"""
REFUSED_BY_FUNCTIONS = (
    r"pipelines\.yaml:8:5: pipelines\[1\]\.transactional: pipeline 'tx-copy' is transactional, "
    r"which Azure Functions cannot run \(the Functions host receives the source's messages "
    r"and settles them on its own connection, which cannot join the transaction the copies "
    r"are sent in\); it runs in the local host \(python -m replication start\) or the task "
    r"pump .*, or set transactional: false"
)


# ---------------------------------------------------------------------- refused elsewhere


def test_register_pipelines_refuses_a_transactional_pipeline() -> None:
    """Azure Functions: nothing is registered (not even the plain pipeline), and the error
    names the pipeline, its line, why, and where it runs instead."""
    app = func.FunctionApp()
    with pytest.raises(PipelineConfigError, match=REFUSED_BY_FUNCTIONS):
        register_pipelines(app, parse_pipelines(MIXED, "pipelines.yaml"), {})
    assert app.get_functions() == []


def test_the_local_host_takes_the_transactional_pipeline_over() -> None:
    app = func.FunctionApp()
    with pumped_by_host() as pumped:
        names = register_pipelines(app, parse_pipelines(MIXED, "pipelines.yaml"), {})
    assert names == ["plain_copy", "plain_copy_rpo"]  # the trigger and its RPO timer
    assert [p.name for p in pumped] == ["tx-copy"]
    assert [f.get_function_name() for f in app.get_functions()] == names
    with pytest.raises(PipelineConfigError, match="tx-copy"):  # only inside the host's load
        register_pipelines(func.FunctionApp(), parse_pipelines(MIXED, "pipelines.yaml"), {})


def test_spark_has_the_same_refusal_at_hand() -> None:
    [_, transactional] = parse_pipelines(MIXED, "pipelines.yaml").pipelines
    with pytest.raises(PipelineConfigError, match=r"which the Spark runner cannot run"):
        transactional.refuse_transactional("spark")


def test_the_spark_runner_refuses_a_transactional_pipeline_before_spark_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from replication.cli import main

    (tmp_path / "pipelines.yaml").write_text(MIXED)
    bus = (
        "Endpoint=sb://localhost:5999;SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
    )
    (tmp_path / "local.settings.json").write_text(json.dumps({"Values": {"Bus": bus}}))
    code = main(["spark", "--pipeline", "tx-copy", "--dir", str(tmp_path), "--no-brokers"])
    assert code == 2
    assert "which the Spark runner cannot run" in capsys.readouterr().err


def app_folder(folder: Path, pipelines: str) -> Path:
    folder.mkdir()
    for name in ("function_app.py", "host.json", "requirements.txt", ".funcignore"):
        shutil.copy(REPO_ROOT / name, folder / name)
    (folder / "pipelines.yaml").write_text(pipelines)
    return folder


def test_package_refuses_a_transactional_pipeline(tmp_path: Path) -> None:
    from replication.deploy.package import build_package

    app = app_folder(tmp_path / "app", MIXED)
    (app / "replication").mkdir()  # what the package must hold (a stand-in)
    (app / "replication" / "__init__.py").write_text("")
    with pytest.raises(PipelineConfigError, match=REFUSED_BY_FUNCTIONS):
        build_package(app, tmp_path / "out")
    assert not (tmp_path / "out" / "functionapp.zip").exists()


def test_validate_warns_and_still_checks_the_functions(tmp_path: Path) -> None:
    """The file may be meant for the local host: a warning, not an error; function_app.py
    is still loaded for the settlement checks (as the host loads it)."""
    app = app_folder(tmp_path / "app", MIXED)
    result = subprocess.run(
        [sys.executable, "-m", "replication", "validate", str(app / "pipelines.yaml")],
        capture_output=True, text=True, cwd=app, timeout=120,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "warning: pipeline 'tx-copy' is transactional: the local host (python -m replication "
        "start) runs it with the task pump, but Azure Functions cannot (the Functions host "
        "receives the source's messages and settles them on its own connection, which cannot "
        "join the transaction the copies are sent in): register_pipelines and python -m "
        "replication package refuse it"
    ]


# ---------------------------------------------------------------------- run by the local host

LOCAL = """\
pipelines:
  - name: tx-local
    source: {connection: PrimaryServiceBus, queue: work}
    steps:
      - filter: {condition: "keep = 1"}
      - validate: {json_schema: {type: object, required: [n]}}
    target: {connection: PrimaryServiceBus, queue: copies}
    error_target: {connection: PrimaryServiceBus, queue: errors}
    batch_size: 20
    transactional: true
  - name: plain-local
    source: {connection: PrimaryServiceBus, queue: other}
    target: {connection: SecondaryServiceBus, queue: other}
"""


async def test_the_local_host_pumps_a_transactional_pipeline(tmp_path: Path) -> None:
    """In-process host on its embedded brokers: the transactional pipeline runs with the
    pump (its batch size), not as a function, next to a plain pipeline run as one. Every
    kept message arrives once, the ones that fail the schema go to the error target with
    the reason (as a function sends them), the source is left empty, and the metrics count
    it all as they do for a function."""
    from azure.servicebus.aio import ServiceBusClient as AsyncClient

    from replication.host.app import Host, HostConfig
    from replication.host.peek import peek
    from replication.host.pumped import PumpRunner
    from replication.host.trigger import TriggerRunner

    directory, settings = project(tmp_path, LOCAL)
    total = 300
    bad = {49, 149, 199, 299}  # kept (i % 3), not JSON

    def done(host: Host) -> bool:
        tx, plain = metrics.counts("tx-local"), metrics.counts("plain-local")
        return tx["received"] >= total and tx["backlog"] == 0 and plain["forwarded"] >= 10

    host = Host(HostConfig(directory=directory, metrics_port=None, progress=False))
    host.config.stop_when = done
    run = asyncio.create_task(host.run())
    while not host.healthy:
        assert not run.done(), run.result()
        await asyncio.sleep(0.05)
    [pumped] = [r for r in host.runners if isinstance(r, PumpRunner)]
    assert (pumped.pipeline, pumped.entity, pumped.options.max_message_batch_size) == (
        "tx-local", "work", 20,
    )  # fmt: skip
    assert [r.trigger.name for r in host.runners if isinstance(r, TriggerRunner)] == ["plain_local"]
    assert host.pipelines() == ["plain-local", "tx-local"]
    async with AsyncClient.from_connection_string(settings["PrimaryServiceBus"]) as client:
        async with client.get_queue_sender("work") as sender:
            await sender.send_messages([
                ServiceBusMessage("{oops" if i in bad else json.dumps({"n": i}),
                                  message_id=f"m{i}",
                                  application_properties={"keep": int(i % 3 != 0)})
                for i in range(total)
            ])  # fmt: skip
        async with client.get_queue_sender("other") as sender:
            await sender.send_messages([ServiceBusMessage(f"o{i}") for i in range(10)])
    assert await asyncio.wait_for(run, 120) == 0
    counts = metrics.counts("tx-local")
    assert (counts["received"], counts["forwarded"], counts["filtered"]) == (300, 196, 100)
    assert (counts["dead_lettered"], counts["failed_batches"]) == (4, 0)
    stats = pumped.stats
    assert (stats.completed, stats.abandoned, stats.released) == (300, 0, 0)
    copies = await peek(directory, settings, "PrimaryServiceBus", "copies", 500)
    assert sorted(p["message_id"] for p in copies) == sorted(
        f"m{i}" for i in range(total) if i % 3 and i not in bad
    )
    errors = await peek(directory, settings, "PrimaryServiceBus", "errors", 10)
    assert sorted(p["message_id"] for p in errors) == sorted(f"m{i}" for i in bad)
    assert all(p["properties"]["DeadLetterReason"].startswith("validate") for p in errors)
    assert await peek(directory, settings, "PrimaryServiceBus", "work", 10) == []


# ---------------------------------------------------------------------- a crash mid-transaction

TX_HOST = "127.0.0.2"
"""The namespace's broker listens here, outside the host (it outlives the host's crash)."""
CRASHED = """\
pipelines:
  - name: tx-crash
    source: {connection: TxBus, queue: work}
    target: {connection: TxBus, queue: copies}
    batch_size: 20
    transactional: true
"""
CRASH_AT_COMMIT = """\
import os
import signal
import sys

from replication.servicebus.transactions import Transaction

real_discharge = Transaction._discharge
commits = 0


async def discharge(self, *, fail):
    global commits
    commits += not fail
    if commits == {at} and not fail:  # copies accepted, completes answered: no commit
        os.kill(os.getpid(), signal.SIGKILL)
    await real_discharge(self, fail=fail)


Transaction._discharge = discharge

from replication.cli import main  # noqa: E402

sys.exit(main())
"""


def start_host(
    processes: Processes, directory: Path, *command: str
) -> tuple[subprocess.Popen[str], int]:
    """The host with its output appended to ``host.log`` (a pipe nobody reads would stall
    it), its metrics on a port from the OS; and where in the log its output starts."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    log_path = directory / "host.log"
    before = len(log_path.read_text()) if log_path.exists() else 0
    with log_path.open("a") as log:
        return processes.start(
            [*command, "start", "--dir", str(directory), "--metrics-port", "0",
             "--no-progress"],
            cwd=directory, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        ), before  # fmt: skip


def wait_healthy(process: subprocess.Popen[str], directory: Path, after: int) -> None:
    """Until the host's ``/health`` (on the metrics port it logged past ``after``) answers."""
    port = bound_port(directory / "host.log", process, METRICS, after=after)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, (directory / "host.log").read_text()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError((directory / "host.log").read_text())


def wait_exited(process: subprocess.Popen[str], directory: Path, timeout: float = 60) -> int:
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError((directory / "host.log").read_text()) from None


def peek_count(connection: str, queue: str) -> int:
    with (
        QuickCloseClient.from_connection_string(connection) as client,
        client.get_queue_receiver(queue) as receiver,
    ):
        return len(receiver.peek_messages(max_message_count=1000))


def receive_all(connection: str, queue: str, **kwargs: object) -> list[str]:
    with (
        QuickCloseClient.from_connection_string(connection) as client,
        client.get_queue_receiver(queue, prefetch_count=100, **kwargs) as receiver,  # type: ignore[arg-type]
    ):
        return [str(m.message_id) for m in take_all(receiver, wait=2)]


def test_a_host_killed_before_a_commit_leaves_no_duplicate(
    tmp_path: Path, processes: Processes
) -> None:
    """The host is SIGKILLed as it is about to commit its fifth batch: the copies of the
    batches in flight were accepted (in their transactions) and their completes answered.
    The broker, outside the host, drops those transactions with the connection; once the
    locks (5 s) run out the restarted host replicates the rest. The copies queue has no
    duplicate detection, and every message is there exactly once; nothing is left at the
    source or dead-lettered."""
    directory, settings = project(tmp_path, CRASHED)
    (directory / "crash.py").write_text(textwrap.dedent(CRASH_AT_COMMIT).replace("{at}", "5"))
    config = write_config(tmp_path / "tx.json", make_config({
        "work": {"LockDuration": "PT5S", "MaxDeliveryCount": 10}, "copies": {},
    }))  # fmt: skip
    broker_log = tmp_path / "broker.log"
    with broker_log.open("w") as log:
        broker = processes.start(
            [sys.executable, "-m", "replication", "broker", "--config", str(config),
             "--host", TX_HOST, "--port", "0", "--no-http",
             "--data-dir", str(tmp_path / "tx-data")],
            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        )  # fmt: skip
    try:
        port = bound_port(broker_log, broker, timeout=30)  # the settings name it: first
        connection = (
            f"Endpoint=sb://{TX_HOST}:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
            "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
        )
        settings["TxBus"] = connection
        (directory / "local.settings.json").write_text(json.dumps({"Values": settings}))
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection((TX_HOST, port), 0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, broker_log.read_text()
                time.sleep(0.1)
        total = 400
        with (
            QuickCloseClient.from_connection_string(connection) as client,
            client.get_queue_sender("work") as sender,
        ):
            for n in range(0, total, 50):
                sender.send_messages(
                    [ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(n, n + 50)]
                )

        crashing, _ = start_host(processes, directory, sys.executable, str(directory / "crash.py"))
        assert wait_exited(crashing, directory) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        # the batches in flight: the copies' send and the 20 completes each, dropped
        while "21 operations dropped, the connection closed" not in broker_log.read_text():
            assert time.monotonic() < deadline, broker_log.read_text()
            time.sleep(0.1)
        committed = peek_count(connection, "copies")
        assert 0 < committed < total and committed % 20 == 0  # whole batches
        assert peek_count(connection, "work") == total - committed

        host, logged_from = start_host(processes, directory, sys.executable, "-m", "replication")
        try:
            wait_healthy(host, directory, logged_from)
            deadline = time.monotonic() + 120
            while peek_count(connection, "work"):
                assert time.monotonic() < deadline, (directory / "host.log").read_text()
                time.sleep(0.5)
        finally:
            host.send_signal(signal.SIGINT)
            assert wait_exited(host, directory) == 0, (directory / "host.log").read_text()
        output = (directory / "host.log").read_text()
        assert "tx-crash is transactional: its sources run with the task pump" in output

        arrived = Counter(receive_all(connection, "copies"))
        assert [m for m, n in arrived.items() if n > 1] == []
        assert sorted(arrived) == sorted(f"m{i}" for i in range(total))
        assert receive_all(connection, "work", sub_queue=ServiceBusSubQueue.DEAD_LETTER) == []
    finally:
        broker.send_signal(signal.SIGKILL)
        broker.wait(10)
