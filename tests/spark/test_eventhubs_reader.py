"""What the ``eventhubs`` source is made of, without Spark: our AMQP reader of a partition
range and the ``$management`` reads against the embedded broker (exact ranges, events
retention removed), the offsets' arithmetic (shares of ``maxEventsPerTrigger``, ranges cut
for ``minPartitions``) and the options' checks."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from azure.eventhub import EventData

from replication.broker.clock import ManualClock
from replication.servicebus.client import EntityNotFound
from replication.servicebus.eventhubs import DataLoss, EventHubClient, hub_source
from replication.spark.eventhub_options import EventHubOptions, Position, parse_position
from replication.spark.eventhub_ranges import EventRange, advance, from_offset, plan, to_offset
from replication.spark.options import OptionError
from tests.broker.eventhubs_support import eventhub_config, eventhub_connection_string, producer

pytestmark = pytest.mark.timeout(60)


def _send(port: int, bodies: list[str], partition_id: str = "0") -> None:
    with producer(port) as client:
        batch = client.create_batch(partition_id=partition_id)
        for body in bodies:
            batch.add(EventData(body))
        client.send_batch(batch)


async def _read(port: int, partition: str, start: int, end: int, **options: Any) -> list[Any]:
    source, hub = hub_source(eventhub_connection_string(port))
    assert hub is not None
    client = EventHubClient(source, hub, "$Default")
    try:
        return [batch async for batch in client.read(partition, start, end, **options)]
    finally:
        await source.close()


async def _properties(port: int) -> dict[str, Any]:
    source, hub = hub_source(eventhub_connection_string(port))
    assert hub is not None
    try:
        return await EventHubClient(source, hub).partitions()
    finally:
        await source.close()


def test_a_range_is_read_exactly_in_batches(broker_factory: Any) -> None:
    handle = broker_factory(eventhub_config())
    _send(handle.port, [f"e{i}" for i in range(12)], partition_id="1")
    found = asyncio.run(_properties(handle.port))
    assert (found["1"].earliest, found["1"].end) == (0, 12)
    assert (found["0"].earliest, found["0"].end, found["0"].empty) == (0, 0, True)
    batches = asyncio.run(_read(handle.port, "1", 3, 10, batch=3, prefetch=2))
    assert [e.body for b in batches for e in b] == [b"e%d" % i for i in range(3, 10)]
    assert all(1 <= len(b) <= 3 for b in batches)
    event = batches[0][0]
    assert (event.sequence_number, event.partition_id) == (3, "1")
    assert event.offset is not None and int(event.offset) > 0 and event.enqueued_time
    assert asyncio.run(_read(handle.port, "1", 5, 5)) == []


def test_events_retention_removed_fail_the_read_unless_told_to_go_on(
    broker_factory: Any,
) -> None:
    handle = broker_factory(
        eventhub_config({"eh1": {"PartitionCount": "1", "RetentionTimeInHours": 1}}),
        clock=ManualClock(),
    )
    _send(handle.port, ["old-1", "old-2"])
    handle.advance(1800)
    _send(handle.port, ["new"])
    handle.advance(1801)  # the first two are older than an hour now: gone
    with pytest.raises(DataLoss, match=r"events 0 to 1 are gone .*failOnDataLoss"):
        asyncio.run(_read(handle.port, "0", 0, 3))
    batches = asyncio.run(_read(handle.port, "0", 0, 3, fail_on_data_loss=False))
    assert [e.body for b in batches for e in b] == [b"new"]


def test_a_partition_the_hub_lacks_is_entity_not_found(broker_factory: Any) -> None:
    """The answer names no condition: its 404 stands for one (``management_link``)."""
    handle = broker_factory(eventhub_config())

    async def partition_9() -> Any:
        source, hub = hub_source(eventhub_connection_string(handle.port))
        assert hub is not None
        try:
            return await EventHubClient(source, hub).partition("9")
        finally:
            await source.close()

    with pytest.raises(EntityNotFound, match=r"partition properties of eh1: 404 The partition '9'"):
        asyncio.run(partition_9())


def test_a_trigger_s_events_are_shared_by_what_each_partition_has_waiting() -> None:
    start = {"0": 0, "1": 10, "2": 5}
    available = {"0": 12, "1": 18, "2": 15}  # waiting 12, 8, 10
    assert advance(start, available, None) == available
    assert advance(start, available, 30) == available
    assert advance(start, available, 10) == {"0": 4, "1": 13, "2": 8}  # 4 + 3 + 3
    assert advance(start, {"0": 100, "1": 11, "2": 5}, 10) == {"0": 9, "1": 11, "2": 5}
    assert advance({"0": 7, "1": 3}, {"0": 5, "1": 3}, 10) == {"0": 7, "1": 3}  # never back
    assert advance({"0": 1, "9": 4}, {"0": 3}, 1) == {"0": 2, "9": 4}  # a gone one is kept


def test_ranges_are_one_per_partition_cut_for_min_partitions() -> None:
    start, end = {"0": 0, "1": 10, "2": 5}, {"0": 12, "1": 10, "2": 8}
    assert plan(start, end) == [EventRange("0", 0, 12), EventRange("2", 5, 8)]
    cut = plan(start, end, min_partitions=5)
    assert cut == [EventRange("0", 0, 3), EventRange("0", 3, 6), EventRange("0", 6, 9),
                   EventRange("0", 9, 12), EventRange("2", 5, 8)]  # fmt: skip
    assert plan({"0": 0}, {"0": 2, "new": 5}) == [EventRange("0", 0, 2)]  # new: next batch
    offset = to_offset("Orders", {"10": 1, "2": 3})
    assert json.dumps(offset) == '{"Orders": {"2": 3, "10": 1}}'
    assert from_offset("orders", offset) == {"2": 3, "10": 1}
    with pytest.raises(ValueError, match=r"not one of event hub 'other'.*new checkpoint"):
        from_offset("other", offset)


def test_positions_and_options_follow_the_connector() -> None:
    assert parse_position("earliest", "p") == parse_position('{"offset": "-1"}', "p")
    assert parse_position('{"offset": "@latest", "seqNo": -1}', "p").kind == "latest"
    assert parse_position('{"seqNo": 7, "isInclusive": false}', "p") == Position(
        "sequence", 7, False
    )
    moment = parse_position('{"enqueuedTime": "2026-01-31T12:00:00.000Z"}', "p").value
    assert str(moment) == "2026-01-31 12:00:00+00:00"
    connection = "Endpoint=sb://localhost:5672;SharedAccessKeyName=k;SharedAccessKey=x"
    options = EventHubOptions.parse({
        "eventhubs.connectionString": connection + ";EntityPath=orders",
        "eventhubs.consumerGroup": "spark", "maxEventsPerTrigger": "50",
        "eventhubs.receiverTimeout": "PT1M30S",
        "eventhubs.startingPositions": json.dumps({
            json.dumps({"ehName": "orders", "partitionId": 2}): {"seqNo": 4},
        }),
    })  # fmt: skip
    assert (options.event_hub, options.consumer_group, options.max_events_per_trigger,
            options.receiver_timeout) == ("orders", "spark", 50, 90.0)  # fmt: skip
    assert options.start_of("2") == Position("sequence", 4) and options.start_of("0").kind == (
        "earliest"
    )
    with pytest.raises(OptionError, match="give option 'eventHub'"):
        EventHubOptions.parse({"connectionString": connection})
    with pytest.raises(OptionError, match=r"'eventHub' is 'a' but .* EntityPath is 'orders'"):
        EventHubOptions.parse({"connectionString": connection + ";EntityPath=orders",
                               "eventHub": "a"})  # fmt: skip
    with pytest.raises(OptionError, match="give one of 'offset', 'seqNo' and 'enqueuedTime'"):
        parse_position('{"seqNo": 3, "offset": "5"}', "startingPosition")
    with pytest.raises(OptionError, match="'startingPosition' is 'earliest', 'latest' or"):
        parse_position("yesterday", "startingPosition")
    with pytest.raises(OptionError, match="'maxEventsPerTrigger' must be at least 1"):
        EventHubOptions.parse({"connectionString": connection, "eventHub": "o",
                               "maxEventsPerTrigger": "0"})  # fmt: skip
