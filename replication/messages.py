"""One message model for every runner: Functions triggers, the local host, Spark.

A ``Message`` is what pipeline steps read and return. It carries everything a Service Bus
message has that a replica must keep (identity, routing and user properties, body) plus the
facts of the source delivery (enqueued time, sequence number, delivery count) that stamping
and ordering need. ``replication.adapters`` converts it to and from every outside form (the
SDKs, Functions, AMQP bytes, Spark rows, Capture records), each walking the one table of
fields in ``adapters/fields.py``; the SDK and Functions adapters are importable from here too.
"""

from __future__ import annotations

import dataclasses
import importlib
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

PropertyValue = str | int | float | bool | bytes | datetime | timedelta | uuid.UUID | None


@dataclass(slots=True)
class Message:
    """A Service Bus message, or an Event Hubs event, as the task library sees it."""

    body: bytes = b""
    message_id: str | None = None
    session_id: str | None = None
    partition_key: str | None = None
    correlation_id: str | None = None
    subject: str | None = None
    content_type: str | None = None
    reply_to: str | None = None
    reply_to_session_id: str | None = None
    to: str | None = None
    time_to_live: timedelta | None = None
    scheduled_enqueue_time: datetime | None = None
    application_properties: dict[str, PropertyValue] = field(default_factory=dict)

    # facts of the source delivery: read, never sent
    enqueued_time: datetime | None = None
    sequence_number: int | None = None
    delivery_count: int | None = None
    locked_until: datetime | None = None
    """When the source lock was due to expire as received (None: not peek-locked)."""
    dead_letter_reason: str | None = None
    dead_letter_description: str | None = None
    dead_letter_source: str | None = None
    offset: str | None = None
    """Event Hubs: the event's offset in its partition (``x-opt-offset``)."""
    partition_id: str | None = None
    """Event Hubs: the partition the event was read from (the reader's, not in the event)."""

    target: str | None = None
    """Where a router (or an error path) sends this output; None: the task's target."""
    source: Any = field(default=None, repr=False, compare=False)
    """The object the message was received as (for settling it), if any."""

    def copy(self, **changes: Any) -> Message:
        """A new message with the same content (properties copied) and some fields changed."""
        new = _copy_fields(self)
        if "application_properties" not in changes:
            new.application_properties = dict(self.application_properties)
        for name, value in changes.items():
            if name not in _FIELD_NAMES:
                unknown = ", ".join(sorted(changes.keys() - _FIELD_NAMES))
                raise TypeError(f"Message has no field(s) {unknown}")
            setattr(new, name, value)
        return new

    def with_properties(self, properties: dict[str, PropertyValue]) -> Message:
        """A copy whose application properties are ``properties`` (taken as they are, not
        copied): ``copy(application_properties=properties)`` without the keyword handling,
        for the stamp every replica gets."""
        new = _copy_fields(self)
        new.application_properties = properties
        return new

    @property
    def order_key(self) -> tuple[str | None, str | None]:
        """Messages with the same key must leave in the order they arrived."""
        return self.session_id, self.partition_key

    def text(self, encoding: str = "utf-8") -> str:
        return self.body.decode(encoding)


_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(Message))


def _copy_fields(message: Message) -> Message:
    """Every field copied by attribute, written out: every stamped or transformed message is
    a copy (0.33 µs, where a loop of ``getattr``/``setattr`` took 1.75 and
    ``dataclasses.replace`` about twice that). A field added to ``Message`` is added here
    (tests/tasks/test_messages.py checks that every field is copied)."""
    new: Message = _new(Message)
    new.body = message.body
    new.message_id = message.message_id
    new.session_id = message.session_id
    new.partition_key = message.partition_key
    new.correlation_id = message.correlation_id
    new.subject = message.subject
    new.content_type = message.content_type
    new.reply_to = message.reply_to
    new.reply_to_session_id = message.reply_to_session_id
    new.to = message.to
    new.time_to_live = message.time_to_live
    new.scheduled_enqueue_time = message.scheduled_enqueue_time
    new.application_properties = message.application_properties
    new.enqueued_time = message.enqueued_time
    new.sequence_number = message.sequence_number
    new.delivery_count = message.delivery_count
    new.locked_until = message.locked_until
    new.dead_letter_reason = message.dead_letter_reason
    new.dead_letter_description = message.dead_letter_description
    new.dead_letter_source = message.dead_letter_source
    new.offset = message.offset
    new.partition_id = message.partition_id
    new.target = message.target
    new.source = message.source
    return new


_new = object.__new__


_MOVED = {
    "from_functions": "functions",
    "from_received": "sdk",
    "to_sdk": "sdk",
    "body_bytes": "sdk",
    "properties_from_amqp": "values",
}
"""The adapters that lived here, still importable from here (``replication.adapters.*``)."""


def __getattr__(name: str) -> Any:
    """The moved adapters, loaded when first asked for (``adapters`` imports this module)."""
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"replication.adapters.{module}"), name)
