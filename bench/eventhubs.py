"""Benchmark: the embedded broker's Event Hubs face against its Service Bus face, and Service
Bus -> Event Hubs replication against a plain azure-eventhub send of the same events.

    python bench/eventhubs.py [--messages 20000] [--size 256] [--batch 100] [--partitions 4]
                              [--keys 10] [--send-backend amqp|sdk] [--host-messages 2000]

Starts the embedded broker as a subprocess on port 0 (one listener serving both faces:
Service Bus queues ``plain``, ``src``, ``hsrc``; event hubs ``events``, ``ref``, ``dst``,
``hdst`` with ``--partitions`` partitions each), then in the same run:

1. faces, the same ``--messages`` bodies of ``--size`` bytes in batches of ``--batch``,
   asyncio clients, each sender's link opened (one warm-up send) before the clock:
   - Event Hubs send: ``EventHubProducerClient.send_batch`` (no key: round-robin);
   - Service Bus send: ``ServiceBusSender.send_messages`` to a queue;
   - Event Hubs receive: ``EventHubConsumerClient.receive_batch`` from the start of every
     partition (greedy load balancing, prefetch 300, batches of ``--batch``) until all are in;
   - Service Bus receive: ``receive_messages`` (receive-and-delete: like reading events,
     nothing is settled; prefetch 300, batches of ``--batch``) until all are in.
   Receive clocks include opening the client (the consumer claims its partitions then).
2. Service Bus -> Event Hubs: ``src`` loaded with the messages (untimed), each with one of
   ``--keys`` partition keys (0: none, round-robin), then
   - reference: ``EventHubProducerClient.send_batch`` of the same events to ``ref``, each
     key's events in batches of ``--batch`` (the best a hand-written forwarder's send does);
   - replicate: the task library's pump (``tasks.pump``: receive, stamp, per-key ordered
     batched send through ``SenderPool``'s Event Hubs sender, ``--send-backend``, complete)
     moves ``src`` to ``dst``;
   - host: ``--host-messages`` through the generated function of a pipeline with an
     ``eventhub:`` target, run by the local host's trigger runner (``python -m replication
     start``'s, host.json's concurrency; settlement over the extension's gRPC client).

Prints events/s (msgs/s), the ratios to the reference of each section, and the load average
with each figure (the machine is shared; a figure taken under load is not the code's).

Measured 2026-11-25, ``--messages 20000`` (defaults otherwise), 2 shared cores under load
2.5-4.7, four runs (one with ``--send-backend sdk``): send Event Hubs / Service Bus
1.97-2.94x (11,056-19,757 events/s vs 5,610-8,532 msgs/s); receive 0.91-1.87x from opening
(the consumer claims its partitions first), 1.10-2.70x first to last event; replicate /
reference 1.12-1.74x with the ``amqp`` send (5,170-9,279 events/s vs 2,973-7,075), 0.53x
with ``sdk`` (2,136 vs 4,017); the local host 0.29-0.35x in the three ``amqp`` runs
(875-2,362 events/s: settlement per message over gRPC, as in bench/replication.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import azure.eventhub
import azure.servicebus
from azure.eventhub import EventData
from azure.eventhub.aio import EventHubConsumerClient, EventHubProducerClient
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.local_host import host_seconds  # noqa: E402
from replication.messages import Message  # noqa: E402
from replication.tasks.pump import PumpStats, Source, pump  # noqa: E402
from replication.tasks.targets import SenderPool, Target  # noqa: E402
from replication.tasks.task import ReplicationTask  # noqa: E402

READY = re.compile(r"broker listening on \S+:(\d+)")
QUEUES = ("plain", "src", "hsrc")
HUBS = ("events", "ref", "dst", "hdst")
PREFETCH = 300
"""azure-eventhub's default prefetch; the Service Bus receiver gets the same."""
START_TIMEOUT = 60.0
STALL = 60.0
"""Seconds without progress after which a receive loop gives up (the broker lost some)."""


class BenchError(Exception):
    """The run could not measure (a broker that did not start, events that never came)."""


# ---------------------------------------------------------------------- the broker


class Broker:
    """``python -m replication broker`` on port 0 in its own process group; its output is
    drained by a thread (kept for the error message)."""

    def __init__(self, workdir: Path, partitions: int) -> None:
        config = {"UserConfig": {
            "Namespaces": [{"Name": "sbemulatorns", "Queues": [
                {"Name": name, "Properties": {}} for name in QUEUES
            ]}],
            "NamespaceConfig": [{"Type": "EventHub", "Name": "emulatorNs1", "Entities": [
                {"Name": name, "PartitionCount": str(partitions), "ConsumerGroups": []}
                for name in HUBS
            ]}],
            "Logging": {"Type": "Console"},
        }}  # fmt: skip
        (workdir / "Config.json").write_text(json.dumps(config))
        self.tail: deque[str] = deque(maxlen=40)
        self.port = 0
        self._ready = threading.Event()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "replication", "broker", "--config",
             str(workdir / "Config.json"), "--port", "0", "--data-dir", str(workdir / "data")],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1"),
        )  # fmt: skip
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT
        while not self._ready.wait(0.05):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise BenchError("the broker did not start:\n" + "\n".join(self.tail))

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.tail.append(line.rstrip("\n"))
            match = READY.search(line)
            if match and not self._ready.is_set():
                self.port = int(match.group(1))
                self._ready.set()

    @property
    def connection_string(self) -> str:
        return (
            f"Endpoint=sb://localhost:{self.port};SharedAccessKeyName=RootManageSharedAccessKey;"
            "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
        )

    def stop(self) -> None:
        """SIGTERM to the broker's process group, then SIGKILL if it lingers."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)


@contextlib.contextmanager
def broker(partitions: int) -> Iterator[Broker]:
    with tempfile.TemporaryDirectory(prefix="bench-eventhubs-") as tmp:
        started = Broker(Path(tmp), partitions)
        try:
            yield started
        finally:
            started.stop()


# ---------------------------------------------------------------------- helpers


def load_average() -> str:
    """The 1/5/15-minute load, as ``uptime`` prints it: the box is shared."""
    return "load " + ", ".join(f"{load:.2f}" for load in os.getloadavg())


def bodies(count: int, size: int) -> list[bytes]:
    body = os.urandom(size // 2 + 1).hex().encode()[:size]
    return [body] * count


def key_of(index: int, keys: int) -> str | None:
    return f"k{index % keys}" if keys else None


def chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class Progress:
    """A count that must reach ``target``; fails the run when it stalls for ``STALL`` s.
    Keeps when the first and the last item came (receives: open-to-last and steady rate)."""

    def __init__(self, target: int, what: str) -> None:
        self.target = target
        self.what = what
        self.count = 0
        self.done = asyncio.Event()
        self.started = self._moved = time.perf_counter()
        self.first: float | None = None
        self.last = self.started

    def add(self, n: int) -> None:
        if n:
            self.count += n
            self._moved = self.last = time.perf_counter()
            if self.first is None:
                self.first = self.last
            if self.count >= self.target:
                self.done.set()

    def check(self) -> None:
        if time.perf_counter() - self._moved > STALL:
            raise BenchError(f"{self.what}: {self.count} of {self.target} after a stall")

    async def wait(self) -> None:
        while not self.done.is_set():
            self.check()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), 1.0)

    def rates(self) -> tuple[float, float]:
        """(items/s from opening to the last item, items/s from the first to the last)."""
        assert self.first is not None
        steady = (self.count - 1) / max(self.last - self.first, 1e-9)
        return self.count / (self.last - self.started), steady


# ---------------------------------------------------------------------- 1. the two faces


async def eh_send(conn: str, hub: str, payloads: list[bytes], batch: int) -> float:
    async with EventHubProducerClient.from_connection_string(conn, eventhub_name=hub) as client:
        await client.send_batch([EventData(b"warm-up")])
        started = time.perf_counter()
        for chunk in chunks(payloads, batch):
            await client.send_batch([EventData(p) for p in chunk])
        return time.perf_counter() - started


async def sb_send(conn: str, queue: str, payloads: list[bytes], batch: int) -> float:
    async with (
        ServiceBusClient.from_connection_string(conn) as client,
        client.get_queue_sender(queue) as sender,
    ):
        await sender.send_messages([ServiceBusMessage(b"warm-up")])
        started = time.perf_counter()
        for chunk in chunks(payloads, batch):
            await sender.send_messages([ServiceBusMessage(p) for p in chunk])
        return time.perf_counter() - started


async def eh_receive(conn: str, hub: str, count: int, batch: int) -> tuple[float, float]:
    """Rates reading ``count`` events from every partition's start (see ``Progress.rates``)."""
    progress = Progress(count, f"Event Hubs receive from {hub}")

    async def on_batch(context: Any, events: list[EventData]) -> None:
        progress.add(len(events))

    client = EventHubConsumerClient.from_connection_string(
        conn, consumer_group="$Default", eventhub_name=hub, load_balancing_strategy="greedy",
        prefetch=PREFETCH,
    )  # fmt: skip
    job = asyncio.create_task(
        client.receive_batch(
            on_batch, max_batch_size=batch, max_wait_time=1.0, starting_position="-1"
        )
    )
    try:
        await progress.wait()
        return progress.rates()
    finally:
        await client.close()
        await asyncio.gather(job, return_exceptions=True)


async def sb_receive(conn: str, queue: str, count: int, batch: int) -> tuple[float, float]:
    progress = Progress(count, f"Service Bus receive from {queue}")
    async with (
        ServiceBusClient.from_connection_string(conn) as client,
        client.get_queue_receiver(
            queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, prefetch_count=PREFETCH
        ) as receiver,
    ):
        while progress.count < count:
            got = await receiver.receive_messages(max_message_count=batch, max_wait_time=1.0)
            progress.add(len(got))
            progress.check()
        return progress.rates()


async def faces(conn: str, args: argparse.Namespace) -> list[str]:
    payloads = bodies(args.messages, args.size)
    n = args.messages
    lines = []
    eh = n / await eh_send(conn, "events", payloads, args.batch)
    sb = n / await sb_send(conn, "plain", payloads, args.batch)
    lines.append(
        f"send    Event Hubs {eh:,.0f} events/s | Service Bus {sb:,.0f} msgs/s | "
        f"ratio EH/SB {eh / sb:.2f} ({load_average()})"
    )
    (eh, eh_steady), (sb, sb_steady) = (
        await eh_receive(conn, "events", n + 1, args.batch),  # + the warm-up
        await sb_receive(conn, "plain", n + 1, args.batch),
    )
    lines.append(
        f"receive Event Hubs {eh:,.0f} events/s | Service Bus {sb:,.0f} msgs/s "
        f"(receive-and-delete) | ratio EH/SB {eh / sb:.2f} ({load_average()})"
    )
    lines.append(
        f"receive, first to last item: Event Hubs {eh_steady:,.0f} events/s | Service Bus "
        f"{sb_steady:,.0f} msgs/s | ratio EH/SB {eh_steady / sb_steady:.2f}"
    )
    return lines


# ---------------------------------------------------------------------- 2. SB -> EH


async def load_source(conn: str, queue: str, payloads: list[bytes], keys: int, batch: int) -> None:
    """``queue`` filled with the messages (untimed), each with its partition key."""
    async with (
        ServiceBusClient.from_connection_string(conn) as client,
        client.get_queue_sender(queue) as sender,
    ):
        for start in range(0, len(payloads), batch):
            await sender.send_messages([
                ServiceBusMessage(payloads[i], message_id=f"m{i}", partition_key=key_of(i, keys),
                                  application_properties={"i": i})
                for i in range(start, min(start + batch, len(payloads)))
            ])  # fmt: skip


async def reference(conn: str, hub: str, payloads: list[bytes], keys: int, batch: int) -> float:
    """Seconds for azure-eventhub to send the same events, each key's in batches of
    ``batch`` (so the clock holds no event building the replicator would not do too)."""
    by_key: dict[str | None, list[int]] = {}
    for i in range(len(payloads)):
        by_key.setdefault(key_of(i, keys), []).append(i)
    async with EventHubProducerClient.from_connection_string(conn, eventhub_name=hub) as client:
        await client.send_batch([EventData(b"warm-up")])
        started = time.perf_counter()
        for key, indexes in by_key.items():
            for chunk in chunks(indexes, batch):
                events = []
                for i in chunk:
                    event = EventData(payloads[i])
                    event.message_id = f"m{i}"
                    event.properties = {"i": i}
                    events.append(event)
                await client.send_batch(events, partition_key=key)
        return time.perf_counter() - started


async def replicate(conn: str, count: int, batch: int, backend: str) -> float:
    """Seconds for the task pump to move ``count`` messages from queue src to hub dst."""
    stop = asyncio.Event()
    stats = PumpStats()
    pool = SenderPool({None: Target(conn, "dst", event_hub=True)}, backend=backend)  # type: ignore[arg-type]
    async with pool(None) as sender:  # the hub's link up before the clock, as for the reference
        await sender.send_messages([Message(b"warm-up")])
    client = ServiceBusClient.from_connection_string(conn)
    started = time.perf_counter()
    task = ReplicationTask("bench")
    job = asyncio.create_task(
        pump(task, client, Source("src"), pool, stop, max_batch=batch, stats=stats)
    )
    moved = time.monotonic()
    last = 0
    while stats.completed < count:
        if job.done():
            job.result()
        if stats.completed != last:
            last, moved = stats.completed, time.monotonic()
        elif time.monotonic() - moved > STALL:
            raise BenchError(f"replicate: {stats.completed} of {count} after a stall")
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - started
    stop.set()
    await job
    await pool.close()
    await client.close()
    if stats.abandoned or stats.dead_lettered:
        raise BenchError(f"replicate: {stats.abandoned} abandoned, {stats.dead_lettered} dlq")
    return elapsed


async def host(conn: str, count: int, batch: int) -> float:
    """Seconds for the local host's trigger runner to move ``count`` messages from queue hsrc
    to hub hdst through the generated function of an ``eventhub:`` target pipeline."""
    text = f"""\
pipelines:
  - name: bench-eventhubs-host
    source: {{connection: Bus, queue: hsrc}}
    target: {{connection: Hubs, eventhub: hdst}}
    batch_size: {batch}
"""
    return await host_seconds(text, {"Bus": conn, "Hubs": conn}, count, batch)


async def partitions_used(conn: str, hub: str) -> dict[str, int]:
    """Events per partition of ``hub`` (the last sequence number + 1): where keys went."""
    async with EventHubProducerClient.from_connection_string(conn, eventhub_name=hub) as client:
        found = {}
        for pid in await client.get_partition_ids():
            props = await client.get_partition_properties(pid)
            found[pid] = 0 if props["is_empty"] else props["last_enqueued_sequence_number"] + 1
        return found


async def replication(conn: str, args: argparse.Namespace) -> list[str]:
    n = args.messages
    payloads = bodies(n, args.size)
    await load_source(conn, "src", payloads, args.keys, args.batch)
    plain = n / await reference(conn, "ref", payloads, args.keys, args.batch)
    lines = [f"reference (azure-eventhub send_batch per key): {plain:,.0f} events/s "
             f"({load_average()})"]  # fmt: skip
    rate = n / await replicate(conn, n, args.batch, args.send_backend)
    spread = await partitions_used(conn, "dst")
    lines.append(
        f"replicate (task pump, {args.send_backend} send): {rate:,.0f} events/s | ratio "
        f"replicate/reference {rate / plain:.2f} ({load_average()}); dst partitions {spread}"
    )
    if args.host_messages:
        m = args.host_messages
        await load_source(conn, "hsrc", payloads[:m], args.keys, args.batch)
        host_rate = m / await host(conn, m, args.batch)
        lines.append(
            f"host (generated function, local host trigger runner, {m:,} messages): "
            f"{host_rate:,.0f} events/s | ratio host/reference {host_rate / plain:.2f} "
            f"({load_average()})"
        )
    return lines


# ---------------------------------------------------------------------- main


async def run(args: argparse.Namespace) -> None:
    print(
        f"azure-eventhub {azure.eventhub.__version__}, azure-servicebus "
        f"{azure.servicebus.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs; {args.messages:,} x {args.size} B, batches of {args.batch}, "
        f"{args.partitions} partitions, {args.keys} partition keys"
    )
    with broker(args.partitions) as started:
        conn = started.connection_string
        print(f"1. the broker's faces, same bodies and batches (pid {started.process.pid}):")
        for line in await faces(conn, args):
            print("  " + line)
        print("2. Service Bus -> Event Hubs:")
        for line in await replication(conn, args):
            print("  " + line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--keys", type=int, default=10,
                        help="partition keys of the replicated messages (0: none)")  # fmt: skip
    parser.add_argument("--send-backend", choices=("amqp", "sdk"), default="amqp",
                        help="the replicator's Event Hubs sender")  # fmt: skip
    parser.add_argument("--host-messages", type=int, default=2000,
                        help="messages through the local host (0: skip)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        asyncio.run(run(args))
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
