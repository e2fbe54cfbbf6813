"""The lag a task measured on its way to the driver, without a JVM: the ``lag`` column's
text and back, a worker process running tasks one after another, and the driver adding a
micro-batch's columns to its ``metrics.LAG``. The same on real Spark:
``test_pipeline.py``'s merge test."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import Row

from replication import metrics
from replication.clock import ManualClock
from replication.spark.executor import COUNTS_SCHEMA, Counts
from replication.spark.progress import LAG, SUMMED, PipelineProgress
from replication.spark.task_lag import TaskLag, decode, encode, merged
from replication.telemetry.lag import BOUNDS, HOP, PATH, Distribution, LagBook


def test_the_lag_column_round_trips_the_pipelines_distributions() -> None:
    hops = Distribution.of([0.004, 0.2, 0.2, 1.5, 4000.0])
    paths = Distribution.of([12.25])
    taken = {
        ("copy", "target", HOP): hops,
        ("copy", "a|b", PATH): paths,  # a target's name may hold the separator
        ("other", "target", HOP): Distribution.of([9.0]),  # not this task's pipeline
    }
    text = encode(taken, "copy")
    assert text is not None
    assert decode(text) == {("target", HOP): hops, ("a|b", PATH): paths}
    assert len(json.loads(text)["target|hop"]) == len(BOUNDS) + 1 + 4
    assert encode(taken, "nothing") is None  # null: collect_list leaves it out
    assert encode({}, "copy") is None


def test_a_text_this_version_did_not_write_is_refused_with_the_format() -> None:
    for text in ("not json", '{"target": [1, 2]}', '{"target|hop": [1]}', "[1]"):
        with pytest.raises(ValueError, match="bucket counts, total, count, minimum"):
            decode(text)


def test_a_micro_batchs_columns_merge_per_target_and_scope() -> None:
    one = encode({("p", "target", HOP): Distribution.of([1.0, 2.0])}, "p")
    two = encode(
        {
            ("p", "target", HOP): Distribution.of([0.5]),
            ("p", "target", PATH): Distribution.of([30.0]),
        },
        "p",
    )
    total = merged([one, None, two])
    assert total[("target", HOP)] == Distribution.of([1.0, 2.0, 0.5])
    assert total[("target", PATH)] == Distribution.of([30.0])
    assert merged([]) == {}


def test_tasks_run_one_after_another_in_a_worker_carry_only_their_own_copies() -> None:
    """A reused Python worker: the second task's column holds none of the first's copies,
    and the finished tasks leave no reader behind."""
    book = LagBook(ManualClock())
    book.record("p", "target", HOP, [100.0])  # an earlier task's, before this one began
    with TaskLag("p", book) as first:
        book.record("p", "target", HOP, [1.0, 2.0])
        carried = first.encoded()
    with TaskLag("p", book) as second:
        book.record("p", "target", HOP, [3.0])
        later = second.encoded()
    assert carried is not None and later is not None
    assert decode(carried)[("target", HOP)] == Distribution.of([1.0, 2.0])
    assert decode(later)[("target", HOP)] == Distribution.of([3.0])
    book.record("p", "target", HOP, [4.0])
    with pytest.raises(RuntimeError):
        first.encoded()
    assert book.totals()[("p", "target", HOP)].count == 5
    assert book._since == []


def test_the_counts_row_ends_with_the_lag_column() -> None:
    assert COUNTS_SCHEMA.endswith(", lag string")
    assert Counts(received=3).row(1, "{}") == (1, 3, *[0] * 9, "{}")


def test_the_driver_adds_a_micro_batchs_lag_to_its_metrics() -> None:
    """``PipelineProgress.record`` with the observed row Spark hands it: the tasks' columns
    merged into the driver's ``metrics.LAG`` under the listener's pipeline."""
    pipeline = "task-lag-driver"
    key = (pipeline, "target", HOP)
    columns = [
        encode({(pipeline, "target", HOP): Distribution.of([0.25, 0.75])}, pipeline),
        encode({(pipeline, "target", HOP): Distribution.of([1.5])}, pipeline),
    ]
    observed = Row(*SUMMED, LAG)(*([3, 3] + [0] * (len(SUMMED) - 2)), columns)
    reader = metrics.LAG.reader()
    try:
        counts, lag = PipelineProgress(pipeline, {"q"}).record("q", 2.0, observed)
        taken = reader.take()
    finally:
        reader.close()
    assert counts["forwarded"] == 3
    assert lag == {("target", HOP): Distribution.of([0.25, 0.75, 1.5])}
    assert taken == {key: Distribution.of([0.25, 0.75, 1.5])}
    assert metrics.LAG.last()[key] == 1.5  # the batch's maximum
