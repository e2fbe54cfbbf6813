"""The Functions host's Event Hubs batch, as the local host builds it from received events,
read back into messages: identity, the delivery facts, the partition and the properties (as
JSON values, which is what the host's metadata holds)."""

from __future__ import annotations

from datetime import UTC, datetime

from azure.eventhub import EventData
from azure.eventhub._pyamqp._encode import encode_payload
from azure.eventhub._transport._pyamqp_transport import PyamqpTransport

from replication.adapters.eventhubs import from_event_hub_event, to_event_data, to_event_hub_events
from replication.messages import Message

AT = datetime(2026, 11, 25, 7, 0, tzinfo=UTC)


def delivered(message: Message, sequence: int) -> EventData:
    """The event as a consumer receives it (the broker's annotations added)."""
    raw = to_event_data(message).raw_amqp_message
    raw.annotations = {
        b"x-opt-partition-key": message.partition_key, b"x-opt-offset": str(sequence * 64),
        b"x-opt-sequence-number": sequence, b"x-opt-enqueued-time": AT,
    }  # fmt: skip
    outgoing = PyamqpTransport.to_outgoing_amqp_message(raw)
    return EventData.from_bytes(bytes(encode_payload(bytearray(), outgoing)))


def test_a_batch_reads_back_as_the_events_it_was_made_of() -> None:
    sent = [
        Message(b"a", message_id="m1", session_id="s1", correlation_id="c1", subject="sub",
                content_type="text/plain", to="t", reply_to="r", reply_to_session_id="rs",
                partition_key="k1", application_properties={"n": 1, "on": True, "x": "y"}),
        Message(b"b", message_id="m2", partition_key="k2"),
    ]  # fmt: skip
    events = to_event_hub_events(
        [delivered(m, i) for i, m in enumerate(sent)], "3", "$Default", "hub"
    )  # fmt: skip
    back = [from_event_hub_event(event, i) for i, event in enumerate(events)]
    first, second = back
    assert (first.message_id, first.session_id, first.correlation_id, first.subject) == (
        "m1", "s1", "c1", "sub",
    )  # fmt: skip
    assert (first.content_type, first.to, first.reply_to, first.reply_to_session_id) == (
        "text/plain", "t", "r", "rs",
    )  # fmt: skip
    assert first.application_properties == {"n": 1, "on": True, "x": "y"}
    assert [m.partition_key for m in back] == ["k1", "k2"]
    assert [(m.sequence_number, m.offset) for m in back] == [(0, "0"), (1, "64")]
    assert all(m.enqueued_time == AT and m.partition_id == "3" for m in back)
    assert second.body == b"b" and second.session_id is None


def test_cardinality_one_gives_each_event_its_own_metadata() -> None:
    """As the Event Hubs extension binds one event: ``SystemProperties``, ``Properties``
    and the event's own fields, which ``azure.functions`` tells from a batch's arrays (a
    function reading ``event.metadata["SystemProperties"]`` failed on the batch's shape)."""
    sent = [
        Message(b"a", message_id="m1", partition_key="k1", application_properties={"n": 1}),
        Message(b"b", message_id="m2"),
    ]
    events = to_event_hub_events(
        [delivered(m, i) for i, m in enumerate(sent)], "3", "$Default", "hub", many=False
    )
    first, second = (event.metadata or {} for event in events)
    assert first["SystemProperties"]["message-id"] == "m1"
    assert first["SystemProperties"]["SequenceNumber"] == 0
    assert first["Properties"] == {"n": 1}
    assert (first["PartitionKey"], first["SequenceNumber"], first["Offset"]) == ("k1", 0, "0")
    assert first["PartitionContext"] == {
        "ConsumerGroup": "$Default",
        "EventHubName": "hub",
        "PartitionId": "3",
    }
    assert second["SystemProperties"]["message-id"] == "m2" and second["Properties"] == {}
    assert "PartitionKey" not in second
    back = [from_event_hub_event(event, 0) for event in events]  # each its own: index unused
    assert [(m.message_id, m.partition_key, m.sequence_number) for m in back] == [
        ("m1", "k1", 0),
        ("m2", None, 1),
    ]
    assert back[0].application_properties == {"n": 1}
