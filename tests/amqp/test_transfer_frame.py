"""The transfer frame written straight from its fields is byte for byte the general one.

Every message the broker delivers goes out through ``frames.transfer_frame``; the general
path (``encode_transfer_frames`` on a ``Transfer``) is the oracle, and proton decodes it.
"""

from __future__ import annotations

import proton
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replication.amqp.codec import decode_at
from replication.amqp.errors import DecodeError
from replication.amqp.frames import (
    FrameReader,
    ProtocolHeader,
    encode_transfer_frames,
    read_transfer,
    transfer_frame,
)
from replication.amqp.outcomes import Accepted, Released
from replication.amqp.performatives import Transfer

uint = st.one_of(st.integers(0, 0x1FF), st.integers(0, 0xFFFFFFFF))


@settings(max_examples=500)
@given(
    channel=st.integers(0, 0xFFFF),
    handle=uint,
    delivery_id=uint,
    tag=st.binary(max_size=32),
    message_format=uint,
    settled=st.sampled_from([None, True, False]),
    payload=st.binary(max_size=300),
)
def test_the_same_bytes_as_the_general_encoder(
    channel: int,
    handle: int,
    delivery_id: int,
    tag: bytes,
    message_format: int,
    settled: bool | None,
    payload: bytes,
) -> None:
    fast = transfer_frame(
        channel, handle, delivery_id, tag, message_format, settled, payload, 1 << 20
    )
    transfer = Transfer(
        handle=handle,
        delivery_id=delivery_id,
        delivery_tag=tag,
        message_format=message_format,
        settled=settled,
    )
    assert [fast] == encode_transfer_frames(channel, transfer, payload, 1 << 20)


def test_what_does_not_fit_one_frame_takes_the_general_path() -> None:
    assert transfer_frame(0, 0, 1, b"t", 0, False, b"x" * 600, 512) is None
    assert transfer_frame(0, 0, 1, b"t" * 33, 0, False, b"x", 512) is None


def test_proton_reads_the_frame() -> None:
    frame = transfer_frame(3, 1, 70_000, b"tag-1", 0, True, b"payload", 1 << 20)
    assert frame is not None
    reader = FrameReader()
    reader.expect_header = False
    reader.feed(frame)
    decoded = reader.next()
    assert decoded is not None
    body = decoded.body  # type: ignore[union-attr]
    assert (body.handle, body.delivery_id, body.delivery_tag, body.settled) == (
        1,
        70_000,
        b"tag-1",
        True,
    )
    assert decoded.payload == b"payload"  # type: ignore[union-attr]
    data = proton.Data()
    used = data.decode(frame[8:])
    assert frame[8 + used :] == b"payload"
    data.next()
    performative = data.get_object()
    assert performative.descriptor == 0x14
    assert list(performative.value[:5]) == [1, 70_000, b"tag-1", 0, True]


def _fields(transfer: object) -> list[tuple[object, type]]:
    """Each field's value and its type (uint and ubyte are ints of their own class)."""
    values = [getattr(transfer, name) for name in Transfer.__dataclass_fields__]
    return [(value, type(value)) for value in values]


@settings(max_examples=500)
@given(
    handle=uint,
    delivery_id=st.none() | uint,
    tag=st.none() | st.binary(max_size=40),
    message_format=st.none() | uint,
    settled=st.sampled_from([None, True, False]),
    more=st.booleans(),
    rcv_settle_mode=st.none() | st.integers(0, 1),
    state=st.sampled_from([None, Accepted(), Released()]),
    resume=st.booleans(),
    aborted=st.booleans(),
    batchable=st.booleans(),
    payload=st.binary(max_size=40),
)
def test_the_fast_reader_makes_what_the_general_decoder_makes(
    handle: int,
    delivery_id: int | None,
    tag: bytes | None,
    message_format: int | None,
    settled: bool | None,
    more: bool,
    rcv_settle_mode: int | None,
    state: object,
    resume: bool,
    aborted: bool,
    batchable: bool,
    payload: bytes,
) -> None:
    """Every frame read goes through ``read_transfer`` first: for any transfer the general
    encoder writes, it reads the same fields, of the same types, as the general decoder, or
    leaves the frame to it (a delivery state); the payload follows either way."""
    transfer = Transfer(
        handle,
        delivery_id,
        tag,
        message_format,
        settled,
        more,
        rcv_settle_mode,
        state,
        resume,
        aborted,
        batchable,
    )
    (frame,) = encode_transfer_frames(0, transfer, payload, 1 << 20)
    data = frame[8:]
    general, offset = decode_at(data, 0)
    fast = read_transfer(data)
    if state is None:
        assert fast is not None
        assert _fields(fast) == _fields(general)
    else:
        assert fast is None
    reader = FrameReader()
    reader.expect_header = False
    reader.feed(frame)
    read = reader.next()
    assert read is not None and not isinstance(read, ProtocolHeader)
    assert _fields(read.body) == _fields(general)
    assert read.payload == data[offset:] == payload


def test_the_fast_reader_leaves_other_encodings_to_the_general_decoder() -> None:
    """A uint as a ulong, a boolean as its one-byte form, a truncated list: not read here
    (the general decoder takes the first two, and says what is wrong with the third)."""
    written = frames_of(Transfer(1, 2, b"t", 0, False))
    assert read_transfer(written) is not None
    as_ulong = written.replace(b"\x52\x02", b"\x53\x02", 1)  # delivery-id as smallulong
    assert read_transfer(as_ulong) is None
    assert decode_at(as_ulong, 0)[0].delivery_id == 2
    one_byte_boolean = written.replace(b"\xa0\x01t\x43\x42", b"\xa0\x01t\x43\x56\x00", 1)
    one_byte_boolean = (
        one_byte_boolean[:4] + bytes([one_byte_boolean[4] + 1]) + one_byte_boolean[5:]
    )
    assert read_transfer(one_byte_boolean) is None
    assert decode_at(one_byte_boolean, 0)[0].settled is False
    assert read_transfer(written[:9]) is None
    with pytest.raises(DecodeError):
        decode_at(written[:9], 0)


def frames_of(transfer: Transfer) -> bytes:
    (frame,) = encode_transfer_frames(0, transfer, b"", 1 << 20)
    return frame[8:]
