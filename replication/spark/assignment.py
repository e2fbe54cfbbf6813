"""A partition is an assignment: what one task receives, not the messages themselves.

The driver plans work, not data (README "A partition is an assignment"): each micro-batch
is ``numPartitions`` assignments, each naming the namespace the source resolved to for this
batch, the entity, how many sessions to accept (0: a plain receiver), this slot's share of
``maxMessagesPerTrigger`` and how long to wait for the first message. An assignment pickles
to a few hundred bytes whatever the message sizes; the task receives the messages itself,
on its Python worker's connection (``worker.source_for``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition


@dataclass(frozen=True)
class Assignment(InputPartition):
    run: str
    """The planning reader's run (offsets are ``{run, batch}``)."""
    batch: int
    slot: int
    namespace: str
    """The source's namespace host as resolved for this batch (failover)."""
    path: str
    """A queue, or ``topic/Subscriptions/sub``."""
    sessions: int
    """0: a plain receiver; n: accept up to n next-available sessions."""
    max_messages: int
    """This slot's share of ``maxMessagesPerTrigger``."""
    max_wait: float
    """Seconds to wait for the first message (or the first session)."""
    cutoff: float | None = None
    """``Trigger.AvailableNow``: messages enqueued after this (Unix seconds) are released
    untouched; None otherwise."""
    commit_service: str | None = None
    """The ``servicebus`` data source (README "(b)"): ``host:port`` of the driver's commit
    service, which the task's holder asks whether the batch was committed; None for the
    pipeline runner (its tasks settle by themselves)."""
    max_seconds: float | None = None
    """The pipeline runner: seconds after which the task takes no new batch (it finishes and
    settles what it took), so a micro-batch lasts about this long however slow the source;
    None: only the share bounds it."""


def plan(
    run: str,
    batch: int,
    namespace: str,
    path: str,
    *,
    partitions: int,
    total: int,
    sessions: int = 0,
    max_wait: float = 1.0,
    cutoff: float | None = None,
    commit_service: str | None = None,
    max_seconds: float | None = None,
) -> list[Assignment]:
    """``partitions`` assignments sharing ``total`` messages; ``sessions`` (the source's
    ``maxConcurrentSessions``, 0 without sessions) spread over them, at least one each."""
    partitions = max(1, partitions)
    share = max(1, math.ceil(total / partitions))
    per_slot = max(1, math.ceil(sessions / partitions)) if sessions else 0
    fixed = (namespace, path, per_slot, share, max_wait, cutoff, commit_service, max_seconds)
    return [Assignment(run, batch, slot, *fixed) for slot in range(partitions)]
