"""Metrics and progress of a pipeline's streaming queries, from Spark's own progress events.

Executors cannot update the driver's counters, so the counts come from what Spark reports
to the driver for each micro-batch: the pipeline's observed metrics (``Dataset.observe`` on
the tasks' rows of counts, ``executor.Counts``: messages received, copies the targets and
the error targets accepted, messages filtered, dead-lettered, abandoned). They feed the same
Prometheus counters as the Functions worker and the local host
(``replication_received_messages_total`` and friends), plus the Spark-only batch count,
batch duration and rate (messages per second). The lag of the copies comes the same way: each
task's row carries what it measured (``task_lag``), the observed metrics collect the
micro-batch's, and they are added to the driver's ``metrics.LAG`` (``replication_lag_seconds``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge, Histogram
from pyspark.sql.streaming import StreamingQueryListener

from .. import metrics
from ..telemetry.lag import HOP, Distribution
from .task_lag import TargetScope, merged

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row
    from pyspark.sql.streaming.listener import (
        QueryIdleEvent,
        QueryProgressEvent,
        QueryStartedEvent,
        QueryTerminatedEvent,
    )

log = logging.getLogger("replication.spark")

BATCHES = Counter(
    "replication_spark_batches",
    "Micro-batches a pipeline's streaming query completed.",
    ["pipeline", "query"],
    registry=metrics.REGISTRY,
)
BATCH_SECONDS = Histogram(
    "replication_spark_batch_duration_seconds",
    "Wall time of a micro-batch (planning, steps, sending, commit).",
    ["pipeline"],
    registry=metrics.REGISTRY,
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
RATE = Gauge(
    "replication_spark_processed_rows_per_second",
    "Source messages per second of the last micro-batch.",
    ["pipeline", "query"],
    registry=metrics.REGISTRY,
)

OBSERVED_PREFIX = "replication:"
"""Name prefix of the observed metrics of planned rows (``observed_name``)."""


def observed_name(query_name: str) -> str:
    return OBSERVED_PREFIX + query_name


SUMMED = (
    "received",
    "forwarded",
    "to_error_target",
    "filtered",
    "dead_lettered",
    "abandoned",
    "released",
    "late",
    "errors",
)
"""The columns of ``executor.Counts`` summed per micro-batch."""

LAG = "lag"
"""The tasks' lag column (``task_lag``), collected per micro-batch (nulls left out)."""


def observe(counts: DataFrame, query_name: str) -> DataFrame:
    """The tasks' rows of counts with their sums, and their lag columns, observed per
    micro-batch."""
    from pyspark.sql import functions as f

    return counts.observe(
        observed_name(query_name),
        *(f.coalesce(f.sum(name), f.lit(0)).alias(name) for name in SUMMED),
        f.collect_list(LAG).alias(LAG),
    )


class PipelineProgress(StreamingQueryListener):
    """Counts a pipeline's micro-batches into the metrics and logs one line per batch."""

    def __init__(self, pipeline: str, query_names: set[str]) -> None:
        self.pipeline = pipeline
        self.query_names = query_names
        self.recorded: dict[str, int] = {}
        """Per query, the last batch whose progress reached this listener."""
        self._progressed = threading.Condition()

    def wait_for(self, queries: list[Any], timeout: float = 30.0) -> bool:
        """Until the last progress of each (ended) query reached the listener: Spark hands
        progress to listeners on its own thread, after a query may already have ended, and a
        listener removed before then would miss the last micro-batch's counts. False when
        ``timeout`` seconds went by first."""
        wanted = {}
        for query in queries:
            last = query.lastProgress
            if last is not None:
                batch = last["batchId"] if isinstance(last, dict) else last.batchId
                wanted[query.name] = int(batch)
        deadline = time.monotonic() + timeout
        with self._progressed:
            while any(self.recorded.get(name, -1) < batch for name, batch in wanted.items()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._progressed.wait(remaining)
        return True

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        pass

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        pass

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        progress = event.progress
        if progress.name not in self.query_names:
            return
        try:
            self._progress(progress)
        finally:
            with self._progressed:
                batch = max(self.recorded.get(progress.name, -1), int(progress.batchId))
                self.recorded[progress.name] = batch
                self._progressed.notify_all()

    def _progress(self, progress: Any) -> None:
        seconds = progress.durationMs.get("triggerExecution", 0) / 1000
        try:
            counts, lag = self.record(
                progress.name, seconds, progress.observedMetrics.get(observed_name(progress.name))
            )
        except Exception:  # a listener that raises is dropped by Spark: log and go on
            log.exception(
                "%s: cannot record the progress of batch %s", self.pipeline, progress.batchId
            )
            return
        received = counts.get("received", 0)
        level = logging.INFO if received or counts.get("errors") else logging.DEBUG
        hops = [dist.maximum for (_, scope), dist in lag.items() if scope == HOP]
        log.log(
            level,
            "%s: batch %d, %d messages in %.2f s (%.0f msgs/s): %s%s",
            progress.name,
            progress.batchId,
            received,
            seconds,
            received / seconds if seconds else 0.0,
            ", ".join(f"{k} {v}" for k, v in counts.items() if v and k != "received"),
            f"; lag up to {max(hops):.3f} s" if hops else "",
        )

    def record(
        self, query: str, seconds: float, observed: Row | None
    ) -> tuple[dict[str, int], dict[TargetScope, Distribution]]:
        """Counts one micro-batch into the metrics and adds its tasks' lag to
        ``metrics.LAG``; returns its observed sums and lag."""
        name = self.pipeline
        counts = {key: int(observed[key] or 0) for key in SUMMED} if observed is not None else {}
        BATCHES.labels(name, query).inc()
        BATCH_SECONDS.labels(name).observe(seconds)
        RATE.labels(name, query).set(counts.get("received", 0) / seconds if seconds else 0.0)
        metrics.RECEIVED.labels(name).inc(counts.get("received", 0))
        metrics.FORWARDED.labels(name).inc(counts.get("forwarded", 0))
        metrics.FILTERED.labels(name).inc(counts.get("filtered", 0))
        metrics.DEAD_LETTERED.labels(name).inc(
            counts.get("dead_lettered", 0) + counts.get("to_error_target", 0)
        )
        if counts.get("abandoned"):
            metrics.FAILED.labels(name).inc()
        lag = merged(observed[LAG] or ()) if observed is not None else {}
        for (target, scope), distribution in lag.items():
            metrics.LAG.add(name, target, scope, distribution)
        return counts, lag
