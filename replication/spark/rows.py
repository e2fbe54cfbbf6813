"""Spark rows of the ``servicebus`` source and sink: one row per message, and back, without
losing a property type. The columns are ``fields.FIELDS``' ``column`` column, in its order,
then the stamps. The ``eventhubs`` source's rows (``to_event_row``, ``EVENT_SCHEMA``) take
the same columns for the fields events carry (``Field.eventhubs``: no delivery count or
schedule), the event's ``offset``, the stamps and the ``partition`` it was read from.

Application properties are typed in Service Bus (string, long, double, boolean, timestamp,
duration, uuid, binary, and every other AMQP type a sender may write); a Spark map has one
value type. So a row carries two maps with the same keys: ``application_properties`` (every
value as text, easy to filter on: ``application_properties['region'] = 'eu'``) and
``application_property_types`` (the type of each: ``string``, ``long``, ``double``,
``boolean``, ``timestamp`` (ISO 8601), ``duration`` (seconds), ``uuid``, ``binary``
(base64), ``null``; and for a received value of another AMQP type its name: ``int``,
``short``, ``byte``, ``ubyte``, ``ushort``, ``uint``, ``ulong``, ``float``, ``char``,
``symbol``, ``decimal32`` and ``decimal64`` (their raw bits as an integer), ``decimal128``
(its 16 bytes in hex), and ``amqp`` (its AMQP encoding in base64) for the rest, such as
.NET's ``Uri``, ``TimeSpan`` and ``DateTimeOffset``, which it writes as described values).
Writing reads both back and sends each value with its type; a key without a type is a
string, so a DataFrame built by hand needs only the first map.
"""

from __future__ import annotations

import base64
import contextlib
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from ..adapters.fields import FIELDS as MESSAGE_FIELDS
from ..adapters.values import text, utc
from ..amqp import codec
from ..amqp.errors import EncodeError
from ..amqp.types import (
    byte,
    char,
    decimal32,
    decimal64,
    decimal128,
    float32,
    int32,
    long,
    short,
    symbol,
    timestamp,
    ubyte,
    uint,
    ulong,
    ushort,
)
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


_AMQP_INTEGERS: dict[str, type[int]] = {
    "long": long,
    "byte": byte,
    "short": short,
    "int": int32,
    "ubyte": ubyte,
    "ushort": ushort,
    "uint": uint,
    "ulong": ulong,
    "decimal32": decimal32,
    "decimal64": decimal64,
}
"""The AMQP integer types by name (the decimals as their raw IEEE 754 bits); a plain int is a
long (what a row built by hand writes is sent as the row says). What each holds is the
codec's to check, as it writes them."""
_NAME_OF_INTEGER = {kind: name for name, kind in _AMQP_INTEGERS.items()}
_TEXTS: dict[str, type[str]] = {"char": char, "symbol": symbol}


def _encode(value: PropertyValue) -> tuple[str, str | None]:
    """(type, text) of one value: received values by their AMQP type (``adapters.amqp``
    keeps it), so that a message written back sends each as it came."""
    if value is None:
        return "null", None
    if isinstance(value, bool):
        return "boolean", "true" if value else "false"
    if isinstance(value, timestamp):
        with contextlib.suppress(OverflowError):  # beyond a datetime's years: its milliseconds
            return "timestamp", value.to_datetime().isoformat()
    if isinstance(value, int):
        return _NAME_OF_INTEGER.get(type(value), "long"), str(int(value))
    if isinstance(value, float32):
        return "float", repr(float(value))
    if isinstance(value, float):
        return "double", repr(value)
    if isinstance(value, datetime):
        stamp = value if value.tzinfo else value.replace(tzinfo=UTC)
        return "timestamp", stamp.astimezone(UTC).isoformat()
    if isinstance(value, timedelta):
        return "duration", repr(value.total_seconds())
    if isinstance(value, uuid.UUID):
        return "uuid", str(value)
    if isinstance(value, decimal128):
        return "decimal128", bytes(value).hex()
    if isinstance(value, bytes | bytearray | memoryview):
        return "binary", base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, char | symbol):
        return type(value).__name__, str(value)
    if isinstance(value, str):
        return "string", str(value)
    # a described value (.NET's Uri, TimeSpan, DateTimeOffset), a list, a map: its encoding
    return "amqp", base64.b64encode(codec.encode(value)).decode("ascii")


_TYPE_NAMES = ("string", *_AMQP_INTEGERS, "double", "float", "boolean", "timestamp", "duration")
_TYPE_NAMES += ("uuid", "binary", "decimal128", *_TEXTS, "amqp", "null")


def _decode(kind: str, text: str | None, key: str) -> PropertyValue:
    if text is None or kind == "null":
        return None
    try:
        if kind == "string":
            return text
        if kind in _AMQP_INTEGERS:
            integer = _AMQP_INTEGERS[kind](text)
            try:
                codec.encode(integer)  # refused here, not when the sink sends it
            except EncodeError:
                raise ValueError("out of its range") from None
            return integer
        if kind == "double":
            return float(text)
        if kind == "float":
            return float32(text)
        if kind in _TEXTS:
            if kind == "char" and len(text) != 1:
                raise ValueError("not one character")
            return _TEXTS[kind](text)
        if kind == "amqp":
            return cast(PropertyValue, codec.decode(base64.b64decode(text, validate=True)))
        if kind == "decimal128":
            raw = bytes.fromhex(text)
            if len(raw) != 16:
                raise ValueError("not 16 bytes")
            return decimal128(raw)
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
        f"{', '.join(_TYPE_NAMES)})"
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
