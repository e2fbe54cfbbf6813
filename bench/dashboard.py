"""Benchmark: the dashboard explorer on a big namespace (issue 41: "it stays fast on 1,000
entities and 10,000 messages in a queue").

    python bench/dashboard.py [--entities 1000] [--messages 10000] [--rounds 5]

An embedded broker in this process (a temporary data directory, a free port on 127.0.0.1)
with ``--entities`` queues, one of them (``big``) holding ``--messages`` messages of which
every tenth has a ``tenant=contoso`` property. The dashboard is asked as the page asks
(``Dashboard.handle`` with ``Request`` values, no HTTP in between), each figure the median
of ``--rounds``:

1. overview: every entity with its counts (the page's first load, and each live update);
2. peek: the first page of 20, and a page of 20 from the middle;
3. search: a message id that is the last message (the search looks through its limit,
   5,000 messages, and finds nothing past it), and a property over the first 5,000
   (stops at the first 20 matches);
4. entities: one queue's settings (the Settings tab), and a create form checked (its name
   free, its forward target there) as the page asks before its confirmation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from replication.broker.config import parse_config
from replication.broker.httpapi import Request
from replication.broker.main import build_broker
from replication.dashboard import Dashboard, Namespace
from replication.messages import Message


def config(entities: int) -> dict[str, Any]:
    queues = [{"Name": "big", "Properties": {}}]
    queues += [{"Name": f"q{i:04d}", "Properties": {}} for i in range(entities - 1)]
    return {
        "UserConfig": {
            "Namespaces": [{"Name": "sbemulatorns", "Queues": queues}],
            "Logging": {"Type": "File"},
        }
    }


async def timed(
    dashboard: Dashboard, route: str, rounds: int, body: Any = None, **params: Any
) -> float:
    """The median seconds of ``rounds`` GETs of ``route`` (POSTs of ``body``, given one)."""
    target = f"/$dashboard/api/{route}?{urlencode(params)}"
    headers = {"host": "127.0.0.1", "content-type": "application/json"}
    method, data = ("GET", b"") if body is None else ("POST", json.dumps(body).encode())
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        response = await dashboard.handle(Request(method, target, headers, data))
        times.append(time.perf_counter() - started)
        assert response is not None and response.status == 200, response
    return statistics.median(times)


async def main(entities: int, messages: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as data:
        broker = build_broker(parse_config(config(entities)), Path(data), "127.0.0.1", 0)
        await broker.start()
        namespace = Namespace.of_broker(broker, "bench")
        dashboard = Dashboard([namespace])
        try:
            started = time.perf_counter()
            batch = [
                Message(
                    body=b"x" * 200,
                    message_id=f"m{i}",
                    application_properties={"tenant": "contoso" if i % 10 == 0 else "fabrikam"},
                )
                for i in range(messages)
            ]
            await namespace.send("big", batch)
            took = time.perf_counter() - started
            print(f"setup: {entities} queues, {messages} messages sent in {took:.1f} s")
            where = {"namespace": "bench", "entity": "big"}
            figures = {
                "overview (all entities, counts)": await timed(dashboard, "overview", rounds),
                "peek 20 from #1": await timed(dashboard, "messages", rounds, **where, count=20),
                "peek 20 from the middle": await timed(
                    dashboard, "messages", rounds, **where, count=20, **{"from": messages // 2}
                ),
                "search message id (5,000 scanned, no match)": await timed(
                    dashboard, "messages", rounds, **where, message_id=f"m{messages - 1}"
                ),
                "search property tenant=contoso (20 matches)": await timed(
                    dashboard, "messages", rounds, **where, property="tenant=contoso"
                ),
                "settings of one queue (Settings tab)": await timed(
                    dashboard, "entity", rounds, **where
                ),
                "create checked (name free, forward target)": await timed(
                    dashboard,
                    "entity/create",
                    rounds,
                    {
                        "kind": "queue",
                        "name": "new",
                        "check": True,
                        "settings": {"LockDuration": "PT30S", "ForwardTo": f"q{entities - 2:04d}"},
                    },
                    namespace="bench",
                ),
            }
            for name, seconds in figures.items():
                print(f"{name:48s} {seconds * 1000:8.1f} ms")
        finally:
            await dashboard.stop()
            await broker.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--entities", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.entities, args.messages, args.rounds))
