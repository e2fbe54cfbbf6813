"""Benchmark: how a Spark task of the ``eventhubs`` source reads its range, our AMQP reader
(``servicebus.eventhubs.EventHubClient.read``) against ``azure-eventhub``.

    python bench/spark_eventhubs.py [--events 20000] [--size 200] [--runs 3]
                                    [--spark-events 80000]

Starts the embedded broker as a subprocess (``bench/eventhubs.py``'s ``broker``), sends
``--events`` events of ``--size`` bytes to partition 0 of the event hub ``events``
(untimed), then ``--runs`` times each, in this one process:

- ours: ``EventHubClient.read`` of ``[0, events)`` in batches of 500 (prefetch 500), each
  event decoded straight into a ``Message``;
- sdk: ``EventHubConsumerClient.receive_batch`` from sequence number 0 (inclusive; batches of
  500, prefetch 500) until all are in, each event made a ``Message`` with
  ``adapters.eventhubs.from_event_data`` (what a task needs).

Then, with ``--spark-events N`` (0: skipped), the source itself: N events of 1 KiB over the
4 partitions of ``events`` (a second broker, 4 partitions), read by
``spark.readStream.format("eventhubs")`` in ``local[2]`` into Spark's ``noop`` sink with
``Trigger.AvailableNow`` and ``maxEventsPerTrigger`` N/2 (two micro-batches); the rate
after the first micro-batch (which pays for the Python workers' start) and each batch's
seconds.

Prints wall seconds, this process's CPU seconds and events/s per run. Measured 2026-11-25,
defaults, 2 shared cores (load 2.7-2.9), two runs of three: ours 0.55-0.60 s, 0.34-0.43 CPU s
(33,000-37,000 events/s; one first read 2.4 s while the broker warmed up), sdk 1.5-2.0 s,
1.1-1.5 CPU s (10,000-13,000 events/s). ``--spark-events 80000``, two runs: batches of 6.0
and 3.5 s, 15.5 and 3.4 s (the first pays for the Python workers); 11,351 and 11,754
events/s after the first.
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
    from replication.servicebus.eventhubs import EventHubClient, hub_source

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


def spark_rate(events: int) -> str:
    """The ``eventhubs`` source in ``local[2]`` (see the module)."""
    import os
    import tempfile

    from azure.eventhub import EventData, EventHubProducerClient
    from pyspark.sql import SparkSession

    from replication.spark import register

    with broker(4) as running, tempfile.TemporaryDirectory() as checkpoint:
        connection = running.connection_string
        with EventHubProducerClient.from_connection_string(connection, eventhub_name=HUB) as p:
            for partition in range(4):
                for _ in range(0, events // 4, 500):
                    batch = p.create_batch(partition_id=str(partition))
                    for _ in range(500):
                        batch.add(EventData(b"x" * 1024))
                    p.send_batch(batch)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .getOrCreate())  # fmt: skip
        register(spark)
        try:
            options = {"connectionString": connection + f"EntityPath={HUB}",
                       "maxEventsPerTrigger": str(events // 2)}  # fmt: skip
            query = (spark.readStream.format("eventhubs").options(**options).load()
                     .writeStream.format("noop").option("checkpointLocation", checkpoint)
                     .trigger(availableNow=True).start())  # fmt: skip
            query.awaitTermination()
            batches = [p for p in query.recentProgress if p["numInputRows"]]
        finally:
            spark.stop()
    seconds = [b["durationMs"]["triggerExecution"] / 1000 for b in batches]
    rows = sum(b["numInputRows"] for b in batches)
    later = sum(b["numInputRows"] for b in batches[1:]) / max(sum(seconds[1:]), 1e-9)
    return (
        f"spark local[2]: {rows} events in {len(batches)} micro-batches of "
        f"{', '.join(f'{s:.1f}' for s in seconds)} s; {later:,.0f} events/s after the first"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--spark-events", type=int, default=0)
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
    if args.spark_events:
        print(spark_rate(args.spark_events))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
