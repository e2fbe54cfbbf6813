"""Hostile input for the decoder: random bytes, mutated valid encodings and declared-size bombs.

Whatever the bytes, ``decode``, ``decode_all`` and ``decode_message`` either return a value or
raise ``DecodeError``; nothing else may escape (a connection turns DecodeError into a
decode-error close; any other exception would be a crash), and nothing may take long or
allocate more than the input can describe.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replication.amqp import codec
from replication.amqp.codec import decode, decode_all, encode
from replication.amqp.errors import DecodeError
from replication.amqp.message import decode_message, encode_message
from replication.amqp.types import Array

from .strategies import amqp_values, assert_same
from .test_codec import FULL, MESSAGES

FUZZ_EXAMPLES = int(
    os.environ.get("AMQP_FUZZ_EXAMPLES", "10000" if os.environ.get("CI") else "500")
)
fuzz = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
fuzz_quarter = settings(fuzz, max_examples=max(FUZZ_EXAMPLES // 4, 1))
"""For the properties that decode many times per example (every prefix, decode twice)."""

DECODERS: list[Callable[[bytes], Any]] = [decode, decode_all, decode_message]


def decodes_or_rejects(data: bytes) -> None:
    """Every entry point returns or raises DecodeError; any other exception fails the test."""
    for entry in DECODERS:
        try:
            entry(data)
        except DecodeError:  # the one exception allowed out
            continue


# --------------------------------------------------------------------------------------------
# (a) random bytes

CONSTRUCTORS = [0x00, *sorted(codec._ARRAY_TYPE)]  # described, and every value constructor


@fuzz
@given(st.binary(max_size=300))
def test_random_bytes(data: bytes) -> None:
    decodes_or_rejects(data)


@fuzz
@given(
    st.lists(
        st.tuples(st.sampled_from(CONSTRUCTORS), st.binary(max_size=12)), min_size=1, max_size=12
    ).map(lambda parts: b"".join(bytes([code]) + rest for code, rest in parts))
)
def test_random_bytes_with_valid_constructors(data: bytes) -> None:
    # mostly-valid constructor bytes reach far deeper into the decoders than uniform noise
    decodes_or_rejects(data)


# --------------------------------------------------------------------------------------------
# (b) mutations of valid encodings

CORPUS: list[bytes] = [encode(v) for v in FULL] + [encode_message(m) for m in MESSAGES]
corpus = st.one_of(
    st.sampled_from(CORPUS),
    amqp_values(max_leaves=15).map(encode),
    st.lists(amqp_values(max_leaves=5), min_size=1, max_size=4).map(
        lambda vs: b"".join(encode(v) for v in vs)
    ),
)

OPERATIONS = ["flip", "set", "truncate", "insert", "delete", "size32", "size8"]
BIG = [0xFFFFFFFF, 0xFFFFFFFE, 0x80000000, 0x7FFFFFFF, 0x01000000, 0x00010000, 0x00000100]


@st.composite
def mutated(draw: Any) -> bytes:
    data = bytearray(draw(corpus))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(OPERATIONS))
        n = len(data)
        at = draw(st.integers(0, max(n - 1, 0)))
        if op == "flip" and n:
            data[at] ^= draw(st.integers(1, 255))
        elif op == "set" and n:
            data[at] = draw(st.sampled_from([0x00, 0x40, 0x45, 0xA1, 0xC0, 0xD0, 0xE0, 0xF0, 0xFF]))
        elif op == "truncate":
            del data[at:]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        elif op == "size32":
            # a 32-bit size or count field (list32/map32/array32/vbin32/str32) made huge
            data[at : at + 4] = draw(st.sampled_from(BIG)).to_bytes(4, "big")
        elif op == "size8" and n:
            data[at] = draw(st.sampled_from([0x00, 0x01, 0xFE, 0xFF]))
    return bytes(data)


@fuzz
@given(mutated())
def test_mutated_encodings(data: bytes) -> None:
    decodes_or_rejects(data)


@fuzz_quarter
@given(amqp_values(max_leaves=15).map(encode), st.data())
def test_every_truncation_and_wide_count(wire: bytes, data: st.DataObject) -> None:
    # every proper prefix of one value is incomplete
    for end in range(len(wire)):
        try:
            decode(wire[:end])
        except DecodeError:
            continue
        raise AssertionError(f"prefix {wire[:end].hex()} of {wire.hex()} decoded")
    # a huge count or size at any offset
    at = data.draw(st.integers(0, max(len(wire) - 1, 0)))
    bombed = wire[:at] + b"\xff\xff\xff\xff" + wire[at + 4 :]
    decodes_or_rejects(bombed)


@fuzz_quarter
@given(mutated())
def test_whatever_decodes_reencodes(data: bytes) -> None:
    # anything read from a peer can be forwarded: it encodes, and reads back the same
    try:
        value = decode(data)
    except DecodeError:
        return
    assert_same(decode(encode(value)), value)


# --------------------------------------------------------------------------------------------
# (c) declared-size bombs and deep nesting: DecodeError, quickly, without a big allocation


def _nest(prefix: bytes, depth: int, leaf: bytes = b"\x40") -> bytes:
    return prefix * depth + leaf


DEEP = "values nested too deeply"
HANG_GUARD = 120
"""Seconds before pytest-timeout ends a test that never returns; the bounds the tests assert
are CPU seconds of this process (``time.process_time``), which other load does not inflate."""
TOO_MANY = "4294967295 elements cannot fit in"
BOMBS = {  # name: (bytes, what the DecodeError says)
    "list32 4G size and count": (bytes.fromhex("d0 ffffffff ffffffff"), "compound of 4294967295"),
    "list32 4G count": (bytes.fromhex("d0 00000008 ffffffff") + b"\x40" * 4, TOO_MANY),
    "map32 4G count": (bytes.fromhex("d1 00000008 ffffffff") + b"\x40" * 4, TOO_MANY),
    "array32 4 billion nulls": (bytes.fromhex("f0 00000005 ffffffff 40"), TOO_MANY),
    "array32 4 billion true": (bytes.fromhex("f0 00000005 ffffffff 41"), TOO_MANY),
    "array32 4 billion uint0": (bytes.fromhex("f0 00000005 ffffffff 43"), TOO_MANY),
    "array32 4 billion list0": (bytes.fromhex("f0 00000005 ffffffff 45"), TOO_MANY),
    "array32 4G ulongs": (bytes.fromhex("f0 00000009 ffffffff 80") + bytes(8), TOO_MANY),
    "array32 4G strings": (bytes.fromhex("f0 00000006 ffffffff a1 00"), TOO_MANY),
    "vbin32 4G": (bytes.fromhex("b0 ffffffff"), "binary of 4294967295 bytes overruns the buffer"),
    "str32 4G": (bytes.fromhex("b1 ffffffff") + b"a" * 16, "string overruns the buffer"),
    "sym32 4G": (bytes.fromhex("b3 ffffffff"), "symbol overruns the buffer"),
    "vbin8 overrun": (bytes.fromhex("a0 ff") + b"a" * 10, "binary of 255 bytes overruns"),
    "list8 nested 100k": (bytes.fromhex("c0 03 01") * 100_000, DEEP),
    "list32 nested 100k": (_nest(bytes.fromhex("d0 00000009 00000001"), 100_000), DEEP),
    "map8 nested 100k": (_nest(bytes.fromhex("c1 04 02 40"), 100_000), DEEP),
    "described nested 100k": (b"\x00" * 100_000, DEEP),
    "described descriptor nested": (_nest(bytes.fromhex("00 53 99"), 100_000), DEEP),
    "array of array nested 100k": (b"\xe0" + bytes.fromhex("ff 01 e0") * 100_000, DEEP),
    "composite nested 100k": (_nest(bytes.fromhex("00 53 17 c0 05 01"), 100_000), DEEP),
}


def _elements(value: Any) -> int:
    """How many values a decoded tree holds (what its memory grows with)."""
    if isinstance(value, list | tuple | Array):
        return 1 + sum(_elements(v) for v in value)
    if isinstance(value, dict):
        return 1 + sum(_elements(k) + _elements(v) for k, v in value.items())
    return 1


@pytest.mark.timeout(HANG_GUARD)
@pytest.mark.parametrize(("bomb", "message"), list(BOMBS.values()), ids=list(BOMBS))
def test_declared_size_bombs(bomb: bytes, message: str) -> None:
    for entry in DECODERS:
        started = time.process_time()
        with pytest.raises(DecodeError, match="^" + re.escape(message)):
            entry(bomb)
        assert time.process_time() - started < 2.0, entry.__name__


@pytest.mark.timeout(HANG_GUARD)
@pytest.mark.parametrize(
    "element", [b"\x40", b"\x41", b"\x43", b"\x44", b"\x45"], ids=lambda e: e.hex()
)
def test_zero_width_arrays_do_not_amplify(element: bytes) -> None:
    # arrays of zero-width elements (null, true, uint0, ulong0, list0) take no bytes per
    # element: many arrays each declaring 65536 of them must not decode into millions of
    # values from a few kilobytes
    inner = bytes.fromhex("f0 00000005 00010000") + element
    count = 400
    body = count.to_bytes(4, "big") + inner * count
    bomb = b"\xd0" + len(body).to_bytes(4, "big") + body
    started = time.process_time()
    try:
        value = decode(bomb)
    except DecodeError:
        return
    assert time.process_time() - started < 5.0
    assert _elements(value) <= 64 * len(bomb), f"{_elements(value)} values from {len(bomb)} bytes"


@pytest.mark.timeout(HANG_GUARD)
def test_large_valid_input_is_linear() -> None:
    # half a megabyte of small values decodes in well under 5 CPU seconds (nothing quadratic)
    wire = encode([[i, str(i), {"k": [None]}] for i in range(40_000)])
    started = time.process_time()
    back = decode(wire)
    assert len(back) == 40_000
    assert time.process_time() - started < 5.0
