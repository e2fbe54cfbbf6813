"""A task pump as a separate process, for crash tests: ``python pump_process.py CONN SRC DST``.

Replicates queue SRC to queue DST (same namespace) until killed; prints ``completed N`` after
every batch so the test can kill it mid-stream. ``--slow`` sleeps inside each batch's send so
a kill lands between the target's accept and the source's settle as often as not.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from azure.servicebus.aio import ServiceBusClient

from replication.tasks.pump import PumpStats, Source, pump
from replication.tasks.targets import SenderPool, Target
from replication.tasks.task import ReplicationTask


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("connection_string")
    parser.add_argument("source")
    parser.add_argument("target")
    args = parser.parse_args(argv)
    pool = SenderPool({None: Target(args.connection_string, args.target)})
    client = ServiceBusClient.from_connection_string(args.connection_string)

    def progress(stats: PumpStats) -> None:
        print(f"completed {stats.completed}", flush=True)

    await pump(
        ReplicationTask("crash"), client, Source(args.source), pool, asyncio.Event(),
        max_batch=50, on_batch=progress,
    )  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
