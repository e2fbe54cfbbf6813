"""Metrics and progress of a pipeline's streaming queries, from Spark's own progress events.

Executors cannot update the driver's counters, so the counts come from what Spark reports
to the driver for each micro-batch: ``numInputRows`` (source messages received) and the
pipeline's observed metrics (``Dataset.observe`` on the planned rows: rows sent to a target,
rows sent to the error target). They feed the same Prometheus counters as the Functions
worker and the local host (``replication_received_messages_total`` and friends), plus the
Spark-only batch count, batch duration and rate. ``FILTERED`` is not counted on Spark: with
routers one message can become several rows, so input minus output says nothing exact.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from pyspark.sql.streaming import StreamingQueryListener

from .. import metrics

log = logging.getLogger("replication.spark")

BATCHES = Counter(
    "replication_spark_batches", "Micro-batches a pipeline's streaming query completed.",
    ["pipeline", "query"], registry=metrics.REGISTRY,
)  # fmt: skip
BATCH_SECONDS = Histogram(
    "replication_spark_batch_duration_seconds",
    "Wall time of a micro-batch (planning, steps, sending, commit).",
    ["pipeline"], registry=metrics.REGISTRY,
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)  # fmt: skip
RATE = Gauge(
    "replication_spark_processed_rows_per_second", "Rows per second of the last micro-batch.",
    ["pipeline", "query"], registry=metrics.REGISTRY,
)  # fmt: skip

OBSERVED_PREFIX = "replication:"
"""Name prefix of the observed metrics of planned rows (``observed_name``)."""


def observed_name(query_name: str) -> str:
    return OBSERVED_PREFIX + query_name


def observe(planned: Any, query_name: str, error_target: str) -> Any:
    """The planned rows with their counts observed per micro-batch."""
    from pyspark.sql import functions as f

    to_error = f.when(f.col("target") == error_target, 1).otherwise(0)
    return planned.observe(
        observed_name(query_name),
        f.count(f.lit(1)).alias("rows"),
        f.coalesce(f.sum(to_error), f.lit(0)).alias("to_error_target"),
    )


class PipelineProgress(StreamingQueryListener):
    """Counts a pipeline's micro-batches into the metrics and logs one line per batch."""

    def __init__(self, pipeline: str, query_names: set[str]) -> None:
        self.pipeline = pipeline
        self.query_names = query_names

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if progress.name not in self.query_names:
            return
        try:
            self.record(progress.name, progress.numInputRows,
                        progress.durationMs.get("triggerExecution", 0) / 1000,
                        progress.processedRowsPerSecond,
                        progress.observedMetrics.get(observed_name(progress.name)))  # fmt: skip
        except Exception:  # a listener that raises is dropped by Spark: log and go on
            log.exception("%s: cannot record the progress of batch %s", self.pipeline,
                          progress.batchId)  # fmt: skip
            return
        log.info("%s: batch %d, %d rows in %.2f s, %.0f rows/s", progress.name,
                 progress.batchId, progress.numInputRows,
                 progress.durationMs.get("triggerExecution", 0) / 1000,
                 progress.processedRowsPerSecond or 0.0)  # fmt: skip

    def record(self, query: str, received: int, seconds: float, rate: float | None,
               observed: Any) -> None:  # fmt: skip
        name = self.pipeline
        BATCHES.labels(name, query).inc()
        BATCH_SECONDS.labels(name).observe(seconds)
        RATE.labels(name, query).set(rate or 0.0)
        metrics.RECEIVED.labels(name).inc(received)
        if observed is not None:
            to_error = int(observed["to_error_target"] or 0)
            metrics.FORWARDED.labels(name).inc(int(observed["rows"] or 0) - to_error)
            metrics.DEAD_LETTERED.labels(name).inc(to_error)
