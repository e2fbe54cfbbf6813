"""``start --demo``: feeds the sample pipelines so a newcomer watches them work, then shows
what arrived.

The producer sends, to the primary namespace: orders in 10 sessions (replicated to the
secondary in per-session order, with stamps), Avro telemetry (turned into JSON), events with
a ``region`` (routed to three queues), a few messages to each side's ``mirror`` topic
(replicated across, never back), and an audit trail in sessions (streamed into an event hub,
each session in one partition). The run ends when every source is drained.

It sends over our AMQP client (``servicebus.sender``), as the pipelines' targets do.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..messages import Message
from ..servicebus.client import AmqpSource
from ..servicebus.sender import AmqpSender

if TYPE_CHECKING:
    from ..pipeline import PipelineFile

log = logging.getLogger("replication.host.demo")

SESSIONS = 10
ORDERS_PER_SESSION = 20
BATCH = 50
"""Messages per send (one transfer each)."""
TELEMETRY = 50
EVENTS = 30
MIRRORED = 5
AUDIT_SESSIONS = 4
AUDIT_PER_SESSION = 5
REGIONS = ("eu", "us", "apac")


def expected_receipts(pipelines: PipelineFile) -> int:
    """Source messages the sample pipelines receive in the demo (mirror copies arrive twice:
    once sent, once as the other side's copy, which the loop guard then drops)."""
    audit = AUDIT_SESSIONS * AUDIT_PER_SESSION if _reads(pipelines, "order-audit") else 0
    return SESSIONS * ORDERS_PER_SESSION + TELEMETRY + EVENTS + 2 * MIRRORED * 2 + audit


def _avro_schema(pipelines: PipelineFile) -> dict[str, Any] | None:
    for pipeline in pipelines.pipelines:
        for name, options in pipeline.steps:
            if name == "transcode" and options.get("from") == "avro-binary":
                schema = options.get("schema")
                return json.loads(schema) if isinstance(schema, str) else schema
    return None


def _avro(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    from fastavro import parse_schema, schemaless_writer

    out = io.BytesIO()
    schemaless_writer(out, parse_schema(schema), record)
    return out.getvalue()


async def produce(pipelines: PipelineFile, settings: Mapping[str, str]) -> int:
    """Sends the demo messages; returns how many source messages the pipelines will see."""
    primary = settings["PrimaryServiceBus"]
    secondary = settings["SecondaryServiceBus"]
    schema = _avro_schema(pipelines)
    async with AmqpSource.from_connection_string(primary) as namespace:
        orders = [
            Message(
                json.dumps({"order": i, "session": s}).encode(),
                session_id=f"customer-{s}",
                message_id=f"order-{s}-{i}",
                content_type="application/json",
            )
            for i in range(ORDERS_PER_SESSION)
            for s in range(SESSIONS)
        ]
        await _send(namespace, "orders", orders)
        if schema is not None:
            await _send(
                namespace,
                "telemetry-avro",
                [
                    Message(
                        _avro(schema, _telemetry(schema, i)),
                        message_id=f"telemetry-{i}",
                        content_type="avro/binary",
                    )
                    for i in range(TELEMETRY)
                ],
            )
        await _send(
            namespace,
            "events",
            [
                Message(
                    json.dumps({"event": i}).encode(),
                    message_id=f"event-{i}",
                    application_properties={"region": REGIONS[i % len(REGIONS)]},
                )
                for i in range(EVENTS)
            ],
        )
        await _send(namespace, "mirror", _mirrored("primary", "p"))
        if _reads(pipelines, "order-audit"):
            await _send(
                namespace,
                "order-audit",
                [
                    Message(
                        json.dumps({"customer": s, "step": i}).encode(),
                        session_id=f"customer-{s}",
                        message_id=f"audit-{s}-{i}",
                        content_type="application/json",
                    )
                    for i in range(AUDIT_PER_SESSION)
                    for s in range(AUDIT_SESSIONS)
                ],
            )
    async with AmqpSource.from_connection_string(secondary) as namespace:
        await _send(namespace, "mirror", _mirrored("secondary", "s"))
    expected = expected_receipts(pipelines)
    log.info("demo: sent %d messages to the primary and secondary namespaces", expected)
    return expected


def _reads(pipelines: PipelineFile, queue: str) -> bool:
    """Whether a pipeline of the file reads ``queue`` (a sample file without it: not fed)."""
    return any(s.queue == queue for p in pipelines.pipelines for s in p.sources)


async def _send(namespace: AmqpSource, entity: str, messages: list[Message]) -> None:
    """Sends in batches of ``BATCH``, in order, each accepted before the next goes."""
    sender = AmqpSender(namespace, entity)
    try:
        for start in range(0, len(messages), BATCH):
            await sender.send_messages(messages[start : start + BATCH])
    finally:
        await sender.close()


def _mirrored(side: str, prefix: str) -> list[Message]:
    return [
        Message(f"from {side} {i}".encode(), message_id=f"{prefix}-{i}") for i in range(MIRRORED)
    ]


def _telemetry(schema: dict[str, Any], i: int) -> dict[str, Any]:
    """A record for the sample schema: fills the fields it declares by their types."""
    record: dict[str, Any] = {}
    for field in schema.get("fields", []):
        kind = field["type"]
        if isinstance(kind, list):  # a union: its first non-null branch
            kind = next((k for k in kind if k != "null"), "null")
        if not isinstance(kind, str):
            kind = "string"
        record[field["name"]] = {
            "int": i,
            "long": 1_700_000_000_000 + i,
            "double": 20.0 + i / 10,
            "float": 1.5,
            "boolean": i % 2 == 0,
            "string": f"sensor-{i % 5}",
            "null": None,
        }.get(kind, f"value-{i}")
    return record
