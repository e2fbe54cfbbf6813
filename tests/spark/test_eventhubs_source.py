"""The ``eventhubs`` data source in real Spark (``local[2]``) against the embedded broker's
Event Hubs face: a stream over three partitions into parquet with several micro-batches, a
restart from the checkpoint that reads only what came since, every kind of starting
position, and batch reads (ending positions, ``minPartitions``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.eventhub import EventData
from pyspark.errors import StreamingQueryException

from replication.spark.rows import EVENT_FIELDS
from tests.broker.conftest import BrokerHandle
from tests.broker.eventhubs_support import eventhub_config, eventhub_connection_string, producer

pytestmark = pytest.mark.timeout(300)

HUB = "orders"
CONFIG = eventhub_config({HUB: {"PartitionCount": "3", "ConsumerGroups": [{"Name": "spark"}]}})


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One broker for the module (its events are only ever added to)."""
    handle = BrokerHandle(CONFIG, tmp_path_factory.mktemp("eventhubs-broker"))
    yield handle
    handle.stop()


def send(hub: BrokerHandle, names: list[str], **where: Any) -> None:
    """Events with bodies ``names`` (``partition_id`` or ``partition_key`` in ``where``), a
    message-id and typed application properties each."""
    with producer(hub.port, HUB) as client:
        batch = client.create_batch(**where)
        for name in names:
            event = EventData(name)
            event.properties = {"name": name, "n": len(name), "ok": True}
            event.raw_amqp_message.properties.message_id = f"id-{name}"  # type: ignore[union-attr]
            batch.add(event)
        client.send_batch(batch)


def source(hub: BrokerHandle, **more: Any) -> dict[str, str]:
    return {"connectionString": eventhub_connection_string(hub.port, HUB),
            "consumerGroup": "spark", **{k: str(v) for k, v in more.items()}}  # fmt: skip


def run_available_now(spark: Any, options: dict[str, str], out: Path, checkpoint: Path) -> Any:
    stream = spark.readStream.format("eventhubs").options(**options).load()
    query = (stream.writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())  # fmt: skip
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return query


def test_a_stream_reads_each_partition_once_and_a_restart_reads_only_new_events(
    spark: Any, hub: BrokerHandle, tmp_path: Path
) -> None:
    first = [f"a{i}" for i in range(30)]
    send(hub, first[:12], partition_id="0")
    send(hub, first[12:20], partition_id="1")
    send(hub, first[20:], partition_key="customer-7")
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    query = run_available_now(spark, source(hub, maxEventsPerTrigger=10), out, checkpoint)
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert len(batches) == 3  # 30 events, 10 a trigger, shared by what each partition holds
    assert json.loads(batches[-1]["sources"][0]["endOffset"]) == {HUB: _ends(hub)}
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.body.decode() for r in rows) == sorted(first)
    assert len({(r.partition, r.sequence_number) for r in rows}) == 30
    for partition in ("0", "1", "2"):
        numbers = sorted(r.sequence_number for r in rows if r.partition == partition)
        assert numbers == list(range(len(numbers)))
    row = next(r for r in rows if r.body == b"a3")
    assert row.partition == "0" and row.message_id == "id-a3" and int(row.offset) >= 0
    assert row.application_properties == {"name": "a3", "n": "2", "ok": "true"}
    assert row.application_property_types == {"name": "string", "n": "int", "ok": "boolean"}
    assert row.enqueued_time is not None
    keyed = [r for r in rows if r.partition_key == "customer-7"]
    assert len(keyed) == 10 and len({r.partition for r in keyed}) == 1
    assert EVENT_FIELDS[-2:] == ["repl_sequence", "partition"]

    second = [f"b{i}" for i in range(9)]
    send(hub, second[:4], partition_id="2")
    send(hub, second[4:], partition_id="0")
    run_available_now(spark, source(hub, maxEventsPerTrigger=10), out, checkpoint)
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.body.decode() for r in rows) == sorted(first + second)  # none twice


def _ends(hub: BrokerHandle) -> dict[str, int]:
    """Where the first events end: 12 and 8 sent to partitions 0 and 1, 10 with a key."""
    from replication.broker.eventhubs.partitioning import partition_for_key

    ends = {"0": 12, "1": 8, "2": 0}
    ends[str(partition_for_key("customer-7", 3))] += 10
    return ends


def test_starting_positions_name_where_each_partition_starts(
    spark: Any, hub: BrokerHandle, tmp_path: Path
) -> None:
    """latest (nothing of what is there), a sequence number per partition (inclusive and
    not), an enqueued time, an offset."""
    before = datetime.now(UTC) - timedelta(milliseconds=50)
    send(hub, [f"p{i}" for i in range(5)], partition_id="1")
    props = _partition(hub, "1")
    first_p = props["last_enqueued_sequence_number"] - 4  # p0's sequence number
    names = lambda frame: sorted(r.body.decode() for r in frame.collect())  # noqa: E731

    latest = tmp_path / "latest"
    run_available_now(spark, source(hub, startingPosition="latest"), latest, tmp_path / "c1")
    assert names(spark.read.parquet(str(latest))) == []

    per_partition = {
        json.dumps({"ehName": HUB, "partitionId": 1}): {
            "offset": None, "seqNo": first_p + 1, "enqueuedTime": None, "isInclusive": True},
        "0": "latest", "2": "latest",
    }  # fmt: skip
    options = source(hub, startingPositions=json.dumps(per_partition))
    frame = spark.read.format("eventhubs").options(**options).load()
    assert names(frame) == ["p1", "p2", "p3", "p4"]

    exclusive = {"1": {"seqNo": first_p + 1, "isInclusive": False}, "0": "latest", "2": "latest"}
    frame = (spark.read.format("eventhubs")
             .options(**source(hub, startingPositions=json.dumps(exclusive))).load())  # fmt: skip
    assert names(frame) == ["p2", "p3", "p4"]

    since = {"enqueuedTime": before.isoformat().replace("+00:00", "Z")}
    frame = (spark.read.format("eventhubs")
             .options(**source(hub, startingPosition=json.dumps(since))).load())  # fmt: skip
    assert names(frame) == ["p0", "p1", "p2", "p3", "p4"]

    p3 = frame.where("body = cast('p3' as binary)").collect()[0]
    at_offset = {"1": {"offset": p3.offset, "isInclusive": True}, "0": "latest", "2": "latest"}
    frame = (spark.read.format("eventhubs")
             .options(**source(hub, startingPositions=json.dumps(at_offset))).load())  # fmt: skip
    assert names(frame) == ["p3", "p4"]


def test_a_batch_read_takes_a_range_and_min_partitions_cuts_it(
    spark: Any, hub: BrokerHandle
) -> None:
    send(hub, [f"r{i}" for i in range(40)], partition_id="2")
    last = _partition(hub, "2")["last_enqueued_sequence_number"]
    start = {"2": {"seqNo": last - 39}, "0": "latest", "1": "latest"}
    ending = {"seqNo": last - 10, "isInclusive": True}
    frame = (spark.read.format("eventhubs")
             .options(**source(hub, startingPositions=json.dumps(start),
                               endingPosition=json.dumps(ending), minPartitions=4))
             .load())  # fmt: skip
    assert frame.rdd.getNumPartitions() == 4
    rows = frame.collect()
    assert [r.body.decode() for r in rows] == [f"r{i}" for i in range(30)]
    assert {r.partition for r in rows} == {"2"}


def _partition(hub: BrokerHandle, partition: str) -> dict[str, Any]:
    from azure.eventhub import EventHubConsumerClient

    client = EventHubConsumerClient.from_connection_string(
        eventhub_connection_string(hub.port, HUB), consumer_group="spark"
    )
    with client:
        return dict(client.get_partition_properties(partition))


def test_a_micro_batch_that_failed_is_read_again_from_the_same_offsets(
    spark: Any, hub: BrokerHandle, tmp_path: Path
) -> None:
    """The sink fails in the second micro-batch: the query stops, and the restarted one
    reads that batch's range again (and only that: the first was committed)."""
    send(hub, [f"f{i}" for i in range(6)], partition_id="1")
    first = _partition(hub, "1")["last_enqueued_sequence_number"] - 5
    start = {"1": {"seqNo": first}, "0": "latest", "2": "latest"}
    options = source(hub, startingPositions=json.dumps(start), maxEventsPerTrigger=3)
    seen: list[tuple[int, list[str]]] = []
    failing = [True]

    def sink(frame: Any, batch_id: int) -> None:
        seen.append((batch_id, sorted(r.body.decode() for r in frame.collect())))
        if batch_id == 1 and failing:
            failing.pop()
            raise RuntimeError("the sink failed")

    def run() -> None:
        stream = spark.readStream.format("eventhubs").options(**options).load()
        query = (stream.writeStream.foreachBatch(sink)
                 .option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(availableNow=True).start())  # fmt: skip
        query.awaitTermination(120)

    with pytest.raises(StreamingQueryException, match="the sink failed"):
        run()
    run()
    again = ["f3", "f4", "f5"]
    assert seen == [(0, ["f0", "f1", "f2"]), (1, again), (1, again)]
