"""The unmodified sync ``azure-eventhub`` SDK against the broker's Event Hubs face:
sends (single, batch, partition key, partition id, buffered), receives from every kind of
start position, consumer groups, properties round trip, ``$management`` reads."""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from azure.core.credentials import AzureNamedKeyCredential
from azure.eventhub import (
    EventData,
    EventHubConsumerClient,
    EventHubProducerClient,
    TransportType,
)
from azure.eventhub.amqp import AmqpAnnotatedMessage
from azure.eventhub.exceptions import EventHubError

from replication.broker.auth import EMULATOR_KEY, EMULATOR_RULE_NAME
from replication.broker.clock import ManualClock
from replication.broker.eventhubs.partitioning import partition_for_key

from .conftest import BrokerHandle, concurrently
from .eventhubs_support import HUB, consumer, eventhub_config, producer, receive

StartBroker = Callable[..., BrokerHandle]


@pytest.fixture
def hub(broker_factory: StartBroker) -> BrokerHandle:
    return broker_factory(eventhub_config())


def _send(port: int, bodies: list[str], **kwargs: Any) -> None:
    with producer(port) as client:
        batch = client.create_batch(**kwargs)
        for body in bodies:
            batch.add(EventData(body))
        client.send_batch(batch)


def read_until(reader: EventHubConsumerClient, until: Callable[[], bool], **receive: Any) -> None:
    """Runs ``reader.receive(**receive)`` in a thread until ``until()`` (10 s at most), then
    closes the reader (its callbacks recorded what the test checks)."""
    worker = threading.Thread(target=reader.receive, kwargs=receive, daemon=True)
    worker.start()
    deadline = time.monotonic() + 10
    while not until() and time.monotonic() < deadline:
        time.sleep(0.05)
    reader.close()
    worker.join(10)


@pytest.mark.slow
def test_a_batch_sent_to_a_partition_is_received_from_the_start(hub: BrokerHandle) -> None:
    _send(hub.port, ["a", "b", "c"], partition_id="1")
    _send(hub.port, ["marker"], partition_id="0")  # partition 0 holds this one only
    events, zero = concurrently(
        lambda: receive(hub.port, 3, partition_id="1", starting_position="-1"),
        lambda: receive(hub.port, 1, partition_id="0", starting_position="-1"),
    )
    assert [e.body_as_str() for e in events] == ["a", "b", "c"]
    assert [e.sequence_number for e in events] == [0, 1, 2]
    offsets = [int(e.offset) for e in events]
    assert offsets[0] == 0 and offsets == sorted(offsets) and len(set(offsets)) == 3
    assert all(e.enqueued_time is not None for e in events)
    assert [e.body_as_str() for e in zero] == ["marker"]


def test_a_partition_key_keeps_its_events_in_one_partition_the_services_hash_picks(
    hub: BrokerHandle,
) -> None:
    keys = [f"customer-{n}" for n in range(6)]
    with producer(hub.port) as client:
        for key in keys:
            client.send_event(EventData(f"{key}:1"), partition_key=key)
            client.send_event(EventData(f"{key}:2"), partition_key=key)
    per_partition = {0: 0, 1: 0}
    for key in keys:
        per_partition[partition_for_key(key, 2)] += 2
    seen: dict[str, list[str]] = {}
    read = concurrently(
        lambda: receive(hub.port, per_partition[0], partition_id="0", starting_position="-1"),
        lambda: receive(hub.port, per_partition[1], partition_id="1", starting_position="-1"),
    )
    for pid, events in zip(("0", "1"), read, strict=True):
        for event in events:
            key = event.partition_key.decode()
            assert partition_for_key(key, 2) == int(pid)
            seen.setdefault(key, []).append(event.body_as_str())
    assert seen == {key: [f"{key}:1", f"{key}:2"] for key in keys}


def test_events_without_a_key_go_round_robin(hub: BrokerHandle) -> None:
    with producer(hub.port) as client:
        for n in range(4):
            client.send_event(EventData(f"e{n}"))
    zero, one = concurrently(
        lambda: receive(hub.port, 2, partition_id="0", starting_position="-1"),
        lambda: receive(hub.port, 2, partition_id="1", starting_position="-1"),
    )
    assert sorted(e.body_as_str() for e in zero + one) == ["e0", "e1", "e2", "e3"]
    assert len(zero) == len(one) == 2


@pytest.mark.slow
def test_each_start_position(hub: BrokerHandle) -> None:
    """Each position read by its own reader, all at once; ``e5``, sent once ``e4`` was read
    back (long after ``e4``'s time and a millisecond), is all a reader from that time gets."""
    _send(hub.port, [f"e{n}" for n in range(5)], partition_id="0")
    everything = receive(hub.port, 5, starting_position="-1")
    third = everything[2]
    assert third.enqueued_time is not None and everything[-1].enqueued_time is not None
    later = everything[-1].enqueued_time + datetime.timedelta(milliseconds=1)
    _send(hub.port, ["e5"], partition_id="0")
    before = third.enqueued_time - datetime.timedelta(milliseconds=1)
    positions: list[tuple[dict[str, Any], list[str]]] = [
        ({"starting_position": third.offset}, ["e3", "e4", "e5"]),
        (
            {"starting_position": third.offset, "starting_position_inclusive": True},
            ["e2", "e3", "e4", "e5"],
        ),
        ({"starting_position": 2}, ["e3", "e4", "e5"]),
        ({"starting_position": 2, "starting_position_inclusive": True}, ["e2", "e3", "e4", "e5"]),
        ({"starting_position": before}, [f"e{n}" for n in range(6)]),  # same millisecond: all
        ({"starting_position": later}, ["e5"]),
    ]
    read = concurrently(
        *(
            lambda options=options, expected=expected: receive(hub.port, len(expected), **options)
            for options, expected in positions
        )
    )
    for (options, expected), events in zip(positions, read, strict=True):
        assert [e.body_as_str() for e in events] == expected, options


def test_latest_sees_only_what_is_sent_after_the_receiver_started(hub: BrokerHandle) -> None:
    _send(hub.port, ["old"], partition_id="0")
    events = receive(
        hub.port, 1, starting_position="@latest",
        then=lambda: _send(hub.port, ["new"], partition_id="0"),
    )  # fmt: skip
    assert [e.body_as_str() for e in events] == ["new"]


def test_two_consumer_groups_read_the_same_events_and_reading_removes_nothing(
    hub: BrokerHandle,
) -> None:
    _send(hub.port, ["x", "y"], partition_id="0")
    first = receive(hub.port, 2, starting_position="-1")
    again, other = concurrently(
        lambda: receive(hub.port, 2, starting_position="-1"),
        lambda: receive(hub.port, 2, group="cg1", starting_position="-1"),
    )
    for events in (first, again, other):
        assert [e.body_as_str() for e in events] == ["x", "y"]


def test_a_consumer_of_an_unknown_group_is_told_which_exist(hub: BrokerHandle) -> None:
    errors: list[Exception] = []
    reader = consumer(hub.port, group="nope", retry_total=0)

    def on_error(_context: Any, error: Exception) -> None:
        errors.append(error)

    read_until(reader, lambda: bool(errors), on_event=lambda *_: None, on_error=on_error,
               partition_id="0")  # fmt: skip
    assert errors and "has consumer groups $Default, cg1" in str(errors[0])


def test_properties_round_trip(hub: BrokerHandle) -> None:
    event = EventData(b"\x00binary\xff")
    event.properties = {"kind": "order", "n": 7, "flag": True}
    event.content_type = "application/octet-stream"
    event.correlation_id = "corr-1"
    event.message_id = "msg-1"
    with producer(hub.port) as client:
        client.send_event(event, partition_id="1")
    (got,) = receive(hub.port, 1, partition_id="1", starting_position="-1")
    assert got.body_as_str(encoding="latin-1") == "\x00binary\xff"
    assert got.properties == {b"kind": b"order", b"n": 7, b"flag": True}
    assert (got.content_type, got.correlation_id, got.message_id) == (
        "application/octet-stream", "corr-1", "msg-1",
    )  # fmt: skip
    assert got.system_properties[b"x-opt-sequence-number"] == 0


def test_eventhub_and_partition_properties(hub: BrokerHandle) -> None:
    with producer(hub.port) as client:
        empty = client.get_partition_properties("1")
        client.send_batch([EventData("a"), EventData("bb")], partition_id="1")
        info = client.get_eventhub_properties()
        full = client.get_partition_properties("1")
        assert client.get_partition_ids() == ["0", "1"]
    assert info["eventhub_name"] == HUB and info["partition_ids"] == ["0", "1"]
    assert abs(info["created_at"].timestamp() - time.time()) < 60
    assert empty["is_empty"] and empty["last_enqueued_sequence_number"] == -1
    assert empty["beginning_sequence_number"] == -1 and empty["last_enqueued_offset"] == "-1"
    assert not full["is_empty"] and full["last_enqueued_sequence_number"] == 1
    assert full["beginning_sequence_number"] == 0 and full["id"] == "1"
    (last,) = receive(hub.port, 1, partition_id="1", starting_position=0)
    assert full["last_enqueued_offset"] == last.offset
    assert full["last_enqueued_time_utc"] == last.enqueued_time


def test_a_missing_partition_is_named(hub: BrokerHandle) -> None:
    with (
        producer(hub.port, retry_total=0) as client,
        pytest.raises(EventHubError, match="has partitions 0, 1"),
    ):
        client.get_partition_properties("7")  # the SDK checks ids only for sends and receives


def test_buffered_producer_delivers_every_event_by_key(hub: BrokerHandle) -> None:
    sent: list[EventData] = []
    failed: list[Any] = []
    client = producer(
        hub.port, buffered_mode=True, max_wait_time=0.2,
        on_success=lambda events, _pid: sent.extend(events),
        on_error=lambda events, _pid, error: failed.append(error),
    )  # fmt: skip
    with client:
        for n in range(20):
            client.send_event(EventData(f"b{n}"), partition_key=f"key-{n % 4}")
        client.flush()
    assert not failed and len(sent) == 20
    with producer(hub.port) as reader:
        counts = {
            pid: reader.get_partition_properties(pid)["last_enqueued_sequence_number"] + 1
            for pid in ("0", "1")
        }
    assert sum(counts.values()) == 20
    by_key: dict[str, list[str]] = {}
    partitions = concurrently(
        lambda: receive(hub.port, counts["0"], partition_id="0", starting_position="-1"),
        lambda: receive(hub.port, counts["1"], partition_id="1", starting_position="-1"),
    )
    for events in partitions:
        for event in events:
            by_key.setdefault(event.partition_key.decode(), []).append(event.body_as_str())
    assert by_key == {f"key-{k}": [f"b{n}" for n in range(k, 20, 4)] for k in range(4)}


def test_retention_drops_events_older_than_the_hub_keeps_them(
    broker_factory: StartBroker,
) -> None:
    handle = broker_factory(
        eventhub_config({HUB: {"PartitionCount": "1", "RetentionTimeInHours": 1}}),
        clock=ManualClock(),
    )
    _send(handle.port, ["old-1", "old-2"], partition_id="0")
    handle.advance(1800)
    _send(handle.port, ["new"], partition_id="0")
    handle.advance(1801)  # the first two are now older than an hour
    with producer(handle.port) as client:
        props = client.get_partition_properties("0")
    assert (props["beginning_sequence_number"], props["last_enqueued_sequence_number"]) == (2, 2)
    events = receive(handle.port, 1, starting_position="-1")
    assert [(e.body_as_str(), e.sequence_number) for e in events] == [("new", 2)]


def test_a_higher_owner_level_takes_the_partition(hub: BrokerHandle) -> None:
    errors: list[Exception] = []
    first = consumer(hub.port)

    def on_error(_context: Any, error: Exception) -> None:
        errors.append(error)

    worker = threading.Thread(target=first.receive, kwargs={
        "on_event": lambda *_: None, "on_error": on_error, "partition_id": "0",
        "owner_level": 1, "max_wait_time": 0.3,
    }, daemon=True)  # fmt: skip
    worker.start()
    try:
        time.sleep(1.0)  # the first reader is attached
        _send(hub.port, ["x"], partition_id="0")
        events = receive(hub.port, 1, starting_position="-1", owner_level=2)
        assert [e.body_as_str() for e in events] == ["x"]
        deadline = time.monotonic() + 10
        while not errors and time.monotonic() < deadline:
            time.sleep(0.05)
        assert errors and "higher epoch of '2'" in str(errors[0])
    finally:
        first.close()
        worker.join(10)


def test_a_consumer_can_track_where_the_partition_ends(hub: BrokerHandle) -> None:
    _send(hub.port, ["a", "b", "c"], partition_id="0")
    with producer(hub.port) as client:
        last_offset = client.get_partition_properties("0")["last_enqueued_offset"]
    seen: list[dict[str, Any]] = []
    reader = consumer(hub.port)

    def on_event(context: Any, event: EventData | None) -> None:
        if event is not None:
            seen.append(context.last_enqueued_event_properties)

    read_until(reader, lambda: len(seen) >= 3, on_event=on_event, partition_id="0",
               starting_position="-1", track_last_enqueued_event_properties=True)  # fmt: skip
    assert len(seen) == 3
    assert (seen[0]["sequence_number"], seen[0]["offset"]) == (2, last_offset)
    assert seen[0]["enqueued_time"] is not None and seen[0]["retrieval_time"] is not None


def test_a_senders_delivery_annotations_reach_the_consumer(hub: BrokerHandle) -> None:
    """As azure-eventhub's live tests check against Event Hubs (``test_send.py``): sent in a
    batch, as a list and alone; beside the runtime metric a consumer asks for."""

    def annotated(body: bytes) -> AmqpAnnotatedMessage:
        return AmqpAnnotatedMessage(
            data_body=body, delivery_annotations={"delann_key": "delann_value"}
        )

    with producer(hub.port) as client:
        batch = client.create_batch(partition_id="0")
        batch.add(annotated(b"batched"))
        client.send_batch(batch)
        client.send_batch([annotated(b"listed")], partition_id="0")
        client.send_event(annotated(b"alone"), partition_id="0")
    got: list[tuple[EventData, dict[str, Any]]] = []
    reader = consumer(hub.port)

    def on_event(context: Any, event: EventData | None) -> None:
        if event is not None:
            got.append((event, context.last_enqueued_event_properties))

    read_until(
        reader,
        lambda: len(got) >= 3,
        on_event=on_event,
        partition_id="0",
        starting_position="-1",
        track_last_enqueued_event_properties=True,
    )
    assert [b"".join(e.raw_amqp_message.body) for e, _ in got] == [b"batched", b"listed", b"alone"]
    for event, last in got:
        annotations = event.raw_amqp_message.delivery_annotations
        assert annotations[b"delann_key"] == b"delann_value"
        assert last["sequence_number"] == 2  # the runtime metric, in the same section
    for plain in receive(hub.port, 3, partition_id="0", starting_position="-1"):
        assert plain.raw_amqp_message.delivery_annotations == {b"delann_key": b"delann_value"}


def test_sas_rules_grant_send_and_listen_as_for_service_bus(broker_factory: StartBroker) -> None:
    config = eventhub_config()
    config["UserConfig"]["Namespaces"][0]["AuthorizationRules"] = [
        {"Name": "sender", "Key": "send-key", "Rights": ["Send"]},
        {"Name": "listener", "Key": "listen-key", "Rights": ["Listen"]},
    ]
    handle = broker_factory(config)

    def conn(rule: str, key: str) -> str:
        return handle.connection_string_for(rule, key) + f"EntityPath={HUB}"

    with EventHubProducerClient.from_connection_string(conn("sender", "send-key")) as client:
        client.send_event(EventData("allowed"), partition_id="0")
    refused = EventHubProducerClient.from_connection_string(
        conn("listener", "listen-key"), retry_total=0
    )
    with refused, pytest.raises(EventHubError, match="Send claim required"):
        refused.send_event(EventData("refused"), partition_id="0")
    errors: list[Exception] = []
    reader = EventHubConsumerClient.from_connection_string(
        conn("sender", "send-key"), consumer_group="$Default", retry_total=0
    )
    read_until(reader, lambda: bool(errors), on_event=lambda *_: None,
               on_error=lambda _c, e: errors.append(e), partition_id="0",
               starting_position="-1")  # fmt: skip
    assert errors and "Listen claim required" in str(errors[0])


@pytest.mark.parametrize("transport", [TransportType.Amqp, TransportType.AmqpOverWebsocket],
                         ids=lambda t: t.name)  # fmt: skip
def test_over_tls_and_websockets(hub: BrokerHandle, transport: TransportType) -> None:
    """As a client reaches a namespace: TLS (the broker's local CA) on the same port."""
    options: dict[str, Any] = {
        "fully_qualified_namespace": "localhost", "eventhub_name": HUB,
        "credential": AzureNamedKeyCredential(EMULATOR_RULE_NAME, EMULATOR_KEY),
        "custom_endpoint_address": f"sb://localhost:{hub.port}",
        "connection_verify": str(hub.data_dir / "tls" / "ca.pem"), "transport_type": transport,
    }  # fmt: skip
    with EventHubProducerClient(**options) as client:
        client.send_event(EventData(f"over {transport.name}"), partition_id="0")
        assert client.get_partition_properties("0")["last_enqueued_sequence_number"] == 0
    events: list[EventData] = []
    reader = EventHubConsumerClient(consumer_group="$Default", **options)

    def on_event(_context: Any, event: EventData | None) -> None:
        if event is not None:
            events.append(event)

    read_until(reader, lambda: bool(events), on_event=on_event, partition_id="0",
               starting_position="-1")  # fmt: skip
    assert [e.body_as_str() for e in events] == [f"over {transport.name}"]
