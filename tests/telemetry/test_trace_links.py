"""Producer, replication and consumer in one trace: the unmodified azure-servicebus SDK traces
the send and the receive (azure-core's OpenTelemetry plugin), the replication its batch, and
both the batch span and the consumer's receive span link to the producer's message span."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from azure.servicebus import ServiceBusMessage
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from replication.tasks.pump import Source
from replication.tasks.targets import Target
from replication.tasks.task import ReplicationTask
from replication.telemetry import tracing
from tests.broker.conftest import BrokerHandle, make_config, receive_n
from tests.tasks.test_replicate import running
from tests.waiting import until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Every span of this process kept in memory, the SDKs' included, while the test runs.

    The global tracer provider is put back afterwards (OpenTelemetry's own test helpers do
    the same through these names): with a recording provider left behind, the SDK would
    write ``traceparent`` into every message later tests of this worker send."""
    from azure.core.settings import settings

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    saved = trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE
    trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = None, Once()
    trace.set_tracer_provider(provider)
    settings.tracing_implementation = "opentelemetry"
    tracing.enabled = True
    try:
        yield exporter
    finally:
        tracing.enabled = False
        settings.tracing_implementation = None
        trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = saved
        provider.shutdown()


def linked_to(span: ReadableSpan, producer: ReadableSpan) -> bool:
    wanted = producer.context
    return any(
        link.context.trace_id == wanted.trace_id and link.context.span_id == wanted.span_id
        for link in span.links
    )


async def test_the_batch_and_the_consumer_link_to_the_producer(
    broker_factory: Callable[..., BrokerHandle], spans: InMemorySpanExporter
) -> None:
    broker = broker_factory(make_config({"src": {}, "dst": {}}))
    with broker.client() as client, client.get_queue_sender("src") as sender:
        sender.send_messages(ServiceBusMessage("traced", message_id="traced-1"))
    (producer,) = [s for s in spans.get_finished_spans() if s.name == "ServiceBus.message"]

    task = ReplicationTask("traced-function", pipeline="traced")
    targets = {None: Target(broker.connection_string, "dst")}
    async with running(task, broker.connection_string, Source("src"), targets) as stats:
        await until(lambda: stats.completed == 1, "the copy")
    (batch,) = [s for s in spans.get_finished_spans() if s.name == "traced replicate"]
    assert batch.kind is trace.SpanKind.CONSUMER
    assert linked_to(batch, producer)

    with broker.client() as client, client.get_queue_receiver("dst") as receiver:
        (copy,) = receive_n(receiver, 1, timeout=10)
        receiver.complete_message(copy)
    consumers = [s for s in spans.get_finished_spans() if s.name == "ServiceBus.receive"]
    assert any(linked_to(span, producer) for span in consumers), [
        (s.name, [link.context for link in s.links]) for s in consumers
    ]


def test_a_later_send_carries_no_trace_context() -> None:
    """After the traced test the worker's provider is the API's no-op again: what the SDK
    sends then carries no ``traceparent`` (other tests compare properties exactly)."""
    span = trace.get_tracer("check").start_span("after")
    assert not span.get_span_context().is_valid
    span.end()
