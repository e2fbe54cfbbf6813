"""The lag book alone: buckets, deltas per reader, the last value and the windowed maximum
on a ManualClock."""

from __future__ import annotations

import math

import pytest

from replication.clock import ManualClock
from replication.telemetry.lag import BOUNDS, HOP, Distribution, LagBook


def test_a_distribution_buckets_as_prometheus_reads_le() -> None:
    dist = Distribution.of([0.005, 0.0051, 3600.0, 3600.5])
    assert dist.counts[0] == 1  # 0.005 <= 0.005
    assert dist.counts[1] == 1
    assert dist.counts[len(BOUNDS) - 1] == 1  # 3600 <= 3600
    assert dist.counts[len(BOUNDS)] == 1  # above every bound
    assert (dist.count, dist.minimum, dist.maximum) == (4, 0.005, 3600.5)
    assert dist.total == pytest.approx(7200.5101)


def test_totals_add_up_and_each_reader_gets_only_what_is_new() -> None:
    book = LagBook(ManualClock())
    early = book.reader()
    book.record("p", "t", HOP, [1.0, 2.0])
    late = book.reader()
    book.record("p", "t", HOP, [5.0])
    assert book.totals()[("p", "t", HOP)].count == 3
    first = early.take()[("p", "t", HOP)]
    assert (first.count, first.minimum, first.maximum) == (3, 1.0, 5.0)
    second = late.take()[("p", "t", HOP)]
    assert (second.count, second.minimum, second.maximum) == (1, 5.0, 5.0)
    assert early.take() == {} and late.take() == {}  # nothing new since
    book.record("p", "t", HOP, [0.5])
    again = early.take()[("p", "t", HOP)]
    assert (again.count, again.minimum, again.maximum) == (1, 0.5, 0.5)  # this interval's


def test_last_and_window_max_follow_the_clock() -> None:
    clock = ManualClock()
    book = LagBook(clock, window=60.0)
    key = ("p", "t", HOP)
    book.record("p", "t", HOP, [9.0, 3.0])
    clock.advance(30)
    book.record("p", "t", HOP, [4.0])
    assert book.last()[key] == 4.0
    assert book.window_max()[key] == 9.0
    clock.advance(30)  # the 9 s copy was accepted 60 s ago: out of the window
    assert book.window_max()[key] == 4.0
    clock.advance(30)
    assert book.window_max()[key] == 0.0  # nothing accepted in the last minute
    assert book.last()[key] == 4.0


def test_an_empty_batch_records_nothing() -> None:
    book = LagBook(ManualClock())
    book.record("p", "t", HOP, [])
    assert book.totals() == {} and book.window_max() == {}
    assert math.isinf(Distribution().minimum)


def test_add_merges_a_distribution_measured_elsewhere() -> None:
    """What Spark's driver does with a micro-batch's lag from its executors: the totals and
    every reader get it whole, and its maximum stands for the last value (the copies' order
    is lost) and enters the window now."""
    clock = ManualClock()
    book = LagBook(clock, window=60.0)
    key = ("p", "t", HOP)
    reader = book.reader()
    book.record("p", "t", HOP, [1.0])
    book.add("p", "t", HOP, Distribution.of([0.5, 7.0, 2.0]))
    total = book.totals()[key]
    assert (total.count, total.minimum, total.maximum) == (4, 0.5, 7.0)
    assert total.total == pytest.approx(10.5)
    assert total.counts == Distribution.of([1.0, 0.5, 7.0, 2.0]).counts
    taken = reader.take()[key]
    assert (taken.count, taken.total) == (4, pytest.approx(10.5))
    assert book.last()[key] == 7.0
    assert book.window_max()[key] == 7.0
    clock.advance(60)
    assert book.window_max()[key] == 0.0
    book.add("p", "t", HOP, Distribution())  # an empty one changes nothing
    assert book.totals()[key].count == 4 and book.last()[key] == 7.0


def test_a_closed_reader_collects_no_more() -> None:
    book = LagBook(ManualClock())
    kept, closed = book.reader(), book.reader()
    book.record("p", "t", HOP, [1.0])
    closed.close()
    book.record("p", "t", HOP, [2.0])
    assert closed.take()[("p", "t", HOP)].count == 1  # what came before it was closed
    assert kept.take()[("p", "t", HOP)].count == 2
    book.record("p", "t", HOP, [3.0])
    assert closed.take() == {}  # no longer fed: a task's reader costs nothing after it
    assert kept.take()[("p", "t", HOP)].count == 1
