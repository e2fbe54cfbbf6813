"""The drill's report: a table for people, JSON with the same figures for the record.

Times in the table are rounded for reading (seconds with milliseconds); the JSON keeps them
unrounded, with the message-ids behind the counts (the recovery point's, the duplicates',
anything the secondary lost), so a team can look each one up.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from .figures import Lag
from .run import DrillResult

WIDTH = 132
"""Columns of the table when the output is not a terminal."""


def as_json(result: DrillResult) -> dict[str, Any]:
    options = result.options
    return {
        "run_id": result.run_id,
        "mode": options.mode,
        "pipeline": result.pipeline,
        "entity": result.entity,
        "failover_source": result.failover_source,
        "primary": result.primary,
        "secondary": result.secondary,
        "rate": options.rate,
        "duration": options.duration,
        "flip_after": options.flip_after,
        "recheck_interval": options.recheck_interval,
        "failures": options.failures,
        "replicated_by_drill": options.replicate,
        "started_at": result.started_at,
        "started_at_utc": _iso(result.started_at),
        "flip": {
            "elapsed": result.flip.elapsed,
            "at": result.flip.at,
            "at_utc": _iso(result.flip.at),
        },
        "figures": dataclasses.asdict(result.figures),
        "accepted": {
            role: [a.message_id for a in result.production.accepted if a.namespace == host]
            for role, host in (("primary", result.primary), ("secondary", result.secondary))
        },
        "unsent": result.production.unsent,
    }


def table(result: DrillResult) -> Table:
    f = result.figures
    options = result.options
    what = "primary killed and alias flipped" if options.mode == "kill" else "alias flipped"
    if "file" in result.failover_source.split(" ", 1)[0]:
        what = what.replace("alias", "file")
    title = (
        f"failover drill {result.run_id}: {result.pipeline} ({result.entity}), "
        f"{what} at {result.flip.elapsed:.3f} s"
    )
    grid = Table(title=title, title_justify="left")
    grid.add_column("figure")
    grid.add_column("value")
    rows = [
        ("failover source", f"{result.failover_source}"),
        ("namespaces", f"{result.primary} -> {result.secondary}"),
        (
            "produced",
            f"{f.produced} at {options.rate:g} msg/s for {options.duration:g} s: "
            f"{f.accepted_by_primary} to the primary ({f.accepted_by_primary_after_flip} "
            f"after the flip), {f.accepted_by_secondary} to the secondary, {f.unsent} unsent",
        ),
        ("recovery time (RTO)", _recovery_time(result)),
        (
            "recovery point (RPO)",
            f"{_messages(f.rpo_messages)}, {f.rpo_seconds:.3f} s: accepted by the primary, "
            "not on the secondary",
        ),
        ("behind at the flip", f"{_messages(f.behind_at_flip)} not replicated yet"),
        ("duplicates", f"{f.duplicates} (extra copies of a message-id on the secondary)"),
        ("lag before the flip", _lag(f.lag_before)),
        ("lag after the flip", _lag(f.lag_after)),
        (
            "on the secondary",
            f"{_messages(f.on_secondary)} ({f.distinct_on_secondary} distinct): "
            f"{f.replicated} replicated, {f.sent_to_secondary} sent there",
        ),
    ]
    if f.lost_by_secondary:
        rows.append(("lost by the secondary", f"{_messages(len(f.lost_by_secondary))}"))
    for row in rows:
        grid.add_row(*row)
    return grid


def print_table(result: DrillResult, console: Console | None = None) -> None:
    if console is None:
        console = Console()
        if not console.is_terminal:  # a log or a pipe: lines as long as the figures need
            console = Console(width=WIDTH)
    console.print(table(result))


def _recovery_time(result: DrillResult) -> str:
    f = result.figures
    if f.rto is None:
        return "- (nothing reached the secondary)"
    text = f"{f.rto:.3f} s to the first accept on the secondary ({f.first_on_secondary})"
    if result.options.mode == "flip":  # no error tells the producer: its next re-check does
        text += f"; the producer re-checks every {result.options.recheck_interval:g} s"
    return text


def _messages(count: int) -> str:
    return f"{count} message{'' if count == 1 else 's'}"


def _lag(lag: Lag) -> str:
    if lag.p50 is None or lag.max is None:
        return "- (no replicated copy)"
    copies = f"{lag.copies} cop{'y' if lag.copies == 1 else 'ies'}"
    return f"p50 {lag.p50 * 1000:.0f} ms, max {lag.max * 1000:.0f} ms ({copies})"


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat(timespec="milliseconds")
