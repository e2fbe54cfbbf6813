"""``/metrics``: the app's instruments as Prometheus reads them, under the same names.

The local host and the Spark driver serve this registry; the values come from the
instruments themselves (``instruments.py``), so ``/metrics`` shows them whatever
OpenTelemetry provider the process has, and counters get prometheus_client's ``_total``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .instruments import Counter, Gauge


class InstrumentCollector(Collector):
    def __init__(self, instruments: Sequence[Counter | Gauge]) -> None:
        self.instruments = list(instruments)

    def collect(self) -> Iterator[Metric]:
        for instrument in self.instruments:
            labels = list(instrument.label_names)
            family: CounterMetricFamily | GaugeMetricFamily
            if isinstance(instrument, Counter):
                family = CounterMetricFamily(instrument.name, instrument.description, labels=labels)
            else:
                family = GaugeMetricFamily(instrument.name, instrument.description, labels=labels)
            for values, value in sorted(instrument.values().items()):
                family.add_metric(list(values), value)
            yield family
