"""What SQL conditions see of a ``Message``, and conditions compiled for messages.

Pipeline conditions (the ``filter`` step, routes, de-duplication keys) use the grammar of the
broker's subscription rules (``replication.sqlfilter``), with one opt-in extension: ``body.``
names read fields of a JSON body (``body.order.total > 100``, ``body.items.0.sku = 'a'``).

``facts_for`` maps a message to the properties a Service Bus rule would see:

====================== =========================================================
``sys.`` name          from ``Message``
====================== =========================================================
MessageId              ``message_id``
CorrelationId          ``correlation_id``
Label (alias Subject)  ``subject``
To                     ``to``
ReplyTo                ``reply_to``
ReplyToSessionId       ``reply_to_session_id``
ContentType            ``content_type``
SessionId              ``session_id``
PartitionKey           ``partition_key``
TimeToLive             ``time_to_live`` (``timedelta``)
ScheduledEnqueueTimeUtc ``scheduled_enqueue_time``
EnqueuedTimeUtc        ``enqueued_time``
ExpiresAtUtc           ``enqueued_time + time_to_live`` (when both are known)
SequenceNumber         ``sequence_number``
DeliveryCount          ``delivery_count``
DeadLetterSource       ``dead_letter_source``
Size                   ``len(body)`` (the body only: Service Bus counts headers and
                       properties too, which a replica does not have yet)
====================== =========================================================

Properties the message does not have are left out (unknown, ``EXISTS`` false);
EnqueuedSequenceNumber, LockedUntilUtc, LockToken, State, ViaPartitionKey and
ForcePersistence are never set here. ``user.`` names are the application properties (a copy,
so rule actions applied to the facts do not change the message).

Body fields: the body is parsed with ``json.loads`` (UTF-8, -16 or -32, a BOM allowed)
whatever the content type says, and only for conditions that read ``body.`` names. A body
that is empty or not JSON has no fields: every ``body.`` name is missing, so a comparison is
unknown and the condition is not TRUE (a ``filter`` drops the message; it is not an error).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

from ..messages import Message
from ..sqlfilter import MessageFacts, SqlExpression, SqlFilter, parse_expression, parse_filter

__all__ = [
    "Condition",
    "Expression",
    "compile_condition",
    "compile_expression",
    "facts_for",
    "json_body",
]


def json_body(message: Message) -> Any:
    """The body as a JSON document, or None when it is empty or not JSON."""
    if not message.body:
        return None
    try:
        return json.loads(message.body)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError included
        return None


def facts_for(message: Message, *, body: bool = True) -> MessageFacts:
    """The message as SQL filters see it; ``body=False`` skips parsing the JSON body."""
    fields = (
        ("MessageId", message.message_id),
        ("CorrelationId", message.correlation_id),
        ("Label", message.subject),
        ("To", message.to),
        ("ReplyTo", message.reply_to),
        ("ReplyToSessionId", message.reply_to_session_id),
        ("ContentType", message.content_type),
        ("SessionId", message.session_id),
        ("PartitionKey", message.partition_key),
        ("TimeToLive", message.time_to_live),
        ("ScheduledEnqueueTimeUtc", message.scheduled_enqueue_time),
        ("EnqueuedTimeUtc", message.enqueued_time),
        ("SequenceNumber", message.sequence_number),
        ("DeliveryCount", message.delivery_count),
        ("DeadLetterSource", message.dead_letter_source),
    )
    system: dict[str, Any] = {name: value for name, value in fields if value is not None}
    if message.enqueued_time is not None and message.time_to_live is not None:
        with contextlib.suppress(OverflowError):  # TimeSpan.MaxValue: never expires
            system["ExpiresAtUtc"] = message.enqueued_time + message.time_to_live
    system["Size"] = len(message.body)
    return MessageFacts(
        system, dict(message.application_properties), json_body(message) if body else None
    )


class Condition:
    """A SQL condition compiled for messages: ``condition(message)`` is True only when the
    condition is TRUE (FALSE and unknown both reject, as for subscription rules).

    Raises ``SqlSyntaxError`` (a ``ValueError``) for a bad condition when made; calling it may
    raise ``SqlEvaluationError`` (division by zero of longs...) for one message.
    """

    __slots__ = ("filter",)

    def __init__(self, text: str, parameters: Mapping[str, Any] | None = None) -> None:
        self.filter: SqlFilter = parse_filter(text, parameters, body_fields=True)

    @property
    def expression(self) -> str:
        return self.filter.expression

    @property
    def uses_body(self) -> bool:
        return self.filter.uses_body

    def evaluate(self, message: Message) -> bool | None:
        """The three-valued result: True, False or None (unknown)."""
        return self.filter.evaluate(facts_for(message, body=self.filter.uses_body))

    def __call__(self, message: Message) -> bool:
        return self.evaluate(message) is True

    def __repr__(self) -> str:
        return f"Condition({self.expression!r})"


class Expression:
    """A SQL value expression compiled for messages: ``expression(message)`` is its value,
    None when unknown (``sys.MessageId``, ``tenant + '/' + body.order.id``)."""

    __slots__ = ("sql",)

    def __init__(self, text: str, parameters: Mapping[str, Any] | None = None) -> None:
        self.sql: SqlExpression = parse_expression(text, parameters, body_fields=True)

    @property
    def expression(self) -> str:
        return self.sql.expression

    @property
    def uses_body(self) -> bool:
        return self.sql.uses_body

    def __call__(self, message: Message) -> Any:
        return self.sql.value(facts_for(message, body=self.sql.uses_body))

    def __repr__(self) -> str:
        return f"Expression({self.expression!r})"


def compile_condition(text: str, parameters: Mapping[str, Any] | None = None) -> Condition:
    """``text`` (the broker's SQL filter grammar plus ``body.`` names) as a message test."""
    return Condition(text, parameters)


def compile_expression(text: str, parameters: Mapping[str, Any] | None = None) -> Expression:
    """``text`` (a SQL value expression, ``body.`` names allowed) as a function of messages."""
    return Expression(text, parameters)
