"""The replication lag of the copies a batch's targets accepted.

Per copy: its accept time minus the source message's enqueued time (scope ``hop``) and,
for a message replicated before, minus the first hop's enqueued time (scope ``path``: the
first entry of ``repl-enqueue-time``). Recorded a batch at a time into ``metrics.LAG``,
per pipeline and target (the pipeline's name for it: ``target`` for a single target).
"""

from __future__ import annotations

from datetime import datetime

from .. import metrics
from ..messages import Message
from ..telemetry.lag import HOP, PATH
from .sender import SendResult
from .stamping import ENQUEUE_TIME, SEPARATOR
from .targets import DEFAULT_TARGET_NAME


def record_lag(
    pipeline: str,
    sources: list[Message],
    outputs: list[Message],
    owners: list[int],
    result: SendResult,
) -> None:
    """``outputs[i]`` was made from ``sources[owners[i]]``; ``result`` says when each was
    accepted."""
    hops: dict[str, list[float]] = {}
    paths: dict[str, list[float]] = {}
    last: datetime | None = None
    start = 0.0
    for output, owner, accepted in zip(outputs, owners, result.accepted_at, strict=True):
        if accepted is None:
            continue
        moment = sources[owner].enqueued_time
        if moment is None:
            continue  # never on a broker (nothing to measure from)
        if moment is not last:  # a batch's messages mostly share one (adapters.amqp._time)
            last, start = moment, moment.timestamp()
        target = output.target or DEFAULT_TARGET_NAME
        _lags(hops, target).append(accepted - start)
        stamps = output.application_properties.get(ENQUEUE_TIME)
        if isinstance(stamps, str) and SEPARATOR in stamps:
            first = _first_hop(stamps)
            if first is not None:
                _lags(paths, target).append(accepted - first)
    for target, lags in hops.items():
        metrics.LAG.record(pipeline, target, HOP, lags)
    for target, lags in paths.items():
        metrics.LAG.record(pipeline, target, PATH, lags)


def _lags(by_target: dict[str, list[float]], target: str) -> list[float]:
    """``by_target``'s list for ``target`` (not ``setdefault``: that makes a list per copy)."""
    lags = by_target.get(target)
    if lags is None:
        lags = by_target[target] = []
    return lags


def _first_hop(stamps: str) -> float | None:
    try:
        return datetime.fromisoformat(stamps.split(SEPARATOR, 1)[0]).timestamp()
    except ValueError:  # a stamp someone else wrote: no path lag, the hop's still counts
        return None
