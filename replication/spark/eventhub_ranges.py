"""Event Hubs offsets and the ranges a micro-batch reads: pure arithmetic, no I/O.

A stream's offset is the map partition -> the next sequence number to read, written as the
Event Hubs Spark connector writes its offsets, ``{"<event hub>": {"0": 120, "1": 97}}``. A
micro-batch from ``start`` to ``end`` reads ``[start[p], end[p])`` of each partition: one
``EventRange`` per partition, cut into pieces when ``minPartitions`` asks for more tasks
(the data source only: the pipeline runner keeps a partition in one task, in order). A
range names sequence numbers only, so it pickles to a few hundred bytes whatever the events
weigh, and reading it again (a retried task, a replayed batch) reads the same events.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import InputPartition

Offsets = dict[str, int]
"""Partition id -> the next sequence number to read."""


@dataclass(frozen=True)
class EventRange(InputPartition):
    """What one task reads: events ``start`` (inclusive) to ``end`` (exclusive) of one
    partition."""

    partition: str
    start: int
    end: int

    @property
    def count(self) -> int:
        return self.end - self.start


def to_offset(hub: str, offsets: Mapping[str, int]) -> dict[str, Any]:
    """The JSON-ready offset (partitions in id order)."""
    return {hub: {p: int(offsets[p]) for p in sorted(offsets, key=_order)}}


def from_offset(hub: str, offset: Mapping[str, Any]) -> Offsets:
    """The partitions of an offset this source wrote (``ValueError`` for another hub's)."""
    if not offset:
        return {}
    found = {str(k).lower(): v for k, v in offset.items()}
    partitions = found.get(hub.lower())
    if not isinstance(partitions, dict):
        raise ValueError(
            f"the checkpoint's offset {dict(offset)!r} is not one of event hub {hub!r}: start "
            "this query with a new checkpoint location"
        )
    return {str(p): int(n) for p, n in partitions.items()}


def _order(partition: str) -> tuple[int, str]:
    return (int(partition), "") if partition.isdigit() else (1 << 62, partition)


def advance(start: Offsets, available: Offsets, limit: int | None) -> Offsets:
    """The end of the next micro-batch: every partition up to ``available``, or, with a
    ``limit``, that many events in all, shared in proportion to what each partition has
    waiting (as the connector shares ``maxEventsPerTrigger``). Offsets never go back, and
    a partition that has anything waiting gets at least one event while the limit lasts."""
    waiting = {p: max(0, available[p] - start.get(p, available[p])) for p in available}
    end = {p: max(start.get(p, available[p]), available[p]) for p in available}
    for p, n in start.items():
        end.setdefault(p, n)  # a partition that is gone keeps its offset
    total = sum(waiting.values())
    if limit is None or total <= limit:
        return end
    shares = {p: limit * n / total for p, n in waiting.items()}
    taken = {p: min(waiting[p], math.floor(share)) for p, share in shares.items()}
    left = limit - sum(taken.values())
    by_rest = sorted(waiting, key=lambda p: (taken[p] > 0, -(shares[p] - taken[p]), _order(p)))
    for p in by_rest:
        if left <= 0:
            break
        if taken[p] < waiting[p]:
            taken[p] += 1
            left -= 1
    return {**end, **{p: start.get(p, available[p]) + taken[p] for p in waiting}}


def plan(start: Offsets, end: Offsets, min_partitions: int | None = None) -> list[EventRange]:
    """The ranges of a micro-batch: one per partition with events, the biggest cut into
    equal pieces until there are ``min_partitions`` (when given)."""
    ranges = [
        EventRange(p, start.get(p, end[p]), end[p])
        for p in sorted(end, key=_order)
        if end[p] > start.get(p, end[p])
    ]
    total = sum(r.count for r in ranges)
    if not min_partitions or len(ranges) >= min_partitions or total == 0:
        return ranges
    pieces: list[EventRange] = []
    for r in ranges:  # pieces in proportion to the range's share, as Spark's Kafka source cuts
        parts = max(1, min(r.count, round(min_partitions * r.count / total)))
        size = math.ceil(r.count / parts)
        pieces += [
            EventRange(r.partition, low, min(r.end, low + size))
            for low in range(r.start, r.end, size)
        ]
    return pieces
