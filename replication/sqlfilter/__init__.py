"""Azure Service Bus rule filters and actions: SQL filters, correlation filters, SQL actions.

One implementation for the broker's subscription rules and for pipeline conditions::

    rule = parse_filter("color = 'red' AND quantity > @min", {"@min": 10})
    facts = MessageFacts(system={"Label": "order"}, user={"color": "red", "quantity": 12})
    rule.matches(facts)                                   # True
    parse_action("SET quantity = quantity / 2; REMOVE color").apply(facts)

The grammar and semantics are those of Microsoft's "SQL filter syntax", "SQL rule action
syntax" and "Topic filters" pages: keywords, functions and property names are
case-insensitive; a missing user property is unknown (SQL three-valued logic) and a filter
selects a message only when it is TRUE; naming a system property that does not exist is an
error, refused when the rule is parsed. Where those pages are silent, ``SEMANTICS.md`` next to
this file lists the choices made.

``MessageFacts.system`` keys are the canonical names of ``SYSTEM_PROPERTIES``. From an AMQP
message (Service Bus's own mapping): properties.message-id -> MessageId, correlation-id ->
CorrelationId, subject -> Label, to -> To, reply-to -> ReplyTo, content-type -> ContentType,
group-id -> SessionId, reply-to-group-id -> ReplyToSessionId, absolute-expiry-time ->
ExpiresAtUtc; header.ttl -> TimeToLive, header.delivery-count -> DeliveryCount; message
annotations x-opt-enqueued-time -> EnqueuedTimeUtc, x-opt-sequence-number -> SequenceNumber,
x-opt-enqueue-sequence-number -> EnqueuedSequenceNumber, x-opt-scheduled-enqueue-time ->
ScheduledEnqueueTimeUtc, x-opt-partition-key -> PartitionKey, x-opt-via-partition-key ->
ViaPartitionKey, x-opt-locked-until -> LockedUntilUtc, x-opt-deadletter-source ->
DeadLetterSource; the stored size -> Size. Times as aware ``datetime`` (UTC), TimeToLive as
``timedelta``, ids as ``str``. ``user`` is the application-properties map, with AMQP
timestamps turned into ``datetime`` (``types.timestamp`` is an ``int`` and would read as a
long).

Extensions, off unless asked for (Service Bus has neither): ``body.`` names for fields of a
JSON body (``parse_filter(text, body_fields=True)``, the document in ``MessageFacts.body``),
and value expressions on their own (``parse_expression``). ``SEMANTICS.md`` describes both.
"""

from __future__ import annotations

from .actions import RuleAction, SqlRuleAction, parse_action
from .correlation import CorrelationFilter
from .errors import SqlEvaluationError, SqlSyntaxError
from .expressions import SqlExpression, parse_expression
from .facts import SYSTEM_PROPERTIES, MessageFacts, SystemProperty, system_property
from .filters import FalseFilter, Filter, SqlFilter, TrueFilter, parse_filter

MAX_FILTER_LENGTH = 1024
"""Service Bus quota: characters in a SQL filter condition (not enforced by the parser)."""
MAX_ACTION_LENGTH = 1024
"""Service Bus quota: characters in a SQL rule action (not enforced by the parser)."""
MAX_ACTION_STATEMENTS = 32
"""Service Bus quota: expressions per rule action (not enforced by the parser)."""

__all__ = [
    "MAX_ACTION_LENGTH",
    "MAX_ACTION_STATEMENTS",
    "MAX_FILTER_LENGTH",
    "SYSTEM_PROPERTIES",
    "CorrelationFilter",
    "FalseFilter",
    "Filter",
    "MessageFacts",
    "RuleAction",
    "SqlEvaluationError",
    "SqlExpression",
    "SqlFilter",
    "SqlRuleAction",
    "SqlSyntaxError",
    "SystemProperty",
    "TrueFilter",
    "parse_action",
    "parse_expression",
    "parse_filter",
    "system_property",
]
