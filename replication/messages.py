"""One message model for every runner: Functions triggers, the local host, Spark.

A ``Message`` is what pipeline steps read and return. It carries everything a Service Bus
message has that a replica must keep (identity, routing and user properties, body) plus the
facts of the source delivery (enqueued time, sequence number, delivery count) that stamping
and ordering need. Adapters convert losslessly from what a Functions trigger hands us
(``azure.functions.ServiceBusMessage``) and from ``azure.servicebus.ServiceBusReceivedMessage``,
and to ``azure.servicebus.ServiceBusMessage`` for sending.

Application property keys are always ``str``; string values the SDK hands back as ``bytes``
become ``str`` (the SDK sends ``bytes`` values as strings on the wire, so this is the value
that was sent).
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import azure.functions as func
    from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage

PropertyValue = str | int | float | bool | bytes | datetime | timedelta | uuid.UUID | None


@dataclass(slots=True)
class Message:
    """A Service Bus message as the task library sees it."""

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

    target: str | None = None
    """Where a router (or an error path) sends this output; None: the task's target."""
    source: Any = field(default=None, repr=False, compare=False)
    """The object the message was received as (for settling it), if any."""

    def copy(self, **changes: Any) -> Message:
        """A new message with the same content (properties copied) and some fields changed."""
        unknown = changes.keys() - _FIELD_NAMES
        if unknown:
            raise TypeError(f"Message has no field(s) {', '.join(sorted(unknown))}")
        new = _copy_fields(self)
        new.application_properties = dict(self.application_properties)
        for name, value in changes.items():
            setattr(new, name, value)
        return new

    @property
    def order_key(self) -> tuple[str | None, str | None]:
        """Messages with the same key must leave in the order they arrived."""
        return self.session_id, self.partition_key

    def text(self, encoding: str = "utf-8") -> str:
        return self.body.decode(encoding)


_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(Message))
_FIELD_ORDER = tuple(f.name for f in dataclasses.fields(Message))


def _copy_fields(message: Message) -> Message:
    """Every field copied by attribute: every stamped or transformed message is a copy, and
    ``dataclasses.replace`` costs about twice as much (keyword arguments, ``__init__``)."""
    new = object.__new__(Message)
    for name in _FIELD_ORDER:
        setattr(new, name, getattr(message, name))
    return new


# ---------------------------------------------------------------------- adapters in


def from_functions(message: func.ServiceBusMessage) -> Message:
    """What an Azure Functions Service Bus trigger hands the function."""
    props = dict(message.application_properties or {}) or dict(message.user_properties or {})
    return Message(
        body=message.get_body() or b"",
        message_id=message.message_id,
        session_id=message.session_id,
        partition_key=message.partition_key,
        correlation_id=message.correlation_id,
        subject=message.subject or message.label,
        content_type=message.content_type,
        reply_to=message.reply_to,
        reply_to_session_id=message.reply_to_session_id,
        to=message.to,
        time_to_live=message.time_to_live,
        scheduled_enqueue_time=_utc(message.scheduled_enqueue_time_utc),
        application_properties=properties_from_amqp(props),
        enqueued_time=_utc(message.enqueued_time_utc),
        sequence_number=message.sequence_number,
        delivery_count=message.delivery_count,
        dead_letter_reason=message.dead_letter_reason,
        dead_letter_description=message.dead_letter_error_description,
        dead_letter_source=message.dead_letter_source,
        source=message,
    )


def from_received(message: ServiceBusReceivedMessage) -> Message:
    """A message received with ``azure-servicebus``."""
    return Message(
        body=body_bytes(message),
        message_id=_text(message.message_id),
        session_id=_text(message.session_id),
        partition_key=_text(message.partition_key),
        correlation_id=_text(message.correlation_id),
        subject=_text(message.subject),
        content_type=_text(message.content_type),
        reply_to=_text(message.reply_to),
        reply_to_session_id=_text(message.reply_to_session_id),
        to=_text(message.to),
        time_to_live=message.time_to_live,
        scheduled_enqueue_time=_utc(message.scheduled_enqueue_time_utc),
        application_properties=properties_from_amqp(message.application_properties or {}),
        enqueued_time=_utc(message.enqueued_time_utc),
        sequence_number=message.sequence_number,
        delivery_count=message.delivery_count,
        locked_until=_locked_until(message),
        dead_letter_reason=message.dead_letter_reason,
        dead_letter_description=message.dead_letter_error_description,
        dead_letter_source=message.dead_letter_source,
        source=message,
    )


def _locked_until(message: ServiceBusReceivedMessage) -> datetime | None:
    try:
        return _utc(message.locked_until_utc)
    except (AttributeError, TypeError, ValueError):  # received and delete, or no annotation
        return None


# ---------------------------------------------------------------------- adapter out


def to_sdk(message: Message) -> ServiceBusMessage:
    """The message to send with ``azure-servicebus``: identity, routing and user properties
    kept; source facts (sequence number, enqueued time, ...) are the target's to assign."""
    from azure.servicebus import ServiceBusMessage

    return ServiceBusMessage(
        message.body,
        message_id=message.message_id,
        session_id=message.session_id,
        partition_key=message.partition_key if message.session_id is None else None,
        correlation_id=message.correlation_id,
        subject=message.subject,
        content_type=message.content_type,
        reply_to=message.reply_to,
        reply_to_session_id=message.reply_to_session_id,
        to=message.to,
        time_to_live=message.time_to_live,
        scheduled_enqueue_time_utc=message.scheduled_enqueue_time,
        # the SDK's hint omits types its encoder takes (datetime, timedelta, None)
        application_properties=cast(Any, dict(message.application_properties) or None),
    )


# ---------------------------------------------------------------------- helpers


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8")
    return str(value)


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def properties_from_amqp(props: Any) -> dict[str, PropertyValue]:
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


def body_bytes(message: ServiceBusReceivedMessage) -> bytes:
    body = message.body
    if isinstance(body, bytes | bytearray):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    try:
        return b"".join(bytes(part) for part in body)
    except TypeError:
        return str(body).encode("utf-8")
