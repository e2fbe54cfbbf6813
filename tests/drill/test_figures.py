"""The drill's figures from made-up accepts and copies: each figure is the set arithmetic
or the timing the report says it is."""

from __future__ import annotations

import pytest

from replication.drill.figures import Flip, Lag, compute
from replication.drill.inventory import Copy, source_enqueued_at
from replication.drill.producer import Accepted, Production

P, S = "primary.drill.invalid", "secondary.drill.invalid"
T0 = 1_800_000_000.0
"""Wall time of the drill's start."""
FLIP = Flip(elapsed=5.0, at=T0 + 5.0)


def close(seconds: float) -> object:
    """Equal to a microsecond (wall times near 1.8e9 s keep about that much)."""
    return pytest.approx(seconds, abs=1e-6)


def accepted(number: int, namespace: str, elapsed: float) -> Accepted:
    """Message ``number``, sent 10 ms before its accept at ``elapsed`` seconds."""
    at = T0 + elapsed
    return Accepted(f"m-{number}", namespace, at - 0.01, at, elapsed, 1)


def replicated(number: int, source_at: float, lag: float) -> Copy:
    return Copy(f"m-{number}", source_at + lag, source_at)


def direct(number: int, at: float) -> Copy:
    return Copy(f"m-{number}", at, None)


def test_the_figures_follow_from_the_accepts_and_what_the_secondary_holds() -> None:
    production = Production(
        accepted=[
            accepted(0, P, 1.0),
            accepted(1, P, 2.0),  # never replicated: part of the recovery point
            accepted(2, P, 3.0),  # replicated only after the flip
            accepted(3, P, 4.0),  # never replicated
            accepted(4, P, 5.2),  # the primary still took it after the flip, replicated
            accepted(5, S, 5.75),  # the first on the secondary: RTO 0.75 s
            accepted(6, S, 6.0),
            accepted(7, S, 7.0),  # accepted by the secondary, and not there
        ],
        unsent=["m-8"],
    )
    copies = [
        replicated(0, T0 + 1.0, 0.004),
        replicated(2, T0 + 3.0, 2.5),  # lands at 5.5 s: after the flip
        replicated(4, T0 + 5.2, 0.1),
        direct(5, T0 + 5.74),
        direct(6, T0 + 5.99),
        replicated(0, T0 + 1.0, 0.006),  # a second copy of m-0
        direct(6, T0 + 6.5),  # and of m-6
    ]
    figures = compute(production, FLIP, P, S, copies)
    assert figures.produced == 9
    assert (figures.accepted_by_primary, figures.accepted_by_secondary) == (5, 3)
    assert figures.accepted_by_primary_after_flip == 1
    assert figures.unsent == 1
    assert figures.rto == pytest.approx(0.75)
    assert figures.first_on_secondary == "m-5"
    assert figures.rpo_ids == ["m-1", "m-3"]
    assert figures.rpo_messages == 2
    assert figures.rpo_seconds == pytest.approx(5.0 - (2.0 - 0.01))  # m-1's send to the flip
    assert figures.behind_at_flip == 3  # m-1, m-3 never; m-2 after the flip
    assert (figures.on_secondary, figures.distinct_on_secondary) == (7, 5)
    assert (figures.replicated, figures.sent_to_secondary) == (4, 3)
    assert (figures.duplicates, figures.duplicate_ids) == (2, ["m-0", "m-6"])
    assert figures.lag_before == Lag(2, close(0.005), close(0.006))
    assert figures.lag_after == Lag(2, close(1.3), close(2.5))
    assert figures.lost_by_secondary == ["m-7"]


def test_nothing_lost_nothing_reached_and_sends_after_the_flip() -> None:
    """A recovery point of messages all sent after the flip goes back 0 s; a secondary
    that never took anything has no recovery time; no copies, no lag."""
    production = Production(accepted=[accepted(0, P, 5.5)])
    figures = compute(production, FLIP, P, S, [])
    assert (figures.rpo_ids, figures.rpo_seconds) == (["m-0"], 0.0)
    assert (figures.rto, figures.first_on_secondary) == (None, None)
    assert figures.behind_at_flip == 0  # accepted after the flip: not behind *at* it
    assert figures.lag_before == figures.lag_after == Lag(0, None, None)
    assert (figures.duplicates, figures.lost_by_secondary) == (0, [])


def test_a_stamp_gives_its_last_hop_as_wall_time() -> None:
    first, last = "2026-11-23T10:15:30.1234560Z", "2026-11-23T10:15:31.5000000Z"
    assert source_enqueued_at(f"{first};{last}") == pytest.approx(1795428931.5)
    assert source_enqueued_at(first) == pytest.approx(1795428930.123456)
    assert source_enqueued_at(None) is None
