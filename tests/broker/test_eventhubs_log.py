"""The Event Hubs face's sans-IO parts: partition logs in SQLite, start positions, partition
keys, the ``$management`` answers and the delivery bytes (the SDK's decoder reads them)."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest
from azure.eventhub._buffered_producer._partition_resolver import generate_hash_code
from azure.eventhub._pyamqp._decode import decode_payload

from replication.broker import wire
from replication.broker.eventhubs import management
from replication.broker.eventhubs.hub import EventHub, EventHubSpec, parse_address
from replication.broker.eventhubs.log import Event, EventLog, PartitionLog
from replication.broker.eventhubs.partitioning import RoundRobin, hash_code, partition_for_key
from replication.broker.eventhubs.selector import (
    EARLIEST,
    LATEST,
    Position,
    SelectorError,
    parse_selector,
)
from replication.broker.eventhubs.wire import delivery_payload, stored_event


class Db:
    """A database like the broker's: one connection, writes in a transaction committed by
    the owner (here: the test)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.open = False

    def begin(self) -> None:
        if not self.open:
            self.conn.execute("BEGIN")
            self.open = True

    def commit(self) -> None:
        if self.open:
            self.conn.execute("COMMIT")
            self.open = False


@pytest.fixture
def db(tmp_path: Path) -> Db:
    return Db(tmp_path / "messages.db")


def _append(partition: PartitionLog, db: Db, bodies: list[bytes], now_ms: int) -> None:
    partition.append([(None, None, body) for body in bodies], now_ms)
    db.commit()
    partition.publish()


def test_appended_events_are_read_in_order_only_after_publish(db: Db) -> None:
    partition = EventLog(db.conn, db.begin).partition("hub/Partitions/0", 1_000)
    partition.append([(None, None, b"a"), ("k", None, b"bb")], 5_000)
    assert partition.read(0, 10) == []  # not committed yet: no consumer sees it
    db.commit()
    assert partition.publish()
    events = partition.read(0, 10)
    assert [(e.sequence_number, e.offset, e.bare, e.partition_key) for e in events] == [
        (0, 0, b"a", None), (1, 1, b"bb", "k"),
    ]  # fmt: skip
    assert partition.state.last_sequence_number == 1
    assert partition.state.last_offset == 1
    assert not partition.state.is_empty


def test_a_reopened_log_continues_numbering_and_keeps_its_events(db: Db) -> None:
    _append(EventLog(db.conn, db.begin).partition("hub/Partitions/0", 1), db, [b"x", b"yy"], 10)
    reopened = EventLog(db.conn, db.begin).partition("hub/Partitions/0", 99)
    assert reopened.created_ms == 1
    _append(reopened, db, [b"z"], 20)
    assert [(e.sequence_number, e.offset) for e in reopened.read(0, 10)] == [(0, 0), (1, 1), (2, 3)]


def test_uncommitted_appends_are_lost_with_the_process(db: Db) -> None:
    partition = EventLog(db.conn, db.begin).partition("hub/Partitions/0", 1)
    _append(partition, db, [b"kept"], 10)
    partition.append([(None, None, b"lost")], 11)  # never committed
    db.conn.close()  # a crash: the open transaction goes
    again = Db(db.path)
    reopened = EventLog(again.conn, again.begin).partition("hub/Partitions/0", 1)
    assert [e.bare for e in reopened.read(0, 10)] == [b"kept"]
    assert reopened.next == 1


def test_start_positions(db: Db) -> None:
    partition = EventLog(db.conn, db.begin).partition("hub/Partitions/0", 1)
    for index, body in enumerate([b"aaaa", b"bb", b"c"]):  # offsets 0, 4, 6
        _append(partition, db, [body], 1_000 * (index + 1))
    assert partition.start(EARLIEST) == 0
    assert partition.start(LATEST) == 3
    assert partition.start(Position("x-opt-offset", 4, False)) == 2
    assert partition.start(Position("x-opt-offset", 4, True)) == 1
    assert partition.start(Position("x-opt-offset", 3, True)) == 1  # the next one after 3
    assert partition.start(Position("x-opt-sequence-number", 1, False)) == 2
    assert partition.start(Position("x-opt-sequence-number", 1, True)) == 1
    assert partition.start(Position("x-opt-sequence-number", 99, True)) == 3
    assert partition.start(Position("x-opt-enqueued-time", 2_000, False)) == 2
    assert partition.start(Position("x-opt-enqueued-time", 2_000, True)) == 1
    assert partition.start(Position("x-opt-enqueued-time", 0, False)) == 0


def test_retention_cuts_the_oldest_events_and_positions_follow(db: Db) -> None:
    partition = EventLog(db.conn, db.begin).partition("hub/Partitions/0", 1)
    for index in range(5):
        _append(partition, db, [b"e%d" % index], 1_000 * index)
    assert partition.trim(2_500) == 3
    db.commit()
    assert partition.state.begin_sequence_number == 3
    assert partition.start(EARLIEST) == 3
    assert [e.sequence_number for e in partition.read(0, 10)] == [3, 4]
    assert partition.trim(2_500) == 0
    assert partition.trim(10_000) == 2
    assert partition.state.is_empty and partition.state.last_sequence_number == 4
    _append(partition, db, [b"new"], 10_000)
    assert [e.sequence_number for e in partition.read(0, 10)] == [5]


def test_enqueued_time_never_goes_back_within_a_partition(db: Db) -> None:
    partition = EventLog(db.conn, db.begin).partition("hub/Partitions/0", 1)
    _append(partition, db, [b"a"], 5_000)
    _append(partition, db, [b"b"], 4_000)  # the clock went back
    assert [e.enqueued_ms for e in partition.read(0, 10)] == [5_000, 5_000]


def test_read_stops_at_about_max_bytes_but_returns_at_least_one(db: Db) -> None:
    partition = EventLog(db.conn, db.begin).partition("hub/Partitions/0", 1)
    _append(partition, db, [b"x" * 100] * 5, 1)
    assert len(partition.read(0, 10, max_bytes=250)) == 3
    assert len(partition.read(0, 10, max_bytes=1)) == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, LATEST),
        ("amqp.annotation.x-opt-offset > '-1'", EARLIEST),
        ("amqp.annotation.x-opt-offset > '@latest'", LATEST),
        ("amqp.annotation.x-opt-offset >= '120'", Position("x-opt-offset", 120, True)),
        ("amqp.annotation.x-opt-sequence-number > '7'",
         Position("x-opt-sequence-number", 7, False)),
        ("amqp.annotation.x-opt-enqueued-time > '1700000000123'",
         Position("x-opt-enqueued-time", 1700000000123, False)),
    ],
)  # fmt: skip
def test_selector_filters_the_sdk_sends(text: str | None, expected: Position) -> None:
    assert parse_selector(text) == expected


def test_a_selector_filter_of_another_form_is_refused_with_the_form_it_takes() -> None:
    with pytest.raises(SelectorError, match=r"expected .*x-opt-offset"):
        parse_selector("amqp.annotation.x-opt-offset < '5'")
    with pytest.raises(SelectorError, match="must be a whole number, got 'abc'"):
        parse_selector("amqp.annotation.x-opt-sequence-number > 'abc'")


def test_partition_key_hash_matches_the_sdk_resolver() -> None:
    for key in ["", "a", "order-17", "customer:4711", "x" * 12, "y" * 13, "z" * 25, "üñí"]:
        if key.isascii():  # the SDK hashes characters, the service UTF-8 bytes
            assert hash_code(key) == generate_hash_code(key)
    assert hash_code("") == generate_hash_code("")
    assert {partition_for_key(f"k{n}", 4) for n in range(100)} == {0, 1, 2, 3}
    assert all(partition_for_key(f"k{n}", 4) == partition_for_key(f"k{n}", 4) for n in range(9))


def test_negative_hashes_use_the_services_remainder() -> None:
    key = next(f"k{n}" for n in range(1000) if hash_code(f"k{n}") % 3 and hash_code(f"k{n}") < 0)
    value = hash_code(key)
    assert partition_for_key(key, 3) == abs(value) % 3  # .NET: Math.Abs(value % 3)
    assert partition_for_key(key, 3) != value % 3  # Python's % would pick another


def test_round_robin_visits_every_partition_in_turn() -> None:
    robin = RoundRobin(3)
    assert [robin.next() for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_addresses() -> None:
    assert parse_address("hub").partition is None
    assert parse_address("hub/Partitions/2") == parse_address("hub/partitions/2")
    address = parse_address("hub/ConsumerGroups/$Default/Partitions/0")
    assert address is not None and (address.consumer_group, address.partition) == ("$Default", "0")
    assert parse_address("hub/Subscriptions/x") is None


def test_management_reads(db: Db) -> None:
    hub = EventHub(
        EventHubSpec("Hub", 2, ("cg",), timedelta(hours=1)), EventLog(db.conn, db.begin), 42
    )
    hubs = {"hub": hub}
    info = management.read(
        hubs, {"operation": "READ", "type": management.EVENTHUB_TYPE, "name": "hub"}
    )
    assert info["name"] == "Hub" and info["created_at"] == 42 and info["partition_count"] == 2
    assert info["partition_ids"].elements == ["0", "1"]
    props = {
        "operation": "READ",
        "type": management.PARTITION_TYPE,
        "name": "hub",
        "partition": "1",
    }
    empty = management.read(hubs, props)
    assert (empty["begin_sequence_number"], empty["last_enqueued_sequence_number"]) == (-1, -1)
    assert empty["last_enqueued_offset"] == "-1" and empty["is_partition_empty"] is True
    _append(hub.partitions[1], db, [b"abc", b"d"], 7_000)
    full = management.read(hubs, props)
    assert (full["begin_sequence_number"], full["last_enqueued_sequence_number"]) == (0, 1)
    assert full["last_enqueued_offset"] == "3" and full["last_enqueued_time_utc"] == 7_000
    assert full["is_partition_empty"] is False
    with pytest.raises(management.ManagementError, match="has partitions 0, 1"):
        management.read(hubs, {**props, "partition": "2"})
    with pytest.raises(management.ManagementError, match="'nope' could not be found"):
        management.read(hubs, {**props, "name": "nope"})


def test_a_delivery_carries_the_service_annotations_and_the_senders_bytes() -> None:
    sent = wire.parse_message(
        b"\x00\x53\x72\xc1\x1a\x02\xa3\x13x-opt-partition-key\xa1\x02pk\x00\x53\x75\xa0\x05hello"
    )
    key, annotations, bare = stored_event(sent, None)
    assert key == "pk"
    payload = delivery_payload(Event(3, 1234, 1_700_000_000_000, key, annotations, bare))
    message = decode_payload(memoryview(payload))
    assert message.message_annotations == {
        b"x-opt-partition-key": b"pk", b"x-opt-sequence-number": 3,
        b"x-opt-offset": b"1234", b"x-opt-enqueued-time": 1_700_000_000_000,
    }  # fmt: skip
    assert message.data == [b"hello"]


def test_the_routing_key_is_written_into_an_event_that_lacks_one() -> None:
    sent = wire.parse_message(b"\x00\x53\x75\xa0\x01x")
    key, annotations, _ = stored_event(sent, "outer")
    assert key == "outer" and annotations is not None and b"outer" in annotations
