"""Every message adapter against the one table of fields (``replication.adapters.fields``).

A message with every field set goes out through each form and back: the fields the table
says the form carries come back equal, the others come back empty. The SDKs are the real
ones (``azure-servicebus`` encodes and decodes its own bytes, ``azure-functions`` holds the
trigger's message), Capture records go through a real Avro file (``fastavro``). A delivery
as Service Bus hands it over is built from the table's AMQP column, so the facts only a
broker writes (enqueued time, sequence number, lock, dead-letter reason) are read where the
table says, by our decoder and by the SDK alike.
"""

from __future__ import annotations

import dataclasses
import io
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.eventhub import EventData
from azure.eventhub._pyamqp._encode import encode_payload as encode_event_payload
from azure.eventhub._transport._pyamqp_transport import PyamqpTransport as EventHubsTransport
from azure.servicebus import ServiceBusReceivedMessage
from azure.servicebus._pyamqp._decode import decode_payload
from azure.servicebus._pyamqp._encode import encode_payload
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
from fastavro import parse_schema, reader, writer

from replication.adapters import capture, eventhubs
from replication.adapters.amqp import decode_to_message, encode
from replication.adapters.fields import FIELDS, Field
from replication.adapters.functions import from_functions, to_functions_message
from replication.adapters.sdk import from_received, to_sdk
from replication.adapters.values import text
from replication.amqp.errors import EncodeError
from replication.amqp.message import Header, Properties, decode_message, encode_message
from replication.amqp.message import Message as AmqpMessage
from replication.amqp.types import (
    Described,
    byte,
    char,
    decimal32,
    decimal64,
    decimal128,
    float32,
    int32,
    short,
    symbol,
    timestamp,
    ubyte,
    uint,
    ulong,
    ushort,
)
from replication.host import bindings
from replication.messages import Message, PropertyValue
from replication.spark import rows as spark_rows
from replication.tasks.stamping import ENQUEUE_TIME, SEQUENCE

MOMENT = datetime(2026, 11, 24, 9, 30, 15, 250000, tzinfo=UTC)
STAMPS: dict[str, PropertyValue] = {ENQUEUE_TIME: "2026-11-24T09:30:15.25Z", SEQUENCE: "41"}
WIRE_PROPERTIES: dict[str, PropertyValue] = {
    "region": "eu", "count": 7, "ratio": 1.5, "urgent": True,
    "trace": uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e"), "nothing": None, **STAMPS,
}  # fmt: skip
"""What both SDK and our encoder keep on the wire (the SDK refuses ints beyond 32 bits and
bytes that are not UTF-8; a timestamp comes back as its milliseconds: see below)."""
ROW_PROPERTIES: dict[str, PropertyValue] = {
    **WIRE_PROPERTIES, "big": 2**40, "blob": b"\xff\x00", "at": MOMENT,
    "wait": timedelta(seconds=90),
}  # fmt: skip
CAPTURE_PROPERTIES: dict[str, PropertyValue] = {
    "region": "eu", "count": 7, "ratio": 1.5, "blob": b"\xff\x00", "nothing": None, **STAMPS,
}  # fmt: skip
"""Capture's map holds long, double, string, bytes and null."""


def full(session: bool, properties: dict[str, PropertyValue]) -> Message:
    """Every field of the table set (a session's partition key is its session: none)."""
    return Message(
        body=b'{"order": 1}', message_id="m-1", session_id="s-1" if session else None,
        partition_key=None if session else "pk-1", correlation_id="c-1", subject="orders",
        content_type="application/json", to="dest", reply_to="replies",
        reply_to_session_id="rs-1", time_to_live=timedelta(hours=1),
        scheduled_enqueue_time=MOMENT + timedelta(minutes=5),
        application_properties=dict(properties),
        enqueued_time=MOMENT, sequence_number=42, delivery_count=3,
        locked_until=MOMENT + timedelta(seconds=30), dead_letter_reason="Poison",
        dead_letter_description="a step said so", dead_letter_source="orders",
    )  # fmt: skip


def values(message: Message, fields: list[Field]) -> dict[str, Any]:
    return {f.name: getattr(message, f.name) for f in fields}


def empty(value: Any) -> bool:
    return value in (None, b"", {}, 0)  # 0: a header's delivery count when none was written


# ---------------------------------------------------------------------- the real SDK


def sdk_bytes(message: Message) -> bytes:
    """What ``azure-servicebus`` puts on the wire for ``to_sdk(message)``."""
    outgoing = PyamqpTransport.to_outgoing_amqp_message(to_sdk(message).raw_amqp_message)
    return bytes(encode_payload(bytearray(), outgoing))


def sdk_received(payload: bytes) -> ServiceBusReceivedMessage:
    """The SDK's received message of a delivery's bytes (no receiver: a peek-lock message)."""
    return ServiceBusReceivedMessage(decode_payload(memoryview(payload)), receiver=None)


def through_avro(message: Message) -> Message:
    out = io.BytesIO()
    writer(out, parse_schema(capture.CAPTURE_SCHEMA), [capture.to_record(message)])
    out.seek(0)
    (record,) = list(reader(out))
    assert isinstance(record, dict)
    return capture.to_message(record)


def through_event_data(message: Message) -> Message:
    """Out as ``azure-eventhub`` sends an event, back as it receives one."""
    event = eventhubs.to_event_data(message)
    outgoing = EventHubsTransport.to_outgoing_amqp_message(event.raw_amqp_message)
    payload = bytes(encode_event_payload(bytearray(), outgoing))
    return eventhubs.from_event_data(EventData.from_bytes(payload), "0")


def through_row(message: Message) -> Message:
    return spark_rows.from_row(
        dict(zip(spark_rows.FIELDS, spark_rows.to_row(message), strict=True))
    )


def through_event_row(message: Message) -> Message:
    """Out as the ``eventhubs`` source's row, back as a row is sent; the event's own facts
    (offset, partition: ``full`` has none) ride along."""
    row = spark_rows.to_event_row(message.copy(partition_id="3", offset="4096"))
    back = spark_rows.from_row(dict(zip(spark_rows.EVENT_FIELDS, row, strict=True)))
    assert (back.partition_id, back.offset) == ("3", "4096")
    return back.copy(partition_id=None, offset=message.offset)


Form = tuple[Callable[[Field], bool], dict[str, PropertyValue], Callable[[Message], Message]]
FORMS: dict[str, Form] = {
    "amqp": (lambda f: f.sent, WIRE_PROPERTIES, lambda m: decode_to_message(encode(m))),
    "sdk": (lambda f: f.sent and bool(f.sdk), WIRE_PROPERTIES,
            lambda m: from_received(sdk_received(sdk_bytes(m)))),
    "sdk-bytes-to-amqp": (lambda f: f.sent, WIRE_PROPERTIES,
                          lambda m: decode_to_message(sdk_bytes(m))),
    "amqp-bytes-to-sdk": (lambda f: f.sent and bool(f.sdk), WIRE_PROPERTIES,
                          lambda m: from_received(sdk_received(encode(m)))),
    "functions": (lambda f: f.sent and bool(f.functions), WIRE_PROPERTIES,
                  lambda m: from_functions(to_functions_message(sdk_received(encode(m))))),
    "spark_rows": (lambda f: f.column is not None and f.servicebus, ROW_PROPERTIES, through_row),
    "spark_event_rows": (lambda f: f.column is not None and f.eventhubs, ROW_PROPERTIES,
                         through_event_row),
    "capture": (lambda f: f.capture is not None, CAPTURE_PROPERTIES, through_avro),
    # an event keeps no Service Bus annotation; its partition key goes with the send
    "eventhubs": (lambda f: f.sent and f.amqp.section != "annotations", WIRE_PROPERTIES,
                  through_event_data),
}  # fmt: skip


def test_the_table_has_every_field_a_message_exchanges() -> None:
    own = {"target", "source", "partition_id"}  # the task library's, never outside
    names = [f.name for f in FIELDS]
    assert len(names) == len(set(names))
    assert set(names) == {f.name for f in dataclasses.fields(Message)} - own


@pytest.mark.parametrize("session", [True, False], ids=["session", "partition-key"])
@pytest.mark.parametrize("form", list(FORMS))
def test_a_message_goes_out_and_back_as_the_table_says(form: str, session: bool) -> None:
    carries, properties, round_trip = FORMS[form]
    message = full(session, properties)
    back = round_trip(message)
    kept = [f for f in FIELDS if carries(f)]
    assert values(back, kept) == values(message, kept)
    lost = {f.name: getattr(back, f.name) for f in FIELDS if not carries(f)}
    assert all(empty(v) for k, v in lost.items() if k != "message_id"), lost


def test_our_encoding_keeps_what_the_sdk_cannot_send() -> None:
    """Ints beyond 32 bits and non-UTF-8 bytes: the SDK refuses them, ours sends them (as
    long and binary), and the SDK reads them back."""
    message = Message(b"x", message_id="m", application_properties={"big": 2**40, "b": b"\xff"})
    assert decode_to_message(encode(message)).application_properties == {"big": 2**40, "b": b"\xff"}
    sdk = from_received(sdk_received(encode(message)))
    assert sdk.application_properties == {"big": 2**40, "b": b"\xff"}
    with pytest.raises(ValueError, match="Value supplied for int invalid"):
        sdk_bytes(Message(b"x", message_id="m", application_properties={"big": 2**40}))
    with pytest.raises(UnicodeDecodeError, match="can't decode byte 0xff"):
        sdk_bytes(Message(b"x", message_id="m", application_properties={"b": b"\xff"}))


EVERY_AMQP_TYPE: dict[str, Any] = {
    "string": "s",
    "long": 2**40,
    "small long": 7,
    "double": 0.25,
    "boolean": True,
    "null": None,
    "uuid": uuid.UUID(int=5),
    "binary": b"\x00\xff",
    "utf-8 binary": b"abc",
    "int": int32(-70_000),
    "short": short(-300),
    "byte": byte(-3),
    "ubyte": ubyte(3),
    "ushort": ushort(300),
    "uint": uint(70_000),
    "ulong": ulong(2**64 - 1),
    "float": float32(0.5),
    "char": char("€"),
    "symbol": symbol("sym"),
    "timestamp": timestamp(1_764_000_000_123),
    "decimal32": decimal32(0x3200000C),
    "decimal64": decimal64(0x31C0000000000007),
    "decimal128": decimal128(bytes(range(16))),
    "uri": Described(symbol("com.microsoft:uri"), "https://example.com/"),
}
"""An application property of every AMQP type, as .NET's SDK writes some of them (decimal as
decimal128, char, DateTime as timestamp, Uri as a described string)."""


def typed(properties: dict[str, Any]) -> dict[str, tuple[type, Any]]:
    return {key: (type(value), value) for key, value in properties.items()}


@pytest.mark.parametrize("form", ["amqp", "spark_rows"])
def test_a_received_property_goes_out_with_its_amqp_type(form: str) -> None:
    """What a .NET reader of the copy casts to must be what the sender wrote: a long stays a
    long (the SDK's rule would send 7 as an int), a decimal128 its 16 bytes, a ulong beyond
    a long's range is sent, binary stays binary."""
    wire = encode_message(AmqpMessage(body=[b"x"], application_properties=EVERY_AMQP_TYPE))
    received = decode_to_message(wire)
    if form == "spark_rows":
        received = through_row(received)
    sent = decode_message(encode(received)).application_properties
    assert typed(sent) == typed(EVERY_AMQP_TYPE)  # the codec reads a long as a plain int


def test_an_int_only_a_ulong_holds_goes_as_a_ulong() -> None:
    """One the SDK's reader gave as a plain int (the local host's functions): a long cannot
    hold it, and the send failed for good, so the message was dead-lettered."""
    sent = encode(Message(b"x", message_id="m", application_properties={"u": 2**63}))
    assert typed(decode_message(sent).application_properties) == {"u": (ulong, 2**63)}
    with pytest.raises(EncodeError, match="does not fit"):
        encode(Message(b"x", message_id="m", application_properties={"u": 2**64}))


def test_a_timestamp_property_comes_back_as_its_milliseconds_from_both() -> None:
    message = Message(b"x", message_id="m", application_properties={"at": MOMENT})
    millis = int(MOMENT.timestamp() * 1000)
    assert decode_to_message(encode(message)).application_properties == {"at": millis}
    assert from_received(sdk_received(sdk_bytes(message))).application_properties == {"at": millis}


# ---------------------------------------------------------------------- as delivered


def delivery(message: Message) -> bytes:
    """The message as Service Bus delivers it: every field where the table's AMQP column
    puts it (annotations and dead-letter properties are the broker's to write)."""
    header: dict[str, Any] = {}
    properties: dict[str, Any] = {}
    annotations: dict[Any, Any] = {}
    application = dict(message.application_properties)
    for f in FIELDS:
        value = getattr(message, f.name)
        if f.kind == "time":
            value = timestamp.from_datetime(value)
        elif f.kind == "duration":
            value = int(value.total_seconds() * 1000)
        section, key = f.amqp.section, f.amqp.key
        if section == "header":
            header[key] = value
        elif section == "properties":
            properties[key] = value
        elif section == "annotations" and value is not None:
            annotations[key] = value
        elif section == "application" and key:
            application[key] = value
    return encode_message(AmqpMessage(
        header=Header(**header), message_annotations=annotations,
        properties=Properties(**properties), application_properties=application,
        body=[message.body],
    ))  # fmt: skip


READERS: dict[str, tuple[Callable[[Field], bool], Callable[[bytes], Message]]] = {
    "amqp": (lambda f: True, decode_to_message),
    "sdk": (lambda f: bool(f.sdk), lambda payload: from_received(sdk_received(payload))),
    "functions": (lambda f: bool(f.functions),
                  lambda payload: from_functions(to_functions_message(sdk_received(payload)))),
    # an event hub has no dead-letter queue: its reason and description stay properties
    "eventhubs": (lambda f: f.amqp.section != "application" or not f.amqp.key,
                  lambda payload: eventhubs.from_event_data(EventData.from_bytes(payload))),
}  # fmt: skip


@pytest.mark.parametrize("session", [True, False], ids=["session", "partition-key"])
@pytest.mark.parametrize("form", list(READERS))
def test_a_delivery_is_read_where_the_table_says(form: str, session: bool) -> None:
    reads, read = READERS[form]
    message = full(session, WIRE_PROPERTIES)
    message.application_properties.update(
        DeadLetterReason=message.dead_letter_reason,
        DeadLetterErrorDescription=message.dead_letter_description,
    )
    back = read(delivery(message))
    kept = [f for f in FIELDS if reads(f) and f.servicebus]
    if form != "eventhubs":  # every Service Bus form reads every field of a delivery
        assert kept == [f for f in FIELDS if f.servicebus]
    assert values(back, kept) == values(message, kept)


def through_functions_binding(payload: bytes) -> ServiceBusReceivedMessage:
    """The SDK message the Functions extension decodes (with uamqp) from the binding data."""
    content = bindings.binding_content(payload, uuid.uuid4())
    (received,) = bindings.decode([content], True, list[ServiceBusReceivedMessage])
    return received


IDENTIFIERS = ["text-id", 42, uuid.UUID(int=7), b"utf-8 binary id"]
"""What a message id or correlation id may be on the wire (string, ulong, uuid, binary)."""


@pytest.mark.parametrize("decoded", [sdk_received, through_functions_binding])
@pytest.mark.parametrize("identifier", [*IDENTIFIERS, None], ids=str)
def test_the_sdk_reader_agrees_with_the_sdks_own_getters(
    decoded: Callable[[bytes], ServiceBusReceivedMessage], identifier: Any
) -> None:
    """``from_received`` reads the properties section itself (faster); it gives what the
    SDK's getters give, made text. ``None``: a message without a properties section."""
    properties = None
    if identifier is not None:
        properties = Properties(
            message_id=identifier,
            correlation_id=identifier,
            group_id="s",
            reply_to_group_id="r",
            to="t",
            subject="x",
            content_type="c",
            reply_to="rt",
        )
    received = decoded(encode_message(AmqpMessage(properties=properties, body=[b"b"])))

    read = from_received(received)

    texts = [f for f in FIELDS if f.sdk and f.kind == "text"]
    assert {f.name: getattr(read, f.name) for f in texts} == {
        f.name: text(getattr(received, f.sdk or "")) for f in texts
    }
    if identifier is not None:
        assert read.message_id == text(identifier) and read.session_id == "s"


def test_a_capture_record_without_a_message_id_gets_one_from_its_place() -> None:
    record = capture.to_record(full(False, CAPTURE_PROPERTIES), offset="4096")
    del record["SystemProperties"]["message-id"]
    assert capture.to_message(record).message_id == "capture-42-4096"


@pytest.mark.parametrize(
    ("kind", "text", "said"),
    [
        ("ulong", "-1", "out of its range"),
        ("int", str(2**31), "out of its range"),
        ("long", str(2**63), "out of its range"),
        ("char", "ab", "not one character"),
        ("decimal128", "00ff", "not 16 bytes"),
        ("float", "half", "could not convert"),
        ("money", "1", "unknown type 'money'"),
    ],
)
def test_a_row_s_property_of_a_wrong_type_is_named(kind: str, text: str, said: str) -> None:
    """A hand-built DataFrame's ``application_property_types``: the sink says which key and
    why, before anything is sent."""
    with pytest.raises(ValueError, match=rf"application property 'p': .*{said}"):
        spark_rows.decode_properties({"p": text}, {"p": kind})


def test_a_functions_message_has_the_trigger_metadata_the_host_sends() -> None:
    """``func.ServiceBusMessage.metadata`` is the binding data by its names (it was None):
    what the Microsoft Learn trigger sample prints."""
    sent = Message(
        b"x",
        message_id="m-1",
        correlation_id="c-1",
        subject="s",
        content_type="text/plain",
        application_properties={"k": "v", "n": 7},
        time_to_live=timedelta(minutes=90),
    )
    metadata = to_functions_message(sdk_received(encode(sent))).metadata or {}
    assert metadata["MessageId"] == "m-1" and metadata["CorrelationId"] == "c-1"
    assert metadata["Subject"] == metadata["Label"] == "s"
    assert metadata["ContentType"] == "text/plain"
    assert metadata["UserProperties"] == metadata["ApplicationProperties"] == {"k": "v", "n": 7}
    assert metadata["TimeToLive"] == "01:30:00"
    assert "SequenceNumber" not in metadata  # never through a broker: none to say
