"""A span per replicated batch, linked to each message's producer (the Azure SDKs' way).

The Azure SDKs write the producer's W3C context into every message they send, as the
application properties ``Diagnostic-Id`` and ``traceparent`` (``tracestate`` beside), and
keep a value that is already there; their receive and process spans *link* to it. A
replication does the same: its batch span (kind CONSUMER, ``<pipeline> replicate``) links
to the context of each message it copied, and the copies keep the properties unchanged, so
the consumer at the target links to the same producer span: producer, replication and
consumer are joined in one trace by links. Without a tracer provider (``export`` sets one)
nothing is parsed: a batch costs a check.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AnyValue

from ..messages import Message

TRACER = trace.get_tracer("replication")
TRACEPARENT = "traceparent"
DIAGNOSTIC_ID = "Diagnostic-Id"
TRACESTATE = "tracestate"
MAX_LINKS = 128
"""OpenTelemetry's default span link limit: a batch links to its first 128 messages."""

_PROPAGATOR = TraceContextTextMapPropagator()
enabled = False
"""Set by ``export.configure`` once spans go somewhere."""


def producer_link(message: Message) -> Link | None:
    """The link to the span that sent ``message`` (``traceparent``, else ``Diagnostic-Id``),
    if it carries a valid W3C context."""
    properties = message.application_properties
    parent = properties.get(TRACEPARENT) or properties.get(DIAGNOSTIC_ID)
    if not isinstance(parent, str | bytes) or not parent:
        return None
    carrier = {TRACEPARENT: parent.decode() if isinstance(parent, bytes) else parent}
    state = properties.get(TRACESTATE)
    if isinstance(state, str | bytes) and state:
        carrier[TRACESTATE] = state.decode() if isinstance(state, bytes) else state
    context = trace.get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
    return Link(context) if context.is_valid else None


@contextlib.contextmanager
def batch_span(
    pipeline: str, messages: Sequence[Message], system: str = "servicebus"
) -> Iterator[Span | None]:
    """The span of one batch's replication (None when tracing is off)."""
    if not enabled:
        yield None
        return
    links = []
    for message in messages:
        link = producer_link(message)
        if link is not None:
            links.append(link)
            if len(links) == MAX_LINKS:
                break
    attributes: dict[str, AnyValue] = {
        "messaging.system": system,
        "messaging.operation.type": "process",
        "messaging.batch.message_count": len(messages),
        "replication.pipeline": pipeline,
    }
    with TRACER.start_as_current_span(
        f"{pipeline} replicate", kind=SpanKind.CONSUMER, links=links, attributes=attributes
    ) as span:
        yield span
