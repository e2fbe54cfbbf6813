"""Instruments on the OpenTelemetry API that also keep their values in the process.

A ``Counter`` or ``Gauge`` here adds to (or is observed by) the OpenTelemetry instrument of
the same name, so every exporter the provider has gets it, and keeps the value, so the
progress display, the dashboard and ``/metrics`` (``prometheus.py``) read it directly,
whatever the provider is. Label values are bound once (``labels(...)``), as
prometheus_client's instruments are: the call sites stay one line.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation


class Counter:
    """A monotonic count per label values (``labels(...).inc(n)``, as prometheus_client
    reads), added to the OpenTelemetry counter of the same name and kept for ``value``."""

    def __init__(
        self, meter: Meter, name: str, description: str, labels: tuple[str, ...], unit: str
    ) -> None:
        self.name, self.description, self.unit = name, description, unit
        self.label_names = labels
        self.instrument = meter.create_counter(name, unit=unit, description=description)
        self._children: dict[tuple[str, ...], BoundCounter] = {}
        self._lock = threading.Lock()

    def labels(self, *values: str) -> BoundCounter:
        child = self._children.get(values)
        if child is None:
            with self._lock:
                child = self._children.setdefault(values, BoundCounter(self, values))
        return child

    def values(self) -> dict[tuple[str, ...], float]:
        """Every label set counted so far, with its count."""
        return {values: child.value() for values, child in list(self._children.items())}


class BoundCounter:
    __slots__ = ("_attributes", "_instrument", "_lock", "_value")

    def __init__(self, parent: Counter, values: tuple[str, ...]) -> None:
        self._instrument = parent.instrument
        self._attributes = dict(zip(parent.label_names, values, strict=True))
        self._lock = threading.Lock()
        self._value = 0.0

    def inc(self, amount: float = 1) -> None:
        if amount:
            self._instrument.add(amount, self._attributes)
            with self._lock:
                self._value += amount

    def value(self) -> float:
        return self._value


class Gauge:
    """A value set per label values (``labels(...).set(v)``), observed by the exporters."""

    def __init__(
        self, meter: Meter, name: str, description: str, labels: tuple[str, ...], unit: str
    ) -> None:
        self.name, self.description, self.unit = name, description, unit
        self.label_names = labels
        self._values: dict[tuple[str, ...], float] = {}
        meter.create_observable_gauge(
            name, callbacks=[self._observe], unit=unit, description=description
        )

    def labels(self, *values: str) -> BoundGauge:
        return BoundGauge(self._values, values)

    def values(self) -> dict[tuple[str, ...], float]:
        return dict(self._values)

    def _observe(self, _options: CallbackOptions) -> Iterable[Observation]:
        for values, value in list(self._values.items()):
            yield Observation(value, dict(zip(self.label_names, values, strict=True)))


class BoundGauge:
    __slots__ = ("_key", "_values")

    def __init__(self, values: dict[tuple[str, ...], float], key: tuple[str, ...]) -> None:
        self._values = values
        self._key = key

    def set(self, value: float) -> None:
        self._values[self._key] = value

    def value(self) -> float:
        return self._values.get(self._key, 0.0)
