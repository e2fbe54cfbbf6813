"""The local host's worker process (``host/process.py``), run by ``Host`` on a
``function_app.py`` against a real broker, with the SDK sending and checking: a function
that kills its worker gets a new one, its message comes back without a delivery counted
(released), one that kills every worker it reaches is abandoned from its second crash on
until ``MaxDeliveryCount`` dead-letters it, and the host keeps serving the others."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue

from replication.host import process
from replication.host.app import Host, HostConfig
from replication.host.process import WorkerPool
from tests.broker.conftest import BrokerHandle, make_config

pytestmark = [pytest.mark.timeout(120), pytest.mark.starts_processes]

APP = '''\
import json
import os
from pathlib import Path

import azure.functions as func
import azurefunctions.extensions.bindings.servicebus as servicebus

app = func.FunctionApp()
HERE = Path(__file__).parent
if (HERE / "broken").exists():
    raise RuntimeError("function_app.py is broken until 'broken' is removed")


@app.service_bus_queue_trigger(arg_name="message", queue_name="work",
                               connection="SERVICEBUS_CONNECTION")
def crashes(message: servicebus.ServiceBusReceivedMessage) -> None:
    """Writes down each delivery; "crash..." kills its worker once, "poison..." always."""
    name = str(message.message_id)
    with open(HERE / "seen.jsonl", "a") as seen:
        seen.write(json.dumps([name, message.delivery_count, os.getpid()]) + "\\n")
    if name.startswith("poison"):
        os._exit(9)
    if name.startswith("crash") and not (HERE / name).exists():
        (HERE / name).touch()
        os._exit(7)
    if name.startswith("break") and not (HERE / name).exists():
        (HERE / name).touch()
        (HERE / "broken").touch()  # as an app edited into a broken state while it ran
        os._exit(7)
'''


def project(folder: Path, broker: BrokerHandle) -> Host:
    (folder / "function_app.py").write_text(APP)
    settings = {"SERVICEBUS_CONNECTION": broker.connection_string}
    (folder / "local.settings.json").write_text(json.dumps({"Values": settings}))
    return Host(HostConfig(directory=folder, metrics_port=None, progress=False))


def seen(folder: Path) -> list[tuple[str, int, int]]:
    lines = (folder / "seen.jsonl").read_text().splitlines()
    return [tuple(json.loads(line)) for line in lines]  # type: ignore[misc]


def send(broker: BrokerHandle, *names: str) -> None:
    with broker.client() as client, client.get_queue_sender("work") as sender:
        sender.send_messages([ServiceBusMessage(n, message_id=n) for n in names])


def dead_letters(broker: BrokerHandle) -> list[Any]:
    with (
        broker.client() as client,
        client.get_queue_receiver("work", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver,
    ):
        return list(receiver.receive_messages(max_message_count=10, max_wait_time=1))


async def test_a_worker_killed_by_its_function_is_restarted_and_its_message_released(
    broker_factory: Any, tmp_path: Path
) -> None:
    broker: BrokerHandle = broker_factory(make_config({"work": {"MaxDeliveryCount": 10}}))
    send(broker, "a", "crash", "b")
    host = project(tmp_path, broker)
    host.config.stop_when = lambda h: h.runners[0].stats.completed >= 3
    assert await host.run() == 0
    worker, stats = host.worker, host.runners[0].stats  # type: ignore[union-attr]
    assert isinstance(worker, WorkerPool) and worker.restarts == 1
    assert (stats.completed, stats.released, stats.abandoned, stats.failed_calls) == (3, 1, 0, 1)
    deliveries = seen(tmp_path)
    assert sorted(name for name, _, _ in deliveries) == ["a", "b", "crash", "crash"]
    first = next(d for d in deliveries if d[0] == "a")[1]
    crashes = [d for d in deliveries if d[0] == "crash"]
    assert [count for _, count, _ in crashes] == [first, first]  # no delivery counted
    assert crashes[0][2] != crashes[1][2] != os.getpid()  # a new worker, not the host
    assert broker.count("work") == 0
    assert dead_letters(broker) == []


async def test_a_message_that_kills_every_worker_runs_out_of_deliveries(
    broker_factory: Any, tmp_path: Path
) -> None:
    broker: BrokerHandle = broker_factory(make_config({"work": {"MaxDeliveryCount": 2}}))
    send(broker, "poison", "ok")
    host = project(tmp_path, broker)
    host.config.stop_when = lambda h: (
        h.runners[0].stats.completed >= 1 and h.runners[0].stats.abandoned >= 2
    )
    assert await host.run() == 0
    worker, stats = host.worker, host.runners[0].stats  # type: ignore[union-attr]
    assert isinstance(worker, WorkerPool) and worker.restarts == 3
    assert (stats.completed, stats.released, stats.abandoned) == (1, 1, 2)
    poison = [count for name, count, _ in seen(tmp_path) if name == "poison"]
    assert poison == [poison[0], poison[0], poison[0] + 1]  # released, then abandoned twice
    (dead,) = dead_letters(broker)
    assert dead.message_id == "poison" and dead.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert broker.count("work") == 0


async def test_messages_wait_unharmed_while_no_worker_can_start(
    broker_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that dies and cannot be started again (its app broken meanwhile) charges
    no message a delivery: they go back untouched, each try to start waits longer, and once
    the app is mended they run. Before, each try counted as a crash of its batch, so healthy
    messages were dead-lettered within seconds."""
    monkeypatch.setattr(process, "RESTART_BACKOFF", (0.05, 0.4))
    broker: BrokerHandle = broker_factory(make_config({"work": {"MaxDeliveryCount": 2}}))
    send(broker, "break")
    host = project(tmp_path, broker)
    sent_later = threading.Event()

    def step(h: Host) -> bool:
        pool = h.worker
        assert isinstance(pool, WorkerPool)
        if pool.failed_starts >= 1 and not sent_later.is_set():
            sent_later.set()
            threading.Thread(target=send, args=(broker, "a", "b")).start()
        if pool.failed_starts >= 4:
            (tmp_path / "broken").unlink(missing_ok=True)  # mended
        return h.runners[0].stats.completed >= 3

    host.config.stop_when = step
    assert await host.run() == 0
    worker, stats = host.worker, host.runners[0].stats
    assert isinstance(worker, WorkerPool) and worker.failed_starts >= 4
    assert (stats.completed, stats.abandoned) == (3, 0)
    assert dead_letters(broker) == []
    assert broker.count("work") == 0
    counts = {name: count for name, count, _ in seen(tmp_path)}
    assert counts == {"break": counts["break"], "a": counts["break"], "b": counts["break"]}


async def test_a_message_the_extension_cannot_decode_is_named_with_its_value(
    broker_factory: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """.NET writes a ``decimal`` property as an AMQP decimal128, which uamqp (the extension's
    decoder) cannot read: the invocation fails before the function runs, as in Azure, where
    its error names neither the message nor the value. The host names both."""
    from proton import Message, decimal128

    from tests.broker.conftest import proton_connection

    broker: BrokerHandle = broker_factory(make_config({"work": {"MaxDeliveryCount": 2}}))
    connection = proton_connection(broker.port)
    try:
        price = decimal128(bytes(16))
        connection.create_sender("work").send(
            Message(body=b"x", id="priced", properties={"price": price})
        )
    finally:
        connection.close()
    send(broker, "ok")
    host = project(tmp_path, broker)
    host.config.stop_when = lambda h: (
        h.runners[0].stats.completed >= 1 and h.runners[0].stats.abandoned >= 2
    )
    assert await host.run() == 0
    assert [name for name, _, _ in seen(tmp_path)] == ["ok"]  # the function never saw it
    named = [r.getMessage() for r in caplog.records if "cannot decode message" in r.getMessage()]
    assert len(named) == 2 and all("'priced'" in line for line in named), named
    assert "application property 'price' holds an AMQP decimal128" in named[0]
    (dead,) = dead_letters(broker)
    assert dead.message_id == "priced" and dead.dead_letter_reason == "MaxDeliveryCountExceeded"


HUBBED = """\
pipelines:
  - name: hubbed
    source: {connection: PrimaryServiceBus, eventhub: readings}
    target: {connection: SecondaryServiceBus, queue: work}
"""


async def test_an_event_hub_function_runs_in_the_worker_and_its_counts_reach_the_host(
    tmp_path: Path,
) -> None:
    """The events cross to the worker (``EventHubEvent`` batches), the copies go out from
    there, and the host's ``/metrics`` counts come from the worker's relay."""
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient

    from replication import metrics
    from replication.host.peek import peek

    from .test_host import project as pipelines_project

    directory, settings = pipelines_project(tmp_path, HUBBED)
    host = Host(HostConfig(directory=directory, metrics_port=None, progress=False))
    host.config.stop_when = lambda h: metrics.counts("hubbed")["forwarded"] >= 5
    run = asyncio.create_task(host.run())
    while not host.healthy:
        assert not run.done(), run.result()
        await asyncio.sleep(0.05)
    producer = EventHubProducerClient.from_connection_string(
        settings["PrimaryServiceBus"], eventhub_name="readings"
    )
    async with producer:
        batch = await producer.create_batch()
        for n in range(5):
            batch.add(EventData(f"r{n}"))
        await producer.send_batch(batch)
    assert await asyncio.wait_for(run, 120) == 0
    assert isinstance(host.worker, WorkerPool) and host.worker.restarts == 0
    assert metrics.counts("hubbed")["forwarded"] == 5
    (runner,) = host.runners
    assert runner.stats.failed_calls == 0
    peeked = await peek(directory, settings, "SecondaryServiceBus", "work", 10)
    assert sorted(p["body"] for p in peeked) == [f"r{n}" for n in range(5)]


EVENT_APP = """\
import json
from pathlib import Path

import azure.functions as func

app = func.FunctionApp()
HERE = Path(__file__).parent
if (HERE / "broken").exists():
    raise RuntimeError("function_app.py is broken until 'broken' is removed")


@app.event_hub_message_trigger(arg_name="event", event_hub_name="eh1", connection="EventHubs")
def counts(event: func.EventHubEvent) -> None:
    with open(HERE / "seen.jsonl", "a") as seen:
        seen.write(json.dumps(event.get_body().decode()) + "\\n")
"""


async def test_events_wait_while_no_worker_can_start(
    broker_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A function without a retry policy is checkpointed past a batch it failed on, as in
    Azure; but a batch no worker could be started for never reached it: it waits for a
    worker and runs, instead of being skipped."""
    from azure.eventhub import EventData

    from replication.host.checkpoints import SqliteCheckpointStore
    from replication.host.discovery import load_app
    from replication.host.eventhubs import EventHubOptions, EventHubTriggerRunner
    from replication.host.eventhubs import event_hub_triggers as hub_triggers
    from replication.host.settlement import SettlementService
    from tests.broker.eventhubs_support import eventhub_config

    from .eventhubs_host import send_events

    monkeypatch.setattr(process, "RESTART_BACKOFF", (0.05, 0.4))
    broker = broker_factory(eventhub_config({"eh1": {"PartitionCount": "1"}}))
    app_path = tmp_path / "function_app.py"
    app_path.write_text(EVENT_APP)
    (trigger,) = hub_triggers(load_app(app_path), {"EventHubs": broker.connection_string})
    pool = WorkerPool(app_path, SettlementService.shared().worker_arguments())
    store = SqliteCheckpointStore.in_directory(tmp_path)
    runner = EventHubTriggerRunner(
        trigger, broker.connection_string, store, pool, EventHubOptions(10)
    )
    stop = asyncio.Event()
    await pool.start()
    job = asyncio.create_task(runner.run(stop))
    try:
        (tmp_path / "broken").touch()  # the app broken while its worker runs ...
        pid = pool.workers[0].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # ... and the worker lost
        async with asyncio.timeout(60):
            while pool.restarts == 0:
                await asyncio.sleep(0.05)
            events = [(None, "0", EventData(f"e{i}")) for i in range(5)]
            await send_events(broker.connection_string, "eh1", events)
            while pool.failed_starts < 3:
                await asyncio.sleep(0.05)
            (tmp_path / "broken").unlink()  # mended
            while runner.stats.events < 5:
                assert not job.done(), job.result()
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await job
        pool.stop()
    (checkpoint,) = await store.list_checkpoints(f"localhost:{broker.port}", "eh1", "$Default")
    store.close()
    assert checkpoint["sequence_number"] == 4
    assert runner.stats.failed_calls == 0
    lines = (tmp_path / "seen.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [f"e{i}" for i in range(5)]


SLOW_APP = """\
import time
from pathlib import Path

import azure.functions as func

app = func.FunctionApp()
HERE = Path(__file__).parent


@app.service_bus_queue_trigger(arg_name="message", queue_name="work",
                               connection="SERVICEBUS_CONNECTION")
def slow(message: func.ServiceBusMessage) -> None:
    (HERE / "started").touch()
    time.sleep(1.5)
    (HERE / "finished").touch()
"""


def _slow_app_host(
    broker_factory: Any, tmp_path: Path, processes: Any
) -> tuple[BrokerHandle, Any, Path]:
    """``python -m replication start`` running ``SLOW_APP`` on a broker of its own, its
    output in the returned log."""
    from .test_host import start

    broker: BrokerHandle = broker_factory(make_config({"work": {}}))
    (tmp_path / "function_app.py").write_text(SLOW_APP)
    settings = {"SERVICEBUS_CONNECTION": broker.connection_string}
    (tmp_path / "local.settings.json").write_text(json.dumps({"Values": settings}))
    log = tmp_path / "host.log"
    host = start(processes, tmp_path, "--metrics-port", "0", "--no-progress", log=log)
    return broker, host, log


def test_ctrl_c_lets_the_function_in_flight_finish_and_settle(
    broker_factory: Any, tmp_path: Path, processes: Any
) -> None:
    """Ctrl-C in a terminal signals the host's whole process group, its worker too: the
    worker leaves stopping to the host, so the function in flight returns and its message
    is completed, not lost with a worker killed under it and run again on the next start."""
    broker, host, log = _slow_app_host(broker_factory, tmp_path, processes)
    deadline = time.monotonic() + 60
    while "ready (" not in log.read_text():
        assert host.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    send(broker, "order-1")
    while not (tmp_path / "started").exists():
        assert host.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.02)
    os.killpg(host.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    assert host.wait(60) == 0, log.read_text()
    output = log.read_text()
    assert (tmp_path / "finished").exists(), output
    assert "ended (exit code" not in output and "Traceback" not in output, output
    assert broker.count("work") == 0
    assert dead_letters(broker) == []


def test_ctrl_c_while_the_worker_starts_stops_cleanly(
    broker_factory: Any, tmp_path: Path, processes: Any
) -> None:
    """A Ctrl-C made as the worker starts reaches it too: it is started with SIGINT blocked
    and ignores it before unblocking it, so the host stops as asked (exit 0). A worker that
    ignored it only once its module ran died of a Ctrl-C made while it imported (a
    ``KeyboardInterrupt`` traceback), and ``start`` ended with "error: the worker process
    ... exited before it was ready"."""
    _, host, log = _slow_app_host(broker_factory, tmp_path, processes)
    deadline = time.monotonic() + 60
    while not _workers(host.pid):  # the worker has just been started: it is importing
        assert host.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.002)
    os.killpg(host.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    assert host.wait(60) == 0, log.read_text()
    output = log.read_text()
    assert "Traceback" not in output and "error:" not in output, output


def _workers(pid: int) -> list[str]:
    """The process ids of ``pid``'s worker processes, once they run Python (Linux)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(OSError):
                if b"language_worker" in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(child)
    return found


TWO_CONNECTIONS_APP = """\
import azure.functions as func

app = func.FunctionApp()


@app.service_bus_queue_trigger(arg_name="message", queue_name="work",
                               connection="SERVICEBUS_CONNECTION")
def configured(message: func.ServiceBusMessage) -> None: ...


@app.service_bus_queue_trigger(arg_name="message", queue_name="work",
                               connection="NOT_DEFINED_CONNECTION")
def misconfigured(message: func.ServiceBusMessage) -> None: ...
"""


async def test_a_function_whose_connection_is_not_defined_is_left_out_alone(
    broker_factory: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As the Functions host says a connection setting does not exist and runs the other
    functions; the local host ended on a ``KeyError`` traceback, running none."""
    broker: BrokerHandle = broker_factory(make_config({"work": {}}))
    send(broker, "a")
    host = project(tmp_path, broker)
    (tmp_path / "function_app.py").write_text(TWO_CONNECTIONS_APP)
    host.config.stop_when = lambda h: h.runners[0].stats.completed >= 1
    assert await host.run() == 0
    assert [r.trigger.name for r in host.runners] == ["configured"]
    assert (
        "function misconfigured is not run: its connection setting 'NOT_DEFINED_CONNECTION' "
        "is not defined" in caplog.text
    )
    assert broker.count("work") == 0


LOGGING_APP = """\
import logging

import azure.functions as func

app = func.FunctionApp()


@app.service_bus_queue_trigger(arg_name="message", queue_name="work",
                               connection="SERVICEBUS_CONNECTION")
def noisy(message: func.ServiceBusMessage) -> None:
    logging.info("processing %s", message.message_id)
    int(message.get_body())
"""


@pytest.mark.parametrize(
    ("host_json", "shown"),
    [({}, True), ({"logging": {"logLevel": {"default": "Warning"}}}, False)],
)
def test_the_functions_logs_show_at_host_jsons_level_with_a_failures_stack(
    broker_factory: Any, tmp_path: Path, processes: Any, host_json: Any, shown: bool
) -> None:
    """As ``func start`` shows them: the function's own ``logging.info`` at Information
    (host.json's default, or its ``logLevel``), and a failure's stack, not one line."""
    from .test_host import start

    broker: BrokerHandle = broker_factory(make_config({"work": {"MaxDeliveryCount": 1}}))
    (tmp_path / "function_app.py").write_text(LOGGING_APP)
    (tmp_path / "host.json").write_text(json.dumps({"version": "2.0", **host_json}))
    settings = {"SERVICEBUS_CONNECTION": broker.connection_string}
    (tmp_path / "local.settings.json").write_text(json.dumps({"Values": settings}))
    log = tmp_path / "host.log"
    host = start(processes, tmp_path, "--metrics-port", "0", "--no-progress", log=log)
    send(broker, "not-a-number")
    deadline = time.monotonic() + 60
    while broker.count("work/$DeadLetterQueue") < 1:
        assert host.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    os.killpg(host.pid, signal.SIGINT)
    host.wait(60)
    output = log.read_text()
    assert ("processing not-a-number" in output) is shown, output
    assert "noisy failed\nTraceback (most recent call last):" in output, output
    assert "in noisy\n    int(message.get_body())" in output, output


async def test_a_function_app_without_pipelines_gets_the_broker_its_trigger_names(
    tmp_path: Path,
) -> None:
    """An emulator connection string in local.settings.json and no pipelines.yaml: the host
    starts the embedded broker on that port with the queue the trigger reads, as the docs
    say, instead of retrying a refused connection every second."""
    from tests.ports import port_for_settings

    port = port_for_settings()
    connection = (
        f"Endpoint=sb://localhost:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true"
    )
    (tmp_path / "function_app.py").write_text(SLOW_APP.replace("time.sleep(1.5)", "pass"))
    settings = {"SERVICEBUS_CONNECTION": connection}
    (tmp_path / "local.settings.json").write_text(json.dumps({"Values": settings}))
    host = Host(HostConfig(directory=tmp_path, metrics_port=None, progress=False))
    sent = threading.Event()

    def step(h: Host) -> bool:
        if h.brokers and not sent.is_set():
            sent.set()
            threading.Thread(target=send_to, args=(connection, "order-1")).start()
        return bool(h.runners) and h.runners[0].stats.completed >= 1

    host.config.stop_when = step
    assert await host.run() == 0
    assert [b.port for b in host.brokers] == [port]
    assert (tmp_path / "finished").exists()


def send_to(connection: str, name: str) -> None:
    from azure.servicebus import ServiceBusClient

    with (
        ServiceBusClient.from_connection_string(connection) as client,
        client.get_queue_sender("work") as sender,
    ):
        sender.send_messages(ServiceBusMessage(name, message_id=name))
