"""The one message model: lossless from a Functions trigger, from the SDK, back to the SDK; and
the replication stamp."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta, timezone

import azure.functions as func
import pytest
from azure.functions import meta
from azure.functions.servicebus import ServiceBusMessageInConverter
from azure.servicebus import ServiceBusMessage

from replication.messages import Message, PropertyValue, from_functions, from_received, to_sdk
from replication.tasks.stamping import ENQUEUE_TIME, SEQUENCE, hops, iso_utc, stamp
from tests.broker.conftest import BrokerHandle, make_config

ENQUEUED = datetime(2026, 11, 23, 10, 15, 30, 123456, tzinfo=UTC)


def trigger_message() -> func.ServiceBusMessage:
    """What the Functions host hands a Python function, decoded by azure-functions itself."""
    metadata = {
        "MessageId": meta.Datum("m-1", "string"),
        "SessionId": meta.Datum("s-1", "string"),
        "PartitionKey": meta.Datum("s-1", "string"),
        "CorrelationId": meta.Datum("c-1", "string"),
        "ContentType": meta.Datum("application/json", "string"),
        "Subject": meta.Datum("orders", "string"),
        "ReplyTo": meta.Datum("replies", "string"),
        "ReplyToSessionId": meta.Datum("rs-1", "string"),
        "To": meta.Datum("dest", "string"),
        "TimeToLive": meta.Datum("01:00:00", "string"),
        "EnqueuedTimeUtc": meta.Datum("2026-11-23T10:15:30.123456Z", "string"),
        "SequenceNumber": meta.Datum(42, "int"),
        "DeliveryCount": meta.Datum(3, "int"),
        "ApplicationProperties": meta.Datum(
            json.dumps({"region": "eu", "count": 7, "repl-sequence": "5"}), "json"
        ),
        "UserProperties": meta.Datum(json.dumps({"region": "eu", "count": 7}), "json"),
    }
    return ServiceBusMessageInConverter.decode(
        meta.Datum(b'{"order": 1}', "bytes"), trigger_metadata=metadata
    )


def test_from_functions_keeps_everything() -> None:
    message = from_functions(trigger_message())
    assert message.body == b'{"order": 1}'
    assert (message.message_id, message.session_id, message.partition_key) == ("m-1", "s-1", "s-1")
    assert (message.correlation_id, message.content_type, message.subject) == (
        "c-1", "application/json", "orders",
    )  # fmt: skip
    assert (message.reply_to, message.reply_to_session_id) == ("replies", "rs-1")
    assert message.to == "dest"
    assert message.time_to_live == timedelta(hours=1)
    assert message.enqueued_time == ENQUEUED
    assert (message.sequence_number, message.delivery_count) == (42, 3)
    assert message.application_properties == {"region": "eu", "count": 7, "repl-sequence": "5"}


def test_to_sdk_and_back_through_the_broker(broker_factory: object) -> None:
    broker: BrokerHandle = broker_factory(make_config({"q": {}}))  # type: ignore[operator]
    original = Message(
        body=b"\x00\x01binary", message_id="id-1", session_id=None, partition_key="pk",
        correlation_id="corr", subject="subj", content_type="application/octet-stream",
        reply_to="r", reply_to_session_id="rs", to="t", time_to_live=timedelta(minutes=5),
        application_properties={"s": "text", "i": 5, "f": 2.5, "b": False, "n": -1},
    )  # fmt: skip
    with broker.client() as client:
        with client.get_queue_sender("q") as sender:
            sender.send_messages(to_sdk(original))
        with client.get_queue_receiver("q") as receiver:
            (received,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            receiver.complete_message(received)
    back = from_received(received)
    for name in (
        "body", "message_id", "partition_key", "correlation_id", "subject", "content_type",
        "reply_to", "reply_to_session_id", "to", "time_to_live", "application_properties",
    ):  # fmt: skip
        assert getattr(back, name) == getattr(original, name), name
    assert back.sequence_number == 1 and back.delivery_count == 0
    assert back.enqueued_time is not None and back.enqueued_time.tzinfo is not None
    assert back.source is received


def test_to_sdk_drops_a_partition_key_that_conflicts_with_the_session() -> None:
    sdk = to_sdk(Message(b"x", session_id="s", partition_key="other"))
    assert isinstance(sdk, ServiceBusMessage)
    assert sdk.session_id == "s" and sdk.partition_key is None


def test_stamp_appends_on_every_hop() -> None:
    first = Message(b"x", sequence_number=7, enqueued_time=ENQUEUED, message_id="keep")
    once = stamp(first)
    assert once.application_properties == {
        ENQUEUE_TIME: "2026-11-23T10:15:30.1234560Z", SEQUENCE: "7",
    }  # fmt: skip
    later = ENQUEUED + timedelta(seconds=2)
    twice = stamp(once.copy(sequence_number=99, enqueued_time=later))
    assert twice.application_properties[ENQUEUE_TIME] == (
        "2026-11-23T10:15:30.1234560Z;2026-11-23T10:15:32.1234560Z"
    )
    assert twice.application_properties[SEQUENCE] == "7;99"
    assert hops(twice) == [("2026-11-23T10:15:30.1234560Z", "7"), (iso_utc(later), "99")]
    assert twice.message_id == "keep" and first.application_properties == {}


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        (datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "2026-01-02T03:04:05.0000000Z"),
        (datetime(2026, 1, 2, 4, 4, 5, 1, tzinfo=UTC).astimezone(), "2026-01-02T04:04:05.0000010Z"),
        (datetime(2026, 1, 2, 3, 4, 5), "2026-01-02T03:04:05.0000000Z"),  # naive = UTC
        (
            datetime(2026, 1, 2, 5, 4, 5, tzinfo=timezone(timedelta(hours=2))),
            "2026-01-02T03:04:05.0000000Z",
        ),
        (datetime.min.replace(tzinfo=UTC), "0001-01-01T00:00:00.0000000Z"),  # as .NET writes it
    ],
)
def test_iso_utc(moment: datetime, text: str) -> None:
    assert iso_utc(moment) == text


def test_copy_keeps_every_field_and_changes_only_the_named_ones() -> None:
    source = object()
    original = Message(
        **{name: f"v-{name}" for name in ("message_id", "session_id", "partition_key",
                                          "correlation_id", "subject", "content_type",
                                          "reply_to", "reply_to_session_id", "to",
                                          "dead_letter_reason", "target")},
        body=b"b", application_properties={"k": 1}, sequence_number=7, delivery_count=2,
        source=source,
    )  # fmt: skip
    copy = original.copy(subject="new")
    assert copy == dataclasses.replace(original, subject="new")
    assert copy.source is source and copy.subject == "new" and original.subject == "v-subject"
    assert copy.application_properties == {"k": 1}
    assert copy.application_properties is not original.application_properties
    with pytest.raises(TypeError, match=r"no field\(s\) colour"):
        original.copy(colour="red")


def test_with_properties_is_a_copy_holding_the_given_properties() -> None:
    """What a stamp makes: every other field as ``copy`` keeps it, the dict itself taken."""
    original = Message(b"b", message_id="m", session_id="s", to="t", sequence_number=7)
    original.application_properties = {"k": 1}
    original.source = object()
    properties: dict[str, PropertyValue] = {"k": 1, "stamp": "x"}
    replica = original.with_properties(properties)
    assert replica == original.copy(application_properties={"k": 1, "stamp": "x"})
    assert replica.application_properties is properties and replica.source is original.source
    assert original.application_properties == {"k": 1}
