"""The pipeline runner scaled out (issue 21, steps 1-3): the driver plans assignments of a few
hundred bytes, executors receive, run the steps, send and settle on their own links.

Real Spark (``local[2]``, or a ``python -m replication spark`` subprocess), the embedded
broker over real sockets, and for failover the in-process DNS server of the failover tests.
"""

from __future__ import annotations

import contextlib
import json
import logging
import pickle
import re
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage

from replication import metrics
from replication.failover import HOST_MAP_SETTING
from replication.pipeline import load_pipelines
from replication.spark.assignment import Assignment
from replication.spark.pipeline_source import PipelineSourceOptions, PipelineStreamReader
from replication.spark.runner import SparkPipeline
from tests.broker.conftest import BrokerHandle, dead_letters, make_config
from tests.failover.dns_server import ALIAS, SB_ZONES, DnsServer, seed_zone
from tests.spark.crash import MARKER
from tests.spark.stall import release
from tests.spark.support import driver_env

pytestmark = pytest.mark.timeout(300)

CONFIG = make_config({
    "src": {"LockDuration": "PT30S"}, "dst": {"RequiresDuplicateDetection": True},
    "big-src": {}, "big-dst": {},
    "s-src": {"RequiresSession": True}, "s-dst": {"RequiresSession": True},
})  # fmt: skip


@pytest.fixture
def dns_server() -> Iterator[DnsServer]:
    with DnsServer() as server:
        yield seed_zone(server)


def app(folder: Path, text: str, settings: dict[str, str]) -> tuple[Any, Path]:
    """Writes the pipeline file and local.settings.json; the first pipeline and its path."""
    (folder / "pipelines.yaml").write_text(text)
    (folder / "local.settings.json").write_text(json.dumps({"Values": settings}))
    loaded = load_pipelines(folder / "pipelines.yaml", settings=settings)
    return loaded.pipelines[0], folder / "pipelines.yaml"


@contextlib.contextmanager
def streaming(
    spark: Any,
    pipeline: Any,
    path: Path,
    settings: dict[str, str],
    checkpoint: Path,
    *,
    max_per_trigger: int,
    name: str,
) -> Iterator[threading.Thread]:
    """Runs ``SparkPipeline.stream`` (``--available-now``) in a thread while the body acts on
    the running query; then waits for it and fails the test if it failed or hangs."""
    failure: list[BaseException] = []

    def stream() -> None:
        try:
            SparkPipeline(spark, pipeline, path, settings).stream(
                checkpoint, available_now=True, max_per_trigger=max_per_trigger
            )
        except BaseException as exc:  # reported by the test's thread
            failure.append(exc)

    runner = threading.Thread(target=stream, name=name)
    runner.start()
    try:
        yield runner
    finally:
        runner.join(240)
    assert not runner.is_alive() and not failure, failure


def send(broker: BrokerHandle, queue: str, messages: list[ServiceBusMessage], per: int) -> None:
    with broker.client() as client, client.get_queue_sender(queue) as sender:
        for start in range(0, len(messages), per):
            sender.send_messages(messages[start : start + per])


def wait_until(predicate: Callable[[], bool], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


COPY = """\
pipelines:
  - name: copy
    source: {connection: Bus, queue: big-src}
    target: {connection: Bus, queue: big-dst}
"""


def test_assignments_are_small_and_the_bodies_never_ride_in_them(
    spark: Any, broker_factory: Any, tmp_path: Path
) -> None:
    """1,000 messages of 64 KiB (two micro-batches): every planned partition pickles to under
    1 KiB; each message arrives once (the target has no duplicate detection to hide a second
    copy)."""
    broker: BrokerHandle = broker_factory(CONFIG)
    total, body = 1000, 64 * 1024
    send(broker, "big-src", [
        ServiceBusMessage(bytes([i % 251]) * body, message_id=f"b-{i}") for i in range(total)
    ], per=3)  # fmt: skip
    settings = {"Bus": broker.connection_string}
    pipeline, path = app(tmp_path, COPY, settings)
    job = SparkPipeline(spark, pipeline, path, settings)

    options = job.source_options(0, 500, max_seconds=12.5)
    reader = PipelineStreamReader(PipelineSourceOptions.parse(options))
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        planned = reader.partitions(start, end)
    finally:
        reader.stop()
    assert len(planned) == spark.sparkContext.defaultParallelism == 2
    assert all(isinstance(p, Assignment) for p in planned)
    assert [(p.max_messages, p.max_seconds) for p in planned] == [(250, 12.5)] * 2
    sizes = [len(pickle.dumps(p)) for p in planned]
    assert max(sizes) < 1024, sizes
    assert broker.count("big-src") == total  # planning received nothing

    job.stream(tmp_path / "checkpoint", available_now=True, max_per_trigger=500)
    ids = broker.message_ids("big-dst")
    assert len(ids) == total
    assert set(ids) == {f"b-{i}" for i in range(total)}
    assert broker.count("big-src") == 0
    with broker.client() as client, client.get_queue_receiver("big-dst") as receiver:
        (first,) = receiver.peek_messages(1)
        assert len(b"".join(first.body)) == body


POISON = """\
pipelines:
  - name: poison
    source: {connection: Bus, queue: src}
    steps:
      - validate: {json_schema: {type: object, required: [qty]}}
    target: {connection: Bus, queue: dst}
"""


def test_a_poison_message_is_dead_lettered_alone_with_its_reason(
    spark: Any, broker_factory: Any, tmp_path: Path
) -> None:
    """No error_target: the step's dead-letter decision dead-letters the one message at the
    source with the step's reason; the rest of its batch is sent and completed."""
    broker: BrokerHandle = broker_factory(CONFIG)
    good = [ServiceBusMessage(json.dumps({"qty": i}), message_id=f"g-{i}") for i in range(300)]
    good.insert(150, ServiceBusMessage(b'{"price": 1}', message_id="poison"))
    send(broker, "src", good, per=100)
    settings = {"Bus": broker.connection_string}
    pipeline, path = app(tmp_path, POISON, settings)
    assert pipeline.error_target is None
    before = metrics.counts("poison")
    SparkPipeline(spark, pipeline, path, settings).stream(
        tmp_path / "checkpoint", available_now=True, max_per_trigger=1000
    )
    assert sorted(broker.message_ids("dst")) == sorted(f"g-{i}" for i in range(300))
    assert broker.count("src") == 0
    (dead,) = dead_letters(broker, "src", 1)
    assert dead.message_id == "poison"
    assert dead.dead_letter_reason is not None
    assert dead.dead_letter_reason.startswith("validate: ")
    assert "qty" in (dead.dead_letter_reason + (dead.dead_letter_error_description or ""))
    after = metrics.counts("poison")
    assert after["received"] - before["received"] == 301
    assert after["forwarded"] - before["forwarded"] == 300
    assert after["dead_lettered"] - before["dead_lettered"] == 1


SESSIONS = """\
pipelines:
  - name: sessions
    source: {connection: Bus, queue: s-src, sessions: true}
    target: {connection: Bus, queue: s-dst}
"""


def test_sessions_keep_their_order_across_two_partitions(
    spark: Any, broker_factory: Any, tmp_path: Path
) -> None:
    """Eight sessions over the two tasks of each micro-batch (four session slots each):
    each session is held by one task at a time, and arrives in order; both slots worked."""
    broker: BrokerHandle = broker_factory(CONFIG)
    sessions, per_session = 8, 40
    send(broker, "s-src", [
        ServiceBusMessage(f"{s}:{n}".encode(), message_id=f"s{s}-{n}", session_id=f"s{s}")
        for n in range(per_session) for s in range(sessions)
    ], per=80)  # fmt: skip
    settings = {"Bus": broker.connection_string}
    pipeline, path = app(tmp_path, SESSIONS, settings)
    job = SparkPipeline(spark, pipeline, path, settings)
    counts = (
        spark.readStream.format("servicebus-pipeline").options(**job.source_options(0, 120)).load()
    )
    query = (counts.writeStream.format("memory").queryName("session_counts")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())  # fmt: skip
    query.awaitTermination(240)
    assert query.exception() is None, query.exception()

    order: dict[str, list[int]] = defaultdict(list)
    for message_id in broker.message_ids("s-dst"):
        session, n = str(message_id).split("-")
        order[session].append(int(n))
    assert sorted(order) == [f"s{s}" for s in range(sessions)]
    for session, numbers in order.items():
        assert numbers == list(range(per_session)), session
    assert broker.count("s-src") == 0
    rows = spark.table("session_counts").collect()
    by_slot: dict[int, int] = defaultdict(int)
    for row in rows:
        by_slot[row.slot] += row.received
    assert by_slot[0] > 0 and by_slot[1] > 0, by_slot
    assert sum(by_slot.values()) == sessions * per_session
    assert max(row.received for row in rows) <= 60  # each slot's share of 120 per trigger


CRASH = """\
pipelines:
  - name: copy
    source: {connection: Bus, queue: src}
    steps:
      - transform: {callable: "tests.spark.crash:crash_once", callable_takes: message}
    target: {connection: Bus, queue: dst}
"""


def test_a_python_worker_killed_mid_batch_loses_nothing(
    broker_factory: Any, tmp_path: Path
) -> None:
    """A step kills its Python worker (``os._exit``) on a marked message in the middle of
    the stream. Spark runs the task again (``local[2,4]``: four attempts); the dead worker's
    connection took its locks with it, so its messages come again at once, uncounted. What
    it had sent and not completed arrives twice; the target's duplicate detection keeps one."""
    broker: BrokerHandle = broker_factory(CONFIG)
    total, marked = 1200, 700  # micro-batches of 400: the crash comes in the second of three
    send(broker, "src", [
        ServiceBusMessage(b"x" * 64, message_id=f"k-{i}",
                          application_properties={"crash": i == marked})
        for i in range(total)
    ], per=250)  # fmt: skip
    app(tmp_path, CRASH, {"Bus": broker.connection_string})
    marker = tmp_path / "crashed"
    run = subprocess.run(
        [sys.executable, "-m", "replication", "spark", "--pipeline", "copy", "--dir",
         str(tmp_path), "--master", "local[2,4]", "--max-messages-per-trigger", "400",
         "--available-now"],
        cwd=tmp_path, env=driver_env(**{MARKER: str(marker)}), capture_output=True, text=True,
        timeout=280,
    )  # fmt: skip
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert marker.read_text() == f"k-{marked}", "the worker was not killed"
    assert "Python worker exited unexpectedly" in output or "crashed" in output, output[-4000:]
    ids = broker.message_ids("dst")
    assert set(ids) == {f"k-{i}" for i in range(total)}
    assert len(ids) == total  # the duplicates were dropped by duplicate detection
    assert broker.count("src") == 0
    assert dead_letters(broker, "src", 0) == []


SB1, SB2 = SB_ZONES["sb1"], SB_ZONES["sb2"]
FAILOVER = """\
pipelines:
  - name: moved
    source:
      connection: Bus
      queue: src
      failover:
        dns: {{alias: {alias}, nameserver: "{nameserver}", timeout: 1}}
        recheck_interval: 0.3
    target: {{connection: Dst, queue: dst}}
"""


def test_a_cname_flip_mid_query_moves_the_source(
    spark: Any, broker_factory: Any, dns_server: DnsServer, tmp_path: Path
) -> None:
    """The driver resolves the source every micro-batch: after the alias moves to sb2, the
    next batch's assignments name sb2 and the executors read there. What was left on sb1
    stays there (drain it, or fail back), as with the local host."""
    sb1, sb2, dst = (broker_factory(CONFIG) for _ in range(3))
    half = 1000  # micro-batches of 100: the flip comes once 300 arrived, 700 still on sb1
    send(sb1, "src", [ServiceBusMessage(b"1", message_id=f"m-{i}") for i in range(half)], 250)
    send(sb2, "src", [ServiceBusMessage(b"2", message_id=f"m-{i}")
                      for i in range(half, 2 * half)], 250)  # fmt: skip
    dns_server.set_cname(ALIAS, "sb1.test.example.com", ttl=0)
    settings = {
        "Bus": sb1.connection_string, "Dst": dst.connection_string,
        HOST_MAP_SETTING: f"{SB1}=127.0.0.1:{sb1.port};{SB2}=127.0.0.1:{sb2.port}",
    }  # fmt: skip
    pipeline, path = app(tmp_path, FAILOVER.format(alias=ALIAS, nameserver=dns_server.address),
                         settings)  # fmt: skip
    with streaming(spark, pipeline, path, settings, tmp_path / "checkpoint",
                   max_per_trigger=100, name="spark-failover") as runner:  # fmt: skip
        wait_until(lambda: dst.count("dst") >= 300 or not runner.is_alive())
        dns_server.set_cname(ALIAS, "sb2.test.example.com", ttl=0)
    copied = set(dst.message_ids("dst"))
    left_on_sb1 = set(sb1.message_ids("src"))
    assert {f"m-{i}" for i in range(half, 2 * half)} <= copied  # sb2 read to the end
    assert sb2.count("src") == 0
    assert {f"m-{i}" for i in range(half)} <= copied | left_on_sb1  # nothing lost on sb1
    assert left_on_sb1, "sb1 was drained before the flip: the test proves nothing"
    assert dns_server.asked(ALIAS, "CNAME") > 2  # asked again while the query ran


LATE = """\
pipelines:
  - name: late
    source: {connection: Bus, queue: big-src}
    target: {connection: Bus, queue: big-dst}
"""


def test_available_now_leaves_what_came_after_the_start(
    spark: Any, broker_factory: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``--available-now`` processes what was there when the query started: messages sent
    while it runs are given back untouched (no delivery counted) and stay at the source.
    The last batch (30 early messages, shares of 50) takes late ones too and releases them."""
    caplog.set_level(logging.INFO, logger="replication.spark")
    broker: BrokerHandle = broker_factory(CONFIG)
    early, late = 1530, 200
    send(broker, "big-src", [ServiceBusMessage(b"e", message_id=f"e-{i}")
                             for i in range(early)], per=250)  # fmt: skip
    settings = {"Bus": broker.connection_string}
    pipeline, path = app(tmp_path, LATE, settings)
    with streaming(spark, pipeline, path, settings, tmp_path / "checkpoint",
                   max_per_trigger=100, name="spark-late") as runner:  # fmt: skip
        wait_until(lambda: broker.count("big-dst") >= 100 or not runner.is_alive())
        send(broker, "big-src", [ServiceBusMessage(b"l", message_id=f"l-{i}")
                                 for i in range(late)], per=100)  # fmt: skip
    assert sorted(broker.message_ids("big-dst")) == sorted(f"e-{i}" for i in range(early))
    with broker.client() as client, client.get_queue_receiver("big-src") as receiver:
        left = receiver.peek_messages(late + 10)
    assert sorted(str(m.message_id) for m in left) == sorted(f"l-{i}" for i in range(late))
    assert {m.delivery_count for m in left} == {0}
    assert any(re.search(r"\blate [1-9]", r.getMessage()) for r in caplog.records), (
        "no late message was received: the test proves nothing"
    )


DROPPED = """\
pipelines:
  - name: dropped
    source: {connection: Bus, queue: src}
    steps:
      - transform: {callable: "tests.spark.stall:stall_once", callable_takes: message}
    target: {connection: Bus, queue: dst}
"""
"""The copy with ``stall.py``'s step: the marked message holds its task (and its receiving
connection) until the test lets it go."""


def test_a_dropped_source_connection_is_reopened_by_the_next_task(
    spark: Any, broker_factory: Any, tmp_path: Path
) -> None:
    """The broker aborts the workers' receiving connections mid-stream (a network failure):
    the tasks on them end (what they held comes again, uncounted), and the next tasks of
    the same Python workers open new connections. Nothing is lost; what was sent and not
    completed is removed by the target's duplicate detection."""
    broker: BrokerHandle = broker_factory(CONFIG)
    total, marked = 4000, 1000  # micro-batches of 400: the stall comes in the third
    marker = tmp_path / "stalled"
    messages = [
        ServiceBusMessage(
            b"d" * 64,
            message_id=f"d-{i}",
            application_properties={"stall": str(marker)} if i == marked else None,
        )
        for i in range(total)
    ]
    send(broker, "src", messages, per=250)
    settings = {"Bus": broker.connection_string}
    pipeline, path = app(tmp_path, DROPPED, settings)
    with streaming(spark, pipeline, path, settings, tmp_path / "checkpoint",
                   max_per_trigger=400, name="spark-dropped") as runner:  # fmt: skip
        wait_until(lambda: marker.exists() or not runner.is_alive())
        assert marker.exists(), "the marked message never held its task"
        dropped = broker.drop_receiving_connections()  # while the stalled task holds its batch
        release(marker)
    assert dropped >= 1, "no receiving connection was dropped: the test proves nothing"
    ids = broker.message_ids("dst")
    assert set(ids) == {f"d-{i}" for i in range(total)}
    assert len(ids) == total
    assert broker.count("src") == 0
