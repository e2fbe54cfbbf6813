"""The app's telemetry reaches its homes, from ``python -m replication start`` as a process:
the real Azure Monitor exporter posting to an ingestion endpoint served here, and the real
OTLP exporter posting to an OTLP/HTTP receiver served here. Both get the counters, the lag
histogram (one observation per copy) and the batch spans linked to the producers' contexts.
"""

from __future__ import annotations

import gzip
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.host.test_host import REPLICATE, project, start, wait_for_port
from tests.processes import Processes

pytestmark = pytest.mark.timeout(180)

COUNT = 40
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


class Receiver:
    """An HTTP server that keeps every request's path and body and answers 200."""

    def __init__(self, answer: Callable[[str, bytes], bytes]) -> None:
        self.requests: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                with receiver._lock:
                    receiver.requests.append((self.path, body))
                reply = answer(self.path, body)
                self.send_response(200)
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self, path: str) -> list[bytes]:
        with self._lock:
            return [body for p, body in self.requests if p.endswith(path)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver_factory() -> Iterator[Callable[[Callable[[str, bytes], bytes]], Receiver]]:
    made: list[Receiver] = []

    def make(answer: Callable[[str, bytes], bytes]) -> Receiver:
        made.append(Receiver(answer))
        return made[-1]

    yield make
    for receiver in made:
        receiver.close()


def run_host(
    tmp_path: Path, processes: Processes, extra: dict[str, str]
) -> tuple[Any, dict[str, str]]:
    """The host replicating ``work`` with ``extra`` app settings; COUNT messages sent, each
    carrying a producer's W3C context as the Azure SDKs write it."""
    directory, settings = project(tmp_path, REPLICATE)
    settings_file = directory / "local.settings.json"
    values = json.loads(settings_file.read_text())["Values"]
    values.update(extra, OTEL_METRIC_EXPORT_INTERVAL="300", OTEL_BSP_SCHEDULE_DELAY="100")
    settings_file.write_text(json.dumps({"Values": values}))
    log = tmp_path / "host.log"
    process = start(processes, directory, "--metrics-port", "0", "--no-progress", log=log)
    wait_for_port(settings["PrimaryServiceBus"], process)
    properties = {"traceparent": TRACEPARENT, "Diagnostic-Id": TRACEPARENT}
    with (
        ServiceBusClient.from_connection_string(settings["PrimaryServiceBus"]) as client,
        client.get_queue_sender("work") as sender,
    ):
        sender.send_messages(
            [
                ServiceBusMessage(f"m{i}", message_id=f"m{i}", application_properties=properties)
                for i in range(COUNT)
            ]
        )
    return process, settings


def azure_monitor_items(receiver: Receiver) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for body in receiver.bodies("/v2.1/track"):
        parsed = json.loads(body)
        items += parsed if isinstance(parsed, list) else [parsed]
    return items


def azure_metric_sum(items: list[dict[str, Any]], name: str, field: str) -> float:
    total = 0.0
    for item in items:
        if item.get("name", "").endswith("Metric"):
            for metric in item["data"]["baseData"]["metrics"]:
                if metric["name"] == name:
                    total += metric.get(field, 0) or 0
    return total


def test_azure_monitor_gets_counts_lag_and_linked_spans(
    tmp_path: Path, processes: Processes, receiver_factory: Callable[..., Receiver]
) -> None:
    def accept(_path: str, body: bytes) -> bytes:
        count = len(json.loads(body)) if body.startswith(b"[") else 1
        return json.dumps({"itemsReceived": count, "itemsAccepted": count, "errors": []}).encode()

    ingestion = receiver_factory(accept)
    connection_string = (
        "InstrumentationKey=00000000-0000-0000-0000-000000000001;"
        f"IngestionEndpoint=http://127.0.0.1:{ingestion.port}/"
    )
    settings = {
        "APPLICATIONINSIGHTS_CONNECTION_STRING": connection_string,
        "APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL": "true",
    }
    process, _ = run_host(tmp_path, processes, settings)

    def exported() -> bool:
        items = azure_monitor_items(ingestion)
        return (
            azure_metric_sum(items, "replication_forwarded_messages", "value") == COUNT
            and azure_metric_sum(items, "replication_lag_seconds", "count") == COUNT
        )

    until_sync(exported, "the forwarded count and the lag histogram at the ingestion endpoint")

    def linked() -> bool:  # the spans come from the worker process, on their own schedule
        items = azure_monitor_items(ingestion)
        # a CONSUMER span is an Application Insights request
        requests = [i for i in items if i.get("name", "").endswith("Request")]
        links = [
            json.loads(r["data"]["baseData"]["properties"]["_MS.links"])
            for r in requests
            if "_MS.links" in r["data"]["baseData"].get("properties", {})
        ]
        return any(link["operation_Id"] == TRACE_ID for group in links for link in group)

    until_sync(linked, "a batch span linked to the producer's trace")
    process.send_signal(signal.SIGINT)
    process.wait(timeout=60)


def test_otlp_gets_counts_lag_and_linked_spans(
    tmp_path: Path, processes: Processes, receiver_factory: Callable[..., Receiver]
) -> None:
    collector = receiver_factory(lambda _path, _body: b"")
    endpoint = f"http://127.0.0.1:{collector.port}"
    process, settings = run_host(tmp_path, processes, {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})

    def metric_points(name: str) -> list[Any]:
        points = []
        for body in collector.bodies("/v1/metrics"):
            request = ExportMetricsServiceRequest.FromString(body)
            for resource in request.resource_metrics:
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        if metric.name == name:
                            kind = metric.WhichOneof("data")
                            points += list(getattr(metric, kind).data_points)
        return points

    def exported() -> bool:  # cumulative: the last point has everything
        forwarded = metric_points("replication_forwarded_messages")
        lag = metric_points("replication_lag_seconds")
        if not (forwarded and lag):
            return False
        last = forwarded[-1]
        return getattr(last, last.WhichOneof("value")) == COUNT and lag[-1].count == COUNT

    until_sync(exported, "the forwarded count and the lag histogram at the OTLP receiver")

    def linked() -> bool:  # the spans come from the worker process, on their own schedule
        traces = set()
        for body in collector.bodies("/v1/traces"):
            for resource in ExportTraceServiceRequest.FromString(body).resource_spans:
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        traces |= {link.trace_id.hex() for link in span.links}
        return TRACE_ID in traces

    until_sync(linked, "a batch span linked to the producer's trace")
    # the copies keep the producer's context, so their consumer's spans link to it too
    with (
        ServiceBusClient.from_connection_string(settings["SecondaryServiceBus"]) as client,
        client.get_queue_receiver("work") as receiver,
    ):
        (copy,) = receiver.peek_messages(max_message_count=1)
    assert copy.application_properties is not None
    assert copy.application_properties[b"traceparent"] == TRACEPARENT.encode()
    assert copy.application_properties[b"Diagnostic-Id"] == TRACEPARENT.encode()
    process.send_signal(signal.SIGINT)
    process.wait(timeout=60)


def until_sync(condition: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.1)
