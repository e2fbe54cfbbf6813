"""``azure.functions.ServiceBusMessage``: what a Functions trigger without the SDK-type
bindings hands a Python function.

``from_functions`` reads every field of ``fields.FIELDS`` with a ``functions`` attribute
(``subject`` falls back to the older ``label``; the properties to ``user_properties``).
``to_functions_message`` builds one from the SDK's received message, as the Python worker
builds it from the trigger's metadata (the local host's trigger needs it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ..messages import Message
from .fields import FIELDS
from .sdk import body_bytes
from .values import binding_datum, properties_from_amqp, text, utc

if TYPE_CHECKING:
    import azure.functions as func
    from azure.servicebus import ServiceBusReceivedMessage

_CONVERTED = ("text", "duration", "time", "int")
_FIELDS: tuple[tuple[str, str, str, str], ...] = tuple(
    (f.name, f.functions, f.sdk, f.kind)
    for f in FIELDS
    if f.functions and f.sdk and f.kind in _CONVERTED
)
"""(Message field, Functions attribute, SDK attribute, kind)."""


def from_functions(message: func.ServiceBusMessage) -> Message:
    """What an Azure Functions Service Bus trigger hands the function."""
    values: dict[str, Any] = {}
    for name, attribute, _, kind in _FIELDS:
        value = getattr(message, attribute)
        values[name] = utc(value) if kind == "time" else value
    values["subject"] = values["subject"] or message.label
    props = dict(message.application_properties or {}) or dict(message.user_properties or {})
    return Message(
        body=message.get_body() or b"",
        application_properties=properties_from_amqp(props),
        source=message,
        **values,
    )


_METADATA: tuple[tuple[str, str], ...] = (
    ("MessageId", "message_id"),
    ("ContentType", "content_type"),
    ("CorrelationId", "correlation_id"),
    ("DeliveryCount", "delivery_count"),
    ("EnqueuedTimeUtc", "enqueued_time_utc"),
    ("ScheduledEnqueueTimeUtc", "scheduled_enqueue_time_utc"),
    ("SequenceNumber", "sequence_number"),
    ("SessionId", "session_id"),
    ("ReplyToSessionId", "reply_to_session_id"),
    ("PartitionKey", "partition_key"),
    ("ReplyTo", "reply_to"),
    ("To", "to"),
    ("Subject", "subject"),
    ("Label", "subject"),
    ("TimeToLive", "time_to_live"),
    ("DeadLetterSource", "dead_letter_source"),
    ("DeadLetterReason", "dead_letter_reason"),
    ("DeadLetterErrorDescription", "dead_letter_error_description"),
)
"""Trigger-metadata keys (the Service Bus extension's binding data) and the
``ServiceBusMessage`` attribute each holds."""


def _trigger_metadata(
    message: ServiceBusReceivedMessage, values: dict[str, Any], props: dict[str, Any]
) -> dict[str, Any]:
    """The trigger metadata the Functions host sends with a message, which the worker's
    ``ServiceBusMessage.metadata`` shows (it was None here): the message's fields by their
    binding-data names, and its properties as ``UserProperties``/``ApplicationProperties``."""
    fields: dict[str, Any] = {key: values.get(attribute) for key, attribute in _METADATA}
    fields.update(
        EnqueuedSequenceNumber=message.enqueued_sequence_number,
        ExpiresAtUtc=message.expires_at_utc,
        LockedUntil=message.locked_until_utc,
        LockToken=str(message.lock_token) if message.lock_token else None,
        State=int(message.state) if message.state is not None else None,
    )
    metadata = {key: binding_datum(value) for key, value in fields.items() if value is not None}
    metadata["UserProperties"] = metadata["ApplicationProperties"] = binding_datum(props)
    return metadata


def to_functions_message(message: ServiceBusReceivedMessage) -> func.ServiceBusMessage:
    """What the Python worker builds from the trigger's metadata, built from the SDK's message."""
    from azure.functions.servicebus import ServiceBusMessage as FunctionsMessage

    values: dict[str, Any] = {}
    for _, attribute, sdk_attribute, kind in _FIELDS:
        value = getattr(message, sdk_attribute)
        values[attribute] = text(value) if kind == "text" else value
    props = properties_from_amqp(message.application_properties or {})
    values["message_id"] = values["message_id"] or ""
    return FunctionsMessage(
        body=body_bytes(message),
        trigger_metadata=_trigger_metadata(message, values, props),
        application_properties=props,
        enqueued_sequence_number=message.enqueued_sequence_number,
        expires_at_utc=message.expires_at_utc,
        label=values["subject"],
        lock_token=str(message.lock_token) if message.lock_token else None,
        state=int(message.state) if message.state is not None else None,
        transaction_partition_key=None,
        user_properties=cast(dict[str, object], props),
        **values,
    )
