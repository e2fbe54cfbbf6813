"""Replication lag, aggregated where it is measured: per pipeline, target and scope.

Lag is one value per copy a target accepted (its accept time minus the source message's
enqueued time), so it is aggregated here a batch at a time: bucket counts, sum, count, min
and max, under the OpenTelemetry SDK's default bucket bounds. Recording every value through
the SDK's ``Histogram.record`` costs 4-8 us a copy (attribute hashing, a lock, a
measurement object), a tenth of what a replication costs; here it is a bisect and a few
additions. ``producer`` hands the result to the exporters as an OpenTelemetry histogram.

Besides the histogram the book keeps, per key, the last value and the maximum over a
sliding window (``window`` seconds on ``clock``): what a dashboard or an alert reads as
"how far behind is it now".
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..clock import SYSTEM, Clock

BOUNDS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BOUNDS += (30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
"""Upper bounds of the buckets in seconds, from a local hop (ms) to a target down for an
hour; the last bucket is everything above."""

HOP = "hop"
"""This hop: the target's accept time minus the source's enqueued time."""
PATH = "path"
"""The whole path: accept time minus the first hop's enqueued time (``repl-enqueue-time``'s
first entry), for a message replicated more than once."""

Key = tuple[str, str, str]
"""(pipeline, target, scope)."""


@dataclass(slots=True)
class Distribution:
    """Bucket counts (``len(BOUNDS) + 1``), sum, count, min and max of some lags."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BOUNDS) + 1))
    total: float = 0.0
    count: int = 0
    minimum: float = math.inf
    maximum: float = -math.inf

    @classmethod
    def of(cls, values: Iterable[float]) -> Distribution:
        counts = [0] * (len(BOUNDS) + 1)
        total, count, low, high = 0.0, 0, math.inf, -math.inf
        for value in values:
            counts[bisect_left(BOUNDS, value)] += 1
            total += value
            count += 1
            if value < low:
                low = value
            if value > high:
                high = value
        return cls(counts, total, count, low, high)

    def add(self, other: Distribution) -> None:
        for index, count in enumerate(other.counts):
            if count:
                self.counts[index] += count
        self.total += other.total
        self.count += other.count
        self.minimum = min(self.minimum, other.minimum)
        self.maximum = max(self.maximum, other.maximum)

    def copy(self) -> Distribution:
        return Distribution(list(self.counts), self.total, self.count, self.minimum, self.maximum)


class LagBook:
    """Lag per (pipeline, target, scope): cumulative, per reader since its last take, and
    the last value and windowed maximum. Safe to read from the exporters' threads."""

    def __init__(self, clock: Clock = SYSTEM, window: float = 60.0) -> None:
        self.clock = clock
        self.window = window
        self._lock = threading.Lock()
        self._totals: dict[Key, Distribution] = {}
        self._since: list[dict[Key, Distribution]] = []
        self._last: dict[Key, float] = {}
        self._peaks: dict[Key, deque[tuple[float, float]]] = {}

    def record(self, pipeline: str, target: str, scope: str, lags: list[float]) -> None:
        """One batch's lags (seconds) of copies ``target`` accepted."""
        if lags:
            self._merge((pipeline, target, scope), Distribution.of(lags), lags[-1])

    def add(self, pipeline: str, target: str, scope: str, distribution: Distribution) -> None:
        """Lags measured and aggregated elsewhere: Spark's executors measure the copies
        they send, the driver adds each micro-batch's here (``spark/task_lag.py``). The
        order of the copies is lost on the way, so their maximum stands for the last
        value: the one that says how far behind the batch got, which a "last" alert must
        not miss. The windowed maximum counts them as recorded now."""
        if distribution.count:
            self._merge((pipeline, target, scope), distribution, distribution.maximum)

    def _merge(self, key: Key, batch: Distribution, last: float) -> None:
        now = self.clock.monotonic()
        with self._lock:
            self._totals.setdefault(key, Distribution()).add(batch)
            for since in self._since:
                since.setdefault(key, Distribution()).add(batch)
            self._last[key] = last
            peaks = self._peaks.setdefault(key, deque())
            while peaks and peaks[0][0] <= now - self.window:
                peaks.popleft()
            while peaks and peaks[-1][1] <= batch.maximum:
                peaks.pop()  # a later, larger value outlives it in every window
            peaks.append((now, batch.maximum))

    def totals(self) -> dict[Key, Distribution]:
        """Everything recorded so far (cumulative temporality)."""
        with self._lock:
            return {key: value.copy() for key, value in self._totals.items()}

    def reader(self) -> DeltaReader:
        """A view that gives what was recorded since its previous ``take`` (delta
        temporality: min and max are then those of the interval, as Azure Monitor wants).
        Every record updates every open reader: ``close`` one that is done."""
        since: dict[Key, Distribution] = {}
        with self._lock:
            self._since.append(since)
        return DeltaReader(self, since)

    def last(self) -> dict[Key, float]:
        with self._lock:
            return dict(self._last)

    def window_max(self) -> dict[Key, float]:
        """The largest lag recorded in the last ``window`` seconds, per key; 0 for a key that
        saw none in that time (nothing waited: nothing was replicated late)."""
        now = self.clock.monotonic()
        with self._lock:
            peaks = {}
            for key, entries in self._peaks.items():
                while entries and entries[0][0] <= now - self.window:
                    entries.popleft()
                peaks[key] = entries[0][1] if entries else 0.0
            return peaks


class DeltaReader:
    """What one exporter has not taken yet (``LagBook.reader``)."""

    def __init__(self, book: LagBook, since: dict[Key, Distribution]) -> None:
        self._book = book
        self._since = since

    def take(self) -> dict[Key, Distribution]:
        with self._book._lock:
            taken = {key: value.copy() for key, value in self._since.items() if value.count}
            self._since.clear()
        return taken

    def close(self) -> None:
        """Stops collecting. An exporter's reader lives as long as the process; a Spark
        task's (``spark/task_lag.py``) ends with the task, and one left open would cost
        every later record an update and keep its keys for ever."""
        with self._book._lock:
            readers = self._book._since
            readers[:] = [since for since in readers if since is not self._since]
