"""AMQP messages on the wire: a delivery's bytes to a ``Message``, a ``Message`` to the bytes
``azure-servicebus`` would send.

Decoding fills every field as ``sdk.from_received`` fills it from the SDK's
``ServiceBusReceivedMessage``, with the same values (tests/servicebus/test_client.py holds
the SDK up as the oracle), but that application properties keep their AMQP types, which the
SDK's reader loses (``_properties``: equal values, of the plain types' subclasses, so a
forwarded message's properties go out as they came in). A delivery is read with
``amqp.scan``: the sections Service Bus sends, only the annotations a ``Message`` keeps (not
the lock token, ...), the body bytes as they are; anything else (an amqp-value or
amqp-sequence body, another encoding) goes through the general decoder, which raises
``DecodeError`` for a malformed one. Which header field, property, annotation or
application property fills which ``Message`` field is ``fields.FIELDS``' ``amqp`` column,
written out in ``_message`` and ``encode`` (the receive and send paths' hot code,
bench/replication.py; tests/tasks/test_adapters.py holds both to the table).

Encoding writes what the SDK writes (docs/sdk-wire-notes.md section 3): a header only with a
time to live (``ttl`` in ms); message annotations ``x-opt-partition-key`` (only without a
session id, as ``to_sdk`` does) and ``x-opt-scheduled-enqueue-time`` (a timestamp);
properties (a new ``str(uuid4())`` message-id when the message has none, as the SDK's
constructor makes one); application properties with string keys (``property_value``; a
received one goes out with the type it came with); the body as one data section.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta
from operator import attrgetter
from typing import Any, Final

from ..amqp import codec, scan
from ..amqp.composite import encoder, fields_encoder
from ..amqp.errors import EncodeError
from ..amqp.message import BodyType, Header, Properties, decode_message
from ..amqp.message import Message as AmqpMessage
from ..amqp.types import int32, long, timestamp, ulong
from ..messages import Message, PropertyValue
from ..symbols import (
    DEAD_LETTER_DESCRIPTION,
    DEAD_LETTER_REASON,
    DEAD_LETTER_SOURCE,
    ENQUEUED_TIME,
    LOCKED_UNTIL,
    OFFSET,
    PARTITION_KEY,
    SCHEDULED_ENQUEUE_TIME,
    SEQUENCE_NUMBER,
)
from .fields import in_section, position
from .values import text

_CE_ZERO_MS = -62_135_596_800_000
"""What brokers write for "no time" (0001-01-01); the SDK makes it ``datetime.min``."""
_INT32 = range(-(2**31), 2**31)
_ULONG_ONLY = range(2**63, 2**64)


def _time(ms: Any) -> datetime | None:
    if not ms or not isinstance(ms, int):
        return None
    moment = _times.get(ms)
    if moment is not None:  # a batch's messages were mostly enqueued, and locked, together
        return moment
    if ms == _CE_ZERO_MS:
        return datetime.min.replace(tzinfo=UTC)
    moment = datetime.fromtimestamp(ms / 1000.0, UTC)  # as the SDK does (float seconds)
    if len(_times) >= _TIMES_KEPT:
        _times.clear()
    _times[ms] = moment
    return moment


_times: dict[int, datetime] = {}
"""The times ``_time`` made lately, by ms (a datetime is immutable: sharing it is safe). By
value, not just the last one: a message's enqueued time and lock expiry take turns."""
_TIMES_KEPT = 256


def _duration(ms: Any) -> timedelta | None:
    return timedelta(milliseconds=ms) if ms else None


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


# -- the table's AMQP column, written out below (``_message``, ``encode``): where a field is
# in the header's and the properties' described lists (what ``scan`` hands back, None-padded)
_TTL: Final = position("header", "ttl")
_DELIVERY_COUNT: Final = position("header", "delivery_count")
_MESSAGE_ID: Final = position("properties", "message_id")
_TO: Final = position("properties", "to")
_SUBJECT: Final = position("properties", "subject")
_REPLY_TO: Final = position("properties", "reply_to")
_CORRELATION_ID: Final = position("properties", "correlation_id")
_CONTENT_TYPE: Final = position("properties", "content_type")
_GROUP_ID: Final = position("properties", "group_id")
_REPLY_TO_GROUP_ID: Final = position("properties", "reply_to_group_id")
_HEADER_LIST = attrgetter(*(f.name for f in dataclasses.fields(Header)))
_PROPERTIES_LIST = attrgetter(*(f.name for f in dataclasses.fields(Properties)))
"""The general decoder's sections as the same lists (its slow path only)."""
_WANTED_ANNOTATIONS = {f.amqp.key.encode(): f.amqp.key for f in in_section("annotations")}
"""The annotations a ``Message`` keeps (``scan.pick`` skips the rest: the lock token...)."""
_DEAD_LETTER_REASON: Final = str(DEAD_LETTER_REASON)
_DEAD_LETTER_DESCRIPTION: Final = str(DEAD_LETTER_DESCRIPTION)


# ---------------------------------------------------------------------- decoding


def decode_to_message(payload: bytes, source: Any = None) -> Message:
    """The ``Message`` of one delivery's bytes."""
    try:
        return _scanned(payload, source)
    except Exception:  # scan.Unusual, or a value the shortcut cannot hold: the general path says
        pass
    return to_message(decode_message(payload), source)


def decode_arrived(payload: bytes) -> Message | Exception:
    """Decodes as a delivery arrives (while the pump may be waiting on its target); a
    payload that cannot be decoded becomes its error, for the reader to deal with."""
    try:
        return decode_to_message(payload)
    except Exception as exc:  # e.g. DecodeError, or a timestamp no datetime can hold
        return exc


def to_message(amqp: AmqpMessage, source: Any = None) -> Message:
    """The ``Message`` of a message the general decoder built."""
    props = amqp.properties
    body = amqp.body
    if amqp.body_type is BodyType.DATA:
        body = body[0] if len(body) == 1 else b"".join(body)
    else:
        body = _other_body(body)
    header = amqp.header
    return _message(
        bytes(body),
        None if header is None else list(_HEADER_LIST(header)),
        None if props is None else list(_PROPERTIES_LIST(props)),
        amqp.message_annotations or {},
        amqp.application_properties,
        source,
    )


def _scanned(payload: bytes, source: Any) -> Message:
    found = scan.scan(payload)
    if not found.body_is_data:
        raise scan.Unusual("an amqp-value or amqp-sequence body")
    chunks = found.data
    return _message(
        chunks[0] if len(chunks) == 1 else b"".join(chunks),
        found.header,
        found.properties,
        (
            scan.pick(payload, found.annotations_at, _WANTED_ANNOTATIONS)
            if found.annotations_at >= 0
            else {}
        ),
        (
            scan.string_map(payload, found.application_properties_at)
            if found.application_properties_at >= 0
            else None
        ),
        source,
    )


def _message(
    body: bytes,
    header: list[Any] | None,
    properties: list[Any] | None,
    annotations: dict[Any, Any],
    app: dict[Any, Any] | None,
    source: Any,
) -> Message:
    """The one place the AMQP values become a ``Message``: ``fields.FIELDS``' AMQP column
    written out (tests/tasks/test_adapters.py holds it to the table), so that mypyc compiles
    it, and the ``Message`` made with its fields in their order, not by keyword (a keyword
    call of the dataclass's ``__init__`` cost three times as much; a field added to
    ``Message`` must be added here in its place). ``header`` and ``properties``
    are their described lists, None-padded (``scan``)."""
    if properties is None:
        message_id = session_id = correlation_id = subject = content_type = None
        to = reply_to = reply_to_session_id = None
    else:
        message_id = text(properties[_MESSAGE_ID])
        session_id = text(properties[_GROUP_ID])
        correlation_id = text(properties[_CORRELATION_ID])
        subject = text(properties[_SUBJECT])
        content_type = text(properties[_CONTENT_TYPE])
        to = text(properties[_TO])
        reply_to = text(properties[_REPLY_TO])
        reply_to_session_id = text(properties[_REPLY_TO_GROUP_ID])
    time_to_live: timedelta | None = None
    delivery_count: int | None = None
    if header is not None:
        time_to_live = _duration(header[_TTL])
        count = header[_DELIVERY_COUNT]
        delivery_count = 0 if count is None else int(count)  # the header's default
    dead_letter_reason: str | None = None
    dead_letter_description: str | None = None
    if app:
        reason = app.get(_DEAD_LETTER_REASON)
        dead_letter_reason = reason if type(reason) is str else None
        description = app.get(_DEAD_LETTER_DESCRIPTION)
        dead_letter_description = description if type(description) is str else None
        application_properties = _properties(app)
    else:
        application_properties = {}
    return Message(
        body,
        message_id,
        session_id,
        text(annotations.get(PARTITION_KEY)),
        correlation_id,
        subject,
        content_type,
        reply_to,
        reply_to_session_id,
        to,
        time_to_live,
        _time(annotations.get(SCHEDULED_ENQUEUE_TIME)),
        application_properties,
        _time(annotations.get(ENQUEUED_TIME)),
        _int(annotations.get(SEQUENCE_NUMBER)),
        delivery_count,
        _time(annotations.get(LOCKED_UNTIL)),
        dead_letter_reason,
        dead_letter_description,
        text(annotations.get(DEAD_LETTER_SOURCE)),
        text(annotations.get(OFFSET)),
        None,  # partition_id: the reader's to set
        None,  # target
        source,
    )


def _properties(app: dict[Any, Any]) -> dict[str, PropertyValue]:
    """The application properties as the codec decoded them, so that each goes out again
    with its AMQP type (a .NET reader casts a long to ``long`` and a char to ``char``):
    the codec's marker types kept (``int32``, ``timestamp``, ``decimal128``, ``char``...;
    subclasses of the plain types, so steps and filters read them as those), binary kept
    as bytes, and a long marked (``types.long``), which the SDK's rule would send as an int
    when it fits. The SDK reader (``sdk.from_received``) cannot tell these apart."""
    out: dict[str, PropertyValue] = {}
    for key, value in app.items():
        if type(value) is int:
            value = long(value)
        out[key if type(key) is str else str(key)] = value
    return out


def _other_body(body: Any) -> bytes:
    """amqp-value / amqp-sequence bodies, as ``sdk.body_bytes`` makes them."""
    if isinstance(body, bytes | bytearray):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    try:
        return b"".join(
            _other_body(part) if isinstance(part, str) else bytes(part) for part in body
        )
    except TypeError:
        return str(body).encode("utf-8")


# ---------------------------------------------------------------------- encoding


_write_header = encoder(Header)
_write_properties_fields = fields_encoder(Properties)


def encode(message: Message, *, event_hub: bool = False) -> bytes:
    """The bytes of ``message`` as a sender puts them on the wire (see the module);
    ``event_hub``: as an event, whose partition key goes with a session id (group-id) too.
    The table's sent fields written out (tests/tasks/test_adapters.py holds them to it): a
    loop over the table, keyword calls and a dict per section cost a quarter of the
    replicator's time per message (issue 42)."""
    out = bytearray()
    ttl = message.time_to_live
    if ttl is not None:
        _write_header(out, Header(ttl=int(ttl.total_seconds() * 1000)))
    session_id = message.session_id
    partition_key = message.partition_key
    if session_id is not None and not event_hub:
        partition_key = None  # Service Bus wants a session's partition key to be its session id
    scheduled = message.scheduled_enqueue_time
    if partition_key is not None or scheduled is not None:
        annotations: dict[Any, Any] = {}
        if partition_key is not None:
            annotations[PARTITION_KEY] = partition_key
        if scheduled is not None:
            annotations[SCHEDULED_ENQUEUE_TIME] = timestamp.from_datetime(scheduled)
        out += b"\x00\x53\x72"
        codec.encode_symbol_keyed_map(out, annotations)
    message_id = message.message_id
    _write_properties_fields(  # the values in its fields' order, no ``Properties`` built
        out,
        (
            str(uuid.uuid4()) if message_id is None else message_id,
            None,  # user-id
            message.to,
            message.subject,
            message.reply_to,
            message.correlation_id,
            message.content_type,
            None,  # content-encoding
            None,  # absolute-expiry-time
            None,  # creation-time
            session_id,  # group-id
            None,  # group-sequence
            message.reply_to_session_id,  # reply-to-group-id
        ),
    )
    application = message.application_properties
    if application:
        out += b"\x00\x53\x74"
        _write_application_properties(out, application)
    out += b"\x00\x53\x75"
    codec._enc_binary(out, message.body)
    return bytes(out)


def _write_application_properties(out: bytearray, application: dict[Any, Any]) -> None:
    """The map ``_enc_string_keyed_map`` writes of the ``property_value`` of each value,
    written straight: strings and 32-bit ints (most values, and every stamp) without the
    map of converted values and an ``int32`` made for each. Bytes go as binary: a received
    binary value must stay one (``property_value``'s UTF-8 rule is for what the SDK sends)."""
    body = bytearray()
    for key, value in application.items():
        if not isinstance(key, str):
            raise EncodeError(f"application-properties keys must be strings, got {key!r}")
        codec._enc_string(body, key)
        kind = type(value)
        if kind is str:
            codec._enc_string(body, value)
        elif kind is int and value in _INT32:
            codec._enc_int(body, value)
        elif kind is bytes:
            codec._enc_binary(body, value)  # binary as received stays binary
        else:
            codec.encode_into(body, property_value(value))
    codec.write_compound(out, body, 2 * len(application), 0xC1)


def property_value(value: Any) -> Any:
    """An application property value as the SDK encodes it: ints as AMQP int when they fit
    32 bits (its ``encode_int``), else long; bytes as strings when they are UTF-8 (the SDK
    decodes them, for parity with uamqp; it fails on other bytes, which go as binary here).
    The codec's marker types (``types.long``, ``int32``, ``decimal128``...) as they are."""
    if type(value) is int:
        if value in _INT32:
            return int32(value)
        if value in _ULONG_ONLY:
            return ulong(value)  # only a ulong holds it: one the SDK's reader gave as an int
    if type(value) in (bytes, bytearray):  # not decimal128, a bytes subclass
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(value)
    if isinstance(value, datetime):
        return timestamp.from_datetime(value)
    return value
