"""Where telemetry goes, chosen by the environment, once per process.

- ``APPLICATIONINSIGHTS_CONNECTION_STRING`` (Azure Functions sets it when the app has
  Application Insights): metrics, traces and logs through the Azure Monitor exporters.
- ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the per-signal ``OTEL_EXPORTER_OTLP_*_ENDPOINT``):
  the same through OTLP over HTTP (a collector, Grafana Alloy, Jaeger, Prometheus' OTLP
  receiver), configured by the standard ``OTEL_*`` variables.
- Neither: the API's no-op providers; ``/metrics`` still shows the counts (it reads the
  instruments, see ``prometheus.py``).

Both may be set; ``OTEL_METRICS_EXPORTER=none`` (the standard variable) leaves metrics out
of either (the local host's worker process: its counts go out through the host,
``host/relay.py``). Metrics are exported every ``OTEL_METRIC_EXPORT_INTERVAL`` ms (60,000 by
default, as the SDK reads it). The lag histogram rides along each metric export
(``producer.WithLag``). Providers are global in OpenTelemetry, so the first ``configure`` of
a process decides; later calls return what it made.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry._logs import set_logger_provider
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from . import tracing
from .lag import LagBook
from .producer import WithLag

log = logging.getLogger("replication.telemetry")

AZURE_MONITOR = "APPLICATIONINSIGHTS_CONNECTION_STRING"
OTLP = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTLP_SIGNALS = ("TRACES", "METRICS", "LOGS")
METRICS_EXPORTER = "OTEL_METRICS_EXPORTER"


@dataclass
class Telemetry:
    """What ``configure`` set up: the homes in use and the providers to flush at exit."""

    homes: list[str] = field(default_factory=list)
    meter_provider: MeterProvider | None = None
    tracer_provider: TracerProvider | None = None
    logger_provider: LoggerProvider | None = None

    def flush(self, timeout_millis: int = 10_000) -> None:
        """Exports what is pending now (a run that ends, a test that reads the receiver)."""
        for provider in (self.meter_provider, self.tracer_provider, self.logger_provider):
            if provider is not None:
                provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        for provider in (self.meter_provider, self.tracer_provider, self.logger_provider):
            if provider is not None:
                provider.shutdown()


_lock = threading.Lock()
_configured: Telemetry | None = None


def configure(
    lag: LagBook,
    lag_name: str,
    lag_description: str,
    environ: Mapping[str, str] | None = None,
    service_name: str = "replication",
) -> Telemetry:
    """Sets the global providers with an exporter per home ``environ`` names (see the
    module); ``lag`` is exported as the histogram ``lag_name``."""
    global _configured
    with _lock:
        if _configured is not None:
            return _configured
        env = os.environ if environ is None else environ
        exporters = _exporters(env)
        telemetry = Telemetry(homes=[home for home, _ in exporters])
        _configured = telemetry
        if not exporters:
            return telemetry
        attributes = {"service.name": env.get("OTEL_SERVICE_NAME", service_name)}
        website = env.get("WEBSITE_SITE_NAME")  # the Function App, in Azure
        if website:
            attributes["service.instance.id"] = env.get("WEBSITE_INSTANCE_ID", website)
        resource = Resource.create(attributes)
        readers = [
            PeriodicExportingMetricReader(WithLag(made["metrics"], lag, lag_name, lag_description))
            for _, made in exporters
            if "metrics" in made
        ]
        telemetry.meter_provider = MeterProvider(metric_readers=readers, resource=resource)
        metrics.set_meter_provider(telemetry.meter_provider)
        telemetry.tracer_provider = TracerProvider(resource=resource)
        for _, made in exporters:
            if "traces" in made:
                spans = BatchSpanProcessor(made["traces"])
                telemetry.tracer_provider.add_span_processor(spans)
        trace.set_tracer_provider(telemetry.tracer_provider)
        tracing.enabled = any("traces" in made for _, made in exporters)
        telemetry.logger_provider = LoggerProvider(resource=resource)
        for _, made in exporters:
            if "logs" in made:
                records = BatchLogRecordProcessor(made["logs"])
                telemetry.logger_provider.add_log_record_processor(records)
        set_logger_provider(telemetry.logger_provider)
        handler = LoggingHandler(logging.INFO, logger_provider=telemetry.logger_provider)
        logging.getLogger("replication").addHandler(handler)
        log.info("telemetry to %s", ", ".join(telemetry.homes))
        return telemetry


def _exporters(env: Mapping[str, str]) -> list[tuple[str, dict[str, Any]]]:
    """(home, {"metrics", "traces", "logs": exporter}) for each home the environment names.
    A home whose setting is wrong is left out with an error in the log: telemetry that
    cannot be sent must not stop the replication (the function app would not load)."""
    made: list[tuple[str, dict[str, Any]]] = []
    connection_string = env.get(AZURE_MONITOR, "").strip()
    if connection_string:
        try:
            made.append(("Azure Monitor", _azure_monitor(connection_string)))
        except ValueError as exc:
            log.error("%s is not usable (%s): no telemetry to Azure Monitor", AZURE_MONITOR, exc)
    signals = [s for s in OTLP_SIGNALS if env.get(OTLP) or env.get(_signal_endpoint(s))]
    if signals:
        try:
            made.append(("OTLP", _otlp(signals)))
        except ValueError as exc:
            log.error("the OTLP exporter settings are not usable (%s): no telemetry to OTLP", exc)
    if env.get(METRICS_EXPORTER, "").strip().lower() == "none":
        for _, exporters in made:
            exporters.pop("metrics", None)
    return made


def _signal_endpoint(signal: str) -> str:
    return f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT"


def _azure_monitor(connection_string: str) -> dict[str, Any]:
    from azure.monitor.opentelemetry.exporter import (
        AzureMonitorLogExporter,
        AzureMonitorMetricExporter,
        AzureMonitorTraceExporter,
    )

    # no retry files in the temp folder: a Function App's instance is disposable
    options = {"connection_string": connection_string, "disable_offline_storage": True}
    return {
        "metrics": AzureMonitorMetricExporter(**options),
        "traces": AzureMonitorTraceExporter(**options),
        "logs": AzureMonitorLogExporter(**options),
    }


def _otlp(signals: list[str]) -> dict[str, MetricExporter | SpanExporter | LogRecordExporter]:
    """OTLP over HTTP for the signals with an endpoint (each exporter reads its own
    ``OTEL_EXPORTER_OTLP_*`` variables: endpoint, headers, timeout, compression)."""
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    kinds = {"METRICS": OTLPMetricExporter, "TRACES": OTLPSpanExporter, "LOGS": OTLPLogExporter}
    return {signal.lower(): kinds[signal]() for signal in signals}
