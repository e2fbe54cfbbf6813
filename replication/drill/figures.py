"""The drill's figures, from what the producer was told and what the secondary holds.

Pure: no I/O, no clock. Inputs are the producer's accepts (which namespace, when), the
moment of the flip (or kill), and the secondary's messages of the run (``inventory``).

- Recovery time (RTO): from the flip to the first message accepted by the secondary.
- Recovery point (RPO): messages the primary accepted (the producer got the accept) that
  the secondary does not hold, by message-id: their count, and how far back they go (from
  the oldest one's send to the flip; 0 when they were all sent after it).
- Behind at the flip: messages the primary accepted before the flip whose copy reached the
  secondary only after it, or never: what a loss of the primary at that moment would have
  cost (compares the secondary's enqueued times with this machine's clock).
- Duplicates: copies of one message-id beyond the first at the secondary.
- Replication lag: per replicated copy, the secondary's enqueued time minus the source's
  (``repl-enqueue-time``), before the flip and after it (by the secondary's enqueued time).
- Lost by the secondary: accepted there and not held there (should be none).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from .inventory import Copy
from .producer import Production

NEVER = float("inf")


@dataclass(frozen=True, slots=True)
class Flip:
    """When the drill flipped (as the flip was done), or killed the primary (as it signalled)."""

    elapsed: float
    """Seconds from the start of the drill (the clock's monotonic time)."""
    at: float
    """Wall time."""


@dataclass(frozen=True, slots=True)
class Lag:
    """Replication lag of some copies, in seconds (None when there were none)."""

    copies: int
    p50: float | None
    max: float | None

    @classmethod
    def of(cls, lags: Iterable[float]) -> Lag:
        values = sorted(lags)
        if not values:
            return cls(0, None, None)
        return cls(len(values), statistics.median(values), values[-1])


@dataclass(frozen=True, slots=True)
class Figures:
    produced: int
    accepted_by_primary: int
    accepted_by_secondary: int
    accepted_by_primary_after_flip: int
    """Sends the primary still took after the flip (before the producer noticed it)."""
    unsent: int
    rto: float | None
    """Seconds from the flip to the first accept by the secondary; None: none came."""
    first_on_secondary: str | None
    rpo_messages: int
    rpo_seconds: float
    rpo_ids: list[str]
    behind_at_flip: int
    on_secondary: int
    """Messages of the run at the secondary, copies of one id counted each."""
    distinct_on_secondary: int
    replicated: int
    """Of ``on_secondary``: copies made by the replication (stamped)."""
    sent_to_secondary: int
    """Of ``on_secondary``: messages the producer sent there directly."""
    duplicates: int
    duplicate_ids: list[str]
    lag_before: Lag
    lag_after: Lag
    lost_by_secondary: list[str]


def compute(
    production: Production, flip: Flip, primary: str, secondary: str, copies: list[Copy]
) -> Figures:
    """The figures of one drill; ``primary`` and ``secondary`` are the namespace hosts the
    producer's accepts name."""
    accepted = production.accepted
    by_primary = [a for a in accepted if a.namespace == primary]
    by_secondary = [a for a in accepted if a.namespace == secondary]
    after_flip = [a for a in by_secondary if a.elapsed >= flip.elapsed]
    first = min(after_flip, key=lambda a: a.elapsed, default=None)

    held = Counter(c.message_id for c in copies)
    first_copy: dict[str, float] = {}  # message-id -> when the secondary first held it
    for copy in copies:
        first_copy[copy.message_id] = min(copy.enqueued_at, first_copy.get(copy.message_id, NEVER))
    missing = [a for a in by_primary if a.message_id not in held]
    oldest = min((a.sent_at for a in missing), default=None)
    behind = [
        a
        for a in by_primary
        if a.elapsed < flip.elapsed and first_copy.get(a.message_id, NEVER) > flip.at
    ]
    lags = [
        (c.enqueued_at, c.enqueued_at - c.source_enqueued_at)
        for c in copies
        if c.source_enqueued_at is not None
    ]
    return Figures(
        produced=len(accepted) + len(production.unsent),
        accepted_by_primary=len(by_primary),
        accepted_by_secondary=len(by_secondary),
        accepted_by_primary_after_flip=sum(a.elapsed >= flip.elapsed for a in by_primary),
        unsent=len(production.unsent),
        rto=None if first is None else first.elapsed - flip.elapsed,
        first_on_secondary=None if first is None else first.message_id,
        rpo_messages=len(missing),
        rpo_seconds=0.0 if oldest is None else max(0.0, flip.at - oldest),
        rpo_ids=sorted(a.message_id for a in missing),
        behind_at_flip=len(behind),
        on_secondary=len(copies),
        distinct_on_secondary=len(held),
        replicated=len(lags),
        sent_to_secondary=len(copies) - len(lags),
        duplicates=sum(count - 1 for count in held.values()),
        duplicate_ids=sorted(i for i, count in held.items() if count > 1),
        lag_before=Lag.of(lag for at, lag in lags if at < flip.at),
        lag_after=Lag.of(lag for at, lag in lags if at >= flip.at),
        lost_by_secondary=sorted(a.message_id for a in by_secondary if a.message_id not in held),
    )
