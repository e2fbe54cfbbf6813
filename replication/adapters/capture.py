"""Capture records: the Avro record Event Hubs / Service Bus Capture writes, as a ``Message``.

Record schema (``CAPTURE_SCHEMA``): ``SequenceNumber`` (long), ``Offset`` (string),
``EnqueuedTimeUtc`` (string, ``M/d/yyyy h:mm:ss AM`` as Capture writes it, or ISO 8601),
``SystemProperties`` and ``Properties`` (maps of long / double / string / bytes / null),
``Body`` (bytes). ``fields.FIELDS``' ``capture`` column names a record field or a system
property: AMQP system properties (``message-id``, ``correlation-id``, ``content-type``,
``subject``, ``to``, ``reply-to``, ``reply-to-group-id``, ``group-id`` (or ``session-id``),
``x-opt-partition-key``) fill the message's fields. A record without a message-id gets
``capture-<SequenceNumber>-<Offset>``, the same on every replay, so a target with duplicate
detection drops a replay that ran twice.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ..messages import Message
from .fields import FIELDS

CAPTURE_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "EventData",
    "namespace": "Microsoft.ServiceBus.Messaging",
    "fields": [
        {"name": "SequenceNumber", "type": "long"},
        {"name": "Offset", "type": "string"},
        {"name": "EnqueuedTimeUtc", "type": "string"},
        {
            "name": "SystemProperties",
            "type": {"type": "map", "values": ["long", "double", "string", "bytes", "null"]},
        },
        {
            "name": "Properties",
            "type": {"type": "map", "values": ["long", "double", "string", "bytes", "null"]},
        },
        {"name": "Body", "type": ["null", "bytes"]},
    ],
}
"""The Capture record, for writing test files (and documentation)."""

RECORD_FIELDS = frozenset(field["name"] for field in CAPTURE_SCHEMA["fields"])
SYSTEM_FIELDS = {f.capture: f.name for f in FIELDS if f.capture and f.capture not in RECORD_FIELDS}
"""System property -> ``Message`` field (all text)."""
SYSTEM_ALIASES = {"session-id": "session_id"}
"""Other names writers use for a system property."""


def to_message(record: dict[str, Any]) -> Message:
    """The message of one Capture record."""
    system = record.get("SystemProperties") or {}
    fields: dict[str, Any] = {}
    for key, name in (*SYSTEM_ALIASES.items(), *SYSTEM_FIELDS.items()):
        value = system.get(key)
        if value is not None:
            fields[name] = value.decode() if isinstance(value, bytes) else str(value)
    sequence = int(record["SequenceNumber"])
    fields.setdefault("message_id", f"capture-{sequence}-{record.get('Offset', '')}")
    return Message(
        body=bytes(record.get("Body") or b""),
        application_properties=dict(record.get("Properties") or {}),
        enqueued_time=parse_enqueued_time(str(record.get("EnqueuedTimeUtc", ""))),
        sequence_number=sequence,
        **fields,
    )


def to_record(message: Message, offset: str = "0") -> dict[str, Any]:
    """The Capture record of a message (to write test files; ``sequence_number`` and
    ``enqueued_time`` must be set, as Capture always has them)."""
    if message.sequence_number is None or message.enqueued_time is None:
        raise ValueError("a Capture record needs the message's sequence number and enqueued time")
    system = {key: getattr(message, name) for key, name in SYSTEM_FIELDS.items()}
    return {
        "SequenceNumber": message.sequence_number,
        "Offset": offset,
        "EnqueuedTimeUtc": message.enqueued_time.astimezone(UTC).isoformat(),
        "SystemProperties": {key: value for key, value in system.items() if value is not None},
        "Properties": dict(message.application_properties),
        "Body": message.body,
    }


def parse_enqueued_time(text: str) -> datetime | None:
    """Capture's ``9/21/2020 5:47:58 PM`` (UTC), or ISO 8601."""
    text = text.strip()
    if not text:
        return None
    for pattern in ("%m/%d/%Y %I:%M:%S %p", "%m/%d/%Y %H:%M:%S"):
        try:
            return datetime.strptime(text, pattern).replace(tzinfo=UTC)
        except ValueError:
            continue
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
