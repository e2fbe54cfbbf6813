"""The ``servicebus`` data source in real Spark (``local[2]``) against the embedded broker:
streaming at-least-once with executors receiving and holding until the commit (a memory
sink, sessions in order across two partitions, a sink slower than the lock, a Python
worker and a driver killed between read and commit), ``receiveOn: driver``, batch
peek / receive / write."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage

from tests.broker.conftest import REPO_ROOT, BrokerHandle, make_config
from tests.spark.support import driver_env, fill, options, stream_available_now

pytestmark = pytest.mark.timeout(300)

CONFIG = make_config({
    "src": {}, "dst": {}, "peeked": {}, "short": {"LockDuration": "PT5S"},
    "s-src": {"RequiresSession": True}, "s-dst": {"RequiresSession": True},
})  # fmt: skip


def wait_until(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def collect_available_now(
    spark: Any, source: dict[str, str], checkpoint: Path, *,
    on_batch: Callable[[int, list[Any]], None] | None = None, with_partition: bool = False,
) -> list[tuple[int, Any]]:  # fmt: skip
    """Runs a ``servicebus`` stream into ``foreachBatch`` until the source is drained;
    (batch id, row) in the order the batches came (``partition``: the row's Spark
    partition). ``on_batch`` runs after a batch was read, before Spark commits it."""
    from pyspark.sql.functions import spark_partition_id

    got: list[tuple[int, Any]] = []

    def batch(frame: Any, batch_id: int) -> None:
        rows = frame.collect()
        got.extend((batch_id, row) for row in rows)
        if on_batch is not None:
            on_batch(batch_id, rows)

    stream = spark.readStream.format("servicebus").options(**source).load()
    if with_partition:
        stream = stream.withColumn("partition", spark_partition_id())
    query = (stream.writeStream.foreachBatch(batch)
             .option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())  # fmt: skip
    query.awaitTermination(240)
    assert query.exception() is None, query.exception()
    return got


def _processes() -> dict[int, tuple[int, int, bytes]]:
    """pid -> (parent pid, process group, command line) of every process we can see."""
    found: dict[int, tuple[int, int, bytes]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        found[int(entry.name)] = (int(fields[1]), int(fields[2]), cmdline)
    return found


def _descendants(root: int, processes: dict[int, tuple[int, int, bytes]]) -> list[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for pid, (parent, _, _) in processes.items():
        children[parent].append(pid)
    found, todo = [], [root]
    while todo:
        for child in children[todo.pop()]:
            found.append(child)
            todo.append(child)
    return found


def python_workers() -> list[int]:
    """The Python workers of this test session's Spark: children of its ``pyspark.daemon``."""
    processes = _processes()
    mine = _descendants(os.getpid(), processes)
    daemons = [pid for pid in mine if b"pyspark.daemon" in processes[pid][2]]
    return [pid for daemon in daemons for pid in _descendants(daemon, processes)]


def kill_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the process groups of ``process`` and of everything it started (the
    ``pyspark.daemon`` makes a group of its own), and to each of those processes."""
    processes = _processes()
    tree = [process.pid, *_descendants(process.pid, processes)]
    for group in {processes[pid][1] for pid in tree if pid in processes}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(10)


def test_executors_read_into_a_memory_sink_and_complete_after_the_commit(
    spark: Any, broker_factory: Any, tmp_path: Path
) -> None:
    """The default: each task receives its share, a holder in its Python worker keeps the
    messages locked, and they are completed once Spark committed the batch."""
    broker: BrokerHandle = broker_factory(CONFIG)
    total = 1000
    fill(broker, "src", [
        ServiceBusMessage(f"m-{i}".encode(), message_id=f"m-{i}",
                          application_properties={"n": i, "kind": "test", "ok": True})
        for i in range(total)
    ])  # fmt: skip
    stream = (spark.readStream.format("servicebus")
              .options(**options(broker, "src", maxMessagesPerTrigger=400)).load())  # fmt: skip
    query = (stream.writeStream.format("memory").queryName("executor_rows")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())  # fmt: skip
    query.awaitTermination(240)
    assert query.exception() is None, query.exception()
    rows = spark.table("executor_rows").collect()
    assert sorted(r.message_id for r in rows) == sorted(f"m-{i}" for i in range(total))
    assert {r.application_property_types["n"] for r in rows} == {"int"}  # as the SDK sent it
    wait_until(lambda: broker.count("src") == 0, timeout=10)  # completed after the commit
    assert sum(p["numInputRows"] for p in query.recentProgress) == total


def test_receive_on_the_driver_still_replicates(
    spark: Any, broker_factory: Any, tmp_path: Path
) -> None:
    """``receiveOn: driver``: the driver's intake receives and ships the rows in the tasks
    (for networks where executors cannot reach the driver)."""
    broker: BrokerHandle = broker_factory(CONFIG)
    total = 1000  # 5,000, with a driver killed midway: test_pipeline.py
    fill(broker, "src", [
        ServiceBusMessage(f"m-{i}".encode(), message_id=f"m-{i}",
                          application_properties={"n": i, "kind": "test", "ok": True})
        for i in range(total)
    ])  # fmt: skip
    source = options(broker, "src", maxMessagesPerTrigger=400, receiveOn="driver")
    query = stream_available_now(spark, source, options(broker, "dst"), tmp_path / "checkpoint")
    ids = broker.message_ids("dst")
    assert sorted(ids) == sorted(f"m-{i}" for i in range(total))
    assert broker.count("src") == 0  # completed only after the sink committed
    progress = query.recentProgress
    assert sum(p["numInputRows"] for p in progress) == total


def test_batch_peek_reads_without_taking_and_keeps_property_types(
    spark: Any, broker_factory: Any
) -> None:
    broker: BrokerHandle = broker_factory(CONFIG)
    fill(broker, "peeked", [
        ServiceBusMessage(b"x", message_id=f"p-{i}", session_id=None, subject="s",
                          application_properties={"n": i, "ratio": 0.5, "flag": False,
                                                  "name": "a"})
        for i in range(300)
    ])  # fmt: skip
    frame = spark.read.format("servicebus").options(**options(broker, "peeked")).load()
    rows = frame.orderBy("sequence_number").collect()
    assert [r.message_id for r in rows] == [f"p-{i}" for i in range(300)]
    first = rows[0]
    assert first.application_properties == {"n": "0", "ratio": "0.5", "flag": "false",
                                             "name": "a"}  # fmt: skip
    assert first.application_property_types == {  # n: the SDK sends a small int as an int
        "n": "int",
        "ratio": "double",
        "flag": "boolean",
        "name": "string",
    }
    assert first.subject == "s" and first.enqueued_time is not None
    assert broker.count("peeked") == 300  # peeking takes nothing


def test_batch_write_and_receive(spark: Any, broker_factory: Any) -> None:
    broker: BrokerHandle = broker_factory(CONFIG)
    frame = spark.createDataFrame(
        [(f"body-{i}", f"w-{i}", {"n": str(i)}, {"n": "long"}) for i in range(200)],
        "body string, message_id string, application_properties map<string,string>, "
        "application_property_types map<string,string>",
    )
    frame.write.format("servicebus").options(**options(broker, "dst")).mode("append").save()
    assert sorted(broker.message_ids("dst")) == sorted(f"w-{i}" for i in range(200))
    taken = (spark.read.format("servicebus").options(**options(broker, "dst", mode="receive"))
             .load().collect())  # fmt: skip
    assert sorted(r.message_id for r in taken) == sorted(f"w-{i}" for i in range(200))
    assert {r.application_property_types["n"] for r in taken} == {"long"}
    assert broker.count("dst") == 0  # receive mode takes them


def test_sessions_keep_their_order_across_two_partitions(
    spark: Any, broker_factory: Any, tmp_path: Path
) -> None:
    """Eight sessions over the two tasks of each micro-batch (two session slots each): a
    holder keeps its sessions until the commit, so a session is in one task per batch and
    its messages arrive in order, batch after batch; both tasks read."""
    broker: BrokerHandle = broker_factory(CONFIG)
    sessions, per_session = 8, 30
    fill(broker, "s-src", [
        ServiceBusMessage(f"{s}:{n}".encode(), message_id=f"{s}-{n}", session_id=f"s{s}")
        for n in range(per_session) for s in range(sessions)
    ])  # fmt: skip
    source = options(broker, "s-src", sessions="true", maxConcurrentSessions=4,
                     maxMessagesPerTrigger=100)  # fmt: skip
    got = collect_available_now(spark, source, tmp_path / "checkpoint", with_partition=True)
    order: dict[str, list[int]] = defaultdict(list)
    partitions: dict[tuple[int, str], set[int]] = defaultdict(set)
    for batch_id, row in got:
        order[row.session_id].append(int(str(row.message_id).split("-")[1]))
        partitions[batch_id, row.session_id].add(row.partition)
    assert sorted(order) == [f"s{s}" for s in range(sessions)]
    for session, numbers in order.items():
        assert numbers == list(range(per_session)), session
    assert all(len(parts) == 1 for parts in partitions.values()), partitions
    assert {part for parts in partitions.values() for part in parts} == {0, 1}
    wait_until(lambda: broker.count("s-src") == 0, timeout=10)


def test_a_sink_slower_than_the_lock_duration_costs_no_redelivery(
    spark: Any, broker_factory: Any, tmp_path: Path
) -> None:
    """The first batch's sink takes 8 s on a PT5S lock: the holders renew the locks until
    the commit; every message arrives once, first delivery, and is completed."""
    broker: BrokerHandle = broker_factory(CONFIG)
    total = 200
    fill(broker, "short", [ServiceBusMessage(b"s", message_id=f"s-{i}") for i in range(total)])

    def slow(batch_id: int, rows: list[Any]) -> None:
        if rows and batch_id == 0:
            time.sleep(8)

    got = collect_available_now(spark, options(broker, "short", maxMessagesPerTrigger=500),
                                tmp_path / "checkpoint", on_batch=slow)  # fmt: skip
    assert sorted(row.message_id for _, row in got) == sorted(f"s-{i}" for i in range(total))
    assert {row.delivery_count for _, row in got} == {0}
    wait_until(lambda: broker.count("short") == 0, timeout=10)


def test_a_python_worker_killed_while_holding_loses_nothing(
    spark: Any, broker_factory: Any, tmp_path: Path
) -> None:
    """After the first batch was read, its Python workers (the holder among them) are
    killed before Spark commits: the commit completes nothing of theirs, their connection
    drop gave the messages back, and later batches read them again (duplicates at the
    sink, none lost, the source empty in the end)."""
    broker: BrokerHandle = broker_factory(CONFIG)
    total = 300
    fill(broker, "src", [ServiceBusMessage(b"k", message_id=f"k-{i}") for i in range(total)])
    killed: list[int] = []

    def kill_holders(batch_id: int, rows: list[Any]) -> None:
        if rows and not killed:
            killed.extend(python_workers())
            for pid in killed:
                os.kill(pid, signal.SIGKILL)

    source = options(broker, "src", maxMessagesPerTrigger=100, numPartitions=1)
    got = collect_available_now(spark, source, tmp_path / "checkpoint", on_batch=kill_holders)
    assert killed, "no Python worker found to kill"
    first = {row.message_id for batch_id, row in got if batch_id == 0}
    later = [row.message_id for batch_id, row in got if batch_id > 0]
    assert len(first) == 100
    assert first <= set(later)  # came again: the killed holder completed none of them
    assert set(later) == {f"k-{i}" for i in range(total)}
    wait_until(lambda: broker.count("src") == 0, timeout=10)


def test_a_driver_killed_between_read_and_commit_loses_nothing(
    spark: Any, broker_factory: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The query runs in a process of its own; after its first batch was read (and before
    the commit) the whole driver is killed (``local[2]``: its executors with it). Nothing
    was completed; restarted on the same checkpoint, the query replays that batch with
    new assignments and gets every message, each once."""
    broker: BrokerHandle = broker_factory(CONFIG)
    total = 300
    fill(broker, "src", [ServiceBusMessage(b"d", message_id=f"d-{i}") for i in range(total)])
    checkpoint, marker = tmp_path / "checkpoint", tmp_path / "read"
    driver = subprocess.Popen(
        [sys.executable, "-m", "tests.spark.stream_job", broker.connection_string, "src",
         str(checkpoint), str(marker)],
        cwd=REPO_ROOT, env=driver_env(), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    request.addfinalizer(lambda: kill_tree(driver))
    wait_until(lambda: marker.exists() or driver.poll() is not None, timeout=180)
    assert driver.poll() is None, "the query ended before its first batch was read"
    read_first = json.loads(marker.read_text())
    assert len(read_first) == 200
    kill_tree(driver)

    got = collect_available_now(spark, options(broker, "src", maxMessagesPerTrigger=200),
                                checkpoint)  # fmt: skip
    ids = [row.message_id for _, row in got]
    assert sorted(ids) == sorted(f"d-{i}" for i in range(total))  # each once
    wait_until(lambda: broker.count("src") == 0, timeout=10)
