"""The pipeline runner (``SparkPipeline.stream``, ``local[2]``) with event hubs on the
embedded broker: Event Hubs -> Service Bus (each partition key a session, in order, stamped;
a second run from the checkpoint sends only what came since) and Service Bus -> Event Hubs
(each session's messages in one partition, in order), read back with the ``eventhubs``
source."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from azure.eventhub import EventData
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage

from replication import metrics
from replication.pipeline import load_pipelines
from replication.spark.progress import BATCHES
from replication.spark.runner import SparkPipeline
from replication.telemetry.lag import HOP
from tests.broker.conftest import BrokerHandle
from tests.broker.eventhubs_support import eventhub_config, eventhub_connection_string, producer
from tests.spark.support import fill, properties

pytestmark = pytest.mark.timeout(300)

CONFIG = eventhub_config(
    {
        "telemetry": {"PartitionCount": "2", "ConsumerGroups": [{"Name": "replication"}]},
        "orders-hub": {"PartitionCount": "3", "ConsumerGroups": [{"Name": "check"}]},
    },
    queues={"telemetry-sessions": {"RequiresSession": True}, "orders": {"RequiresSession": True}},
)

PIPELINES = """\
pipelines:
  - name: eh-to-sb
    source: {connection: EventHubs, eventhub: telemetry, consumer_group: replication,
             session_id_from: partition_key}
    steps:
      - filter: {condition: "skip IS NULL"}
    target: {connection: ServiceBus, queue: telemetry-sessions}
  - name: sb-to-eh
    source: {connection: ServiceBus, queue: orders, sessions: true}
    target: {connection: EventHubs, eventhub: orders-hub}
"""


def runner(spark: Any, broker: BrokerHandle, tmp_path: Path, name: str) -> SparkPipeline:
    (tmp_path / "pipelines.yaml").write_text(PIPELINES)
    settings = {"ServiceBus": broker.connection_string, "EventHubs": broker.connection_string}
    pipeline = load_pipelines(tmp_path / "pipelines.yaml", settings=settings).get(name)
    return SparkPipeline(spark, pipeline, tmp_path / "pipelines.yaml", settings)


def send_keyed(broker: BrokerHandle, keys: list[str], numbers: range) -> None:
    with producer(broker.port, "telemetry") as client:
        for key in keys:
            batch = client.create_batch(partition_key=key)
            for i in numbers:
                event = EventData(json.dumps({"key": key, "i": i}))
                event.properties = {"i": i}
                event.raw_amqp_message.properties.message_id = f"{key}-{i}"  # type: ignore[union-attr]
                batch.add(event)
            client.send_batch(batch)


def sessions_received(
    broker: BrokerHandle, queue: str, sessions: int, each: int
) -> dict[str, list[Any]]:
    """The messages of the next ``sessions`` sessions at ``queue`` (``each`` a session:
    taken), in the order they came."""
    got: dict[str, list[Any]] = defaultdict(list)
    with broker.client() as client:
        for _ in range(sessions):
            with client.get_queue_receiver(
                queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
            ) as receiver:
                messages = got[str(receiver.session.session_id)]
                while len(messages) < each:
                    batch = receiver.receive_messages(max_message_count=each, max_wait_time=5)
                    assert batch, f"session {receiver.session.session_id}: {len(messages)}"
                    for message in batch:
                        receiver.complete_message(message)
                    messages += batch
    return got


def test_event_hubs_to_service_bus_sends_each_key_as_a_session_once(
    spark: Any, tmp_path: Path
) -> None:
    broker = BrokerHandle(CONFIG, tmp_path / "broker")
    try:
        keys = ["device-1", "device-2", "device-3", "device-4"]
        send_keyed(broker, keys, range(10))
        skipped = EventData("{}")
        skipped.properties = {"skip": 1}
        with producer(broker.port, "telemetry") as client:  # filtered out by the step
            client.send_event(skipped, partition_key="device-1")
        job = runner(spark, broker, tmp_path, "eh-to-sb")
        batches = BATCHES.labels("eh-to-sb", "eh-to-sb-0")
        before, batches_before = metrics.counts("eh-to-sb"), batches._value.get()
        lag = metrics.LAG.reader()  # what the executors measured, added on the driver
        try:
            job.stream(tmp_path / "checkpoint", available_now=True, max_per_trigger=25)
            measured = lag.take()
        finally:
            lag.close()
        after = metrics.counts("eh-to-sb")
        assert after["received"] - before["received"] == 41
        assert after["forwarded"] - before["forwarded"] == 40
        hop = measured[("eh-to-sb", "target", HOP)]
        assert hop.count == 40 and 0 <= hop.minimum <= hop.maximum < 300
        assert after["filtered"] - before["filtered"] == 1
        assert batches._value.get() - batches_before == 2  # 41 events, 25 a micro-batch

        got = sessions_received(broker, "telemetry-sessions", 4, 10)
        assert sorted(got) == keys
        for key, messages in got.items():
            assert [m.message_id for m in messages] == [f"{key}-{i}" for i in range(10)]
        first = got["device-1"][0]
        props = properties(first)
        assert props["i"] == 0 and props["repl-sequence"].isdigit()
        assert props["repl-offset"].isdigit() and props["repl-enqueue-time"].endswith("Z")

        send_keyed(broker, keys[:2], range(10, 13))  # a second run: only these
        job.stream(tmp_path / "checkpoint", available_now=True, max_per_trigger=25)
        assert metrics.counts("eh-to-sb")["received"] - after["received"] == 6
        got = sessions_received(broker, "telemetry-sessions", 2, 3)
        assert {k: [m.message_id for m in v] for k, v in got.items()} == {
            key: [f"{key}-{i}" for i in range(10, 13)] for key in keys[:2]
        }
        assert broker.message_ids("telemetry-sessions") == []  # and nothing else
    finally:
        broker.stop()


def test_service_bus_to_event_hubs_keeps_each_session_in_one_partition_in_order(
    spark: Any, tmp_path: Path
) -> None:
    broker = BrokerHandle(CONFIG, tmp_path / "broker")
    try:
        sessions, per_session = 4, 10
        fill(broker, "orders", [
            ServiceBusMessage(json.dumps({"n": i}), session_id=f"s{s}", message_id=f"s{s}-{i}")
            for i in range(per_session) for s in range(sessions)
        ])  # fmt: skip
        runner(spark, broker, tmp_path, "sb-to-eh").stream(
            tmp_path / "checkpoint", available_now=True, max_per_trigger=100
        )
        options = {"connectionString": eventhub_connection_string(broker.port, "orders-hub"),
                   "consumerGroup": "check"}  # fmt: skip
        rows = spark.read.format("eventhubs").options(**options).load().collect()
        assert len(rows) == sessions * per_session
        by_session: dict[str, list[Any]] = defaultdict(list)
        for row in sorted(rows, key=lambda r: (r.partition, r.sequence_number)):
            by_session[row.partition_key].append(row)
        assert sorted(by_session) == [f"s{s}" for s in range(sessions)]
        for session, placed in by_session.items():
            assert len({r.partition for r in placed}) == 1, session
            assert [r.message_id for r in placed] == [f"{session}-{i}" for i in range(10)]
            assert {r.session_id for r in placed} == {session}
        assert bytes(by_session["s0"][0].body) == json.dumps({"n": 0}).encode()
        assert broker.message_ids("orders") == []
    finally:
        broker.stop()
