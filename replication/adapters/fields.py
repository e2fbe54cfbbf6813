"""The one table of a message's fields and where each lives in every outside form.

A ``Message`` field is read from and written to six forms: the SDK's messages
(``azure.servicebus``), the Functions trigger's ``azure.functions.ServiceBusMessage``, the
AMQP message on the wire (header, properties, message annotations, application
properties), a Spark row of the ``servicebus`` source and sink, a Capture (Avro)
record, and Event Hubs' ``EventData`` (``eventhubs.py``: the AMQP column, through the
SDK's ``raw_amqp_message``). Every adapter of this package walks ``FIELDS``, so a new field
is one row here (and a test, tests/tasks/test_adapters.py, holds every adapter to this table).

``body`` and ``application_properties`` are rows too, but each adapter has its own code for
them (data sections; typed property maps); the rest are converted by their ``kind``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from ..amqp.message import Header, Properties
from ..symbols import (
    DEAD_LETTER_DESCRIPTION,
    DEAD_LETTER_REASON,
    DEAD_LETTER_SOURCE,
    ENQUEUED_TIME,
    LOCKED_UNTIL,
    OFFSET,
    PARTITION_KEY,
    SCHEDULED_ENQUEUE_TIME,
    SEQUENCE_NUMBER,
)

Kind = Literal["body", "properties", "text", "duration", "time", "int"]
Section = Literal["header", "properties", "annotations", "application", "body"]


@dataclass(frozen=True, slots=True)
class Amqp:
    """Where a field is in an AMQP message: a section and the key (a ``Header`` or
    ``Properties`` field name, an annotation symbol, an application property name)."""

    section: Section
    key: str = ""


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    """The ``Message`` attribute."""
    kind: Kind
    amqp: Amqp
    sdk: str | None
    """The attribute of ``azure.servicebus.ServiceBusReceivedMessage`` (and the keyword of
    ``ServiceBusMessage`` when ``sent``)."""
    functions: str | None
    """The attribute (and constructor keyword) of ``azure.functions.ServiceBusMessage``."""
    column: str | None
    """The Spark row column (``rows.py``); None: rows do not carry it."""
    capture: str | None
    """The Capture record's ``SystemProperties`` key, or a record field (``Body``, ...)."""
    sent: bool
    """A replica keeps it (sent to the target); False: a fact of the source delivery."""
    servicebus: bool = True
    """Service Bus deliveries carry it; False: Event Hubs only (the ``eventhubs`` adapter)."""
    eventhubs: bool = True
    """Events carry it; False: a Service Bus fact (delivery count, schedule, lock, dead
    letter), left out of the ``eventhubs`` Spark source's rows."""


def _field(
    name: str,
    kind: Kind,
    amqp: Amqp,
    *,
    sdk: str | None = "",
    functions: str | None = "",
    column: str | None = "",
    capture: str | None = None,
    sent: bool = True,
    servicebus: bool = True,
    eventhubs: bool = True,
) -> Field:
    """A row; ``sdk``, ``functions`` and ``column`` default to the field's own name."""
    return Field(
        name,
        kind,
        amqp,
        name if sdk == "" else sdk,
        name if functions == "" else functions,
        name if column == "" else column,
        capture,
        sent,
        servicebus,
        eventhubs,
    )


FIELDS: tuple[Field, ...] = (
    _field("body", "body", Amqp("body"), sdk="body", functions="body", capture="Body"),
    _field("message_id", "text", Amqp("properties", "message_id"), capture="message-id"),
    _field("session_id", "text", Amqp("properties", "group_id"), capture="group-id"),
    _field(
        "partition_key", "text", Amqp("annotations", PARTITION_KEY), capture="x-opt-partition-key"
    ),
    _field(
        "correlation_id", "text", Amqp("properties", "correlation_id"), capture="correlation-id"
    ),
    _field("subject", "text", Amqp("properties", "subject"), capture="subject"),
    _field("content_type", "text", Amqp("properties", "content_type"), capture="content-type"),
    _field("to", "text", Amqp("properties", "to"), capture="to"),
    _field("reply_to", "text", Amqp("properties", "reply_to"), capture="reply-to"),
    _field(
        "reply_to_session_id",
        "text",
        Amqp("properties", "reply_to_group_id"),
        capture="reply-to-group-id",
    ),
    _field("time_to_live", "duration", Amqp("header", "ttl"), column="time_to_live_ms"),
    _field(
        "scheduled_enqueue_time",
        "time",
        Amqp("annotations", SCHEDULED_ENQUEUE_TIME),
        sdk="scheduled_enqueue_time_utc",
        functions="scheduled_enqueue_time_utc",
        eventhubs=False,
    ),
    # facts of the source delivery: read, never sent
    _field(
        "enqueued_time",
        "time",
        Amqp("annotations", ENQUEUED_TIME),
        sdk="enqueued_time_utc",
        functions="enqueued_time_utc",
        capture="EnqueuedTimeUtc",
        sent=False,
    ),
    _field(
        "sequence_number",
        "int",
        Amqp("annotations", SEQUENCE_NUMBER),
        capture="SequenceNumber",
        sent=False,
    ),
    _field("delivery_count", "int", Amqp("header", "delivery_count"), sent=False, eventhubs=False),
    _field("application_properties", "properties", Amqp("application"), capture="Properties"),
    _field(
        "locked_until",
        "time",
        Amqp("annotations", LOCKED_UNTIL),
        sdk="locked_until_utc",
        functions="locked_until",
        column=None,
        sent=False,
        eventhubs=False,
    ),
    _field(
        "dead_letter_reason",
        "text",
        Amqp("application", str(DEAD_LETTER_REASON)),
        column=None,
        sent=False,
        eventhubs=False,
    ),
    _field(
        "dead_letter_description",
        "text",
        Amqp("application", str(DEAD_LETTER_DESCRIPTION)),
        sdk="dead_letter_error_description",
        functions="dead_letter_error_description",
        column=None,
        sent=False,
        eventhubs=False,
    ),
    _field(
        "dead_letter_source",
        "text",
        Amqp("annotations", DEAD_LETTER_SOURCE),
        column=None,
        sent=False,
        eventhubs=False,
    ),
    # Event Hubs: the event's offset in its partition (stamped as repl-offset; a column of
    # the eventhubs Spark source's rows only)
    _field(
        "offset",
        "text",
        Amqp("annotations", OFFSET),
        sdk=None,
        functions=None,
        sent=False,
        servicebus=False,
    ),
)
"""Every field a ``Message`` exchanges with the outside (``target``, ``source`` and
``partition_id``, where a runner read an event, are the task library's own)."""

BY_NAME = {f.name: f for f in FIELDS}


def in_section(section: Section) -> tuple[Field, ...]:
    return tuple(f for f in FIELDS if f.amqp.section == section)


def position(section: Section, key: str) -> int:
    """The index of a ``Header`` or ``Properties`` field in its described list (what
    ``amqp.scan`` hands back)."""
    kind = Header if section == "header" else Properties
    names = [f.name for f in dataclasses.fields(kind)]
    return names.index(key)
