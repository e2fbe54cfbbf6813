"""The pipeline runner on a real Spark cluster (issue 21, step 4), run as a user would: a
standalone master and two 1-core workers started with pyspark's ``spark-class``, each in
its own process (``cluster.StandaloneCluster``), the project's wheel built from this
checkout, and ``spark-submit --master spark://... --py-files replication-*.whl
spark_submit.py --pipeline copy --available-now`` against the embedded broker.

The executors run in their own JVMs under the workers, with their own Python workers that
import the package from the wheel Spark shipped them; the driver only plans. Three runs of
4,000 messages each, in several micro-batches so that the kills come mid-stream: a clean
one, one in which a Python worker that holds locked messages is SIGKILLed, and one in which
the driver is SIGKILLed and started again on its checkpoint. The count is not the claim
(``bench/spark.py`` measures throughput): each run costs its driver's and executors' JVM
starts plus about a second per micro-batch, and the messages' CPU on two cores.
The cluster is shared by the module's tests (a driver's death ends its application, not the
cluster) and killed, with everything under it, at the module's end whatever the outcome.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage

from tests.broker.conftest import BrokerHandle, dead_letters, make_config
from tests.spark.cluster import (
    Process,
    StandaloneCluster,
    build_wheel,
    socket_owner,
    submit,
)
from tests.spark.support import JVM_ENV, fill

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]

TOTAL = 4_000
CONFIG = make_config({"src": {}, "dst": {"RequiresDuplicateDetection": True}})
PIPELINE = """\
pipelines:
  - name: copy
    source: {connection: Bus, queue: src}
    target: {connection: Bus, queue: dst}
"""
STALL_STEP = """\
    steps:
      - transform: {callable: "stall:stall_once", callable_takes: message}
"""
STALLING = PIPELINE.replace("    target:", STALL_STEP + "    target:")
"""The copy with ``stall.py``'s step: one marked message stalls its Python worker."""
STALL_PY = Path(__file__).with_name("stall.py")
BIG_TASK = "contains a task of very large size"
PER_TRIGGER = ("--max-messages-per-trigger", "1000")
"""Four micro-batches (the default, 200,000 per task slot, would take them in one): the
kills come after the first."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    folder = tmp_path_factory.mktemp("cluster")
    with StandaloneCluster(folder, workers=2, cores=1, env=JVM_ENV) as started:
        yield started  # __exit__ kills the master and the workers with all under them


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture
def spark_submit(
    cluster: StandaloneCluster, wheel: Path, tmp_path: Path
) -> Iterator[Callable[..., Process]]:
    """``spark_submit(folder, *args, py_files=...)`` starts a driver; every one is killed at
    the end."""
    started: list[Process] = []

    def start(folder: Path, *args: str, py_files: tuple[Path, ...] = ()) -> Process:
        log = tmp_path / f"submit-{len(started)}.log"
        # the driver's Python planner loads the pipeline, steps and all, from its own path
        path = {"PYTHONPATH": os.pathsep.join(str(f.parent) for f in py_files)} if py_files else {}
        env = {**JVM_ENV, **path}
        started.append(submit(cluster.url, wheel, folder, log, *args, py_files=py_files, env=env))
        return started[-1]

    try:
        yield start
    finally:
        for process in started:
            process.kill()


def app(folder: Path, broker: BrokerHandle, pipelines: str = PIPELINE) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pipelines.yaml").write_text(pipelines)
    settings = {"Values": {"Bus": broker.connection_string}}
    (folder / "local.settings.json").write_text(json.dumps(settings))
    return folder


def loaded(broker_factory: Any, stall: Path | None = None) -> BrokerHandle:
    """The broker with ``TOTAL`` messages at ``src``; ``stall``: the one in the middle of
    the second micro-batch names that file for ``stall.py``."""
    broker: BrokerHandle = broker_factory(CONFIG)
    marked = {1500: {"stall": str(stall)}} if stall else {}
    messages = [
        ServiceBusMessage(b"c" * 64, message_id=f"c-{i}", application_properties=marked.get(i))
        for i in range(TOTAL)
    ]
    fill(broker, "src", messages)
    return broker


def finished(process: Process, timeout: float = 300) -> str:
    code = process.wait(timeout)
    output = process.output()
    assert code == 0, output[-5000:]
    return output


def all_arrived_once(broker: BrokerHandle) -> None:
    ids = broker.message_ids("dst")
    assert set(ids) == {f"c-{i}" for i in range(TOTAL)}
    assert len(ids) == TOTAL  # duplicates, if any, were dropped by duplicate detection
    assert broker.count("src") == 0
    assert dead_letters(broker, "src", 0) == []


def wait_until(predicate: Callable[[], bool], process: Process, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert process.popen.poll() is None, process.output()[-5000:]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_four_thousand_messages_on_two_workers(
    broker_factory: Any, spark_submit: Callable[..., Process], tmp_path: Path
) -> None:
    """All arrive once, none left, none dead-lettered; both executors worked; no task carries
    messages (Spark's task-size warning is gone); the lag the executors measured reached
    the driver with each batch's counts."""
    broker = loaded(broker_factory)
    folder = app(tmp_path / "app", broker)
    output = finished(spark_submit(folder, "--available-now", *PER_TRIGGER))
    all_arrived_once(broker)
    assert "forwarded 1000" in output
    batches = [line for line in output.splitlines() if re.search(r"\bforwarded \d+", line)]
    lags = [re.search(r"; lag up to ([0-9.]+) s$", line) for line in batches]
    assert batches and all(lags), batches  # every batch that forwarded carries its lag
    assert all(0 <= float(lag[1]) < 300 for lag in lags if lag), batches
    assert BIG_TASK not in output
    executors = set()
    for line in output.splitlines():
        if "Finished task" in line and "(executor " in line:
            executors.add(line.split("(executor ")[1].split(")")[0])
    assert len(executors) == 2, executors


def held_receivers(broker: BrokerHandle) -> list[int]:
    """Client ports of the broker's connections whose receiving links hold locked messages."""

    def ports() -> list[int]:
        assert broker.broker is not None
        found = []
        for peer in broker.broker.peers.values():
            if any(consumer.locks for consumer in peer.consumers.values()):
                transport = peer.driver.transport
                if transport is not None:
                    found.append(int(transport.get_extra_info("peername")[1]))
        return found

    return broker.call(ports)


def test_a_python_worker_killed_mid_batch_loses_nothing(
    broker_factory: Any, spark_submit: Callable[..., Process], cluster: StandaloneCluster,
    wheel: Path, tmp_path: Path,
) -> None:  # fmt: skip
    """In the second micro-batch, the Python worker (under one of the workers' executors)
    that holds a batch of locked messages is SIGKILLed (it stalls on a marked message,
    ``stall.py``, until then): its connection drops, the broker gives its messages back
    uncounted, Spark runs the task again; what it had sent and not completed arrives twice
    and the target's duplicate detection keeps one."""
    marker = tmp_path / "stalled"
    broker = loaded(broker_factory, stall=marker)
    folder = app(tmp_path / "app", broker, STALLING)
    driver = spark_submit(folder, "--available-now", *PER_TRIGGER, py_files=(STALL_PY,))
    wait_until(marker.exists, driver)
    victim = int(marker.read_text())
    assert victim in cluster.python_workers()
    # its executor's folder has the wheel Spark shipped (first on sys.path)
    assert (Path(f"/proc/{victim}/cwd").resolve() / wheel.name).is_file()
    holders = [socket_owner(port, broker.port, [victim]) for port in held_receivers(broker)]
    assert victim in holders  # the broker has messages locked on its connection
    assert broker.count("dst") >= 1000  # the first micro-batch is done
    os.kill(victim, signal.SIGKILL)
    output = finished(driver)
    assert "Lost task" in output, output[-5000:]  # the killed worker's task failed and ran again
    all_arrived_once(broker)


def test_a_killed_driver_restarted_on_its_checkpoint_loses_nothing(
    broker_factory: Any, spark_submit: Callable[..., Process], tmp_path: Path
) -> None:
    """The driver (spark-submit's whole process group) is SIGKILLed after a batch; the
    master ends its application and the workers kill its executors, whose connections drop
    (what they held comes back at once). A new spark-submit on the same checkpoint replays
    the planned batch with new assignments and drains the rest."""
    broker = loaded(broker_factory)
    folder = app(tmp_path / "app", broker)
    checkpoint = tmp_path / "checkpoint"
    first = spark_submit(
        folder,
        "--available-now",
        "--checkpoint",
        str(checkpoint),
        "--max-messages-per-trigger",
        "500",
    )
    wait_until(lambda: broker.count("dst") >= 1000, first)
    first.kill()
    assert broker.count("src") > 0, "the first run finished before the kill"
    assert (checkpoint / "source-0" / "offsets").is_dir()
    second = spark_submit(folder, "--available-now", "--checkpoint", str(checkpoint), *PER_TRIGGER)
    finished(second)
    all_arrived_once(broker)
