"""Spark rows of the ``servicebus`` source and sink: one row per message, and back, without
losing a property type. The columns are ``fields.FIELDS``' ``column`` column, in its order,
then the stamps. The ``eventhubs`` source's rows (``to_event_row``, ``EVENT_SCHEMA``) take
the same columns for the fields events carry (``Field.eventhubs``: no delivery count or
schedule), the event's ``offset``, the stamps and the ``partition`` it was read from.

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

from ..adapters.fields import FIELDS as MESSAGE_FIELDS
from ..adapters.values import text, utc
from ..messages import Message, PropertyValue
from ..tasks.stamping import ENQUEUE_TIME, SEQUENCE

_TYPES = {
    "body": "binary",
    "text": "string",
    "duration": "long",
    "time": "timestamp",
    "int": "long",
}
_TYPE_OF = {"delivery_count": "int"}
"""Columns whose Spark type is not their kind's."""
TYPES = "map<string,string>"
STAMPS = (("repl_enqueue_time", ENQUEUE_TIME), ("repl_sequence", SEQUENCE))
"""Columns that repeat a replication stamp of ``application_properties`` (for convenience)."""

Column = tuple[str, str, str]
"""(Message field, column, kind)."""
_CARRIED = tuple(f for f in MESSAGE_FIELDS if f.column)
_ALL: tuple[Column, ...] = tuple((f.name, f.column, f.kind) for f in _CARRIED if f.column)
"""Every field a row may carry, in the table's order (what ``from_row`` reads)."""
_COLUMNS = tuple(column for column, f in zip(_ALL, _CARRIED, strict=True) if f.servicebus)
"""(Message field, column, kind) of a ``servicebus`` row, in row order (the table's)."""
_EVENT_COLUMNS = tuple(column for column, f in zip(_ALL, _CARRIED, strict=True) if f.eventhubs)
"""The same for an ``eventhubs`` row."""
PARTITION = "partition"
"""The ``eventhubs`` row's last column: the partition the event was read from."""


def _columns(columns: tuple[Column, ...]) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for name, column, kind in columns:
        if kind == "properties":
            found += [(column, TYPES), ("application_property_types", TYPES)]
        else:
            found.append((column, _TYPE_OF.get(name, _TYPES[kind])))
    return found + [(column, "string") for column, _ in STAMPS]


def _ddl(columns: list[tuple[str, str]]) -> str:
    return ", ".join(f"`{column}` {kind}" for column, kind in columns)


COLUMNS = _columns(_COLUMNS)
"""(column, Spark SQL type) of a read row, in order."""
SCHEMA = _ddl(COLUMNS)
"""The schema of read rows (DDL)."""
FIELDS = [column for column, _ in COLUMNS]
EVENT_COLUMNS = [*_columns(_EVENT_COLUMNS), (PARTITION, "string")]
"""(column, Spark SQL type) of an ``eventhubs`` row, in order."""
EVENT_SCHEMA = _ddl(EVENT_COLUMNS)
EVENT_FIELDS = [column for column, _ in EVENT_COLUMNS]


# ---------------------------------------------------------------------- properties


def encode_properties(
    props: Mapping[str, PropertyValue],
) -> tuple[dict[str, str | None], dict[str, str]]:
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
    return tuple(_row(message, _COLUMNS))


def to_event_row(message: Message) -> tuple[Any, ...]:
    """An ``eventhubs`` row (``EVENT_SCHEMA`` order) for an event."""
    return (*_row(message, _EVENT_COLUMNS), message.partition_id)


def _row(message: Message, columns: tuple[Column, ...]) -> list[Any]:
    row: list[Any] = []
    for name, _, kind in columns:
        value = getattr(message, name)
        if kind == "properties":
            row += encode_properties(value)
        elif value is None:
            row.append(None)
        elif kind == "duration":
            row.append(int(value.total_seconds() * 1000))
        elif kind == "time":
            row.append(value.astimezone(UTC))
        else:
            row.append(value)
    props = message.application_properties
    row += [text(props.get(stamp)) for _, stamp in STAMPS]
    return row


def from_row(row: Any) -> Message:
    """The message of a row with (some of) the ``SCHEMA`` columns; ``body`` is the one that
    must be there (binary, or a string sent as UTF-8). The source facts (enqueued time,
    sequence number, delivery count) come along for stamping; sending ignores them. A
    ``target`` column names the pipeline target a row goes to."""
    data: Mapping[str, Any] = row.asDict() if hasattr(row, "asDict") else row
    if "body" not in data:
        raise ValueError("a row to send needs a 'body' column (binary or string)")
    values: dict[str, Any] = {}
    for name, column, kind in _ALL:
        value = data.get(column)
        if kind == "body":
            value = value.encode("utf-8") if isinstance(value, str) else bytes(value or b"")
        elif kind == "properties":
            value = decode_properties(value, data.get("application_property_types"))
        elif value is None:
            pass
        elif kind == "duration":
            value = timedelta(milliseconds=int(value))
        elif kind == "time":
            value = utc(value)  # Spark hands timestamps back as naive UTC
        values[name] = value
    return Message(target=data.get("target") or None, partition_id=data.get(PARTITION), **values)


def rows_to_messages(rows: Iterator[Any]) -> Iterator[Message]:
    for row in rows:
        yield from_row(row)
