"""The transfer frame written straight from its fields is byte for byte the general one.

Every message the broker delivers goes out through ``frames.transfer_frame``; the general
path (``encode_transfer_frames`` on a ``Transfer``) is the oracle, and proton decodes it.
"""

from __future__ import annotations

import proton
from hypothesis import given, settings
from hypothesis import strategies as st

from replication.amqp.frames import FrameReader, encode_transfer_frames, transfer_frame
from replication.amqp.performatives import Transfer

uint = st.one_of(st.integers(0, 0x1FF), st.integers(0, 0xFFFFFFFF))


@settings(max_examples=500)
@given(
    channel=st.integers(0, 0xFFFF), handle=uint, delivery_id=uint,
    tag=st.binary(max_size=32), message_format=uint,
    settled=st.sampled_from([None, True, False]), payload=st.binary(max_size=300),
)  # fmt: skip
def test_the_same_bytes_as_the_general_encoder(
    channel: int, handle: int, delivery_id: int, tag: bytes, message_format: int,
    settled: bool | None, payload: bytes,
) -> None:  # fmt: skip
    fast = transfer_frame(
        channel, handle, delivery_id, tag, message_format, settled, payload, 1 << 20
    )
    transfer = Transfer(
        handle=handle, delivery_id=delivery_id, delivery_tag=tag,
        message_format=message_format, settled=settled,
    )  # fmt: skip
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
        1, 70_000, b"tag-1", True,
    )  # fmt: skip
    assert decoded.payload == b"payload"  # type: ignore[union-attr]
    data = proton.Data()
    used = data.decode(frame[8:])
    assert frame[8 + used :] == b"payload"
    data.next()
    performative = data.get_object()
    assert performative.descriptor == 0x14
    assert list(performative.value[:5]) == [1, 70_000, b"tag-1", 0, True]
