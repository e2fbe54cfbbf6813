"""python-qpid-proton as an oracle: what we write proton reads back, and what proton writes we
read back, value for value and type for type; the same for whole messages."""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest
from hypothesis import given

from replication.amqp.codec import decode, encode
from replication.amqp.message import (
    BodyType,
    Header,
    Message,
    Properties,
    decode_message,
    encode_message,
)
from replication.amqp.types import (
    AMQPType,
    Array,
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

from .strategies import amqp_values, assert_same

proton = pytest.importorskip("proton")
P = proton.Data

# --------------------------------------------------------------------------------------------
# converting between proton's Python types and ours

_KIND_TO_PROTON = {
    AMQPType.NULL: P.NULL,
    AMQPType.BOOLEAN: P.BOOL,
    AMQPType.UBYTE: P.UBYTE,
    AMQPType.USHORT: P.USHORT,
    AMQPType.UINT: P.UINT,
    AMQPType.ULONG: P.ULONG,
    AMQPType.BYTE: P.BYTE,
    AMQPType.SHORT: P.SHORT,
    AMQPType.INT: P.INT,
    AMQPType.LONG: P.LONG,
    AMQPType.FLOAT: P.FLOAT,
    AMQPType.DOUBLE: P.DOUBLE,
    AMQPType.DECIMAL32: P.DECIMAL32,
    AMQPType.DECIMAL64: P.DECIMAL64,
    AMQPType.DECIMAL128: P.DECIMAL128,
    AMQPType.CHAR: P.CHAR,
    AMQPType.TIMESTAMP: P.TIMESTAMP,
    AMQPType.UUID: P.UUID,
    AMQPType.BINARY: P.BINARY,
    AMQPType.STRING: P.STRING,
    AMQPType.SYMBOL: P.SYMBOL,
    AMQPType.LIST: P.LIST,
    AMQPType.MAP: P.MAP,
    AMQPType.ARRAY: P.ARRAY,
}
_PROTON_TO_KIND = {v: k for k, v in _KIND_TO_PROTON.items()}

# (our type, proton's type): the same AMQP type on each side; exact-type dispatch both ways
_SCALARS = [
    (ubyte, proton.ubyte),
    (ushort, proton.ushort),
    (uint, proton.uint),
    (ulong, proton.ulong),
    (byte, proton.byte),
    (short, proton.short),
    (int32, proton.int32),
    (float32, proton.float32),
    (decimal32, proton.decimal32),
    (decimal64, proton.decimal64),
    (decimal128, proton.decimal128),
    (char, proton.char),
    (symbol, proton.symbol),
    (timestamp, proton.timestamp),
]
_TO_PROTON = dict(_SCALARS)
_FROM_PROTON = {theirs: ours for ours, theirs in _SCALARS}
_SHARED = (type(None), bool, int, float, str, bytes, uuid.UUID)


def to_proton(value: Any) -> Any:
    kind = type(value)
    if kind in _SHARED:
        return value
    if kind in _TO_PROTON:
        return _TO_PROTON[kind](value)
    if kind is list:
        return [to_proton(v) for v in value]
    if kind is dict:
        return {to_proton(k): to_proton(v) for k, v in value.items()}
    if kind is Described:
        return proton.Described(to_proton(value.descriptor), to_proton(value.value))
    if kind is Array:
        descriptor = proton.UNDESCRIBED if value.descriptor is None else to_proton(value.descriptor)
        return proton.Array(
            descriptor, _KIND_TO_PROTON[value.type], *(to_proton(e) for e in value.elements)
        )
    raise TypeError(f"no proton equivalent for {kind.__name__}")


def from_proton(value: Any) -> Any:
    kind = type(value)
    if kind is memoryview:  # proton's get_binary
        return bytes(value)
    if kind in _SHARED:
        return value
    if kind in _FROM_PROTON:
        return _FROM_PROTON[kind](value)
    if kind is list:
        return [from_proton(v) for v in value]
    if isinstance(value, dict):  # dict, and proton's AnnotationDict / PropertyDict
        return {from_proton(k): from_proton(v) for k, v in value.items()}
    if kind is proton.Described:
        return Described(from_proton(value.descriptor), from_proton(value.value))
    if kind is proton.Array:
        descriptor = (
            None if value.descriptor is proton.UNDESCRIBED else from_proton(value.descriptor)
        )
        return Array(
            _PROTON_TO_KIND[value.type], [from_proton(e) for e in value.elements], descriptor
        )
    raise TypeError(f"unexpected proton value {value!r} ({kind.__name__})")


def proton_encode(value: Any) -> bytes:
    data = proton.Data()
    data.put_object(to_proton(value))
    return data.encode()


def proton_decode(wire: bytes) -> Any:
    data = proton.Data()
    consumed = data.decode(wire)
    assert consumed == len(wire)
    data.rewind()
    assert data.next() is not None
    return from_proton(data.get_object())


# --------------------------------------------------------------------------------------------
# values

# Two proton 0.40 bugs kept out of the generated corpus:
# - it cannot read maps with binary keys (get_dict hashes a writable memoryview);
# - it misreads a described value whose value is described when a sibling follows it in a list,
#   even in its own encoding: d0 0000000a 00000002 00 44 00 44 40 40, the list
#   [Described(0, Described(0, None)), None], reads back without the trailing null (and inside
#   an array it may lose the array's type). See test_described_in_described.
values = amqp_values(max_leaves=25, binary_keys=False, described_in_described=False)


@given(values)
def test_proton_reads_what_we_write(value: Any) -> None:
    assert_same(proton_decode(encode(value)), value)


@given(values)
def test_we_read_what_proton_writes(value: Any) -> None:
    assert_same(decode(proton_encode(value)), value)


EDGES: list[Any] = [
    None, True, False,
    ubyte(0), ubyte(255), ushort(65535), uint(0), uint(255), uint(256), uint(2**32 - 1),
    ulong(0), ulong(255), ulong(2**64 - 1), byte(-128), short(-32768),
    int32(-(2**31)), int32(-1), int32(127), int32(128), 0, -1, 127, 128, -(2**63), 2**63 - 1,
    float32(3.4028234663852886e38), float32(-math.inf), float32(1.401298464324817e-45),
    5e-324, -math.inf, decimal32(0xFFFFFFFF), decimal64(2**64 - 1), decimal128(b"\xff" * 16),
    char("\x00"), char("\U0010ffff"), char("\U0001f600"), timestamp(-(2**63)), timestamp(2**63 - 1),
    uuid.UUID(int=2**128 - 1), b"", b"\x00" * 255, b"\x00" * 256, "", "\u00e9" * 128,
    symbol(""), symbol("s" * 256), [], [None] * 300, {}, {str(i): i for i in range(200)},
    Array(AMQPType.INT, []), Array(AMQPType.STRING, ["a", "b" * 300]),
    Array(AMQPType.BOOLEAN, [True, False]), Array(AMQPType.NULL, [None]),
    Array(AMQPType.UBYTE, [ubyte(1)] * 300), Array(AMQPType.UUID, [uuid.UUID(int=1)]),
    Array(AMQPType.SYMBOL, [symbol("a")], descriptor=symbol("x-test:arr")),
    Array(AMQPType.LIST, [[1], [], ["x"]]), Array(AMQPType.MAP, [{"a": 1}, {}]),
    Array(AMQPType.ARRAY, [Array(AMQPType.INT, [int32(1)]), Array(AMQPType.STRING, [])]),
    Described(symbol("x-test:d"), [Described(ulong(0x1_0000_0000), {"k": None})]),
    Described(symbol("x-test:a"), Described(ulong(7), Described(ulong(8), "inner"))),
]  # fmt: skip


@pytest.mark.parametrize("value", EDGES, ids=[repr(v)[:40] for v in EDGES])
def test_edges_both_directions(value: Any) -> None:
    assert_same(proton_decode(encode(value)), value)
    assert_same(decode(proton_encode(value)), value)


def test_described_in_described() -> None:
    value = [Described(ulong(0), Described(ulong(0), None)), None]
    assert encode(value) == bytes.fromhex("c0 07 02 00 44 00 44 40 40")
    assert_same(decode(proton_encode(value)), value)  # we read proton's list32 of it
    # proton (0.40) reads our bytes, and its own, without the trailing null; alone it is fine
    assert_same(proton_decode(encode(value[:1])), value[:1])


def test_nan_both_directions() -> None:
    for value in (float32(math.nan), math.nan):
        back = proton_decode(encode(value))
        assert type(back) is type(value) and math.isnan(back)
        back = decode(proton_encode(value))
        assert type(back) is type(value) and math.isnan(back)


def test_proton_writes_wide_forms_we_read() -> None:
    # proton writes maps and arrays in their 32-bit forms even when small: we must read them
    assert proton_encode({})[0] == 0xD1
    assert proton_encode(Array(AMQPType.INT, [int32(1)]))[0] == 0xF0
    assert decode(proton_encode({})) == {}


# --------------------------------------------------------------------------------------------
# messages

BODY = bytes(range(256))
APP_PROPERTIES = {
    "string": "value",
    "long": 2**40,
    "int": int32(-7),
    "bool": True,
    "double": 2.5,
    "uuid": uuid.UUID(int=12345),
    "timestamp": timestamp(1_700_000_000_000),
    "binary": b"\x00\x01",
}
ANNOTATIONS = {
    symbol("x-opt-sequence-number"): 1234567,
    symbol("x-opt-enqueued-time"): timestamp(1_700_000_000_456),
    symbol("x-opt-partition-key"): "partition-7",
    symbol("x-opt-locked-until"): timestamp(1_700_000_030_000),
}


def ours_service_bus_message(body: Any = None, body_type: BodyType = BodyType.DATA) -> Message:
    return Message(
        body=[BODY] if body is None else body,
        body_type=body_type,
        header=Header(durable=True, priority=4, ttl=60_000, delivery_count=1),
        message_annotations=dict(ANNOTATIONS),
        properties=Properties(
            message_id="message-1",
            to="queue-a",
            subject="order-created",
            reply_to="queue-b",
            correlation_id="correlation-1",
            content_type=symbol("application/json"),
            group_id="session-1",
            reply_to_group_id="session-2",
            creation_time=timestamp(1_700_000_000_000),
            absolute_expiry_time=timestamp(1_700_000_060_000),
        ),
        application_properties=dict(APP_PROPERTIES),
    )


def _proton_properties() -> dict[str, Any]:
    return {k: to_proton(v) for k, v in APP_PROPERTIES.items()}


def _proton_annotations() -> dict[Any, Any]:
    return {to_proton(k): to_proton(v) for k, v in ANNOTATIONS.items()}


def test_proton_reads_our_message() -> None:
    theirs = proton.Message()
    theirs.decode(encode_message(ours_service_bus_message()))
    assert theirs.id == "message-1"
    assert theirs.group_id == "session-1"
    assert theirs.reply_to_group_id == "session-2"
    assert theirs.correlation_id == "correlation-1"
    assert theirs.subject == "order-created"
    assert theirs.address == "queue-a"
    assert theirs.reply_to == "queue-b"
    assert theirs.content_type == "application/json"
    assert theirs.durable is True
    assert theirs.priority == 4
    assert theirs.ttl == 60.0
    assert theirs.delivery_count == 1
    assert theirs.creation_time == 1_700_000_000.0
    assert theirs.expiry_time == 1_700_000_060.0
    assert_same(from_proton(theirs.properties), APP_PROPERTIES)
    assert_same(from_proton(theirs.annotations), ANNOTATIONS)
    assert theirs.body == BODY


@pytest.mark.parametrize(
    ("body", "body_type"),
    [
        ("a string value", BodyType.VALUE),
        ({"k": [1, int32(2)]}, BodyType.VALUE),
        ([[1, "a"]], BodyType.SEQUENCE),
    ],
)
def test_proton_reads_our_other_bodies(body: Any, body_type: BodyType) -> None:
    theirs = proton.Message()
    theirs.decode(encode_message(ours_service_bus_message(body, body_type)))
    expected = body if body_type is BodyType.VALUE else body[0]
    assert_same(from_proton(theirs.body), expected)


def test_we_read_protons_message() -> None:
    theirs = proton.Message(
        body=BODY,
        inferred=True,  # binary body as a data section, not an amqp-value
        id="message-1",
        group_id="session-1",
        reply_to_group_id="session-2",
        correlation_id="correlation-1",
        subject="order-created",
        address="queue-a",
        reply_to="queue-b",
        content_type="application/json",
        durable=True,
        ttl=60.0,
        delivery_count=1,
        creation_time=1_700_000_000.0,
        properties=_proton_properties(),
        annotations=_proton_annotations(),
    )
    ours = decode_message(theirs.encode())
    assert ours.body_type is BodyType.DATA
    assert ours.body == [BODY]
    assert ours.data == BODY
    props = ours.properties
    assert props is not None
    assert props.message_id == "message-1"
    assert props.group_id == "session-1"
    assert props.reply_to_group_id == "session-2"
    assert props.correlation_id == "correlation-1"
    assert props.subject == "order-created"
    assert props.to == "queue-a"
    assert props.reply_to == "queue-b"
    assert_same(props.content_type, symbol("application/json"))
    assert_same(props.creation_time, timestamp(1_700_000_000_000))
    assert ours.header is not None
    assert ours.header.durable is True
    assert ours.header.ttl == 60_000
    assert ours.header.delivery_count == 1
    assert_same(ours.application_properties, APP_PROPERTIES)
    assert_same(ours.message_annotations, ANNOTATIONS)


@pytest.mark.parametrize(
    ("body", "inferred", "body_type", "expected"),
    [
        ("text", False, BodyType.VALUE, "text"),
        (b"bytes", False, BodyType.VALUE, b"bytes"),  # not inferred: binary as an amqp-value
        ([1, "a"], True, BodyType.SEQUENCE, [[1, "a"]]),
        ([1, "a"], False, BodyType.VALUE, [1, "a"]),
        ({"k": "v"}, False, BodyType.VALUE, {"k": "v"}),
        (None, False, BodyType.DATA, []),
    ],
)
def test_we_read_protons_other_bodies(
    body: Any, inferred: bool, body_type: BodyType, expected: Any
) -> None:
    ours = decode_message(proton.Message(body=body, inferred=inferred).encode())
    assert ours.body_type is body_type
    assert_same(ours.body, expected)


def test_message_ids_of_every_type_both_ways() -> None:
    for message_id in (ulong(7), uuid.UUID(int=7), b"binary-id", "string-id"):
        ours = Message.from_bytes(
            b"x", properties=Properties(message_id=message_id, correlation_id=message_id)
        )
        theirs = proton.Message()
        theirs.decode(encode_message(ours))
        if type(message_id) is ulong:  # proton's Message.id gives a ulong id back as an int
            assert theirs.id == message_id and theirs.correlation_id == message_id
        else:
            assert_same(from_proton(theirs.id), message_id)
            assert_same(from_proton(theirs.correlation_id), message_id)
        back = decode_message(
            proton.Message(body=b"x", inferred=True, id=to_proton(message_id)).encode()
        )
        assert back.properties is not None
        assert_same(back.properties.message_id, message_id)
