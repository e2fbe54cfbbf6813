"""The AMQP message format (spec 3.2): sections, the bare/annotated message, and its encoding.

A transfer's payload is a sequence of sections; ``decode_message`` turns it into a ``Message``
and ``encode_message`` back. Annotation and footer keys are written as symbols, application
property keys as strings, as the spec requires, whatever Python string type the caller used.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from . import codec
from .composite import amqp_field, composite, described_wrapper, encoder
from .errors import DecodeError, EncodeError


@composite(0x70, "amqp:header:list")
@dataclass(slots=True)
class Header:
    durable: bool = amqp_field("boolean", default=False)
    priority: int = amqp_field("ubyte", default=4)
    ttl: int | None = amqp_field("uint")
    first_acquirer: bool = amqp_field("boolean", default=False)
    delivery_count: int = amqp_field("uint", default=0)


@composite(0x73, "amqp:properties:list")
@dataclass(slots=True)
class Properties:
    message_id: Any = amqp_field("*")
    user_id: bytes | None = amqp_field("binary")
    to: Any = amqp_field("*")
    subject: str | None = amqp_field("string")
    reply_to: Any = amqp_field("*")
    correlation_id: Any = amqp_field("*")
    content_type: str | None = amqp_field("symbol")
    content_encoding: str | None = amqp_field("symbol")
    absolute_expiry_time: int | None = amqp_field("timestamp")
    creation_time: int | None = amqp_field("timestamp")
    group_id: str | None = amqp_field("string")
    group_sequence: int | None = amqp_field("uint")
    reply_to_group_id: str | None = amqp_field("string")


def _is_map(value: Any) -> bool:
    return isinstance(value, dict)


def _enc_string_keyed_map(out: bytearray, value: Any) -> None:
    """A map with string keys, whatever ``str`` subclass (e.g. a symbol) a key is. Written
    straight into the map's body: no copy of the map (issue 42)."""
    body = bytearray()
    for key, item in value.items():
        if not isinstance(key, str):
            raise EncodeError(f"application-properties keys must be strings, got {key!r}")
        codec._enc_string(body, key)
        codec.encode_into(body, item)
    codec.write_compound(out, body, 2 * len(value), 0xC1)


@described_wrapper(0x71, "amqp:delivery-annotations:map", codec.encode_symbol_keyed_map, _is_map)
@dataclass(slots=True)
class DeliveryAnnotations:
    value: dict[Any, Any]


@described_wrapper(0x72, "amqp:message-annotations:map", codec.encode_symbol_keyed_map, _is_map)
@dataclass(slots=True)
class MessageAnnotations:
    value: dict[Any, Any]


def _is_string_keyed_map(value: Any) -> bool:
    """A map whose keys are strings, as the spec restricts application properties: a peer's
    other key is a decode error (the broker rejects the transfer), not a message that reads
    but cannot be forwarded."""
    if not isinstance(value, dict):
        return False
    for key in value:
        if not isinstance(key, str):
            raise DecodeError(f"application-properties keys must be strings, got {key!r}")
    return True


@described_wrapper(
    0x74, "amqp:application-properties:map", _enc_string_keyed_map, _is_string_keyed_map
)
@dataclass(slots=True)
class ApplicationProperties:
    value: dict[str, Any]


@described_wrapper(0x75, "amqp:data:binary", codec._enc_binary, lambda v: isinstance(v, bytes))
@dataclass(slots=True)
class Data:
    value: bytes


@described_wrapper(0x76, "amqp:amqp-sequence:list", codec._enc_list, lambda v: isinstance(v, list))
@dataclass(slots=True)
class AmqpSequence:
    value: list[Any]


@described_wrapper(0x77, "amqp:amqp-value:*", codec.encode_into)
@dataclass(slots=True)
class AmqpValue:
    value: Any


@described_wrapper(0x78, "amqp:footer:map", codec.encode_symbol_keyed_map, _is_map)
@dataclass(slots=True)
class Footer:
    value: dict[Any, Any]


class BodyType(enum.Enum):
    """Which body sections a message carries (same names as the Service Bus SDK)."""

    DATA = "data"
    SEQUENCE = "sequence"
    VALUE = "value"


@dataclass(slots=True)
class Message:
    """An annotated AMQP message.

    ``body`` is a list of ``bytes`` for DATA (one per data section), a list of lists for
    SEQUENCE, and any AMQP value for VALUE.
    """

    body: Any = field(default_factory=list)
    body_type: BodyType = BodyType.DATA
    header: Header | None = None
    delivery_annotations: dict[Any, Any] | None = None
    message_annotations: dict[Any, Any] | None = None
    properties: Properties | None = None
    application_properties: dict[str, Any] | None = None
    footer: dict[Any, Any] | None = None

    @classmethod
    def from_bytes(cls, payload: bytes, **sections: Any) -> Message:
        """A message with one data section."""
        return cls(body=[bytes(payload)], body_type=BodyType.DATA, **sections)

    @property
    def data(self) -> bytes:
        """The data sections joined (the common single-section case)."""
        if self.body_type is not BodyType.DATA:
            raise TypeError(f"message body is {self.body_type.value}, not data")
        return b"".join(self.body)


_SECTION_ORDER = {
    Header: 0,
    DeliveryAnnotations: 1,
    MessageAnnotations: 2,
    Properties: 3,
    ApplicationProperties: 4,
    Data: 5,
    AmqpSequence: 5,
    AmqpValue: 5,
    Footer: 6,
}


_write_header, _write_properties = encoder(Header), encoder(Properties)


def encode_message(message: Message) -> bytes:
    """The transfer payload for ``message``: its sections in spec order."""
    out = bytearray()
    if message.header is not None:
        _write_header(out, message.header)
    if message.delivery_annotations is not None:
        out += b"\x00\x53\x71"
        codec.encode_symbol_keyed_map(out, message.delivery_annotations)
    if message.message_annotations is not None:
        out += b"\x00\x53\x72"
        codec.encode_symbol_keyed_map(out, message.message_annotations)
    if message.properties is not None:
        _write_properties(out, message.properties)
    if message.application_properties is not None:
        out += b"\x00\x53\x74"
        _enc_string_keyed_map(out, message.application_properties)
    body_type = message.body_type
    if body_type is BodyType.DATA:
        for chunk in message.body:
            out += b"\x00\x53\x75"
            codec._enc_binary(out, chunk)
    elif body_type is BodyType.SEQUENCE:
        for items in message.body:
            out += b"\x00\x53\x76"
            codec._enc_list(out, items)
    else:
        out += b"\x00\x53\x77"
        codec.encode_into(out, message.body)
    if message.footer is not None:
        out += b"\x00\x53\x78"
        codec.encode_symbol_keyed_map(out, message.footer)
    return bytes(out)


def decode_message(payload: bytes | bytearray | memoryview) -> Message:
    """Parses a transfer payload; sections out of order or of mixed body kinds are an error."""
    message = Message()
    body: list[Any] = []
    body_type: BodyType | None = None
    last = -1
    for section in codec.decode_all(payload):
        rank = _SECTION_ORDER.get(type(section))
        if rank is None:
            raise DecodeError(f"not a message section: {section!r}")
        if rank < last or (rank == last and rank != 5):
            raise DecodeError(f"{type(section).__name__} section out of order or repeated")
        last = rank
        kind = type(section)
        if kind is Data or kind is AmqpSequence or kind is AmqpValue:
            this = (
                BodyType.DATA
                if kind is Data
                else BodyType.SEQUENCE
                if kind is AmqpSequence
                else BodyType.VALUE
            )
            if body_type is not None and (body_type is not this or this is BodyType.VALUE):
                raise DecodeError("a message body mixes section kinds or repeats amqp-value")
            body_type = this
            body.append(section.value)
        elif kind is Header:
            message.header = section
        elif kind is Properties:
            message.properties = section
        elif kind is DeliveryAnnotations:
            message.delivery_annotations = section.value
        elif kind is MessageAnnotations:
            message.message_annotations = section.value
        elif kind is ApplicationProperties:
            message.application_properties = section.value
        else:
            message.footer = section.value
    if body_type is BodyType.VALUE:
        message.body = body[0]
        message.body_type = BodyType.VALUE
    else:
        message.body = body
        message.body_type = body_type or BodyType.DATA
    return message
