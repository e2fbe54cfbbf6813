"""Benchmark: rule filters as a broker runs them, one compiled filter against many messages.

    python bench/sqlfilter.py [--seconds 1] [--rounds 5]

Each line is one filter evaluated over a rotating set of eight messages (some match, some do
not, some lack the properties), best round of ``--rounds`` counted, in evaluations per
second. The first line is the typical SQL filter
``color = 'red' AND quantity > 10 OR sys.Label LIKE 'ord%'``; then a few other shapes, a
correlation filter, the parse + compile cost of the typical filter, and a rule action.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from replication.sqlfilter import (
    CorrelationFilter,
    MessageFacts,
    TrueFilter,
    parse_action,
    parse_filter,
)

TYPICAL = "color = 'red' AND quantity > 10 OR sys.Label LIKE 'ord%'"
NOW = datetime(2024, 5, 1, tzinfo=UTC)


def _messages() -> list[MessageFacts]:
    shapes = [
        ({"color": "red", "quantity": 12}, "invoice"),
        ({"color": "red", "quantity": 5}, "order-1"),
        ({"color": "blue", "quantity": 50}, "shipment"),
        ({"Color": "red", "Quantity": 11}, None),
        ({"priority": "high"}, "order-2"),
        ({}, None),
        ({"color": "red", "quantity": 10.5, "region": "eu"}, "ordinal"),
        ({"color": "green", "quantity": "12"}, "x"),
    ]
    messages = []
    for i, (user, label) in enumerate(shapes):
        system = {
            "MessageId": f"m-{i}",
            "SequenceNumber": i,
            "EnqueuedTimeUtc": NOW,
            "TimeToLive": timedelta(minutes=5),
            "CorrelationId": "high" if i % 2 else "low",
        }
        if label is not None:
            system["Label"] = label
        messages.append(MessageFacts(system, dict(user)))
    return messages


def _rate(run: Callable[[MessageFacts], object], seconds: float, rounds: int) -> float:
    messages = _messages()
    batch = messages * 125  # 1,000 evaluations per timing check
    best = 0.0
    for _ in range(rounds):
        count = 0
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            for message in batch:
                run(message)
            count += len(batch)
            now = time.perf_counter()
            if now >= deadline:
                break
        best = max(best, count / (now - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the best one counts")
    args = parser.parse_args()

    print(f"python {platform.python_version()} ({platform.python_implementation()})")
    cases: list[tuple[str, Callable[[MessageFacts], object]]] = [
        (f"sql: {text}", parse_filter(text, parameters).matches)
        for text, parameters in [
            (TYPICAL, None),
            ("StoreId IN ('Store1', 'Store2', 'Store3') AND NOT EXISTS(region)", None),
            ("sys.EnqueuedTimeUtc + sys.TimeToLive > @now AND quantity * 2 >= 20", {"now": NOW}),
            ("sys.Label LIKE '%d_r%' ESCAPE '!'", None),
        ]
    ]
    correlation = CorrelationFilter(correlation_id="high", properties={"color": "red"})
    cases.append((f"correlation: {correlation.expression}", correlation.matches))
    cases.append(("true filter", TrueFilter().matches))
    action = parse_action(
        "SET quantity = quantity / 2; REMOVE priority; SET sys.CorrelationId = 'low'"
    )

    def apply_to_copy(message: MessageFacts) -> None:
        action.apply(message.copy())

    others = [
        (f"action on a copy: {action.expression}", apply_to_copy, "applications/s"),
        (f"parse + compile: {TYPICAL}", lambda _: parse_filter(TYPICAL), "filters/s"),
    ]
    rows = [(name, run, "evaluations/s") for name, run in cases] + others
    width = max(len(name) for name, _, _ in rows)
    for name, run, unit in rows:
        print(f"{name:<{width}}  {_rate(run, args.seconds, args.rounds):>12,.0f} {unit}")


if __name__ == "__main__":
    main()
