"""Benchmark: how a Spark task of the ``eventhubs`` source reads its range, our AMQP reader
(``spark.eventhub_client.EventHubClient.read``) against ``azure-eventhub``.

    python bench/spark_eventhubs.py [--events 20000] [--size 200] [--runs 3]

Starts the embedded broker as a subprocess (``bench/eventhubs.py``'s ``broker``), sends
``--events`` events of ``--size`` bytes to partition 0 of the event hub ``events``
(untimed), then ``--runs`` times each, in this one process:

- ours: ``EventHubClient.read`` of ``[0, events)`` in batches of 500 (prefetch 500), each
  event decoded straight into a ``Message``;
- sdk: ``EventHubConsumerClient.receive_batch`` from sequence number 0 (inclusive; batches of
  500, prefetch 500) until all are in, each event made a ``Message`` with
  ``adapters.eventhubs.from_event_data`` (what a task needs).

Prints wall seconds, this process's CPU seconds and events/s per run. Measured 2026-11-25,
defaults, 2 shared cores (load 2.7-2.9), two runs of three: ours 0.55-0.60 s, 0.34-0.43 CPU s
(33,000-37,000 events/s; one first read 2.4 s while the broker warmed up), sdk 1.5-2.0 s,
1.1-1.5 CPU s (10,000-13,000 events/s).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from eventhubs import broker  # noqa: E402  (bench/eventhubs.py)

HUB = "events"


def send(connection: str, events: int, size: int) -> None:
    from azure.eventhub import EventData, EventHubProducerClient

    with EventHubProducerClient.from_connection_string(connection, eventhub_name=HUB) as client:
        for start in range(0, events, 500):
            batch = client.create_batch(partition_id="0")
            for _ in range(start, min(events, start + 500)):
                batch.add(EventData(b"x" * size))
            client.send_batch(batch)


async def ours(connection: str, events: int) -> int:
    from replication.spark.eventhub_client import EventHubClient, hub_source

    source, _ = hub_source(connection)
    try:
        return sum([len(b) async for b in EventHubClient(source, HUB).read("0", 0, events)])
    finally:
        await source.close()


def sdk(connection: str, events: int) -> int:
    from azure.eventhub import EventHubConsumerClient

    from replication.adapters.eventhubs import from_event_data

    client = EventHubConsumerClient.from_connection_string(
        connection, consumer_group="$Default", eventhub_name=HUB
    )
    got: list[Any] = []
    done = threading.Event()

    def on_batch(_context: Any, batch: list[Any]) -> None:
        got.extend(from_event_data(event, "0") for event in batch)
        if len(got) >= events:
            done.set()

    reader = threading.Thread(target=client.receive_batch, daemon=True, kwargs={
        "on_event_batch": on_batch, "partition_id": "0", "starting_position": 0,
        "starting_position_inclusive": True, "max_batch_size": 500, "prefetch": 500,
        "max_wait_time": 1,
    })  # fmt: skip
    reader.start()
    done.wait(300)
    client.close()
    return len(got)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    with broker(1) as running:
        connection = running.connection_string
        send(connection, args.events, args.size)
        for _ in range(args.runs):
            for name, read in (("ours", lambda: asyncio.run(ours(connection, args.events))),
                               ("sdk", lambda: sdk(connection, args.events))):  # fmt: skip
                wall, cpu = time.perf_counter(), time.process_time()
                count = read()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                print(f"{name}: {count} events, {wall:.2f} s, {cpu:.2f} CPU s, "
                      f"{count / wall:,.0f} events/s")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
