"""The AMQP 1.0 type system codec: exact compact encodings, every legal encoding on read, round
trips of every primitive, container, composite and message section, and the errors."""

from __future__ import annotations

import dataclasses
import enum
import math
import re
import struct
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given

from replication.amqp import codec, types
from replication.amqp.codec import decode, decode_all, decode_at, encode
from replication.amqp.errors import DecodeError, EncodeError
from replication.amqp.message import (
    AmqpSequence,
    AmqpValue,
    ApplicationProperties,
    BodyType,
    Data,
    DeliveryAnnotations,
    Footer,
    Header,
    Message,
    MessageAnnotations,
    Properties,
    decode_message,
    encode_message,
)
from replication.amqp.outcomes import (
    Accepted,
    Coordinator,
    Declare,
    Declared,
    Discharge,
    Modified,
    Received,
    Rejected,
    Released,
    TransactionalState,
)
from replication.amqp.performatives import (
    Attach,
    Begin,
    Close,
    Detach,
    Disposition,
    End,
    Error,
    Flow,
    Open,
    SaslChallenge,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    SaslResponse,
    Transfer,
)
from replication.amqp.terminus import (
    DeleteOnClose,
    DeleteOnNoLinks,
    DeleteOnNoLinksOrMessages,
    DeleteOnNoMessages,
    Source,
    Target,
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

UUID = uuid.UUID("12345678-9abc-def0-1234-56789abcdef0")
E_ACUTE = "\u00e9"  # two bytes in UTF-8
SMILE = "\U0001f600"  # four bytes in UTF-8, outside the BMP


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


def roundtrip(value: Any) -> bytes:
    data = encode(value)
    assert_same(decode(data), value)
    return data


# --------------------------------------------------------------------------------------------
# primitives: the exact (most compact) encoding on write, and the value back on read

COMPACT: list[tuple[Any, bytes]] = [
    (None, h("40")),
    (True, h("41")),
    (False, h("42")),
    (ubyte(0), h("50 00")),
    (ubyte(255), h("50 ff")),
    (ushort(0), h("60 0000")),
    (ushort(0xFFFF), h("60 ffff")),
    (uint(0), h("43")),
    (uint(1), h("52 01")),
    (uint(255), h("52 ff")),
    (uint(256), h("70 00000100")),
    (uint(2**32 - 1), h("70 ffffffff")),
    (ulong(0), h("44")),
    (ulong(5), h("53 05")),
    (ulong(255), h("53 ff")),
    (ulong(256), h("80 0000000000000100")),
    (ulong(2**64 - 1), h("80 ffffffffffffffff")),
    (byte(-128), h("51 80")),
    (byte(127), h("51 7f")),
    (byte(-1), h("51 ff")),
    (short(-32768), h("61 8000")),
    (short(32767), h("61 7fff")),
    (int32(0), h("54 00")),
    (int32(-1), h("54 ff")),
    (int32(-128), h("54 80")),
    (int32(127), h("54 7f")),
    (int32(128), h("71 00000080")),
    (int32(-129), h("71 ffffff7f")),
    (int32(-(2**31)), h("71 80000000")),
    (int32(2**31 - 1), h("71 7fffffff")),
    (0, h("55 00")),
    (5, h("55 05")),
    (-1, h("55 ff")),
    (-128, h("55 80")),
    (127, h("55 7f")),
    (128, h("81 0000000000000080")),
    (-129, h("81 ffffffffffffff7f")),
    (-(2**63), h("81 8000000000000000")),
    (2**63 - 1, h("81 7fffffffffffffff")),
    (float32(1.5), h("72 3fc00000")),
    (float32(-0.0), h("72 80000000")),
    (float32(math.inf), h("72 7f800000")),
    (float32(-math.inf), h("72 ff800000")),
    (1.5, h("82 3ff8000000000000")),
    (-0.0, h("82 8000000000000000")),
    (math.inf, h("82 7ff0000000000000")),
    (decimal32(0x2238_0001), h("74 22380001")),
    (decimal64(0x3138_0000_0000_0001), h("84 3138000000000001")),
    (decimal128(bytes(range(16))), h("94 000102030405060708090a0b0c0d0e0f")),
    (char("a"), h("73 00000061")),
    (char(E_ACUTE), h("73 000000e9")),
    (char(SMILE), h("73 0001f600")),
    (timestamp(0), h("83 0000000000000000")),
    (timestamp(-1), h("83 ffffffffffffffff")),
    (timestamp(1_700_000_000_123), h("83 0000018bcfe5687b")),
    (UUID, h("98 123456789abcdef0123456789abcdef0")),
    (b"", h("a0 00")),
    (b"\x01\x02", h("a0 02 0102")),
    (b"\xab" * 255, h("a0 ff") + b"\xab" * 255),
    (b"\xab" * 256, h("b0 00000100") + b"\xab" * 256),
    ("", h("a1 00")),
    ("abc", h("a1 03 616263")),
    (E_ACUTE * 127, h("a1 fe") + (E_ACUTE * 127).encode()),  # 254 bytes
    (E_ACUTE * 127 + "a", h("a1 ff") + (E_ACUTE * 127 + "a").encode()),  # 255 bytes
    (E_ACUTE * 128, h("b1 00000100") + (E_ACUTE * 128).encode()),  # 256 bytes, 128 chars
    (SMILE * 63 + "abc", h("a1 ff") + (SMILE * 63 + "abc").encode()),  # 255 bytes
    (SMILE * 64, h("b1 00000100") + (SMILE * 64).encode()),  # 256 bytes, 64 chars
    (symbol(""), h("a3 00")),
    (symbol("amqp:accepted:list"), h("a3 12") + b"amqp:accepted:list"),
    (symbol("s" * 255), h("a3 ff") + b"s" * 255),
    (symbol("s" * 256), h("b3 00000100") + b"s" * 256),
    ([], h("45")),
    ([None], h("c0 02 01 40")),
    ([1, "a"], h("c0 06 02 55 01 a1 01 61")),
    ([None] * 254, h("c0 ff fe") + b"\x40" * 254),  # size byte 255: the largest list8
    ([None] * 255, h("d0 00000103 000000ff") + b"\x40" * 255),
    ([None] * 300, h("d0 00000130 0000012c") + b"\x40" * 300),
    ([b"\x00" * 300], h("d0 00000135 00000001 b0 0000012c") + b"\x00" * 300),
    ({}, h("c1 01 00")),
    ({"a": 1}, h("c1 06 02 a1 01 61 55 01")),
    ({symbol("k"): None, uint(1): [True]}, h("c1 0b 04 a3 01 6b 40 52 01 c0 02 01 41")),
    (Array(AMQPType.INT, []), h("e0 02 00 71")),
    (Array(AMQPType.INT, [int32(1), int32(-1)]), h("e0 0a 02 71 00000001 ffffffff")),
    (Array(AMQPType.UINT, [uint(0), uint(7)]), h("e0 0a 02 70 00000000 00000007")),
    (Array(AMQPType.ULONG, [ulong(1)]), h("e0 0a 01 80 0000000000000001")),
    (Array(AMQPType.LONG, [1]), h("e0 0a 01 81 0000000000000001")),
    (Array(AMQPType.BOOLEAN, [True, False]), h("e0 04 02 56 01 00")),
    (Array(AMQPType.STRING, ["a", ""]), h("e0 05 02 a1 01 61 00")),
    (Array(AMQPType.SYMBOL, [symbol("a")]), h("e0 04 01 a3 01 61")),
    (Array(AMQPType.BINARY, [b"\x00" * 256]), h("f0 00000109 00000001 b0 00000100") + bytes(256)),
    (Array(AMQPType.UBYTE, [ubyte(1)] * 253), h("e0 ff fd 50") + b"\x01" * 253),
    (Array(AMQPType.UBYTE, [ubyte(1)] * 254), h("f0 00000103 000000fe 50") + b"\x01" * 254),
    (Array(AMQPType.UBYTE, [ubyte(1)] * 256), h("f0 00000105 00000100 50") + b"\x01" * 256),
    (Array(AMQPType.LIST, []), h("e0 02 00 d0")),
    (Array(AMQPType.LIST, [[], [None]]), h("e0 13 02 d0 00000004 00000000 00000005 00000001 40")),
    (Array(AMQPType.MAP, [{}]), h("e0 0a 01 d1 00000004 00000000")),
    (
        Array(AMQPType.ARRAY, [Array(AMQPType.BOOLEAN, [True])]),
        h("e0 0c 01 f0 00000006 00000001 56 01"),
    ),
    (
        Array(AMQPType.SYMBOL, [symbol("a")], descriptor=ulong(0x99)),
        h("e0 07 01 00 53 99 a3 01 61"),
    ),
    (Described(symbol("x"), None), h("00 a3 01 78 40")),
    (Described(ulong(0x1_3700_0000), "v"), h("00 80 0000000137000000 a1 01 76")),
    (Described(ulong(0xFF), [ulong(1)]), h("00 53 ff c0 03 01 53 01")),
]


@pytest.mark.parametrize(("value", "wire"), COMPACT, ids=[repr(v)[:40] for v, _ in COMPACT])
def test_compact_encoding(value: Any, wire: bytes) -> None:
    assert encode(value) == wire
    assert_same(decode(wire), value)


def test_decoded_types_are_markers() -> None:
    assert type(decode(encode(uint(7)))) is uint
    assert type(decode(encode(ulong(7)))) is ulong
    assert type(decode(encode(int32(7)))) is int32
    assert type(decode(encode(7))) is int
    assert type(decode(encode(1.0))) is float
    assert type(decode(encode(float32(1.0)))) is float32
    assert type(decode(encode("s"))) is str
    assert type(decode(encode(symbol("s")))) is symbol
    assert type(decode(encode(char("s")))) is char
    assert type(decode(encode(b"s"))) is bytes
    assert type(decode(encode(timestamp(1)))) is timestamp
    assert type(decode(encode(decimal128(bytes(16))))) is decimal128
    assert type(decode(encode(True))) is bool


def test_nan() -> None:
    for value in (float32(math.nan), math.nan):
        back = decode(encode(value))
        assert type(back) is type(value)
        assert math.isnan(back)
    back = decode(encode(Array(AMQPType.FLOAT, [float32(math.nan)])))
    assert type(back[0]) is float32 and math.isnan(back[0])


def test_float32_rounds_to_nearest() -> None:
    back = decode(encode(float32(0.1)))
    assert back == struct.unpack(">f", struct.pack(">f", 0.1))[0]


# Legal but non-compact encodings (other peers write these): each must read as the same value.
LOOSE: list[tuple[bytes, Any]] = [
    (h("56 00"), False),
    (h("56 01"), True),
    (h("70 00000000"), uint(0)),
    (h("52 00"), uint(0)),
    (h("70 00000005"), uint(5)),
    (h("80 0000000000000000"), ulong(0)),
    (h("53 00"), ulong(0)),
    (h("80 0000000000000005"), ulong(5)),
    (h("81 0000000000000000"), 0),
    (h("81 ffffffffffffffff"), -1),
    (h("71 ffffffff"), int32(-1)),
    (h("71 00000000"), int32(0)),
    (h("b0 00000000"), b""),
    (h("b0 00000002 0102"), b"\x01\x02"),
    (h("b1 00000001 61"), "a"),
    (h("b1 00000000"), ""),
    (h("b3 00000001 61"), symbol("a")),
    (h("b3 00000000"), symbol("")),
    (h("c0 01 00"), []),
    (h("d0 00000004 00000000"), []),
    (h("d0 00000005 00000001 40"), [None]),
    (h("d0 00000010 00000002 a1 01 61 81 0000000000000001"), ["a", 1]),
    (h("c1 01 00"), {}),
    (h("d1 00000004 00000000"), {}),
    (h("d1 00000009 00000002 a3 01 61 55 01"), {symbol("a"): 1}),
    (h("d1 0000000c 00000002 b3 00000001 61 55 01"), {symbol("a"): 1}),
    (h("f0 00000005 00000000 71"), Array(AMQPType.INT, [])),
    (h("f0 00000009 00000001 71 00000002"), Array(AMQPType.INT, [int32(2)])),
    (h("e0 04 02 54 01 ff"), Array(AMQPType.INT, [int32(1), int32(-1)])),
    (h("e0 04 02 52 01 02"), Array(AMQPType.UINT, [uint(1), uint(2)])),
    (h("e0 04 02 53 01 02"), Array(AMQPType.ULONG, [ulong(1), ulong(2)])),
    (h("e0 04 02 55 01 ff"), Array(AMQPType.LONG, [1, -1])),
    (h("e0 02 01 43"), Array(AMQPType.UINT, [uint(0)])),
    (h("e0 02 01 44"), Array(AMQPType.ULONG, [ulong(0)])),
    (h("e0 02 01 41"), Array(AMQPType.BOOLEAN, [True])),
    (h("e0 02 01 42"), Array(AMQPType.BOOLEAN, [False])),
    (h("e0 02 01 40"), Array(AMQPType.NULL, [None])),
    (h("f0 0000000a 00000001 b1 00000001 61"), Array(AMQPType.STRING, ["a"])),
    (h("f0 00000008 00000002 a3 01 61 00"), Array(AMQPType.SYMBOL, [symbol("a"), symbol("")])),
    (
        h("f0 0000000c 00000001 00 53 05 71 00000001"),
        Array(AMQPType.INT, [int32(1)], descriptor=ulong(5)),
    ),
    (h("e0 05 01 c0 02 01 40"), Array(AMQPType.LIST, [[None]])),
    (h("e0 06 02 c1 01 00 01 00"), Array(AMQPType.MAP, [{}, {}])),
    (h("e0 06 01 e0 03 01 50 07"), Array(AMQPType.ARRAY, [Array(AMQPType.UBYTE, [ubyte(7)])])),
    (h("00 80 0000000000000005 40"), Described(ulong(5), None)),
    (h("00 b3 00000001 78 40"), Described(symbol("x"), None)),
]


@pytest.mark.parametrize(("wire", "value"), LOOSE, ids=[w.hex()[:40] for w, _ in LOOSE])
def test_non_compact_encodings_decode(wire: bytes, value: Any) -> None:
    assert_same(decode(wire), value)


def test_decode_accepts_buffers() -> None:
    wire = encode([1, "a", b"b"])
    assert decode(bytearray(wire)) == [1, "a", b"b"]
    assert decode(memoryview(wire)) == [1, "a", b"b"]


def test_decode_at_and_decode_all() -> None:
    wire = encode(1) + encode("two") + encode([uint(3)])
    value, pos = decode_at(wire, 0)
    assert (value, pos) == (1, 2)
    value, pos = decode_at(wire, pos)
    assert (value, pos) == ("two", 7)
    assert_same(decode_all(wire), [1, "two", [uint(3)]])
    assert decode_all(b"") == []


def test_python_conveniences() -> None:
    class Colour(enum.IntEnum):
        RED = 3

    assert encode(Colour.RED) == encode(3)
    assert encode((1, 2)) == encode([1, 2])
    assert encode(bytearray(b"ab")) == encode(b"ab")
    assert encode(memoryview(b"ab")) == encode(b"ab")
    moment = datetime(2024, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC)
    assert_same(decode(encode(moment)), timestamp(1704164645678))
    assert timestamp(1704164645678).to_datetime() == moment
    assert timestamp.from_datetime(datetime(1969, 12, 31, 23, 59, 59)) == -1000
    assert_same(decode(encode(timestamp(-1000))), timestamp(-1000))


# --------------------------------------------------------------------------------------------
# containers


def test_nested_containers() -> None:
    value = {
        symbol("list"): [1, [2, [3, [uint(4), {}]]], Array(AMQPType.STRING, ["x"])],
        "map": {ubyte(1): {short(-2): {None: [char("c")]}}},
        uint(7): Described(symbol("x-test:d"), {"inner": Described(ulong(0x99), [[], {}])}),
        (b"k"): Array(AMQPType.ARRAY, [Array(AMQPType.MAP, [{1: [2]}]), Array(AMQPType.LIST, [])]),
    }
    wire = roundtrip(value)
    assert wire[0] == 0xC1 or wire[0] == 0xD1


def test_list32_map32_boundaries() -> None:
    for n in (254, 255, 256, 300, 70_000):
        roundtrip(list(range(n)))
        roundtrip({i: str(i) for i in range(n)})
    big = {"k" * 200: "v" * 200}  # one entry, more than 255 bytes
    assert encode(big)[0] == 0xD1
    roundtrip(big)


@pytest.mark.parametrize("kind", [k for k in AMQPType if k != AMQPType.NULL])
def test_arrays_of_every_type(kind: AMQPType) -> None:
    samples: dict[AMQPType, list[Any]] = {
        AMQPType.BOOLEAN: [True, False, True],
        AMQPType.UBYTE: [ubyte(0), ubyte(255)],
        AMQPType.USHORT: [ushort(0), ushort(65535)],
        AMQPType.UINT: [uint(0), uint(1), uint(2**32 - 1)],
        AMQPType.ULONG: [ulong(0), ulong(2**64 - 1)],
        AMQPType.BYTE: [byte(-128), byte(127)],
        AMQPType.SHORT: [short(-32768), short(32767)],
        AMQPType.INT: [int32(-(2**31)), int32(0), int32(2**31 - 1)],
        AMQPType.LONG: [-(2**63), 0, 2**63 - 1],
        AMQPType.FLOAT: [float32(1.5), float32(-math.inf)],
        AMQPType.DOUBLE: [1.5, -0.0, math.inf],
        AMQPType.DECIMAL32: [decimal32(0), decimal32(0xFFFFFFFF)],
        AMQPType.DECIMAL64: [decimal64(0), decimal64(2**64 - 1)],
        AMQPType.DECIMAL128: [decimal128(bytes(16)), decimal128(b"\xff" * 16)],
        AMQPType.CHAR: [char("a"), char(SMILE)],
        AMQPType.TIMESTAMP: [timestamp(-1), timestamp(1_700_000_000_000)],
        AMQPType.UUID: [UUID, uuid.UUID(int=0)],
        AMQPType.BINARY: [b"", b"\x00" * 300],
        AMQPType.STRING: ["", E_ACUTE * 200],
        AMQPType.SYMBOL: [symbol(""), symbol("a" * 300)],
        AMQPType.LIST: [[], [1, "a"], [None] * 300],
        AMQPType.MAP: [{}, {"a": [1]}],
        AMQPType.ARRAY: [Array(AMQPType.INT, []), Array(AMQPType.STRING, ["a"] * 100)],
    }
    elements = samples[kind]
    for n in range(len(elements) + 1):  # the empty array too
        roundtrip(Array(kind, elements[:n]))
    roundtrip(Array(kind, elements, descriptor=symbol("x-test:described")))
    roundtrip(Array(kind, elements, descriptor=ulong(0x1234_5678_9ABC)))
    roundtrip([Array(kind, elements), {"a": Array(kind, elements)}])


def test_array_of_one_null() -> None:
    assert encode(Array(AMQPType.NULL, [None])) == h("e0 02 01 40")
    roundtrip(Array(AMQPType.NULL, []))
    roundtrip(Array(AMQPType.NULL, [None]))


def test_array_of_many_nulls() -> None:
    # python-qpid-proton writes an array of three nulls as f0 00000005 00000003 40: zero-width
    # elements, so the count exceeds the bytes. Our own encoder writes e0 02 03 40 for it.
    assert_same(decode(h("f0 00000005 00000003 40")), Array(AMQPType.NULL, [None] * 3))
    roundtrip(Array(AMQPType.NULL, [None] * 3))


def test_array8_array32_boundary() -> None:
    # array8 needs 1 (count) + 1 (constructor) + 4 * n < 256: 63 ints fit, 64 do not
    for n, code in ((62, 0xE0), (63, 0xE0), (64, 0xF0), (300, 0xF0)):
        wire = roundtrip(Array(AMQPType.INT, [int32(i) for i in range(n)]))
        assert wire[0] == code
    assert roundtrip(Array(AMQPType.BOOLEAN, [True] * 256))[0] == 0xF0
    # one long element string makes every element use str32
    wire = roundtrip(Array(AMQPType.STRING, ["a", "b" * 256]))
    assert wire[:10] == h("f0 0000010e 00000002 b1")


def test_described_values() -> None:
    roundtrip(Described(symbol("com.example:thing"), {"a": 1}))
    roundtrip(Described(ulong(0x0000_0137_0000_0001), [1, 2]))
    roundtrip(Described(Described(symbol("x-test:outer"), None), 5))  # described descriptor
    roundtrip({Described(symbol("x-test:k"), [1]): "described key"})
    roundtrip({Array(AMQPType.INT, [int32(1)]): "array key"})


@given(amqp_values())
def test_roundtrip_generated(value: Any) -> None:
    wire = encode(value)
    back = decode(wire)
    assert_same(back, value)
    assert encode(back) == wire


# --------------------------------------------------------------------------------------------
# errors

OUT_OF_RANGE = [  # (value, what the EncodeError says)
    (ubyte(256), "256 does not fit an AMQP ubyte"),
    (ubyte(-1), "-1 does not fit an AMQP ubyte"),
    (ushort(65536), "65536 does not fit an AMQP ushort"),
    (ushort(-1), "-1 does not fit an AMQP ushort"),
    (uint(-1), "-1 does not fit an AMQP uint"),
    (uint(2**32), "4294967296 does not fit an AMQP uint"),
    (ulong(-1), "-1 does not fit an AMQP ulong"),
    (ulong(2**64), "18446744073709551616 does not fit an AMQP ulong"),
    (byte(128), "128 does not fit an AMQP byte"),
    (byte(-129), "-129 does not fit an AMQP byte"),
    (short(32768), "32768 does not fit an AMQP short"),
    (short(-32769), "-32769 does not fit an AMQP short"),
    (int32(2**31), "2147483648 does not fit an AMQP int"),
    (int32(-(2**31) - 1), "-2147483649 does not fit an AMQP int"),
    (2**63, "9223372036854775808 does not fit an AMQP long"),
    (-(2**63) - 1, "-9223372036854775809 does not fit an AMQP long"),
    (timestamp(2**63), "9223372036854775808 does not fit an AMQP timestamp"),
    (timestamp(-(2**63) - 1), "-9223372036854775809 does not fit an AMQP timestamp"),
    (symbol(E_ACUTE), "AMQP symbol must be ASCII"),
    (symbol("a" + SMILE), "AMQP symbol must be ASCII"),
    (char("ab"), "AMQP char holds one code point, got 2"),
    (char(""), "AMQP char holds one code point, got 0"),
    (char("\ud800"), "AMQP char cannot hold the surrogate 0xd800"),
    ("lone surrogate \ud800", "AMQP string cannot hold a lone surrogate"),
    (float32(1e300), "float32(1e+300) does not fit an AMQP float"),
    (float32(-1e39), "float32(-1e+39) does not fit an AMQP float"),
    (decimal128(b"short"), "decimal128 needs 16 bytes, got 5"),
    (object(), "no AMQP encoding for Python type object"),
    ({1, 2}, "no AMQP encoding for Python type set"),
    ([1, object()], "no AMQP encoding for Python type object"),
    ({"k": {1, 2}}, "no AMQP encoding for Python type set"),
    (Array(AMQPType.UBYTE, [256]), "array of UBYTE: cannot encode an element"),
    (Array(AMQPType.INT, [2**31]), "array of INT: cannot encode an element"),
    (Array(AMQPType.LONG, [2**63]), "array of LONG: cannot encode an element"),
    (Array(AMQPType.ULONG, [-1]), "array of ULONG: cannot encode an element"),
    (Array(AMQPType.FLOAT, [1e300]), "array of FLOAT: cannot encode an element"),
    (Array(AMQPType.SYMBOL, [E_ACUTE]), "AMQP symbol must be ASCII"),
    (Array(AMQPType.STRING, ["\udfff"]), "array of STRING: cannot encode an element"),
    (Array(AMQPType.CHAR, ["\ud800"]), "AMQP char cannot hold the surrogate 0xd800"),
    (Array(AMQPType.NULL, [1]), "an array of null holds only None, got 1"),
    (Array(AMQPType.DECIMAL128, [decimal128(b"short")]), "decimal128 needs 16 bytes, got 5"),
    (Described(symbol("x"), object()), "no AMQP encoding for Python type object"),
]


def _stable_id(value: Any) -> str:
    """repr without memory addresses, so every pytest-xdist worker collects the same ids."""
    return re.sub(r" at 0x[0-9a-f]+", "", repr(value))[:40]


@pytest.mark.parametrize(
    ("value", "message"), OUT_OF_RANGE, ids=[_stable_id(v) for v, _ in OUT_OF_RANGE]
)
def test_unencodable_values_raise_encode_error(value: Any, message: str) -> None:
    with pytest.raises(EncodeError, match="^" + re.escape(message)):
        encode(value)


TRUNCATED = "truncated AMQP encoding: the value at offset 0 runs past the data's end"
MALFORMED = [  # (wire, what the DecodeError says)
    (b"", "no AMQP value at offset 0: the data ends there"),
    (h("01"), "invalid constructor 0x01 at offset 0"),
    (h("ff"), "invalid constructor 0xff at offset 0"),
    (h("52"), TRUNCATED),  # smalluint without its byte
    (h("70 0000"), TRUNCATED),
    (h("80 00"), TRUNCATED),
    (h("94 00"), "truncated AMQP encoding: a value needs 17 bytes, the data holds 2"),
    (h("98 0011"), "truncated AMQP encoding: a value needs 17 bytes, the data holds 3"),
    (h("56 02"), "boolean byte must be 0 or 1, got 2"),
    (h("a1 05 6162"), "string overruns the buffer"),
    (h("a1 01 ff"), "string is not UTF-8"),
    (h("b1 ffffffff"), "string overruns the buffer"),
    (h("a3 01 e9"), "symbol is not ASCII"),
    (h("73 0000d800"), "char 0xd800 is not a Unicode scalar value"),  # surrogate
    (h("73 00110000"), "char 0x110000 is not a Unicode scalar value"),  # beyond U+10FFFF
    (h("40 40"), "1 bytes left after the value"),
    (h("c0 00"), TRUNCATED),  # size cannot hold the count
    (h("d0 00000003 00000000"), "compound size 3 cannot hold its count"),
    (h("c0 02 02 40"), "2 elements cannot fit in 1 bytes"),  # count says two, bytes hold one
    (h("c0 03 02 40"), "compound of 3 bytes overruns the buffer"),  # size 3, two bytes follow
    (h("c0 03 01 40 40"), "compound declares 5 as its end but its elements end at 4"),
    (h("c1 02 01 40"), "map has an odd number of elements"),
    (h("c1 03 02 45 40"), "map key is not hashable"),  # list used as a map key
    (h("c1 05 02 c1 01 00 40"), "map key is not hashable"),  # map used as a map key
    (h("e0 01 00"), TRUNCATED),  # array without a constructor
    (h("e0 02 01 ff"), "invalid array element constructor 0xff"),
    (h("e0 02 01 00"), TRUNCATED),  # described array without descriptor
    (h("e0 03 02 50 01"), "2 elements overrun the array's 1 bytes"),  # two ubytes, one byte
    (h("00"), TRUNCATED),
    (h("00 53"), TRUNCATED),
    (h("00 53 05"), TRUNCATED),  # descriptor without a value
]


@pytest.mark.parametrize(
    ("wire", "message"), MALFORMED, ids=[w.hex() or "empty" for w, _ in MALFORMED]
)
def test_malformed_raises_decode_error(wire: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match="^" + re.escape(message)):
        decode(wire)


def test_decode_error_carries_condition() -> None:
    with pytest.raises(DecodeError, match="invalid constructor 0xff") as info:
        decode(h("ff"))
    assert info.value.condition == "amqp:decode-error"


# --------------------------------------------------------------------------------------------
# composites: performatives, SASL frames, delivery states, termini, transactions, sections

ERROR = Error(
    condition="amqp:link:detach-forced",
    description="went away",
    info={"why": "test", symbol("n"): uint(1)},
)
SOURCE = Source(
    address="queue-a",
    durable=2,
    expiry_policy="never",
    timeout=30,
    dynamic=True,
    dynamic_node_properties={"lifetime-policy": DeleteOnClose()},
    distribution_mode="move",
    filter={"apache.org:selector-filter:string": Described(symbol("apache.org:x"), "a = 1")},
    default_outcome=Modified(delivery_failed=True),
    outcomes=("amqp:accepted:list", "amqp:rejected:list"),
    capabilities=("queue",),
)
TARGET = Target(
    address="queue-b",
    durable=1,
    expiry_policy="link-detach",
    timeout=5,
    dynamic=False,
    dynamic_node_properties={"x": 1},
    capabilities=("topic", "shared"),
)

PROPERTIES = Properties(
    message_id="id-1",
    user_id=b"user",
    to="queue-a",
    subject="subject",
    reply_to="queue-b",
    correlation_id=uuid.UUID(int=5),
    content_type="application/json",
    content_encoding="gzip",
    absolute_expiry_time=1_700_000_060_000,
    creation_time=1_700_000_000_000,
    group_id="session-1",
    group_sequence=4,
    reply_to_group_id="session-2",
)

FULL: list[Any] = [
    ERROR,
    Open(
        container_id="container-1",
        hostname="example.servicebus.windows.net",
        max_frame_size=65536,
        channel_max=255,
        idle_time_out=120_000,
        outgoing_locales=("en-US",),
        incoming_locales=("en-US", "de-DE"),
        offered_capabilities=("ANONYMOUS-RELAY",),
        desired_capabilities=("com.microsoft:cbs",),
        properties={"product": "replication", "version": "1.0"},
    ),
    Begin(
        remote_channel=3,
        next_outgoing_id=1,
        incoming_window=5000,
        outgoing_window=2**32 - 1,
        handle_max=255,
        offered_capabilities=("a",),
        desired_capabilities=("b", "c"),
        properties={"k": timestamp(1)},
    ),
    Attach(
        name="link-1",
        handle=7,
        role=True,
        snd_settle_mode=1,
        rcv_settle_mode=1,
        source=SOURCE,
        target=TARGET,
        unsettled={b"tag-1": Accepted(), b"tag-2": None},
        incomplete_unsettled=True,
        initial_delivery_count=10,
        max_message_size=2**64 - 1,
        offered_capabilities=("x",),
        desired_capabilities=("y",),
        properties={"com.microsoft:timeout": uint(60000)},
    ),
    Attach(
        name="coordinator",
        handle=0,
        role=False,
        source=SOURCE,
        target=Coordinator(capabilities=("amqp:local-transactions",)),
    ),
    Flow(
        next_incoming_id=1,
        incoming_window=2,
        next_outgoing_id=3,
        outgoing_window=4,
        handle=5,
        delivery_count=6,
        link_credit=7,
        available=8,
        drain=True,
        echo=True,
        properties={"p": None},
    ),
    Transfer(
        handle=1,
        delivery_id=2,
        delivery_tag=b"\x00\x01",
        message_format=0,
        settled=False,
        more=True,
        rcv_settle_mode=1,
        state=TransactionalState(txn_id=b"txn", outcome=Accepted()),
        resume=True,
        aborted=True,
        batchable=True,
    ),
    Disposition(role=True, first=1, last=9, settled=True, state=Accepted(), batchable=True),
    Disposition(role=False, first=0, state=Rejected(error=ERROR)),
    Disposition(role=True, first=0, state=Released()),
    Disposition(role=True, first=0, state=Received(section_number=1, section_offset=2**40)),
    Detach(handle=9, closed=True, error=ERROR),
    End(error=ERROR),
    Close(error=ERROR),
    SaslMechanisms(sasl_server_mechanisms=("MSSBCBS", "PLAIN", "ANONYMOUS")),
    SaslInit(mechanism="PLAIN", initial_response=b"\x00user\x00pass", hostname="host"),
    SaslChallenge(challenge=b"challenge"),
    SaslResponse(response=b"response"),
    SaslOutcome(code=1, additional_data=b"more"),
    Received(section_number=3, section_offset=4),
    Accepted(),
    Rejected(error=ERROR),
    Released(),
    Modified(
        delivery_failed=True,
        undeliverable_here=False,
        message_annotations={"x-opt-deadletter-reason": "because"},
    ),
    SOURCE,
    TARGET,
    DeleteOnClose(),
    DeleteOnNoLinks(),
    DeleteOnNoMessages(),
    DeleteOnNoLinksOrMessages(),
    Coordinator(capabilities=("amqp:local-transactions", "amqp:multi-txns-per-ssn")),
    Declare(global_id=b"global"),
    Discharge(txn_id=b"\x00\x00\x00\x01", fail=True),
    Declared(txn_id=b"\x00\x00\x00\x01"),
    TransactionalState(txn_id=b"\x01", outcome=Rejected(error=ERROR)),
    Header(durable=True, priority=9, ttl=60_000, first_acquirer=True, delivery_count=3),
    PROPERTIES,
    DeliveryAnnotations({symbol("x-opt-lock-token"): uuid.UUID(int=1)}),
    MessageAnnotations({symbol("x-opt-sequence-number"): 42}),
    ApplicationProperties({"a": 1, "b": [True]}),
    Data(b"payload"),
    AmqpSequence([1, "two", [3]]),
    AmqpValue({"any": ["value"]}),
    AmqpValue(None),
    Footer({symbol("x-hash"): b"\x00" * 32}),
]

SCALAR_FIELDS = {"ubyte", "ushort", "uint", "ulong", "int", "long", "timestamp", "symbol"}


def _fields(value: Any) -> list[dataclasses.Field[Any]]:
    return list(dataclasses.fields(value))


def _mandatory_only(value: Any) -> Any:
    cls = type(value)
    kwargs = {f.name: getattr(value, f.name) for f in _fields(value) if f.metadata["mandatory"]}
    return cls(**kwargs)


def _check_composite(value: Any) -> bytes:
    wire = encode(value)
    assert wire[:3] == bytes((0x00, 0x53, type(value).DESCRIPTOR))
    back = decode(wire)
    assert type(back) is type(value)
    assert back == value
    assert encode(back) == wire  # field types survive: same bytes again
    return wire


@pytest.mark.parametrize("value", FULL, ids=[type(v).__name__ for v in FULL])
def test_composite_all_fields(value: Any) -> None:
    _check_composite(value)


def test_full_examples_populate_every_field() -> None:
    for cls in {type(v) for v in FULL}:
        examples = [v for v in FULL if type(v) is cls]
        for field in _fields(examples[0]):
            assert any(getattr(v, field.name) is not None for v in examples), (cls, field.name)


COMPOSITES = [v for v in FULL if all("amqp" in f.metadata for f in _fields(v))]


@pytest.mark.parametrize("value", COMPOSITES, ids=[type(v).__name__ for v in COMPOSITES])
def test_composite_mandatory_fields_only(value: Any) -> None:
    _check_composite(_mandatory_only(value))


def test_composite_typed_fields_decode_to_marker_types() -> None:
    back = decode(encode(next(v for v in FULL if type(v) is Attach)))
    assert type(back.handle) is uint
    assert type(back.snd_settle_mode) is ubyte
    assert type(back.max_message_size) is ulong
    assert type(back.role) is bool
    assert type(back.source) is Source and type(back.target) is Target
    assert all(type(c) is symbol for c in back.offered_capabilities)
    assert type(next(iter(back.properties))) is symbol
    props = decode(encode(PROPERTIES))
    assert type(props.content_type) is symbol
    assert type(props.creation_time) is timestamp
    assert type(props.group_sequence) is uint


def test_composite_trailing_nulls_trimmed_and_defaults_applied() -> None:
    assert encode(Accepted()) == h("00 53 24 45")
    # performatives keep every field (performatives.py: the Event Hubs SDK indexes them)
    assert encode(Close()) == h("00 53 18 c0 02 01 40")
    assert encode(Transfer(handle=0)) == h("00 53 14 c0 0c 0b 43 40 40 40 40 42 40 40 42 42 42")
    wire = encode(Flow(incoming_window=1, next_outgoing_id=2, outgoing_window=3))
    assert wire == h("00 53 13 c0 0f 0b 40 52 01 52 02 52 03 40 40 40 40 42 42 40")
    # a peer that leaves defaulted fields out, or writes null, gets the defaults
    opened = decode(h("00 53 10 c0 04 01 a1 01 78"))
    assert opened == Open(container_id="x")
    assert opened.max_frame_size == 2**32 - 1 and opened.channel_max == 65535
    opened = decode(h("00 53 10 c0 06 03 a1 01 78 40 40"))
    assert opened == Open(container_id="x")
    header = decode(h("00 53 70 45"))
    assert header == Header(durable=False, priority=4, ttl=None, delivery_count=0)


def test_transfer_compact() -> None:
    transfer = Transfer(
        handle=0, delivery_id=1, delivery_tag=b"\x01", message_format=0, settled=True
    )
    assert encode(transfer) == h("00 53 14 c0 0f 0b 43 52 01 a0 01 01 43 41 42 40 40 42 42 42")


def test_composite_decodes_by_symbolic_descriptor_and_wide_forms() -> None:
    by_name = encode(Described(symbol("amqp:open:list"), ["x"]))
    assert decode(by_name) == Open(container_id="x")
    assert decode(h("00 80 0000000000000010 c0 04 01 a1 01 78")) == Open(container_id="x")
    assert decode(h("00 53 10 d0 00000007 00000001 a1 01 78")) == Open(container_id="x")
    assert decode(h("00 53 24 c0 01 00")) == Accepted()
    assert decode(h("00 53 24 d0 00000004 00000000")) == Accepted()
    # extra trailing fields (a newer peer) are ignored
    assert decode(h("00 53 24 c0 02 01 40")) == Accepted()


def test_symbol_multiple_fields() -> None:
    # one symbol or an array of them; either way a tuple comes back
    assert decode(encode(Described(ulong(0x30), [symbol("one")]))) == Coordinator(("one",))
    assert decode(encode(Coordinator(capabilities="single"))).capabilities == ("single",)
    wire = encode(SaslMechanisms(sasl_server_mechanisms=("PLAIN",)))
    assert h("e0 08 01 a3 05") + b"PLAIN" in wire


MANDATORY_CASES = [
    (value, field.name, index)
    for value in FULL
    for index, field in enumerate(
        dataclasses.fields(value) if dataclasses.is_dataclass(value) else ()
    )
    if field.metadata.get("mandatory")
]


@pytest.mark.parametrize(
    ("value", "name", "index"),
    MANDATORY_CASES,
    ids=[f"{type(v).__name__}.{n}" for v, n, _ in MANDATORY_CASES],
)
def test_missing_mandatory_field(value: Any, name: str, index: int) -> None:
    broken = dataclasses.replace(value, **{name: None})
    with pytest.raises(EncodeError, match=name.replace("_", "-")):
        encode(broken)
    cls = type(value)
    fields = _untyped(cls, [getattr(value, f.name) for f in dataclasses.fields(value)])
    code = ulong(cls.DESCRIPTOR)
    assert decode(encode(Described(code, fields))) == value  # the plain list is faithful
    # null in the mandatory slot ...
    with_null = [*fields[:index], None, *fields[index + 1 :]]
    with pytest.raises(DecodeError, match=name.replace("_", "-")):
        decode(encode(Described(code, with_null)))
    # ... or the list cut short before it
    with pytest.raises(DecodeError, match=name.replace("_", "-")):
        decode(encode(Described(code, fields[:index])))


_MARKERS = {
    "ubyte": ubyte,
    "ushort": ushort,
    "uint": uint,
    "ulong": ulong,
    "int": int32,
    "symbol": symbol,
    "timestamp": timestamp,
}


def _untyped(cls: type, values: list[Any]) -> list[Any]:
    """Field values wrapped in their AMQP types, so that a plain list encodes like the class."""
    out = []
    for field, value in zip(dataclasses.fields(cls), values, strict=False):
        kind = field.metadata["amqp"]
        if value is None:
            out.append(None)
        elif kind == "symbol[]":
            out.append(Array(AMQPType.SYMBOL, [symbol(s) for s in value]))
        elif kind in _MARKERS:
            out.append(_MARKERS[kind](value))
        elif kind == "fields":
            out.append({symbol(k) if type(k) is str else k: v for k, v in value.items()})
        else:
            out.append(value)
    return out


def test_composite_field_types_are_checked() -> None:
    # a sasl-init whose mechanism is binary, not a symbol, decodes into SaslInit(b"PLAIN"),
    # which then cannot be encoded again (AttributeError, not EncodeError)
    with pytest.raises(DecodeError, match=r"sasl-init\.mechanism must be symbol, got bytes"):
        decode(encode(Described(ulong(0x41), [b"PLAIN"])))


def test_composite_wrong_shape() -> None:
    for wire, message in (
        (h("00 53 10 40"), "open must be a list, got NoneType"),
        (h("00 53 10 55 01"), "open must be a list, got int"),
        (h("00 53 24 a1 01 61"), "accepted must be a list, got str"),
        (h("00 53 75 a1 01 61"), "amqp:data:binary holds the wrong type: str"),
        (h("00 53 76 40"), "amqp:amqp-sequence:list holds the wrong type: NoneType"),
        (h("00 53 74 45"), "amqp:application-properties:map holds the wrong type: list"),
        (h("00 53 72 55 01"), "amqp:message-annotations:map holds the wrong type: int"),
    ):
        with pytest.raises(DecodeError, match=re.escape(message)):
            decode(wire)


def test_sections_check_their_value_type() -> None:
    assert decode(encode(Data(b"x"))) == Data(b"x")
    assert decode(h("00 53 77 55 01")) == AmqpValue(1)
    with pytest.raises(EncodeError, match="application-properties keys must be strings, got 2"):
        encode(ApplicationProperties({symbol("ok"): 1, 2: "not a string key"}))


# --------------------------------------------------------------------------------------------
# messages

HEADER = Header(durable=True, priority=5, ttl=30_000, first_acquirer=True, delivery_count=2)


def _message(body: Any, body_type: BodyType) -> Message:
    return Message(
        body=body,
        body_type=body_type,
        header=HEADER,
        delivery_annotations={"x-opt-lock-token": uuid.UUID(int=9)},
        message_annotations={
            "x-opt-sequence-number": 42,
            symbol("x-opt-enqueued-time"): timestamp(1_700_000_000_000),
            "x-opt-partition-key": "pk",
            ulong(0x1234): "numeric annotation key",
        },
        properties=PROPERTIES,
        application_properties={
            "s": "v",
            "i": int32(-5),
            "l": 2**40,
            "b": False,
            "d": 1.5,
            "u": uuid.UUID(int=3),
            "t": timestamp(5),
            "n": None,
        },
        footer={"x-hash": b"\x01\x02"},
    )


MESSAGES = [
    _message([b"first", b"", b"\xff" * 300], BodyType.DATA),
    _message([b"one"], BodyType.DATA),
    _message([], BodyType.DATA),
    _message([[1, "a"], [], [uint(2), [3]]], BodyType.SEQUENCE),
    _message({"k": [1, 2], "n": None}, BodyType.VALUE),
    _message("a string value", BodyType.VALUE),
    _message(None, BodyType.VALUE),
    _message(Array(AMQPType.INT, [int32(1)]), BodyType.VALUE),
    Message.from_bytes(b"only a body"),
    Message(),
]


@pytest.mark.parametrize(
    "message", MESSAGES, ids=[f"{m.body_type.value}-{i}" for i, m in enumerate(MESSAGES)]
)
def test_message_roundtrip(message: Message) -> None:
    wire = encode_message(message)
    back = decode_message(wire)
    assert back == message
    assert_same(back.body, message.body)
    assert back.body_type is message.body_type
    assert encode_message(back) == wire


def test_message_section_order_and_key_types() -> None:
    message = MESSAGES[0]
    sections = decode_all(encode_message(message))
    assert [type(s) for s in sections] == [
        Header,
        DeliveryAnnotations,
        MessageAnnotations,
        Properties,
        ApplicationProperties,
        Data,
        Data,
        Data,
        Footer,
    ]
    back = decode_message(encode_message(message))
    assert all(type(k) is symbol for k in back.delivery_annotations)
    assert [type(k) for k in back.message_annotations] == [symbol, symbol, symbol, ulong]
    assert all(type(k) is str for k in back.application_properties)
    assert all(type(k) is symbol for k in back.footer)
    # symbol keys given for application properties are written as strings
    wire = encode_message(Message(application_properties={symbol("k"): 1}))
    assert wire == h("00 53 74 c1 06 02 a1 01 6b 55 01")
    assert back.data == b"first" + b"\xff" * 300
    with pytest.raises(TypeError, match="message body is value, not data"):
        _ = MESSAGES[4].data


def test_message_minimal_and_empty() -> None:
    assert encode_message(Message()) == b""
    assert decode_message(b"") == Message()
    assert encode_message(Message.from_bytes(b"x")) == h("00 53 75 a0 01 78")


MIXED_BODY = "a message body mixes section kinds or repeats amqp-value"
BAD_MESSAGES = [  # (wire, what the DecodeError says)
    (encode(Properties()) + encode(Header()), "Header section out of order or repeated"),
    (encode(Header()) + encode(Header()), "Header section out of order or repeated"),
    (encode(Data(b"a")) + encode(AmqpValue(1)), MIXED_BODY),
    (encode(AmqpValue(1)) + encode(AmqpValue(2)), MIXED_BODY),
    (encode(AmqpSequence([])) + encode(Data(b"")), MIXED_BODY),
    (
        encode(Data(b"a")) + encode(Footer({})) + encode(Data(b"b")),
        "Data section out of order or repeated",
    ),
    (encode(1), "not a message section: 1"),
    (encode(Accepted()), "not a message section: Accepted()"),  # a composite, not a section
    (encode(Data(b"a"))[:-1], "binary of 1 bytes overruns the buffer"),  # truncated
    (h("00 53 75 a1 01 61"), "amqp:data:binary holds the wrong type: str"),
    (  # {"a": 1, b"b": [True]}: the codec fuzzer's find, which read but could not be written
        h("00 53 74 c1 0d 04 a1 01 61 55 01 a0 01 62 c0 02 01 41"),
        "application-properties keys must be strings, got b'b'",
    ),
]


@pytest.mark.parametrize(
    ("wire", "message"), BAD_MESSAGES, ids=[w.hex()[:30] for w, _ in BAD_MESSAGES]
)
def test_bad_messages_raise_decode_error(wire: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match="^" + re.escape(message)):
        decode_message(wire)


def test_registered_composites_cover_every_descriptor() -> None:
    codes = {int(k) for k in codec.COMPOSITES if isinstance(k, ulong)}
    covered = {type(v).DESCRIPTOR for v in FULL}
    assert codes == covered


def test_error_fields_must_hold_an_error() -> None:
    # detach(handle=0, closed=true, error="oops"): a string where an amqp:error:list belongs
    with pytest.raises(DecodeError, match=r"detach.error must be amqp:error:list, got str"):
        decode(encode(Described(ulong(0x16), [uint(0), True, "oops"])))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (3, types.uint(38_797_312), "attach.snd-settle-mode must be ubyte, got uint"),
        (4, types.uint(256), "attach.rcv-settle-mode must be ubyte, got uint"),
        (1, types.ulong(2**32), "attach.handle must be uint, got ulong"),
    ],
    ids=["snd-settle-mode", "rcv-settle-mode", "handle"],
)
def test_integer_fields_out_of_range_are_decode_errors(
    field: int, value: int, message: str
) -> None:
    """A peer's wider integer in a ubyte/uint field must fail to decode, not later when the
    value is echoed back (found by the engine fuzz test: an attach echo that could not be
    encoded)."""
    from replication.amqp.performatives import Attach

    fields: list[object] = ["link", types.uint(0), False, types.ubyte(0), types.ubyte(0)]
    descriptor = types.ulong(0x12)
    assert isinstance(codec.decode(codec.encode(types.Described(descriptor, fields))), Attach)
    fields[field] = value
    with pytest.raises(DecodeError, match=re.escape(message)):
        codec.decode(codec.encode(types.Described(descriptor, fields)))


def test_a_string_in_a_symbol_field_reads_as_a_symbol() -> None:
    """Peers sometimes send a string where the spec says symbol (an error's condition); it
    reads as a symbol, so decoding what we re-encode gives the same value (codec fuzz)."""
    from replication.amqp.performatives import Error

    data = b"\x00S\x1d\xc0\x1c\x02\xa1\x17amqp:link:detach-forced\xa1\x00"
    error = codec.decode(data)
    assert isinstance(error, Error)
    assert type(error.condition) is types.symbol
    assert codec.decode(codec.encode(error)) == error


def test_a_symbol_in_a_string_field_reads_as_a_string() -> None:
    """The other direction (codec fuzz): an open's container-id sent as a symbol."""
    from replication.amqp.performatives import Open

    data = b"\x00S\x10\xc0\x0d\x01\xa3\x0acontainer1"
    opened = codec.decode(data)
    assert isinstance(opened, Open)
    assert type(opened.container_id) is str
    assert codec.decode(codec.encode(opened)) == opened


def test_the_typed_seam_writes_and_reads_as_the_codec_does() -> None:
    """``encoder``/``decoder`` hand out what ``@composite`` registered with the codec."""
    from replication.amqp.composite import decoder, encoder

    header = Header(durable=True, priority=types.ubyte(7))
    out = bytearray()
    encoder(Header)(out, header)
    assert bytes(out) == encode(header)
    assert decoder(Header)([True, 7]) == header
    with pytest.raises(DecodeError, match=r"header.priority must be ubyte, got str"):
        decoder(Header)([True, "7"])


def test_composite_takes_only_a_dataclass() -> None:
    from replication.amqp.composite import composite

    class Loose:
        pass

    with pytest.raises(TypeError, match="makes a dataclass a composite; Loose is not one"):
        composite(0x7F00, "test:loose:list")(Loose)
