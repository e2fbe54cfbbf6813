"""Value conversions the adapters share: one ``text``, one ``utc``, one property map."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from ..messages import PropertyValue


def text(value: Any) -> str | None:
    """A string-ish value (string, symbol, UTF-8 binary, other) as ``str``; None stays."""
    if value is None:
        return None
    if type(value) is str:
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8")
    return str(value)


def utc(value: datetime | None) -> datetime | None:
    """Aware and in UTC (a naive time is taken as UTC, as the SDK and Spark hand them)."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def properties_from_amqp(props: Any) -> dict[str, PropertyValue]:
    """Application properties with ``str`` keys; UTF-8 ``bytes`` values as ``str`` (the SDK
    hands strings back as bytes; what is not UTF-8 stays binary)."""
    out: dict[str, PropertyValue] = {}
    for key, value in dict(props).items():
        name = key.decode("utf-8") if isinstance(key, bytes | bytearray) else str(key)
        if isinstance(value, bytes | bytearray):
            try:
                value = bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                value = bytes(value)
        out[name] = value
    return out


def binding_datum(value: Any) -> Any:
    """One trigger-metadata value as the Functions host types it for the worker
    (``azure.functions.meta.Datum``): a number as int, a time as ISO text, a duration as a
    .NET TimeSpan's text (``[d.]hh:mm:ss``), a mapping or list as JSON, the rest as text."""
    from azure.functions.meta import Datum

    if isinstance(value, bool | int):
        return Datum(int(value), "int")
    if isinstance(value, dict | list):
        return Datum(json.dumps(value, default=str), "json")
    if isinstance(value, datetime):
        return Datum(value.isoformat(), "string")
    if isinstance(value, timedelta):
        hours, rest = divmod(int(value.total_seconds()), 3600)
        minutes, seconds = divmod(rest, 60)
        days, hours = divmod(hours, 24)
        head = f"{days}." if days else ""
        return Datum(f"{head}{hours:02}:{minutes:02}:{seconds:02}", "string")
    return Datum(str(value), "string")
