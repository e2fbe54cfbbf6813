"""Shared helpers for the AMQP codec tests: type-strict equality and hypothesis strategies.

``same`` compares values the way the wire does: ``uint(1) == ulong(1) == 1`` in Python, but they
are different AMQP values, so every node of the two trees must also have the same Python type.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from hypothesis import strategies as st

from replication.amqp import codec
from replication.amqp.message import BodyType, Header, Properties
from replication.amqp.message import Message as AmqpMessage
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

# --------------------------------------------------------------------------------------------
# type-strict equality


def same(a: Any, b: Any) -> bool:
    """True when ``a`` and ``b`` are the same AMQP value: equal, and of the same types."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return len(a) == len(b) and all(
            same(ka, kb) and same(va, vb)
            for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True)
        )
    if isinstance(a, Array):
        return (
            a.type == b.type and same(a.descriptor, b.descriptor) and same(a.elements, b.elements)
        )
    if isinstance(a, Described):
        return same(a.descriptor, b.descriptor) and same(a.value, b.value)
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return bool(a == b)


def assert_same(actual: Any, expected: Any) -> None:
    assert same(actual, expected), f"\n  actual:   {actual!r}\n  expected: {expected!r}"


# --------------------------------------------------------------------------------------------
# hypothesis strategies over AMQP values

nulls = st.none()
booleans = st.booleans()
ubytes = st.integers(0, 0xFF).map(ubyte)
ushorts = st.integers(0, 0xFFFF).map(ushort)
uints = st.integers(0, 0xFFFFFFFF).map(uint)
ulongs = st.integers(0, 0xFFFFFFFFFFFFFFFF).map(ulong)
bytes_ = st.integers(-0x80, 0x7F).map(byte)
shorts = st.integers(-0x8000, 0x7FFF).map(short)
int32s = st.integers(-0x80000000, 0x7FFFFFFF).map(int32)
longs = st.integers(-0x8000000000000000, 0x7FFFFFFFFFFFFFFF)
float32s = st.floats(width=32, allow_nan=False).map(float32)
doubles = st.floats(allow_nan=False)
decimal32s = st.integers(0, 0xFFFFFFFF).map(decimal32)
decimal64s = st.integers(0, 0xFFFFFFFFFFFFFFFF).map(decimal64)
decimal128s = st.binary(min_size=16, max_size=16).map(decimal128)
chars = st.characters(codec="utf-8").map(char)  # no lone surrogates: they are not chars
timestamps = st.integers(-0x8000000000000000, 0x7FFFFFFFFFFFFFFF).map(timestamp)
uuids = st.uuids()
binaries = st.binary(max_size=300)
strings = st.text(max_size=100)
symbols = st.text(st.characters(max_codepoint=0x7F), max_size=40).map(symbol)

ELEMENTS: dict[AMQPType, st.SearchStrategy[Any]] = {
    AMQPType.NULL: nulls,
    AMQPType.BOOLEAN: booleans,
    AMQPType.UBYTE: ubytes,
    AMQPType.USHORT: ushorts,
    AMQPType.UINT: uints,
    AMQPType.ULONG: ulongs,
    AMQPType.BYTE: bytes_,
    AMQPType.SHORT: shorts,
    AMQPType.INT: int32s,
    AMQPType.LONG: longs,
    AMQPType.FLOAT: float32s,
    AMQPType.DOUBLE: doubles,
    AMQPType.DECIMAL32: decimal32s,
    AMQPType.DECIMAL64: decimal64s,
    AMQPType.DECIMAL128: decimal128s,
    AMQPType.CHAR: chars,
    AMQPType.TIMESTAMP: timestamps,
    AMQPType.UUID: uuids,
    AMQPType.BINARY: binaries,
    AMQPType.STRING: strings,
    AMQPType.SYMBOL: symbols,
}
"""The elements of an array of each primitive type, as the decoder gives them back."""

primitives = st.one_of(*ELEMENTS.values())

hashable_primitives = primitives
"""Map keys: every primitive hashes, and NaN (a key that never finds itself) is never drawn."""

descriptors = st.one_of(
    ulongs,
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=30).map(
        lambda s: symbol("x-test:" + s)
    ),
).filter(lambda d: d not in codec.COMPOSITES)
"""Descriptors that no composite type claims, so the value decodes as ``Described``."""


def _max_elements(kind: AMQPType) -> int:
    # An array of more than one zero-width null is rejected by the decoder (see
    # test_codec.py::test_array_of_many_nulls); keep generated null arrays to 0 or 1 element.
    return 1 if kind == AMQPType.NULL else 8


@st.composite
def primitive_arrays(draw: Any, described: bool = True) -> Array:
    kind = draw(st.sampled_from(list(ELEMENTS)))
    elements = draw(st.lists(ELEMENTS[kind], max_size=_max_elements(kind)))
    descriptor = draw(st.none() | descriptors) if described else None
    return Array(kind, elements, descriptor)


def amqp_values(
    *,
    max_leaves: int = 20,
    compound_arrays: bool = True,
    described: bool = True,
    binary_keys: bool = True,
    described_in_described: bool = True,
) -> st.SearchStrategy[Any]:
    """Any AMQP value: primitives, arrays, and lists/maps/described values nesting them."""
    leaves = primitives | primitive_arrays(described=described)
    keys = hashable_primitives
    if not binary_keys:
        keys = keys.filter(lambda k: type(k) is not bytes)

    def extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        options = [
            st.lists(children, max_size=5),
            st.dictionaries(keys, children, max_size=5),
        ]
        if described:
            inner = children
            if not described_in_described:
                inner = children.filter(lambda v: type(v) is not Described)
            options.append(st.builds(Described, descriptors, inner))
        if compound_arrays:
            options += [
                st.lists(st.lists(children, max_size=3), max_size=3).map(
                    lambda els: Array(AMQPType.LIST, els)
                ),
                st.lists(st.dictionaries(keys, children, max_size=3), max_size=3).map(
                    lambda els: Array(AMQPType.MAP, els)
                ),
                st.lists(primitive_arrays(described=described), max_size=3).map(
                    lambda els: Array(AMQPType.ARRAY, els)
                ),
            ]
        return st.one_of(*options)

    return st.recursive(leaves, extend, max_leaves=max_leaves)


_ANNOTATION_KEYS = st.sampled_from([
    "x-opt-partition-key", "x-opt-scheduled-enqueue-time", "x-opt-enqueued-time",
    "x-opt-sequence-number", "x-opt-deadletter-source", "x-opt-locked-until",
    "x-opt-lock-token", "x-other",
]).map(symbol)  # fmt: skip
_ANNOTATION_VALUES = st.one_of(
    st.integers(0, 2**62),
    st.integers(0, 4_000_000_000_000).map(timestamp),
    strings,
    uuids,
    amqp_values(max_leaves=5),
)


@st.composite
def amqp_messages(draw: Any) -> AmqpMessage:
    """Messages of every body kind with the sections and annotations Service Bus uses."""
    text = st.none() | strings
    kind = draw(st.sampled_from(["data", "data", "value", "sequence"]))
    body: Any
    if kind == "data":
        body, body_type = draw(st.lists(binaries, min_size=1, max_size=3)), BodyType.DATA
    elif kind == "value":
        body, body_type = (
            draw(st.one_of(strings, binaries, amqp_values(max_leaves=5))),
            BodyType.VALUE,
        )
    else:
        body = draw(
            st.lists(st.lists(amqp_values(max_leaves=3), max_size=3), min_size=1, max_size=2)
        )
        body_type = BodyType.SEQUENCE
    header = draw(st.none() | st.builds(
        Header, durable=st.booleans(), priority=st.integers(0, 9),
        ttl=st.none() | st.integers(0, 2**32 - 1), delivery_count=st.integers(0, 2**32 - 1),
    ))  # fmt: skip
    properties = draw(st.none() | st.builds(
        Properties, message_id=st.none() | strings | uuids | ulongs, to=text, subject=text,
        reply_to=text, correlation_id=st.none() | strings | uuids, content_type=st.none() | symbols,
        group_id=text, reply_to_group_id=text,
        absolute_expiry_time=st.none() | st.integers(0, 2**40).map(timestamp),
    ))  # fmt: skip
    return AmqpMessage(
        body=body, body_type=body_type, header=header,
        delivery_annotations=draw(st.none() | st.dictionaries(symbols, primitives, max_size=3)),
        message_annotations=draw(
            st.none() | st.dictionaries(_ANNOTATION_KEYS, _ANNOTATION_VALUES, max_size=8)
        ),
        properties=properties,
        application_properties=draw(st.none() | st.dictionaries(strings, primitives, max_size=8)),
        footer=draw(st.none() | st.dictionaries(symbols, primitives, max_size=2)),
    )  # fmt: skip
