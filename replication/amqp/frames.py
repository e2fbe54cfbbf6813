"""Framing (spec 2.2, 2.3, 5.3.1): protocol headers and frames, in and out of a byte stream.

``FrameReader`` is fed raw bytes and yields ``ProtocolHeader`` and ``Frame`` values; it knows
when a protocol header is due (the connection tells it) and enforces the negotiated
max-frame-size before buffering a frame body, so a peer cannot make us hold more than that.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Final

from . import codec, message, outcomes, performatives, terminus  # noqa: F401 - register types
from .errors import DecodeError, FramingError
from .performatives import Transfer
from .types import ubyte

AMQP_HEADER: Final = b"AMQP\x00\x01\x00\x00"
TLS_HEADER: Final = b"AMQP\x02\x01\x00\x00"
SASL_HEADER: Final = b"AMQP\x03\x01\x00\x00"

PROTOCOL_AMQP: Final = 0
PROTOCOL_TLS: Final = 2
PROTOCOL_SASL: Final = 3

FRAME_AMQP: Final = 0x00
FRAME_SASL: Final = 0x01

MIN_MAX_FRAME_SIZE: Final = 512
"""Spec 2.7.1: no peer may lower max-frame-size below this."""

_HEADER: Final = struct.Struct(">IBBH")


@dataclass(frozen=True, slots=True)
class ProtocolHeader:
    """The 8-byte header that opens each protocol layer: ``AMQP`` id major minor revision."""

    protocol_id: int
    major: int
    minor: int
    revision: int

    @property
    def is_amqp_1_0(self) -> bool:
        return (self.major, self.minor, self.revision) == (1, 0, 0)

    def to_bytes(self) -> bytes:
        return b"AMQP" + bytes((self.protocol_id, self.major, self.minor, self.revision))


@dataclass(slots=True, init=False)
class Frame:
    """A decoded frame; ``body`` is None for an empty (heartbeat) frame. One per frame read,
    so its ``__init__`` is written out: the one ``dataclass`` writes (a frozen one at that)
    is plain Python, which mypyc does not compile (issue 42)."""

    frame_type: int
    channel: int
    body: Any
    payload: bytes = b""

    def __init__(self, frame_type: int, channel: int, body: Any, payload: bytes = b"") -> None:
        self.frame_type = frame_type
        self.channel = channel
        self.body = body
        self.payload = payload


def encode_frame(
    channel: int, body: Any, payload: bytes | memoryview = b"", frame_type: int = FRAME_AMQP
) -> bytes:
    """A whole frame: header, the performative, and (transfers only) the message payload."""
    out = bytearray(8)
    if body is not None:
        codec.encode_into(out, body)
    if payload:
        out += payload
    _HEADER.pack_into(out, 0, len(out), 2, frame_type, channel)
    return bytes(out)


def _transfer_frame(channel: int, performative: bytes | bytearray, payload: bytes) -> bytes:
    """A one-frame delivery from its already encoded performative."""
    return _HEADER.pack(8 + len(performative) + len(payload), 2, FRAME_AMQP, channel) + (
        performative + payload
    )


_SETTLED: Final = {None: b"\x40", True: b"\x41", False: b"\x42"}
_TRANSFER_TAIL: Final = b"\x42\x40\x40\x42\x42\x42"
"""more, rcv-settle-mode, state, resume, aborted, batchable: false, null, null, false x3."""


def transfer_frame(
    channel: int,
    handle: int,
    delivery_id: int,
    tag: bytes,
    message_format: int,
    settled: bool | None,
    payload: bytes,
    max_frame_size: int,
) -> bytes | None:
    """The one frame of a delivery with no state, written straight from its fields (every
    message the broker delivers goes through here): the same bytes ``encode_into`` writes
    for such a ``Transfer``. None when it needs the general path (a long tag, more than
    one frame)."""
    if len(tag) > 32:
        return None
    fields = b"".join(
        (
            codec.uint_bytes(handle),
            codec.uint_bytes(delivery_id),
            b"\xa0",
            bytes((len(tag),)),
            tag,
            codec.uint_bytes(message_format),
            _SETTLED[settled],
            _TRANSFER_TAIL,
        )
    )
    size = 8 + 6 + len(fields) + len(payload)
    if size > max_frame_size:
        return None
    return b"".join(
        (
            _HEADER.pack(size, 2, FRAME_AMQP, channel),
            _TRANSFER_LIST8,
            bytes((len(fields) + 1, 11)),
            fields,
            payload,
        )
    )


_TRANSFER_LIST8: Final = b"\x00\x53\x14\xc0"
"""A transfer performative as peers write it: descriptor 0x14, its fields an 8-bit list."""
_UINT: Final = 0
_BINARY: Final = 1
_BOOLEAN: Final = 2
_UBYTE: Final = 3
_STATE: Final = 4
_KINDS: Final = bytes(
    (
        _UINT,  # handle
        _UINT,  # delivery-id
        _BINARY,  # delivery-tag
        _UINT,  # message-format
        _BOOLEAN,  # settled
        _BOOLEAN,  # more
        _UBYTE,  # rcv-settle-mode
        _STATE,  # state
        _BOOLEAN,  # resume
        _BOOLEAN,  # aborted
        _BOOLEAN,  # batchable
    )
)
"""The transfer's fields in order (``performatives.Transfer``): what each may hold here (the
delivery state is read by the general decoder only). Bytes, not a tuple: mypyc makes a
``Final`` tuple of ints anew wherever it is read."""


def read_transfer(data: bytes) -> Transfer | None:
    """The transfer performative that starts ``data``, read straight from its fields (every
    delivery arrives in one): the same ``Transfer``, its values of the same types, as the
    general decoder makes of it (tests/amqp/test_transfer_frame.py holds the two together).
    None for anything else, and for what this does not read (a delivery state, a field in
    another encoding, a malformed list): the general decoder reads it, or says what is wrong."""
    if not data.startswith(_TRANSFER_LIST8) or len(data) < 6:
        return None
    stop = 5 + data[4]
    count = data[5]
    if count > 11 or stop > len(data):
        return None
    values: list[Any] = [None] * 11
    pos = 6
    try:
        for index in range(count):
            code = data[pos]
            pos += 1
            if code == 0x40:  # null: the field's default
                continue
            kind = _KINDS[index]
            value: Any
            if kind == _UINT:
                if code == 0x52:
                    value = codec._SMALL_UINTS[data[pos]]
                    pos += 1
                elif code == 0x43:
                    value = codec._SMALL_UINTS[0]
                elif code == 0x70:
                    value, pos = codec._dec_uint(data, pos)
                else:
                    return None
            elif kind == _BOOLEAN:
                if code == 0x41:
                    value = True
                elif code == 0x42:
                    value = False
                else:
                    return None
            elif kind == _BINARY:
                if code != 0xA0:
                    return None
                value = data[pos + 1 : pos + 1 + data[pos]]
                pos += 1 + data[pos]
            elif kind == _UBYTE and code == 0x50:
                value = ubyte(data[pos])
                pos += 1
            else:
                return None
            values[index] = value
    except (IndexError, struct.error):  # runs past the data: the general decoder says so
        return None
    if pos != stop or values[0] is None:  # handle is mandatory
        return None
    return Transfer(
        values[0],
        values[1],
        values[2],
        values[3],
        values[4],
        values[5] is True,  # more, resume, aborted, batchable: false when null
        values[6],
        None,
        values[8] is True,
        values[9] is True,
        values[10] is True,
    )


def encode_transfer_frames(
    channel: int, transfer: Any, payload: bytes, max_frame_size: int
) -> list[bytes]:
    """Splits one delivery into transfer frames no larger than ``max_frame_size``.

    Every frame repeats the first transfer's fields; all but the last carry ``more=true``.
    """
    performative = bytearray()
    codec.encode_into(performative, transfer)
    room = max_frame_size - 8 - len(performative) - 1  # more=true can add a byte
    if len(payload) + len(performative) + 8 <= max_frame_size:
        return [_transfer_frame(channel, performative, payload)]
    if room <= 0:
        raise FramingError(f"max-frame-size {max_frame_size} cannot hold a transfer frame")
    frames = []
    view = memoryview(payload)
    more = transfer.more
    for start in range(0, len(payload), room):
        transfer.more = True if start + room < len(payload) else more
        frames.append(encode_frame(channel, transfer, view[start : start + room]))
    transfer.more = more
    return frames


EMPTY_FRAME: Final = encode_frame(0, None)
"""A heartbeat: a frame with no body keeps an idle connection alive (spec 2.4.5)."""


class FrameReader:
    """Sans-IO frame parser: ``feed`` bytes, then call ``next`` until it returns None."""

    def __init__(self, max_frame_size: int = 0xFFFFFFFF) -> None:
        self._buffer = bytearray()
        self._pos = 0
        self.max_frame_size = max_frame_size
        self.expect_header = True

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._pos and self._pos == len(self._buffer):
            self._buffer.clear()
            self._pos = 0
        self._buffer += data

    @property
    def buffered(self) -> int:
        return len(self._buffer) - self._pos

    def next(self) -> ProtocolHeader | Frame | None:
        """The next complete header or frame, or None when more bytes are needed."""
        buf = self._buffer
        pos = self._pos
        available = len(buf) - pos
        if self.expect_header:
            if available < 8:
                seen = bytes(buf[pos : pos + 4])
                if not b"AMQP".startswith(seen):
                    raise FramingError(f"expected an AMQP protocol header, got {seen!r}")
                return None
            raw = bytes(buf[pos : pos + 8])
            self._consume(8)
            if raw[:4] != b"AMQP":
                raise FramingError(f"expected an AMQP protocol header, got {raw!r}")
            self.expect_header = False
            return ProtocolHeader(raw[4], raw[5], raw[6], raw[7])
        if available < 8:
            return None
        size, doff, frame_type, channel = _HEADER.unpack_from(buf, pos)
        if size < 8:
            raise FramingError(f"frame size {size} is smaller than the frame header")
        if size > self.max_frame_size:
            raise FramingError(
                f"frame of {size} bytes exceeds max-frame-size {self.max_frame_size}"
            )
        if doff < 2 or doff * 4 > size:
            raise FramingError(f"frame data offset {doff} is invalid for a {size}-byte frame")
        if frame_type not in (FRAME_AMQP, FRAME_SASL):
            raise FramingError(f"unknown frame type {frame_type:#04x}")
        if available < size:
            return None
        body_start = pos + doff * 4
        end = pos + size
        data = bytes(buf[body_start:end])
        self._consume(size)
        if not data:
            return Frame(frame_type, channel, None)
        body: Any = read_transfer(data)  # Any: else mypyc holds the general decoder's to it
        if body is not None:  # every delivery's frame
            offset = 5 + data[4]  # where its list ends
        else:
            body, offset = codec.decode_at(data, 0)
            if not hasattr(type(body), "DESCRIPTOR"):
                raise DecodeError(f"frame body is not a performative: {body!r}")
        return Frame(frame_type, channel, body, data[offset:] if offset < len(data) else b"")

    def _consume(self, count: int) -> None:
        self._pos += count
        if self._pos > 65536 and self._pos * 2 > len(self._buffer):
            del self._buffer[: self._pos]
            self._pos = 0
