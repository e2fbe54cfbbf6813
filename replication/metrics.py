"""Counters every runner updates the same way (Functions worker, local host, Spark driver).

Prometheus metrics from ``prometheus_client``: the local host serves them on ``/metrics``
and shows them in its progress display; in Azure they cost nothing when nobody scrapes them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

REGISTRY = CollectorRegistry(auto_describe=True)

RECEIVED = Counter(
    "replication_received_messages", "Source messages handed to a pipeline.",
    ["pipeline"], registry=REGISTRY,
)  # fmt: skip
FORWARDED = Counter(
    "replication_forwarded_messages", "Messages the targets accepted.",
    ["pipeline"], registry=REGISTRY,
)  # fmt: skip
FILTERED = Counter(
    "replication_filtered_messages", "Source messages that produced nothing to send.",
    ["pipeline"], registry=REGISTRY,
)  # fmt: skip
DEAD_LETTERED = Counter(
    "replication_dead_lettered_messages", "Source messages dead-lettered (or sent to the "
    "error target) because a step said so.", ["pipeline"], registry=REGISTRY,
)  # fmt: skip
FAILED = Counter(
    "replication_failed_batches", "Batches that failed and were abandoned for redelivery.",
    ["pipeline"], registry=REGISTRY,
)  # fmt: skip
BACKLOG = Gauge(
    "replication_backlog_messages", "Messages waiting at a pipeline's source (local host).",
    ["pipeline"], registry=REGISTRY,
)  # fmt: skip


def counts(pipeline: str) -> dict[str, float]:
    """The current values for one pipeline (progress display, tests)."""
    return {
        "received": RECEIVED.labels(pipeline)._value.get(),
        "forwarded": FORWARDED.labels(pipeline)._value.get(),
        "filtered": FILTERED.labels(pipeline)._value.get(),
        "dead_lettered": DEAD_LETTERED.labels(pipeline)._value.get(),
        "failed_batches": FAILED.labels(pipeline)._value.get(),
        "backlog": BACKLOG.labels(pipeline)._value.get(),
    }


FAILOVERS = Counter(
    "replication_failovers", "Switches of a failover endpoint to a newly resolved namespace.",
    ["endpoint"], registry=REGISTRY,
)  # fmt: skip
