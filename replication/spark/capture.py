"""Replaying Capture files: Avro containers with the Event Hubs / Service Bus Capture record.

Record schema: ``SequenceNumber`` (long), ``Offset`` (string), ``EnqueuedTimeUtc`` (string,
``M/d/yyyy h:mm:ss AM`` as Capture writes it, or ISO 8601), ``SystemProperties`` and
``Properties`` (maps of long / double / string / bytes / null), ``Body`` (bytes). Files are
listed on the driver and read by executors (``fastavro``), one file per task, so a large
replay spreads over the cluster. AMQP system properties (``message-id``, ``correlation-id``,
``content-type``, ``subject``, ``to``, ``reply-to``, ``group-id``/``session-id``,
``x-opt-partition-key``) fill the message's fields; a record without a message-id gets
``capture-<SequenceNumber>-<Offset>``, the same on every replay, so a target with duplicate
detection drops a replay that ran twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..messages import Message
from .rows import SCHEMA, to_row

SYSTEM_FIELDS = {
    "message-id": "message_id", "correlation-id": "correlation_id",
    "content-type": "content_type", "subject": "subject", "to": "to", "reply-to": "reply_to",
    "group-id": "session_id", "session-id": "session_id",
    "x-opt-partition-key": "partition_key",
}  # fmt: skip

CAPTURE_SCHEMA: dict[str, Any] = {
    "type": "record", "name": "EventData", "namespace": "Microsoft.ServiceBus.Messaging",
    "fields": [
        {"name": "SequenceNumber", "type": "long"},
        {"name": "Offset", "type": "string"},
        {"name": "EnqueuedTimeUtc", "type": "string"},
        {"name": "SystemProperties",
         "type": {"type": "map", "values": ["long", "double", "string", "bytes", "null"]}},
        {"name": "Properties",
         "type": {"type": "map", "values": ["long", "double", "string", "bytes", "null"]}},
        {"name": "Body", "type": ["null", "bytes"]},
    ],
}  # fmt: skip
"""The Capture record, for writing test files (and documentation)."""


def capture_files(path: str | Path) -> list[str]:
    """A file, or every ``*.avro`` under a folder (sorted: Capture names sort by time)."""
    root = Path(path)
    if root.is_file():
        return [str(root)]
    if not root.is_dir():
        raise FileNotFoundError(f"no Capture file or folder at {root}")
    files = sorted(str(p) for p in root.rglob("*.avro"))
    if not files:
        raise FileNotFoundError(f"no *.avro files under {root}")
    return files


def read_file(path: str) -> Iterator[tuple[Any, ...]]:
    """The rows (``rows.SCHEMA``) of one Capture file."""
    from fastavro import reader

    with open(path, "rb") as handle:
        for record in reader(handle):
            assert isinstance(record, dict)  # Capture's schema: one record per event
            yield to_row(to_message(record))


def to_message(record: dict[str, Any]) -> Message:
    system = record.get("SystemProperties") or {}
    fields: dict[str, Any] = {}
    for key, name in SYSTEM_FIELDS.items():
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


def read_capture(spark: Any, path: str | Path) -> Any:
    """A DataFrame (``rows.SCHEMA``) of every record of the Capture files at ``path``."""
    files = capture_files(path)
    rdd = spark.sparkContext.parallelize(files, len(files)).flatMap(read_file)
    return spark.createDataFrame(rdd, SCHEMA)
