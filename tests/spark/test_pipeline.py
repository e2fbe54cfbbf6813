"""Pipelines on Spark (``local[2]``, the embedded broker): the same output as the Functions /
local host path for the same input, Capture replay, and a driver killed mid-stream that
loses nothing when restarted from its checkpoint (its local executors die with it, their
connections drop, and what they held comes again at once). Executors receiving, settling,
sessions and failover: ``test_executors.py``."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage

from replication import metrics
from replication.pipeline import load_pipelines
from replication.spark.runner import SparkPipeline
from replication.telemetry.lag import HOP, PATH
from tests.broker.conftest import BrokerHandle, make_config
from tests.host.support import pipeline_app, run_app, settled
from tests.processes import Processes
from tests.spark.support import driver_env, fill, properties, received_messages

pytestmark = pytest.mark.timeout(300)

CONFIG = make_config({
    "in-host": {}, "in-spark": {}, "out-host": {}, "out-spark": {}, "rejects": {},
    "src": {"LockDuration": "PT5S"}, "dst": {"RequiresDuplicateDetection": True},
    "m-queue": {}, "merged": {},
}, topics={"m-topic": {"Subscriptions": {"replicate": {}}}})  # fmt: skip

EDITOR = """\
pipelines:
  - name: {name}
    source: {{connection: Bus, queue: in-{side}}}
    steps:
      - filter: {{condition: "n % 5 <> 0"}}
      - enrich: {{properties: {{region: eu, pipeline: editor}}, body: {{origin: shop}}}}
      - transform: {{rename: {{qty: quantity}}, drop: [price]}}
    target: {{connection: Bus, queue: out-{side}}}
"""


def orders(count: int) -> list[ServiceBusMessage]:
    return [
        ServiceBusMessage(json.dumps({"qty": i % 7 + 1, "price": 2.5}), message_id=f"o-{i}",
                          content_type="application/json",
                          application_properties={"n": i, "kind": "order"})
        for i in range(count)
    ]  # fmt: skip


def received(broker: BrokerHandle, queue: str) -> dict[str, tuple[bytes, dict[str, Any]]]:
    """message-id -> (body, properties without the stamp values, which name times)."""
    out = {}
    for message in received_messages(broker, queue):
        props = properties(message)
        stamped = {k for k in props if k.startswith("repl-")}
        assert {"repl-enqueue-time", "repl-sequence"} <= stamped
        out[str(message.message_id)] = (
            b"".join(message.body),
            {k: v for k, v in props.items() if k not in stamped},
        )
    return out


def app_folder(tmp_path: Path, broker: BrokerHandle, pipelines: str) -> Path:
    (tmp_path / "pipelines.yaml").write_text(pipelines)
    (tmp_path / "local.settings.json").write_text(json.dumps({"Values": {
        "Bus": broker.connection_string, "REPLICATION_PIPELINES": "pipelines.yaml",
    }}))  # fmt: skip
    return tmp_path


def test_an_editor_pipeline_gives_the_same_output_as_the_local_host(
    spark: Any, broker_factory: Any, tmp_path: Path
) -> None:
    broker: BrokerHandle = broker_factory(CONFIG)
    text = EDITOR.format(name="host", side="host") + EDITOR.format(
        name="spark", side="spark"
    ).removeprefix("pipelines:\n")
    folder = app_folder(tmp_path, broker, text)
    settings = {"Bus": broker.connection_string}
    loaded = load_pipelines(folder / "pipelines.yaml", settings=settings)
    fill(broker, "in-host", orders(150))
    fill(broker, "in-spark", orders(150))

    # the Functions / local host path: the generated function, run as the local host runs it
    host_app = pipeline_app(EDITOR.format(name="host", side="host"), settings)
    asyncio.run(run_app(host_app, settings, until=settled(150)))
    SparkPipeline(spark, loaded.get("spark"), folder / "pipelines.yaml", settings).stream(
        tmp_path / "checkpoint", available_now=True, max_per_trigger=100
    )
    on_host, on_spark = received(broker, "out-host"), received(broker, "out-spark")
    assert len(on_host) == 120  # every fifth filtered out
    assert on_spark == on_host
    body, props = on_spark["o-1"]
    assert json.loads(body) == {"quantity": 2, "origin": "shop"}
    assert props == {"n": 1, "kind": "order", "region": "eu", "pipeline": "editor"}


MERGE = """\
pipelines:
  - name: merge
    sources:
      - {connection: Bus, queue: m-queue}
      - {connection: Bus, topic: m-topic, subscription: replicate}
    steps:
      - validate:
          json_schema: {type: object, required: [qty]}
          on_error: route
    target: {connection: Bus, queue: merged}
    error_target: {connection: Bus, queue: rejects}
"""


def test_a_merge_of_a_queue_and_a_topic_subscription_counts_into_the_metrics(
    spark: Any, broker_factory: Any, tmp_path: Path
) -> None:
    """Two sources (two streaming queries side by side), one of them a subscription; a
    validation failure goes to the error target; the metrics come from Spark's progress,
    and so does the lag the executors measured: one value per copy the target accepted."""
    broker: BrokerHandle = broker_factory(CONFIG)
    started = time.time()
    folder = app_folder(tmp_path, broker, MERGE)
    fill(broker, "m-queue", orders(90))
    with broker.client() as client, client.get_topic_sender("m-topic") as sender:
        sender.send_messages([ServiceBusMessage(json.dumps({"qty": 1}), message_id=f"t-{i}")
                              for i in range(60)])  # fmt: skip
        sender.send_messages(ServiceBusMessage(b"{}", message_id="t-bad"))
    settings = {"Bus": broker.connection_string}
    pipeline = load_pipelines(folder / "pipelines.yaml", settings=settings).get("merge")
    before = metrics.counts("merge")
    lag = metrics.LAG.reader()  # the driver's book: executors record into their own
    try:
        SparkPipeline(spark, pipeline, folder / "pipelines.yaml", settings).stream(
            tmp_path / "checkpoint", available_now=True, max_per_trigger=50
        )
        measured = lag.take()
    finally:
        lag.close()
    elapsed = time.time() - started
    merged = broker.message_ids("merged")
    assert sorted(merged) == sorted([f"o-{i}" for i in range(90)] +
                                    [f"t-{i}" for i in range(60)])  # fmt: skip
    assert broker.message_ids("rejects") == ["t-bad"]
    with (
        broker.client() as client,
        client.get_subscription_receiver("m-topic", "replicate", max_wait_time=1) as receiver,
    ):
        assert receiver.peek_messages(10) == []  # completed by the executors once sent
    after = metrics.counts("merge")
    assert after["received"] - before["received"] == 151
    assert after["forwarded"] - before["forwarded"] == 150
    assert after["dead_lettered"] - before["dead_lettered"] == 1
    hop = measured[("merge", "target", HOP)]
    assert hop.count == after["forwarded"] - before["forwarded"] == 150
    assert 0 <= hop.minimum <= hop.total / hop.count <= hop.maximum < elapsed
    assert sum(hop.counts) == 150
    assert ("merge", "target", PATH) not in measured  # one hop
    assert 0 <= metrics.LAG.last()[("merge", "target", HOP)] < elapsed
    from replication.spark.progress import BATCHES

    batches = sum(BATCHES.labels("merge", f"merge-{i}")._value.get() for i in (0, 1))
    assert batches >= 4  # 90 and 61 messages, 50 per trigger
    # meanwhile the driver probed both sources' recovery point (spark/recovery.py)
    probed = set(metrics.RPO_MESSAGES.values())
    assert {("merge", "m-queue"), ("merge", "m-topic/subscriptions/replicate")} <= probed


def test_capture_replay_sends_the_records_through_the_pipeline(
    spark: Any, broker_factory: Any, tmp_path: Path
) -> None:
    from fastavro import parse_schema, writer

    from replication.spark.capture import CAPTURE_SCHEMA

    broker: BrokerHandle = broker_factory(CONFIG)
    folder = app_folder(
        tmp_path,
        broker,
        """\
pipelines:
  - name: replay
    source: {connection: Bus, queue: src}
    steps:
      - filter: {condition: "keep = 1"}
    target: {connection: Bus, queue: dst}
""",
    )
    records = [{
        "SequenceNumber": 1000 + i, "Offset": str(i * 10),
        "EnqueuedTimeUtc": f"11/23/2026 1:{i % 60:02d}:00 PM",
        "SystemProperties": {"message-id": f"cap-{i}"} if i % 2 else {},
        "Properties": {"keep": int(i % 4 != 0), "name": f"r{i}", "ratio": 0.25},
        "Body": f"record {i}".encode(),
    } for i in range(120)]  # fmt: skip
    capture = tmp_path / "capture" / "0" / "2026" / "11" / "23"
    capture.mkdir(parents=True)
    with (capture / "13_00_00.avro").open("wb") as handle:
        writer(handle, parse_schema(CAPTURE_SCHEMA), records)
    settings = {"Bus": broker.connection_string}
    pipeline = load_pipelines(folder / "pipelines.yaml", settings=settings).get("replay")
    sent = SparkPipeline(spark, pipeline, folder / "pipelines.yaml", settings).replay(
        str(tmp_path / "capture")
    )
    assert sent == 90
    got = received_messages(broker, "dst")
    ids = {str(m.message_id) for m in got}
    assert ids == {f"cap-{i}" if i % 2 else f"capture-{1000 + i}-{i * 10}"
                   for i in range(120) if i % 4}  # fmt: skip
    one = next(m for m in got if str(m.message_id) == "cap-1")
    props = properties(one)
    assert props["repl-sequence"] == "1001"
    assert props["repl-enqueue-time"].startswith("2026-11-23T13:01:00")
    assert (props["keep"], props["ratio"]) == (1, 0.25)


def test_a_killed_driver_loses_nothing_after_a_restart(
    spark: Any, broker_factory: Any, tmp_path: Path, processes: Processes
) -> None:
    """``python -m replication spark`` (its executors in its JVM) is SIGKILLed mid-stream;
    a driver restarted on its checkpoint (this session's: one JVM start fewer than a second
    process) gets every message there once. The runner's log has no console progress bar."""
    broker: BrokerHandle = broker_factory(CONFIG)
    folder = app_folder(
        tmp_path,
        broker,
        """\
pipelines:
  - name: copy
    source: {connection: Bus, queue: src}
    target: {connection: Bus, queue: dst}
""",
    )
    total = 2000  # the first run (micro-batches of 250) is killed once 500 arrived
    fill(broker, "src", [ServiceBusMessage(b"x" * 32, message_id=f"k-{i}") for i in range(total)])
    first = processes.start(
        [
            sys.executable,
            "-m",
            "replication",
            "spark",
            "--pipeline",
            "copy",
            "--dir",
            str(folder),
            "--max-messages-per-trigger",
            "250",
        ],
        cwd=folder,
        env=driver_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 180
    while broker.count("dst") < 500:
        assert first.poll() is None, first.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the first run moved nothing"
        time.sleep(0.2)
    first.send_signal(signal.SIGKILL)  # the driver dies mid-stream: nothing settles cleanly
    output = first.communicate(timeout=30)[0]
    assert "copy: streaming source 0" in output  # its log, into which Spark's console
    assert "[Stage " not in output  # progress bar would run
    assert broker.count("src") > 0, "the first run finished before the kill"
    settings = {"Bus": broker.connection_string}
    pipeline = load_pipelines(folder / "pipelines.yaml", settings=settings).get("copy")
    SparkPipeline(spark, pipeline, folder / "pipelines.yaml", settings).stream(
        folder / ".replication" / "spark" / "copy", available_now=True, max_per_trigger=total
    )
    ids = broker.message_ids("dst")
    assert set(ids) == {f"k-{i}" for i in range(total)}
    assert len(ids) == total  # what the first run sent twice, duplicate detection dropped
    assert broker.count("src") == 0
