"""The ``servicebus`` data source in real Spark (``local[2]``) against the embedded broker:
streaming replication at-least-once, batch peek / receive / write, sessions kept in order."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage

from tests.broker.conftest import BrokerHandle, make_config
from tests.spark.support import fill, options, stream_available_now

pytestmark = pytest.mark.timeout(300)

CONFIG = make_config({
    "src": {}, "dst": {}, "peeked": {},
    "s-src": {"RequiresSession": True}, "s-dst": {"RequiresSession": True},
})  # fmt: skip


def test_streaming_replicates_available_now(
    spark: Any, broker_factory: Any, tmp_path: Path
) -> None:
    broker: BrokerHandle = broker_factory(CONFIG)
    total = 2000  # 5,000, with a driver killed midway: test_pipeline.py
    fill(broker, "src", [
        ServiceBusMessage(f"m-{i}".encode(), message_id=f"m-{i}",
                          application_properties={"n": i, "kind": "test", "ok": True})
        for i in range(total)
    ])  # fmt: skip
    query = stream_available_now(spark, options(broker, "src", maxMessagesPerTrigger=600),
                                 options(broker, "dst"), tmp_path / "checkpoint")  # fmt: skip
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
    assert first.application_property_types == {"n": "long", "ratio": "double",
                                                 "flag": "boolean", "name": "string"}  # fmt: skip
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


def test_sessions_keep_their_order_through_spark(
    spark: Any, broker_factory: Any, tmp_path: Path
) -> None:
    broker: BrokerHandle = broker_factory(CONFIG)
    sessions, per_session = 8, 30
    fill(broker, "s-src", [
        ServiceBusMessage(f"{s}:{n}".encode(), message_id=f"{s}-{n}", session_id=f"s{s}")
        for n in range(per_session) for s in range(sessions)
    ])  # fmt: skip
    source = options(broker, "s-src", sessions="true", maxConcurrentSessions=4,
                     maxMessagesPerTrigger=100)
    stream_available_now(spark, source, options(broker, "s-dst"), tmp_path / "checkpoint")
    order: dict[str, list[int]] = defaultdict(list)
    for message_id in broker.message_ids("s-dst"):
        session, n = str(message_id).split("-")
        order[session].append(int(n))
    assert len(order) == sessions
    for session, numbers in order.items():
        assert numbers == list(range(per_session)), session
