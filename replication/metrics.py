"""The app's metrics, one set of names in every runner and every home: instruments on the
OpenTelemetry API.

The Functions worker, the local host, the pump and Spark count through these;
``telemetry.export.configure`` decides where they go (Azure Monitor when Functions sets
``APPLICATIONINSIGHTS_CONNECTION_STRING``, OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is
set, Prometheus ``/metrics`` in the local host and Spark); unconfigured, the API's no-op
provider takes them for nothing. Counts are also kept here (``counts``), for the progress
display and the dashboard, which read them in the same process.

Replication lag is one value per copy, so it is aggregated where it is measured
(``telemetry.lag``: ``LAG``) and handed to the exporters as the histogram
``replication_lag_seconds``; its last value and windowed maximum are gauges here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from opentelemetry import metrics as otel
from opentelemetry.metrics import CallbackOptions, Observation
from prometheus_client import CollectorRegistry

from .telemetry.export import Telemetry, configure
from .telemetry.instruments import Counter, Gauge
from .telemetry.lag import Key, LagBook
from .telemetry.producer import LAST, LAST_DESCRIPTION, MAX, MAX_DESCRIPTION, LagCollector
from .telemetry.prometheus import InstrumentCollector

METER = otel.get_meter("replication")
"""The global API's meter: bound to the provider ``telemetry.export.configure`` sets."""

REGISTRY = CollectorRegistry(auto_describe=True)
"""What ``/metrics`` shows: the instruments (``InstrumentCollector``) and the lag histogram
and gauges (``LagCollector``) register here; the Spark runner adds its own."""

MESSAGES = "{message}"

RECEIVED = Counter(
    METER,
    "replication_received_messages",
    "Source messages handed to a pipeline.",
    ("pipeline",),
    MESSAGES,
)
FORWARDED = Counter(
    METER,
    "replication_forwarded_messages",
    "Source messages whose copies the targets accepted.",
    ("pipeline",),
    MESSAGES,
)
FILTERED = Counter(
    METER,
    "replication_filtered_messages",
    "Source messages that produced nothing to send.",
    ("pipeline",),
    MESSAGES,
)
DEAD_LETTERED = Counter(
    METER,
    "replication_dead_lettered_messages",
    "Source messages dead-lettered (or sent to the error target) because a step said so.",
    ("pipeline",),
    MESSAGES,
)
FAILED = Counter(
    METER,
    "replication_failed_batches",
    "Batches that failed and were abandoned for redelivery.",
    ("pipeline",),
    "{batch}",
)
FAILOVERS = Counter(
    METER,
    "replication_failovers",
    "Switches of a failover endpoint to a newly resolved namespace.",
    ("endpoint",),
    "{switch}",
)
BACKLOG = Gauge(
    METER,
    "replication_backlog_messages",
    "Messages waiting at a pipeline's source (local host).",
    ("pipeline",),
    MESSAGES,
)
RPO_SECONDS = Gauge(
    METER,
    "replication_rpo_seconds",
    "Age of the oldest message at a pipeline's source not yet replicated (0 when none): "
    "what losing the source now would lose.",
    ("pipeline", "source"),
    "s",
)
RPO_MESSAGES = Gauge(
    METER,
    "replication_rpo_messages",
    "Messages at a pipeline's source not yet replicated (a lower bound when counted by "
    "peeking: see tasks.recovery_point).",
    ("pipeline", "source"),
    MESSAGES,
)

LAG = LagBook()
"""Replication lag per (pipeline, target, scope); exported as ``replication_lag_seconds``."""
LAG_HISTOGRAM = "replication_lag_seconds"
LAG_DESCRIPTION = (
    "Per copy a target accepted: its accept time minus the source message's enqueued time "
    "(scope hop), or minus the first hop's (scope path, replicated more than once)."
)


def _lag_gauge(name: str, description: str, read: Callable[[], dict[Key, float]]) -> None:
    def observe(_options: CallbackOptions) -> Iterable[Observation]:
        for (pipeline, target, scope), value in read().items():
            yield Observation(value, {"pipeline": pipeline, "target": target, "scope": scope})

    METER.create_observable_gauge(name, callbacks=[observe], unit="s", description=description)


_lag_gauge(LAST, LAST_DESCRIPTION, LAG.last)
_lag_gauge(MAX, MAX_DESCRIPTION.format(window=LAG.window), LAG.window_max)


INSTRUMENTS: list[Counter | Gauge] = [
    RECEIVED,
    FORWARDED,
    FILTERED,
    DEAD_LETTERED,
    FAILED,
    FAILOVERS,
    BACKLOG,
    RPO_SECONDS,
    RPO_MESSAGES,
]
"""Every counter and gauge (``/metrics``; a worker process relays them: ``host.relay``)."""
REGISTRY.register(InstrumentCollector(INSTRUMENTS))
REGISTRY.register(LagCollector(LAG, LAG_HISTOGRAM, LAG_DESCRIPTION))


def counts(pipeline: str) -> dict[str, float]:
    """The current values for one pipeline (progress display, dashboard, tests)."""
    return {
        "received": RECEIVED.labels(pipeline).value(),
        "forwarded": FORWARDED.labels(pipeline).value(),
        "filtered": FILTERED.labels(pipeline).value(),
        "dead_lettered": DEAD_LETTERED.labels(pipeline).value(),
        "failed_batches": FAILED.labels(pipeline).value(),
        "backlog": BACKLOG.labels(pipeline).value(),
    }


def export(environ: Mapping[str, str] | None = None) -> Telemetry:
    """Sends these metrics (and the app's traces and logs) where the environment says: Azure
    Monitor, OTLP, or nowhere but ``/metrics`` (``telemetry.export``); once per process."""
    return configure(LAG, LAG_HISTOGRAM, LAG_DESCRIPTION, environ)
