"""The ready set: lowest sequence numbers first, per session, whatever order they came in."""

from __future__ import annotations

from replication.broker.ready import ReadySet


def test_pop_first_takes_the_lowest_in_order_and_leaves_the_rest() -> None:
    ready = ReadySet((seq, None) for seq in range(1, 2001))
    assert ready.pop_first(100) == list(range(1, 101))
    ready.add_many([(50, None), (7, None)])  # abandoned: back at the head, in their places
    assert ready.pop_first(3) == [7, 50, 101]
    assert len(ready) == 1899
    assert ready.pop_first(5000) == list(range(102, 2001))
    assert not ready
    assert ready.pop_first(1) == []


def test_pop_first_keeps_sessions_apart() -> None:
    ready = ReadySet([(3, "a"), (1, "b"), (2, "a"), (4, None)])
    assert ready.pop_first(10, "a") == [2, 3]
    assert ready.pop_first(10, "a") == []
    assert 1 in ready and 2 not in ready
    assert ready.pop_first(1, "b") == [1]
    assert ready.pop_first(1) == [4]
    assert len(ready) == 0
