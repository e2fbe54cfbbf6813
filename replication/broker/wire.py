"""Service Bus message layout on the wire: what the broker reads from a send, writes to a receive.

A sender's message is split once into the parts the broker needs (ids, TTL, schedule) and
the bare message, kept byte for byte; a delivery is a fresh header and message-annotations
section (sequence number, enqueued time, lock expiry, ...) followed by those same bytes, so a
message is never re-encoded on its way through.
"""

from __future__ import annotations

import dataclasses
import struct
import uuid
from dataclasses import dataclass
from typing import Any, Final

from ..amqp import codec, scan
from ..amqp.composite import decoder, encoder
from ..amqp.errors import DecodeError
from ..amqp.message import (
    AmqpSequence,
    AmqpValue,
    ApplicationProperties,
    Data,
    DeliveryAnnotations,
    Footer,
    Header,
    MessageAnnotations,
    Properties,
)
from ..amqp.types import symbol
from ..symbols import (
    DEAD_LETTER_SOURCE,
    ENQUEUE_SEQUENCE_NUMBER,
    ENQUEUED_TIME,
    LOCK_TOKEN,
    LOCKED_UNTIL,
    MESSAGE_STATE,
    SCHEDULED_ENQUEUE_TIME,
    SEQUENCE_NUMBER,
)
from .guids import GUIDS, guid_bytes

MAX_HEADER_TTL: Final = 0xFFFFFFFF
"""The longest time to live the header's uint holds (49.7 days in ms)."""

BATCH_FORMAT: Final = 0x80013700
"""message-format of a Service Bus batch: each data section holds one encoded message."""

_header_of, _properties_of = decoder(Header), decoder(Properties)
_write_annotations = encoder(MessageAnnotations)

_BROKER_KEYS: Final = frozenset(
    {
        SEQUENCE_NUMBER,
        ENQUEUED_TIME,
        LOCKED_UNTIL,
        LOCK_TOKEN,
        MESSAGE_STATE,
        ENQUEUE_SEQUENCE_NUMBER,
    }
)
_BARE_SECTIONS: Final = (Properties, ApplicationProperties, Data, AmqpSequence, AmqpValue, Footer)


@dataclass(slots=True, init=False)
class IncomingMessage:
    """One message as sent, split into what the broker interprets and the bytes it keeps;
    ``__init__`` written out for mypyc (see ``store.StoredMessage``)."""

    header: Header | None
    annotations: dict[Any, Any]
    properties: Properties | None
    application_properties: dict[str, Any] | None
    bare: bytes
    size: int
    properties_span: tuple[int, int] | None = dataclasses.field(default=None, compare=False)
    """Where in ``bare`` the properties section is, when known (so it can be replaced
    without reading the sections again)."""

    def __init__(
        self,
        header: Header | None,
        annotations: dict[Any, Any],
        properties: Properties | None,
        application_properties: dict[str, Any] | None,
        bare: bytes,
        size: int,
        properties_span: tuple[int, int] | None = None,
    ) -> None:
        self.header = header
        self.annotations = annotations
        self.properties = properties
        self.application_properties = application_properties
        self.bare = bare
        self.size = size
        self.properties_span = properties_span

    @property
    def message_id(self) -> str | None:
        value = self.properties.message_id if self.properties else None
        return None if value is None else str(value)

    @property
    def session_id(self) -> str | None:
        return self.properties.group_id if self.properties else None

    @property
    def ttl_ms(self) -> int | None:
        """The sender's time to live: the header ttl, or, where that is the largest a uint
        holds (49.7 days, as the SDKs cap it), ``absolute-expiry-time - creation-time`` when
        that is longer: the SDKs carry a longer TTL only there."""
        ttl = int(self.header.ttl) if self.header and self.header.ttl else None
        if ttl == MAX_HEADER_TTL and self.properties is not None:
            expires, created = self.properties.absolute_expiry_time, self.properties.creation_time
            if expires is not None and created is not None and expires - created > ttl:
                return int(expires - created)
        return ttl

    @property
    def scheduled_ms(self) -> int | None:
        value = self.annotations.get(SCHEDULED_ENQUEUE_TIME)
        return int(value) if value is not None else None


def ensure_message_id(message: IncomingMessage) -> IncomingMessage:
    """Gives a message sent without a message-id one, as Service Bus does: a new GUID as 32
    hex digits, written into the kept bare message (so it is durable, and the same on every
    delivery)."""
    if message.properties is not None and message.properties.message_id is not None:
        return message
    message_id = new_message_id()
    if message.properties is None:  # the common case: a properties section goes in front
        section = _ID_ONLY_PROPERTIES + message_id.encode()
        message.size += len(section)
        message.bare = section + message.bare
        message.properties = Properties(message_id=message_id)
        message.properties_span = (0, len(section))
        return message
    properties = message.properties  # this message's own (parsed for it): set in place
    properties.message_id = message_id
    spliced = _with_message_id(message.bare, message.properties_span, message_id)
    if spliced is not None:
        bare, span = spliced
    else:
        bare, span = _with_properties(message.bare, properties, message.properties_span)
    message.size += len(bare) - len(message.bare)
    message.bare, message.properties, message.properties_span = bare, properties, span
    return message


def with_expiry(message: IncomingMessage, start_ms: int, expires_ms: int | None) -> IncomingMessage:
    """The message as an entity keeps it: ``absolute-expiry-time`` is the instant it expires
    there (Service Bus: "ignored on input, authoritative on output") and ``creation-time``
    the instant its time to live counts from (the enqueued or scheduled time), so a receiver
    that reads TimeToLive as their difference (the .NET, Java and JavaScript SDKs) gets the
    TTL in force exactly, whatever the sender's clock said. A message that never expires
    keeps the sender's ``creation-time`` and has no ``absolute-expiry-time``. A copy when it
    changes, since a topic hands the same message to subscriptions with different TTLs."""
    properties = message.properties
    current = (properties.absolute_expiry_time, properties.creation_time) if properties else None
    if expires_ms is None:
        if current is None or current[0] is None:
            return message
        wanted = dataclasses.replace(properties or Properties(), absolute_expiry_time=None)
    else:
        if current == (expires_ms, start_ms):
            return message
        wanted = dataclasses.replace(
            properties or Properties(), absolute_expiry_time=expires_ms, creation_time=start_ms
        )
    bare, span = _with_properties(message.bare, wanted, message.properties_span)
    return dataclasses.replace(
        message,
        properties=wanted,
        bare=bare,
        size=message.size + len(bare) - len(message.bare),
        properties_span=span,
    )


def _with_properties(
    bare: bytes, properties: Properties, span: tuple[int, int] | None
) -> tuple[bytes, tuple[int, int]]:
    """The bare message with its properties section (at ``span`` when known) replaced, or
    added in front; every other section keeps the sender's bytes. Also where it is now."""
    encoded = bytearray()
    codec.encode_into(encoded, properties)
    if span is None:
        span = (0, 0)  # no properties section: insert one at the front
        pos = 0
        while pos < len(bare):
            section_start = pos
            section, pos = codec.decode_at(bare, pos)
            if type(section) is Properties:
                span = (section_start, pos)
                break
    start, end = span
    return bare[:start] + bytes(encoded) + bare[end:], (start, start + len(encoded))


def _with_message_id(
    bare: bytes, span: tuple[int, int] | None, message_id: str
) -> tuple[bytes, tuple[int, int]] | None:
    """The bare message with a 32-character ``message_id`` written over the null first field
    of its properties section, when that is a small list (as clients write it) or an empty
    one (as proton writes it); else None."""
    if span is None:
        return None
    start, end = span
    if bare[start:end] == _EMPTY_PROPERTIES and len(message_id) == 32:
        section = _ID_ONLY_PROPERTIES + message_id.encode()
        return bare[:start] + section + bare[end:], (start, start + len(section))
    if end - start < 7 or bare[start : start + 4] != _PROPERTIES_LIST8 or bare[start + 6] != 0x40:
        return None
    size = bare[start + 4] + 2 + len(message_id) - 1  # str8 0xa1 <len> <id> for the null
    if size > 0xFF or len(message_id) != 32:
        return None
    section = b"".join(
        (
            _PROPERTIES_LIST8,
            bytes((size, bare[start + 5])),
            b"\xa1\x20",
            message_id.encode(),
            bare[start + 7 : end],
        )
    )
    return bare[:start] + section + bare[end:], (start, start + len(section))


_PROPERTIES_LIST8: Final = b"\x00\x53\x73\xc0"
_EMPTY_PROPERTIES: Final = b"\x00\x53\x73\x45"
_ID_ONLY_PROPERTIES: Final = b"\x00\x53\x73\xc0\x23\x01\xa1\x20"
"""A properties section (list8 of one field) up to its 32-character message-id string."""


def new_message_id() -> str:
    """A message-id as Service Bus assigns one: a random GUID, 32 hex digits, no dashes."""
    return GUIDS.hex()


def parse_message(payload: bytes) -> IncomingMessage:
    """Splits one encoded message; the bare part is kept as the sender wrote it. The body is
    passed over by its size (``amqp.scan``); a form the scanner does not read goes through
    the general decoder, which also names what is wrong with a malformed one."""
    try:
        return _scanned(payload)
    except Exception:  # scan.Unusual, or a value the scanner's shortcut cannot hold
        return _decoded(payload)


def _scanned(payload: bytes) -> IncomingMessage:
    found = scan.scan(payload)
    header = _header_of(found.header) if found.header else None
    properties = _properties_of(found.properties) if found.properties is not None else None
    annotations: dict[Any, Any] = {}
    if found.annotations_at >= 0:
        annotations = dict(codec.decode_at(payload, found.annotations_at)[0])
    application_properties = None
    if found.application_properties_at >= 0:
        application_properties = scan.string_map(payload, found.application_properties_at)
    span = found.properties_span or (found.bare_start, found.bare_start)  # none: in front
    span = (span[0] - found.bare_start, span[1] - found.bare_start)
    return IncomingMessage(
        header,
        annotations,
        properties,
        application_properties,
        payload[found.bare_start : found.bare_end],
        len(payload),
        span,
    )


def _decoded(payload: bytes) -> IncomingMessage:
    header = None
    annotations: dict[Any, Any] = {}
    properties = None
    application_properties = None
    bare_start = bare_end = len(payload)
    pos = 0
    while pos < len(payload):
        start = pos
        section, pos = codec.decode_at(payload, pos)
        kind = type(section)
        if kind is DeliveryAnnotations:
            if bare_start != len(payload):  # the SDK writes them last: not part of the message
                bare_end = min(bare_end, start)
            continue
        if bare_end != len(payload):
            raise DecodeError(f"{kind.__name__} after the delivery-annotations")
        if kind in _BARE_SECTIONS:
            if bare_start == len(payload):
                bare_start = start
            if kind is Properties:
                properties = section
            elif kind is ApplicationProperties:
                application_properties = section.value
        elif bare_start != len(payload):
            raise DecodeError(f"{kind.__name__} after the bare message")
        elif kind is Header:
            header = section
        elif kind is MessageAnnotations:
            annotations = dict(section.value)
        else:
            raise DecodeError(f"not a message section: {section!r}")
    return IncomingMessage(
        header,
        annotations,
        properties,
        application_properties,
        payload[bare_start:bare_end],
        len(payload),
    )


def parse_transfer(payload: bytes, message_format: int) -> list[IncomingMessage]:
    """The messages of one transfer: one, or each data section of a batch."""
    return [parse_message(part) for part in transfer_parts(payload, message_format)]


def transfer_parts(payload: bytes, message_format: int) -> list[bytes]:
    """The encoded messages of one transfer: the payload, or each data section of a batch."""
    if message_format != BATCH_FORMAT:
        return [payload]
    try:
        return scan.scan(payload).data
    except scan.Unusual:  # the general decoder reads it, or says what is wrong
        return [section.value for section in codec.decode_all(payload) if type(section) is Data]


def encode_annotations(annotations: dict[Any, Any]) -> bytes:
    """The message-annotations section bytes the store keeps (sender's keys only)."""
    if not annotations:
        return b""
    kept = {k: v for k, v in annotations.items() if k not in _BROKER_KEYS}
    if not kept:
        return b""
    out = bytearray()
    _write_annotations(out, MessageAnnotations(kept))
    return bytes(out)


def delivery_payload(
    *,
    bare: bytes,
    sender_annotations: bytes | None,
    sequence_number: int,
    enqueued_ms: int,
    delivery_count: int,
    ttl_ms: int | None,
    locked_until_ms: int | None,
    lock_token: uuid.UUID | None,
    state: int = 0,
    dead_letter_source: str | None = None,
) -> bytes:
    """The bytes of one delivery: header, the lock token (delivery annotations), merged
    message annotations, then the sender's bare message.

    Written straight from the values (every delivery goes through here): the sender's stored
    annotation entries are copied undecoded and the broker's appended after them."""
    ttl = ttl_ms if ttl_ms and ttl_ms <= MAX_HEADER_TTL else None
    header = b"".join(
        (
            b"\x41\x50\x04",
            codec.uint_bytes(ttl) if ttl is not None else b"\x40",
            b"\x42",
            codec.uint_bytes(delivery_count),
        )
    )
    count, entries = 0, b""
    if sender_annotations:
        count, entries = _sender_entries(sender_annotations, dead_letter_source)
    # a list of parts joined once: a bytearray grown part by part cost a third more
    pairs = [
        entries,
        _SEQUENCE_NUMBER_KEY,
        _long(sequence_number),
        _ENQUEUED_TIME_KEY,
        _pack_int64(0x83, enqueued_ms),
        _ENQUEUE_SEQUENCE_NUMBER_KEY,
        _long(sequence_number),
    ]
    count += 6
    if locked_until_ms is not None:
        pairs += (_LOCKED_UNTIL_KEY, _pack_int64(0x83, locked_until_ms))
        count += 2
    if state:
        pairs += (_MESSAGE_STATE_KEY, _long(state))
        count += 2
    if dead_letter_source:
        source = bytearray()
        codec.encode_into(source, dead_letter_source)
        pairs += (_DEAD_LETTER_SOURCE_KEY, bytes(source))
        count += 2
    annotations = b"".join(pairs)
    size = len(annotations)
    if size < 0xFF and count <= 0xFF:  # as codec.write_compound chooses
        compound = bytes((0xC1, size + 1, count))
    else:
        compound = _pack_map32(0xD1, size + 4, count)
    return b"".join(
        (
            _HEADER_SECTION,
            bytes((len(header) + 1, 5)),
            header,
            b"" if lock_token is None else _LOCK_TOKEN_SECTION + guid_bytes(lock_token),
            _ANNOTATIONS_SECTION,
            compound,
            annotations,
            bare,
        )
    )


def _symbol(name: str) -> bytes:
    out = bytearray()
    codec.encode_into(out, symbol(name))
    return bytes(out)


_HEADER_SECTION: Final = b"\x00\x53\x70\xc0"
_ANNOTATIONS_SECTION: Final = b"\x00\x53\x72"
_SEQUENCE_NUMBER_KEY: Final = _symbol(SEQUENCE_NUMBER)
_ENQUEUED_TIME_KEY: Final = _symbol(ENQUEUED_TIME)
_ENQUEUE_SEQUENCE_NUMBER_KEY: Final = _symbol(ENQUEUE_SEQUENCE_NUMBER)
_LOCKED_UNTIL_KEY: Final = _symbol(LOCKED_UNTIL)
_LOCK_TOKEN_KEY: Final = _symbol(LOCK_TOKEN)
_MESSAGE_STATE_KEY: Final = _symbol(MESSAGE_STATE)
_DEAD_LETTER_SOURCE_KEY: Final = _symbol(DEAD_LETTER_SOURCE)
_LOCK_TOKEN_SECTION: Final = (
    bytes((0x00, 0x53, 0x71, 0xC1, len(_LOCK_TOKEN_KEY) + 18, 2)) + _LOCK_TOKEN_KEY + b"\x98"
)
"""Delivery annotations holding only ``x-opt-lock-token``, but the token's 16 bytes: where
Service Bus puts it ("the token may also appear in the DeliveryAnnotations as
x-opt-lock-token", the request-response guide), not with the message annotations."""
_pack_int64: Final = struct.Struct(">Bq").pack
_pack_map32: Final = struct.Struct(">BII").pack


def _long(value: int) -> bytes:
    if -0x80 <= value <= 0x7F:
        return bytes((0x55, value & 0xFF))
    return _pack_int64(0x81, value)


def _sender_entries(section: bytes, dead_letter_source: str | None) -> tuple[int, bytes]:
    """The stored annotation section's entries and their count (keys and values); a sender's
    own dead-letter source gives way to the broker's."""
    if dead_letter_source and _DEAD_LETTER_SOURCE_KEY in section:
        kept = {k: v for k, v in codec.decode(section).value.items() if k != DEAD_LETTER_SOURCE}
        if not kept:
            return 0, b""
        section = encode_annotations(kept)
    return scan.map_items(section, len(_ANNOTATIONS_SECTION))


def rewrite_bare(
    bare: bytes,
    properties: Properties | None = None,
    application_properties: dict[str, Any] | None = None,
) -> bytes:
    """The bare message with its properties and/or application-properties replaced (kept
    when None); body and footer sections are copied unchanged, in order."""
    out = bytearray()
    old_properties: Properties | None = None
    old_app: dict[str, Any] | None = None
    rest: list[Any] = []
    for section in codec.decode_all(bare):
        if type(section) is Properties:
            old_properties = section
        elif type(section) is ApplicationProperties:
            old_app = dict(section.value)
        else:
            rest.append(section)
    properties = properties if properties is not None else old_properties
    app = application_properties if application_properties is not None else old_app
    if properties is not None:
        codec.encode_into(out, properties)
    if app:
        codec.encode_into(out, ApplicationProperties(app))
    for section in rest:
        codec.encode_into(out, section)
    return bytes(out)


def with_application_properties(bare: bytes, updates: dict[str, Any]) -> bytes:
    """The bare message with some application properties added or overwritten."""
    current: dict[str, Any] = {}
    for section in codec.decode_all(bare):
        if type(section) is ApplicationProperties:
            current = dict(section.value)
    current.update(updates)
    return rewrite_bare(bare, application_properties=current)


def optional_text(value: Any) -> str | None:
    """A dead-letter reason or description as text (peers send str, symbol or nothing)."""
    return None if value is None else str(value)


def lock_token_for_tag(tag: bytes) -> uuid.UUID:
    """The SDK reads the lock token as ``UUID(bytes_le=delivery_tag)``."""
    return uuid.UUID(bytes_le=bytes(tag))
