"""A received Service Bus message as the task library's ``Message``: the mirror of
``outgoing.py``.

Every field is filled as ``messages.from_received`` fills it from the SDK's
``ServiceBusReceivedMessage``, with the same values (tests/servicebus/test_client.py holds
the SDK up as the oracle). A delivery is read with ``amqp.scan``: the sections Service Bus
sends, only the annotations a ``Message`` keeps (not the lock token, ...), the body bytes as
they are; anything else (an amqp-value or amqp-sequence body, another encoding) goes through
the general decoder, which raises ``DecodeError`` for a malformed one.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

from ..amqp import scan
from ..amqp.message import BodyType, decode_message
from ..amqp.message import Message as AmqpMessage
from ..messages import Message, PropertyValue
from .symbols import (
    DEAD_LETTER_SOURCE,
    ENQUEUED_TIME,
    LOCKED_UNTIL,
    PARTITION_KEY,
    SCHEDULED_ENQUEUE_TIME,
    SEQUENCE_NUMBER,
)

_CE_ZERO_MS = -62_135_596_800_000
"""What brokers write for "no time" (0001-01-01); the SDK makes it ``datetime.min``."""
_PLAIN = (str, int, float, bool, bytes, type(None))
_WANTED_ANNOTATIONS = {
    PARTITION_KEY.encode(): PARTITION_KEY,
    SCHEDULED_ENQUEUE_TIME.encode(): SCHEDULED_ENQUEUE_TIME,
    ENQUEUED_TIME.encode(): ENQUEUED_TIME,
    SEQUENCE_NUMBER.encode(): SEQUENCE_NUMBER,
    DEAD_LETTER_SOURCE.encode(): DEAD_LETTER_SOURCE,
    LOCKED_UNTIL.encode(): LOCKED_UNTIL,
}


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
        body=bytes(body),
        header=None if header is None else (header.ttl, header.delivery_count),
        properties=None if props is None else (
            props.message_id, props.to, props.subject, props.reply_to, props.correlation_id,
            props.content_type, props.group_id, props.reply_to_group_id,
        ),
        annotations=amqp.message_annotations or {},
        app=amqp.application_properties,
        source=source,
    )  # fmt: skip


def _scanned(payload: bytes, source: Any) -> Message:
    found = scan.scan(payload)
    if not found.body_is_data:
        raise scan.Unusual("an amqp-value or amqp-sequence body")
    props = found.properties
    header = found.header
    chunks = found.data
    return _message(
        body=chunks[0] if len(chunks) == 1 else b"".join(chunks),
        header=None if header is None else (header[2], 0 if header[4] is None else header[4]),
        properties=None if props is None else (
            props[0], props[2], props[3], props[4], props[5], props[6], props[10], props[12],
        ),
        annotations=(
            scan.pick(payload, found.annotations_at, _WANTED_ANNOTATIONS)
            if found.annotations_at >= 0
            else {}
        ),
        app=(
            scan.string_map(payload, found.application_properties_at)
            if found.application_properties_at >= 0
            else None
        ),
        source=source,
    )  # fmt: skip


def _message(
    *,
    body: bytes,
    header: tuple[Any, Any] | None,
    properties: tuple[Any, ...] | None,
    annotations: dict[Any, Any],
    app: dict[Any, Any] | None,
    source: Any,
) -> Message:
    """One place that maps the AMQP values (header ttl and delivery count; properties
    message-id, to, subject, reply-to, correlation-id, content-type, group-id,
    reply-to-group-id) onto a ``Message``."""
    if properties is not None:
        message_id, to, subject, reply_to, correlation_id, content_type, session_id, \
            reply_to_session_id = map(text, properties)  # fmt: skip
    else:
        message_id = to = subject = reply_to = correlation_id = content_type = None
        session_id = reply_to_session_id = None
    ttl, delivery_count = header if header is not None else (None, None)
    application_properties, dead_letter_reason, dead_letter_description = _application_facts(app)
    return Message(
        body=body,
        message_id=message_id,
        session_id=session_id,
        partition_key=text(annotations.get(PARTITION_KEY)),
        correlation_id=correlation_id,
        subject=subject,
        content_type=content_type,
        reply_to=reply_to,
        reply_to_session_id=reply_to_session_id,
        to=to,
        time_to_live=timedelta(milliseconds=ttl) if ttl else None,
        scheduled_enqueue_time=_time(annotations.get(SCHEDULED_ENQUEUE_TIME)),
        application_properties=application_properties,
        enqueued_time=_time(annotations.get(ENQUEUED_TIME)),
        sequence_number=None if (seq := annotations.get(SEQUENCE_NUMBER)) is None else int(seq),
        delivery_count=None if delivery_count is None else int(delivery_count),
        locked_until=_time(annotations.get(LOCKED_UNTIL)),
        dead_letter_reason=dead_letter_reason,
        dead_letter_description=dead_letter_description,
        dead_letter_source=_text_only(annotations.get(DEAD_LETTER_SOURCE)),
        source=source,
    )


def _application_facts(app: Any) -> tuple[dict[str, PropertyValue], str | None, str | None]:
    """Application properties (str keys) and the dead-letter reason and description in them."""
    if not app:
        return {}, None, None
    reason = app.get("DeadLetterReason")
    description = app.get("DeadLetterErrorDescription")
    return (
        _properties(app),
        reason if type(reason) is str else None,
        description if type(description) is str else None,
    )


def text(value: Any) -> str | None:
    """An AMQP string-ish value (string, symbol, binary UTF-8, other) as ``str``."""
    if value is None:
        return None
    if type(value) is str:
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8")
    return str(value)


def _text_only(value: Any) -> str | None:
    return str(value) if isinstance(value, str) else None


def _time(ms: Any) -> datetime | None:
    if not ms or not isinstance(ms, int):
        return None
    if ms == _CE_ZERO_MS:
        return datetime.min.replace(tzinfo=UTC)
    return datetime.fromtimestamp(ms / 1000.0, UTC)  # as the SDK does (float seconds)


def _properties(app: dict[Any, Any]) -> dict[str, PropertyValue]:
    out: dict[str, PropertyValue] = {}
    for key, value in app.items():
        kind = type(value)
        if kind is bytes:
            with contextlib.suppress(UnicodeDecodeError):  # as messages.from_received does
                value = value.decode("utf-8")
        elif kind not in _PLAIN:  # our codec's marker types: the plain values the SDK gives
            if isinstance(value, str):
                value = str(value)
            elif isinstance(value, bool):
                value = bool(value)
            elif isinstance(value, int):
                value = int(value)
            elif isinstance(value, float):
                value = float(value)
        out[key if type(key) is str else str(key)] = value
    return out


def _other_body(body: Any) -> bytes:
    """amqp-value / amqp-sequence bodies, as ``messages._body_bytes`` makes them."""
    if isinstance(body, bytes | bytearray):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    try:
        return b"".join(_other_body(part) if isinstance(part, str) else bytes(part)
                        for part in body)  # fmt: skip
    except TypeError:
        return str(body).encode("utf-8")
