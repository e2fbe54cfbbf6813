"""The lag of the copies one task made, carried to the driver in the task's row of counts.

A task measures the lag where its copies are accepted (``tasks.lag.record_lag``), into the
``metrics.LAG`` of the Python worker it runs in, and the driver never sees that process.
So each task opens a delta reader on that book when it starts and takes it when it ends
(``TaskLag``): what the reader holds is what this task's batches recorded, because a
PySpark worker process runs one task at a time (it is reused for the next one, so the
reader must start with the task, not with the process). Were two tasks ever run side by
side in one process, each would carry both tasks' copies and the driver would count them
twice. It travels as a compact JSON string, the ``lag`` column of ``executor.COUNTS_SCHEMA``
(null when the task accepted no copy):

    {"target|hop": [bucket counts (len(BOUNDS) + 1)..., total, count, minimum, maximum]}

The driver collects a micro-batch's strings (``progress.observe``: ``collect_list``),
merges them (``merged``) and adds them to its own ``metrics.LAG`` (``LagBook.add``), so
``/metrics`` and the exporters on the driver show ``replication_lag_seconds`` for the copies
its executors made. The strings ride in each micro-batch's progress (a few hundred bytes a
task), not in a side channel: they arrive exactly when, and only if, the batch's counts do.
A task that fails yields no row: the lag of the copies it made is lost with its counts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from types import TracebackType

from .. import metrics
from ..telemetry.lag import BOUNDS, DeltaReader, Distribution, Key, LagBook

SEPARATOR = "|"
"""Between the target and the scope in a key (a scope never holds one: split at the last)."""

TargetScope = tuple[str, str]


def encode(taken: dict[Key, Distribution], pipeline: str) -> str | None:
    """``pipeline``'s distributions of ``taken`` (a ``DeltaReader.take``) as the ``lag``
    column's text; None when it has none."""
    entries = {
        f"{target}{SEPARATOR}{scope}": [*lag.counts, lag.total, lag.count, lag.minimum, lag.maximum]
        for (name, target, scope), lag in sorted(taken.items())
        if name == pipeline and lag.count
    }
    return json.dumps(entries, separators=(",", ":")) if entries else None


def decode(text: str) -> dict[TargetScope, Distribution]:
    """One task's ``lag`` column back into distributions. ValueError, naming what was
    expected, for a text this version did not write."""
    width = len(BOUNDS) + 1
    expected = (
        f"expected {{'target{SEPARATOR}scope': [{width} bucket counts, total, count, minimum, "
        f"maximum]}}"
    )
    try:
        entries = json.loads(text)
        decoded = {}
        for key, values in entries.items():
            target, separator, scope = key.rpartition(SEPARATOR)
            if not separator or len(values) != width + 4:
                raise ValueError(f"entry {key!r}")
            counts = [int(value) for value in values[:width]]
            total, count, low, high = (float(value) for value in values[width:])
            decoded[(target, scope)] = Distribution(counts, total, int(count), low, high)
    except (AttributeError, TypeError, ValueError) as exc:
        raise ValueError(f"lag column {text[:200]!r}: {expected} ({exc})") from None
    return decoded


def merged(texts: Iterable[str | None]) -> dict[TargetScope, Distribution]:
    """A micro-batch's tasks' ``lag`` columns, summed per target and scope."""
    total: dict[TargetScope, Distribution] = {}
    for text in texts:
        if text:
            for key, lag in decode(text).items():
                total.setdefault(key, Distribution()).add(lag)
    return total


class TaskLag:
    """``with TaskLag(pipeline) as lag:`` around one task's work; ``lag.encoded()`` at its
    end is the task's ``lag`` column. The reader is closed on the way out."""

    def __init__(self, pipeline: str, book: LagBook | None = None) -> None:
        self.pipeline = pipeline
        self._book = metrics.LAG if book is None else book
        self._reader: DeltaReader | None = None

    def __enter__(self) -> TaskLag:
        self._reader = self._book.reader()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def encoded(self) -> str | None:
        """What this task recorded since it started (or since the last call)."""
        if self._reader is None:
            raise RuntimeError("TaskLag.encoded() outside its with block")
        return encode(self._reader.take(), self.pipeline)
