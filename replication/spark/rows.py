"""The ``servicebus`` rows: one Spark row per message, and back, without losing a property type.

Application properties are typed in Service Bus (string, long, double, boolean, timestamp,
duration, uuid, binary); a Spark map has one value type. So a row carries two maps with the
same keys: ``application_properties`` (every value as text, easy to filter on:
``application_properties['region'] = 'eu'``) and ``application_property_types`` (the type of
each: ``string``, ``long``, ``double``, ``boolean``, ``timestamp`` (ISO 8601), ``duration``
(seconds), ``uuid``, ``binary`` (base64), ``null``). Writing reads both back; a key without a
type is a string, so a DataFrame built by hand needs only the first map.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from ..messages import Message, PropertyValue
from ..tasks.stamping import ENQUEUE_TIME, SEQUENCE

SCHEMA = (
    "body binary, message_id string, session_id string, partition_key string, "
    "correlation_id string, subject string, content_type string, `to` string, "
    "reply_to string, reply_to_session_id string, time_to_live_ms long, "
    "enqueued_time timestamp, sequence_number long, delivery_count int, "
    "application_properties map<string,string>, application_property_types map<string,string>, "
    "repl_enqueue_time string, repl_sequence string"
)
"""The schema of read rows (DDL). ``repl_enqueue_time`` / ``repl_sequence`` repeat the
replication stamps of ``application_properties`` for convenience."""

FIELDS = [part.strip().split(" ")[0].strip("`") for part in SCHEMA.split(", ")]


# ---------------------------------------------------------------------- properties


def encode_properties(props: Mapping[str, PropertyValue]) -> tuple[dict[str, str | None],
                                                                  dict[str, str]]:  # fmt: skip
    """(values as text, types) for a message's application properties."""
    values: dict[str, str | None] = {}
    types: dict[str, str] = {}
    for key, value in props.items():
        kind, text = _encode(value)
        values[str(key)] = text
        types[str(key)] = kind
    return values, types


def decode_properties(values: Any, types: Any) -> dict[str, PropertyValue]:
    """Typed properties from the two maps (dicts, or Arrow's lists of pairs)."""
    kinds = _as_dict(types)
    return {
        key: _decode(kinds.get(key, "string"), text, key) for key, text in _as_dict(values).items()
    }


def _as_dict(value: Any) -> dict[str, Any]:
    """A map column as Python sees it: a dict (rows) or (key, value) pairs (Arrow)."""
    if not value:
        return {}
    return dict(value.items() if isinstance(value, Mapping) else value)


def _encode(value: PropertyValue) -> tuple[str, str | None]:
    if value is None:
        return "null", None
    if isinstance(value, bool):
        return "boolean", "true" if value else "false"
    if isinstance(value, int):
        return "long", str(value)
    if isinstance(value, float):
        return "double", repr(value)
    if isinstance(value, datetime):
        stamp = value if value.tzinfo else value.replace(tzinfo=UTC)
        return "timestamp", stamp.astimezone(UTC).isoformat()
    if isinstance(value, timedelta):
        return "duration", repr(value.total_seconds())
    if isinstance(value, uuid.UUID):
        return "uuid", str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return "binary", base64.b64encode(bytes(value)).decode("ascii")
    return "string", str(value)


def _decode(kind: str, text: str | None, key: str) -> PropertyValue:
    if text is None or kind == "null":
        return None
    try:
        if kind == "string":
            return text
        if kind == "long":
            return int(text)
        if kind == "double":
            return float(text)
        if kind == "boolean":
            if text.lower() not in ("true", "false"):
                raise ValueError(text)
            return text.lower() == "true"
        if kind == "timestamp":
            return datetime.fromisoformat(text).astimezone(UTC)
        if kind == "duration":
            return timedelta(seconds=float(text))
        if kind == "uuid":
            return uuid.UUID(text)
        if kind == "binary":
            return base64.b64decode(text, validate=True)
    except ValueError as exc:
        raise ValueError(
            f"application property {key!r}: {text!r} is not a {kind} ({exc})"
        ) from None
    raise ValueError(
        f"application property {key!r}: unknown type {kind!r} (expected one of "
        "string, long, double, boolean, timestamp, duration, uuid, binary, null)"
    )


# ---------------------------------------------------------------------- rows


def to_row(message: Message) -> tuple[Any, ...]:
    """A read row (``SCHEMA`` order) for a message."""
    values, types = encode_properties(message.application_properties)
    ttl = message.time_to_live
    enqueued = message.enqueued_time
    return (
        message.body, message.message_id, message.session_id, message.partition_key,
        message.correlation_id, message.subject, message.content_type, message.to,
        message.reply_to, message.reply_to_session_id,
        None if ttl is None else int(ttl.total_seconds() * 1000),
        None if enqueued is None else enqueued.astimezone(UTC),
        message.sequence_number, message.delivery_count, values, types,
        _text(message.application_properties.get(ENQUEUE_TIME)),
        _text(message.application_properties.get(SEQUENCE)),
    )  # fmt: skip


def from_row(row: Any) -> Message:
    """The message of a row with (some of) the ``SCHEMA`` columns; ``body`` is the one that
    must be there (binary, or a string sent as UTF-8). The source facts (enqueued time,
    sequence number, delivery count) come along for stamping; sending ignores them. A
    ``target`` column names the pipeline target a row goes to."""
    data: Mapping[str, Any] = row.asDict() if hasattr(row, "asDict") else row
    if "body" not in data:
        raise ValueError("a row to send needs a 'body' column (binary or string)")
    body = data["body"]
    if isinstance(body, str):
        body = body.encode("utf-8")
    elif body is None:
        body = b""
    ttl = data.get("time_to_live_ms")
    enqueued = data.get("enqueued_time")
    if isinstance(enqueued, datetime) and enqueued.tzinfo is None:
        enqueued = enqueued.replace(tzinfo=UTC)  # Spark hands timestamps back as naive UTC
    return Message(
        body=bytes(body),
        message_id=data.get("message_id"), session_id=data.get("session_id"),
        partition_key=data.get("partition_key"), correlation_id=data.get("correlation_id"),
        subject=data.get("subject"), content_type=data.get("content_type"), to=data.get("to"),
        reply_to=data.get("reply_to"), reply_to_session_id=data.get("reply_to_session_id"),
        time_to_live=None if ttl is None else timedelta(milliseconds=int(ttl)),
        application_properties=decode_properties(
            data.get("application_properties"), data.get("application_property_types")
        ),
        enqueued_time=enqueued, sequence_number=data.get("sequence_number"),
        delivery_count=data.get("delivery_count"), target=data.get("target") or None,
    )  # fmt: skip


def rows_to_messages(rows: Iterator[Any]) -> Iterator[Message]:
    for row in rows:
        yield from_row(row)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
