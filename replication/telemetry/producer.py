"""The lag histogram handed to the exporters (the OpenTelemetry spec's MetricProducer, which
the Python SDK does not have yet).

A periodic exporter (Azure Monitor, OTLP) is wrapped so each export carries, besides what the
SDK collected, a ``replication_lag_seconds`` histogram built from ``telemetry.lag``: deltas
for an exporter that wants them (Azure Monitor: min and max of the interval), cumulative
otherwise. ``/metrics`` gets the same histogram from a prometheus_client collector.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from .lag import BOUNDS, Distribution, Key, LagBook

SCOPE = InstrumentationScope("replication")
LAST = "replication_lag_last_seconds"
LAST_DESCRIPTION = "The lag of the last copy accepted."
MAX = "replication_lag_max_seconds"
MAX_DESCRIPTION = "The largest lag in the last {window:g} s (0 when no copy was accepted then)."


def lag_metric(
    name: str,
    description: str,
    distributions: dict[Key, Distribution],
    temporality: AggregationTemporality,
    start_ns: int,
    now_ns: int,
) -> Metric:
    points = [
        HistogramDataPoint(
            attributes={"pipeline": pipeline, "target": target, "scope": scope},
            start_time_unix_nano=start_ns,
            time_unix_nano=now_ns,
            count=dist.count,
            sum=dist.total,
            bucket_counts=list(dist.counts),
            explicit_bounds=list(BOUNDS),
            min=dist.minimum,
            max=dist.maximum,
        )
        for (pipeline, target, scope), dist in sorted(distributions.items())
        if dist.count
    ]
    return Metric(name, description, "s", Histogram(points, temporality))


class WithLag(MetricExporter):
    """``inner`` with the lag histogram added to every export (see the module)."""

    def __init__(self, inner: MetricExporter, book: LagBook, name: str, description: str):
        # the inner exporter's preferences are what the reader asks the SDK for
        temporality = inner._preferred_temporality  # private: no public accessor
        super().__init__(temporality, inner._preferred_aggregation)
        self.inner = inner
        self.name = name
        self.description = description
        wanted = (temporality or {}).get(HistogramInstrument)
        self.delta = wanted is AggregationTemporality.DELTA
        self._reader = book.reader() if self.delta else None
        self._book = book
        self._start_ns = time.time_ns()

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        now_ns = time.time_ns()
        if self._reader is not None:
            taken = self._reader.take()
            temporality, start_ns = AggregationTemporality.DELTA, self._start_ns
            self._start_ns = now_ns
        else:
            taken = self._book.totals()
            temporality, start_ns = AggregationTemporality.CUMULATIVE, self._start_ns
        if taken:
            metric = lag_metric(self.name, self.description, taken, temporality, start_ns, now_ns)
            metrics_data = _with_metric(metrics_data, metric)
        return self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def _with_metric(metrics_data: MetricsData | None, metric: Metric) -> MetricsData:
    """The export with ``metric`` in the app's scope (added to the first resource's)."""
    resources: Sequence[ResourceMetrics] = metrics_data.resource_metrics if metrics_data else ()
    if not resources:
        scope = ScopeMetrics(SCOPE, [metric], "")
        return MetricsData([ResourceMetrics(Resource.create(), [scope], "")])
    first, rest = resources[0], list(resources[1:])
    scopes = list(first.scope_metrics)
    for index, scope_metrics in enumerate(scopes):
        if scope_metrics.scope.name == SCOPE.name:
            metrics = [*scope_metrics.metrics, metric]
            scopes[index] = ScopeMetrics(scope_metrics.scope, metrics, scope_metrics.schema_url)
            break
    else:
        scopes.append(ScopeMetrics(SCOPE, [metric], ""))
    return MetricsData([ResourceMetrics(first.resource, scopes, first.schema_url), *rest])


class LagCollector(Collector):
    """``replication_lag_seconds`` on ``/metrics`` (cumulative, as Prometheus reads), and
    the last and windowed-maximum lag gauges next to it."""

    def __init__(self, book: LagBook, name: str, description: str) -> None:
        self.book = book
        self.name = name
        self.description = description

    def collect(self) -> Iterator[HistogramMetricFamily | GaugeMetricFamily]:
        labels = ["pipeline", "target", "scope"]
        for name, description, values in (
            (LAST, LAST_DESCRIPTION, self.book.last()),
            (MAX, MAX_DESCRIPTION.format(window=self.book.window), self.book.window_max()),
        ):
            gauge = GaugeMetricFamily(name, description, labels=labels)
            for key, value in sorted(values.items()):
                gauge.add_metric(list(key), value)
            yield gauge
        family = HistogramMetricFamily(
            self.name, self.description, labels=["pipeline", "target", "scope"]
        )
        for key, dist in sorted(self.book.totals().items()):
            cumulative, buckets = 0, []
            for bound, count in zip((*BOUNDS, float("inf")), dist.counts, strict=True):
                cumulative += count
                buckets.append((_le(bound), cumulative))
            family.add_metric(list(key), buckets, dist.total)
        yield family


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)
