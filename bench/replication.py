"""Benchmark: the replication task code against a plain SDK send of the same messages.

    python bench/replication.py [--messages 20000] [--size 256] [--batch 100] [--workers 1]
                                [--backend amqp|sdk] [--send-backend amqp|sdk]
                                [--skip-host] [--profile-broker FILE] [--callgrind]

Starts the embedded broker as a subprocess (queues ``src``, ``dst``, ``plain``), loads
``--messages`` messages into ``src`` (untimed), then in the same run:

1. reference: the asyncio azure-servicebus SDK sends the same messages to ``plain`` in
   batches of ``--batch``, one batch after another (what a hand-written forwarder's send
   side costs at best);
2. replicate: the task library's pump moves ``src`` to ``dst``: receive (prefetch), steps
   (none), stamping, session-ordered batched send, then complete every source message. As for
   the reference, the target's link is opened (one warm-up message to ``dst``) before the
   clock starts; connecting and attaching the receiver are timed. The process's cycle
   collector is tuned (``gc_tuning``), as in every process of the app that moves messages
   (the broker, the local host, which runs transactional pipelines with this pump, its
   language workers, Spark's Python workers), and before the reference runs: both sides of
   the ratio run with the same collector, so the ratio compares code, not settings.
   ``--backend`` picks the pump's receive side: ``amqp`` (default, the faster: our own AMQP
   stack, ranged settlement) or ``sdk`` (the azure-servicebus receiver); ``--send-backend``
   its send side: ``amqp`` (default: ``servicebus.sender``) or ``sdk``.
2b. our sender alone: ``servicebus.sender.AmqpSender`` sends the same messages to ``plain``
   in batches of ``--batch`` (the replicator's send limit).

3. host: the same replication as a generated Azure Function run by the local host
   (``python -m replication start``'s trigger runner, with the repository's host.json:
   ``maxConcurrentCalls`` batches in flight): our AMQP receive, the binding data decoded by
   the SDK-type bindings extension, the function on the worker loop; a dead-letter or
   abandon would go through ``ServiceBusMessageActions`` (gRPC), the completes are the
   host's (auto-complete, ranged). The function runs in a worker process, as ``start``
   runs it (``--host-workers N``: ``FUNCTIONS_WORKER_PROCESS_COUNT``; ``--host-in-process``:
   on a worker thread of the host's process instead, for comparison).

``--telemetry-cost N`` runs only 2, N times with the app's instrumentation live (an
OpenTelemetry SDK provider exporting metrics every 5 s and every batch span, to exporters that
write nowhere; the lag aggregated per copy) alternated with N times without it (lag not
recorded, no spans; the counters' adds stay, a few per batch), and prints the median ratio.

``--callgrind`` runs only 2, in child processes under valgrind's callgrind (``valgrind``
must be installed): the replicator's instructions, which a busy machine does not change as
it changes seconds. Two children on a freshly loaded ``src``, one moving ``--messages``, one
a fifth of them; start-up, imports and connecting cost both the same, so the difference over
the difference in messages is the replicator's instructions per message (about 50 times
slower than a normal run: 10,000 messages take a few minutes). Measured (issue 42) with
``python bench/replication.py --callgrind --messages 10000``; ``--callgrind-out DIR`` keeps
the two profiles (``callgrind_annotate DIR/callgrind.10000`` shows where they went).

``--profile-broker FILE`` runs only 2, with the broker restarted under cProfile on the
loaded store, and prints the broker's top entries by own time (the profile behind the
broker's per-message work; cProfile slows it about twofold, so the rate it prints is not
the benchmark's).

Prints msgs/s for each and the ratios to the reference (target >= 0.5: replication also
receives and settles every message, so it does about twice the broker round trips).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import pstats
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import azure.servicebus
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.local_host import host_seconds  # noqa: E402
from replication import native  # noqa: E402
from replication.gc_tuning import collect_garbage_for_throughput  # noqa: E402
from replication.messages import Message  # noqa: E402
from replication.servicebus.client import AmqpSource  # noqa: E402
from replication.servicebus.sender import AmqpSender  # noqa: E402
from replication.tasks.pump import PumpStats, Source, pump  # noqa: E402
from replication.tasks.targets import SenderPool, Target  # noqa: E402
from replication.tasks.task import ReplicationTask  # noqa: E402
from tests.spark.cluster import cpu_seconds  # noqa: E402

READY = re.compile(r"broker listening on \S+:(\d+)")


def from_received_like(item: ServiceBusMessage) -> Message:
    """The same message as the task library holds it (what the replicator sends)."""
    return Message(
        body=b"".join(item.body),
        message_id=item.message_id,
        application_properties=dict(item.application_properties or {}),
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_broker(
    workdir: Path,
    port: int | None = None,
    profile: Path | None = None,
    max_size_mb: int | None = None,
) -> tuple[subprocess.Popen[str], str]:
    """The broker on ``workdir``'s store (``port``: the same one again after a restart),
    under cProfile writing to ``profile`` when given; ``max_size_mb``: the queues'
    ``MaxSizeInMegabytes`` (default 1,024, as Service Bus; premium allows up to 81,920)."""
    properties = {} if max_size_mb is None else {"MaxSizeInMegabytes": max_size_mb}
    config = {
        "UserConfig": {
            "Namespaces": [
                {
                    "Name": "sbemulatorns",
                    "Queues": [
                        {"Name": name, "Properties": properties}
                        for name in ("src", "dst", "plain", "hsrc", "hdst")
                    ],
                }
            ],
            "Logging": {"Type": "Console"},
        }
    }
    (workdir / "Config.json").write_text(json.dumps(config))
    port = port or free_port()
    profiler = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
    process = subprocess.Popen(
        [
            sys.executable,
            *profiler,
            "-m",
            "replication",
            "broker",
            "--config",
            str(workdir / "Config.json"),
            "--port",
            str(port),
            "--data-dir",
            str(workdir / "data"),
        ],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert process.stderr is not None
    for line in process.stderr:
        if READY.search(line):
            break
    else:
        raise RuntimeError("the broker did not start")
    connection_string = (
        f"Endpoint=sb://localhost:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
    )
    return process, connection_string


def messages(count: int, size: int) -> list[ServiceBusMessage]:
    body = os.urandom(size // 2).hex().encode()[:size]
    return [
        ServiceBusMessage(body, message_id=f"m{i}", application_properties={"i": i})
        for i in range(count)
    ]


async def send_all(
    connection_string: str, queue: str, items: list[ServiceBusMessage], batch: int
) -> float:
    """Seconds to send ``items`` in batches of ``batch``, one after another."""
    async with (
        ServiceBusClient.from_connection_string(connection_string) as client,
        client.get_queue_sender(queue) as sender,
    ):
        await sender.send_messages(items[:1])  # link up and authorised before the clock
        started = time.perf_counter()
        for start in range(1, len(items), batch):
            await sender.send_messages(items[start : start + batch])
        return time.perf_counter() - started


async def send_ours(connection_string: str, queue: str, items: list[Message], batch: int) -> float:
    """Seconds for ``AmqpSender`` to send ``items`` (after the first, which opens the link)."""
    async with AmqpSource.from_connection_string(connection_string) as namespace:
        sender = AmqpSender(namespace, queue)
        await sender.send_messages(items[0])
        started = time.perf_counter()
        for start in range(1, len(items), batch):
            await sender.send_messages(items[start : start + batch])
        elapsed = time.perf_counter() - started
        await sender.close()
        return elapsed


async def replicate(
    connection_string: str,
    count: int,
    batch: int,
    workers: int,
    backend: str,
    send_backend: str,
) -> float:
    """Seconds for the task pump to move ``count`` messages from src to dst."""
    stop = asyncio.Event()
    stats = PumpStats()
    pool = SenderPool({None: Target(connection_string, "dst")}, backend=send_backend)  # type: ignore[arg-type]
    clients = [ServiceBusClient.from_connection_string(connection_string) for _ in range(workers)]
    task = ReplicationTask("bench")
    async with pool(None) as sender:  # the target link up and authorised before the clock,
        await sender.send_messages([Message(b"warm-up")])  # as for the reference
    collect_garbage_for_throughput()  # as the app's processes that move messages run
    started = time.perf_counter()
    jobs = [
        asyncio.create_task(
            pump(task, c, Source("src"), pool, stop, max_batch=batch, stats=stats, backend=backend)
        )
        for c in clients
    ]
    while stats.completed < count:
        if any(job.done() for job in jobs):
            for job in jobs:
                if job.done():
                    job.result()
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - started
    stop.set()
    await asyncio.gather(*jobs)
    await pool.close()
    for client in clients:
        await client.close()
    if stats.abandoned or stats.dead_lettered:
        print(f"  ! {stats.abandoned} abandoned, {stats.dead_lettered} dead-lettered")
    return elapsed


async def replicate_as_asked(connection_string: str, args: argparse.Namespace) -> float:
    """``replicate`` with the command line's messages, batch, workers and backends."""
    return await replicate(
        connection_string,
        args.messages,
        args.batch,
        args.workers,
        args.backend,
        args.send_backend,
    )


async def host(
    connection_string: str, count: int, batch: int, workers: int = 1, in_process: bool = False
) -> float:
    """Seconds for the local host's trigger runner to move ``count`` messages hsrc -> hdst
    through the generated function (per-message settlement over gRPC) in ``workers`` worker
    processes (or, ``in_process``, on a worker thread of this process)."""
    text = f"""\
pipelines:
  - name: bench-host
    source: {{connection: Bus, queue: hsrc}}
    target: {{connection: Bus, queue: hdst}}
    batch_size: {batch}
"""
    return await host_seconds(
        text, {"Bus": connection_string}, count, batch, workers=workers, in_process=in_process
    )


async def profile_broker(args: argparse.Namespace) -> None:
    """``--profile-broker``: src loaded, the broker restarted under cProfile on the same
    store, then only the replication timed; prints the broker's top entries by own time."""
    with tempfile.TemporaryDirectory(prefix="bench-replication-") as tmp:
        workdir = Path(tmp)
        process, connection_string = start_broker(workdir)
        port = int(connection_string.split("localhost:")[1].split(";")[0])
        try:
            await send_all(connection_string, "src", messages(args.messages, args.size), args.batch)
        finally:
            process.terminate()
            process.wait(20)
        process, connection_string = start_broker(workdir, port, args.profile_broker)
        try:
            elapsed = await replicate_as_asked(connection_string, args)
        finally:
            process.terminate()  # the broker stops cleanly, so cProfile writes its file
            process.wait(20)
    print(f"replicate under the profiled broker: {args.messages / elapsed:,.0f} msgs/s")
    pstats.Stats(str(args.profile_broker)).sort_stats("tottime").print_stats(25)


def replicate_child(connection_string: str, args: argparse.Namespace) -> None:
    """``--callgrind``'s child: the replication alone, in a process of its own."""
    asyncio.run(replicate_as_asked(connection_string, args))


async def callgrind(args: argparse.Namespace) -> None:
    """``--callgrind``: the replicator's instructions per message (see the module)."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--callgrind needs valgrind (apt-get install valgrind)")
    counts = [args.messages // 5, args.messages]
    totals = []
    with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as tmp:
        for count in counts:
            workdir = Path(tmp) / str(count)
            workdir.mkdir()
            process, connection_string = start_broker(workdir)
            try:
                await send_all(connection_string, "src", messages(count, args.size), args.batch)
                out = (args.callgrind_out or Path(tmp)) / f"callgrind.{count}"
                child = [
                    "valgrind",
                    "--tool=callgrind",
                    f"--callgrind-out-file={out}",
                    sys.executable,
                    __file__,
                    "--replicate-child",
                    connection_string,
                    "--messages",
                    str(count),
                    "--batch",
                    str(args.batch),
                    "--backend",
                    args.backend,
                    "--send-backend",
                    args.send_backend,
                ]
                env = dict(os.environ, PYTHONHASHSEED="0")
                subprocess.run(child, check=True, env=env, stderr=subprocess.DEVNULL)
            finally:
                process.terminate()
                process.wait(20)
            summary = re.search(r"^summary: (\d+)", out.read_text(), re.MULTILINE)
            assert summary is not None, f"no summary in {out}"
            totals.append(int(summary.group(1)))
            print(f"  {count:,} messages: {totals[-1]:,} instructions", flush=True)
    per_message = (totals[1] - totals[0]) / (counts[1] - counts[0])
    print(
        f"{args.messages:,} x {args.size} B, {native.STATE}; replicator instructions per "
        f"message (callgrind, {args.backend} receive, {args.send_backend} send): "
        f"{per_message:,.0f}"
    )


def instrumentation(live: bool) -> None:
    """The app's telemetry on (an SDK provider, spans, lag) or off (no lag, no spans)."""
    from replication.tasks import task as task_module
    from replication.tasks.lag import record_lag
    from replication.telemetry import tracing

    task_module.record_lag = record_lag if live else (lambda *args, **kwargs: None)  # type: ignore[assignment]
    tracing.enabled = live


def live_providers() -> None:
    """What ``telemetry.export.configure`` sets up, with exporters that write to /dev/null."""
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    from replication import metrics
    from replication.telemetry.producer import WithLag

    sink = Path(os.devnull).open("w")  # noqa: SIM115 - for the whole run
    exporter = WithLag(ConsoleMetricExporter(out=sink), metrics.LAG, metrics.LAG_HISTOGRAM, "lag")
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=5_000)
    otel_metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=sink)))
    trace.set_tracer_provider(tracer_provider)


async def telemetry_cost(args: argparse.Namespace) -> None:
    live_providers()
    with tempfile.TemporaryDirectory(prefix="bench-telemetry-") as tmp:
        process, connection_string = start_broker(Path(tmp))
        try:
            items = messages(args.messages, args.size)
            rates: dict[bool, list[float]] = {False: [], True: []}
            cpu: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(args.telemetry_cost):
                for live in (False, True):
                    instrumentation(live)
                    await send_all(connection_string, "src", items, args.batch)  # untimed
                    before = time.process_time()
                    elapsed = await replicate_as_asked(connection_string, args)
                    cpu[live].append((time.process_time() - before) * 1e6 / args.messages)
                    rates[live].append(args.messages / elapsed)
                    label = "with" if live else "without"
                    print(
                        f"  {label} telemetry: {rates[live][-1]:,.0f} msgs/s, replicator "
                        f"{cpu[live][-1]:.1f} us CPU/msg",
                        flush=True,
                    )
        finally:
            process.terminate()
            process.wait(20)
    ratios = sorted(w / wo for w, wo in zip(rates[True], rates[False], strict=True))
    median = ratios[len(ratios) // 2]
    costs = sorted(w / wo for w, wo in zip(cpu[True], cpu[False], strict=True))
    cpu_median = costs[len(costs) // 2]
    print(
        f"{args.messages:,} x {args.size} B, {native.STATE}; replicate with / without "
        f"telemetry: median {median:.3f} (pairs {', '.join(f'{r:.3f}' for r in ratios)}); "
        f"replicator CPU per message with / without: median {cpu_median:.3f} "
        f"(pairs {', '.join(f'{c:.3f}' for c in costs)})"
    )


async def run(args: argparse.Namespace) -> None:
    if args.callgrind:
        await callgrind(args)
        return
    if args.profile_broker is not None:
        await profile_broker(args)
        return
    if args.telemetry_cost:
        await telemetry_cost(args)
        return
    with tempfile.TemporaryDirectory(prefix="bench-replication-") as tmp:
        process, connection_string = start_broker(Path(tmp))
        try:
            items = messages(args.messages, args.size)
            await send_all(connection_string, "src", items, args.batch)  # load, untimed
            collect_garbage_for_throughput()  # for the reference too (see the module)
            reference = await send_all(connection_string, "plain", items, args.batch)
            ours = [from_received_like(item) for item in items]
            sender_alone = await send_ours(connection_string, "plain", ours, args.batch)
            cpu_before = cpu_seconds([process.pid]), time.process_time()
            elapsed = await replicate_as_asked(connection_string, args)
            broker_cpu = cpu_seconds([process.pid]) - cpu_before[0]
            replicator_cpu = time.process_time() - cpu_before[1]
            host_elapsed = None
            if not args.skip_host:
                await send_all(connection_string, "hsrc", items, args.batch)  # load, untimed
                host_elapsed = await host(
                    connection_string,
                    args.messages,
                    args.batch,
                    args.host_workers,
                    args.host_in_process,
                )
        finally:
            process.terminate()
            process.wait(20)
    plain_rate = (args.messages - 1) / reference
    rate = args.messages / elapsed
    print(
        f"azure-servicebus {azure.servicebus.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs; {args.messages:,} x {args.size} B; {native.STATE}"
    )
    print(f"reference (SDK batch send, batches of {args.batch}): {plain_rate:,.0f} msgs/s")
    sender_rate = (args.messages - 1) / sender_alone
    print(
        f"our sender alone (servicebus.sender, batches of {args.batch}): {sender_rate:,.0f} "
        f"msgs/s; ratio to the reference: {sender_rate / plain_rate:.2f}"
    )
    print(
        f"replicate (task pump, {args.backend} receive, {args.send_backend} send: receive, "
        f"stamp, ordered batch send, complete; {args.workers} worker(s)): {rate:,.0f} msgs/s"
    )
    print(
        f"ratio replicate / reference: {rate / plain_rate:.2f} (goal >= 2.0); "
        f"replicate / our sender alone: {rate / sender_rate:.2f}"
    )
    print(
        f"  CPU while replicating: broker {broker_cpu / elapsed:.0%} of a core "
        f"({broker_cpu * 1e6 / args.messages:.0f} us/msg), replicator "
        f"{replicator_cpu / elapsed:.0%} ({replicator_cpu * 1e6 / args.messages:.0f} us/msg)"
    )
    if host_elapsed is None:
        return
    host_rate = args.messages / host_elapsed
    where = (
        "on a worker thread of the host's process"
        if args.host_in_process
        else f"{args.host_workers} worker process(es)"
    )
    print(
        f"host (generated function in the local host, {where}, host.json's concurrency, "
        f"completes by the host):"
        f" {host_rate:,.0f} msgs/s; ratio host / reference: {host_rate / plain_rate:.2f}"
    )


def sample_worker_count() -> int:
    """The app's own FUNCTIONS_WORKER_PROCESS_COUNT, as ``start`` reads it from the sample."""
    values = json.loads((ROOT / "local.settings.sample.json").read_text())["Values"]
    return int(values.get("FUNCTIONS_WORKER_PROCESS_COUNT", "1"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--workers", type=int, default=1, help="pumps (receivers) on src")
    parser.add_argument("--skip-host", action="store_true", help="leave out 3 (the host)")
    parser.add_argument(
        "--host-workers",
        type=int,
        default=sample_worker_count(),
        help="3's FUNCTIONS_WORKER_PROCESS_COUNT (default: local.settings.sample.json's, "
        "%(default)s; the Functions host's own default is 1)",
    )
    parser.add_argument(
        "--host-in-process",
        action="store_true",
        help="3 with the function on a worker thread of the host's process",
    )
    parser.add_argument(
        "--backend",
        choices=("amqp", "sdk"),
        default="amqp",
        help="the pump's receive side: our AMQP stack (default, faster) or the SDK",
    )
    parser.add_argument(
        "--send-backend",
        choices=("amqp", "sdk"),
        default="amqp",
        help="the pump's send side: our AMQP stack (default) or the SDK",
    )
    parser.add_argument(
        "--telemetry-cost",
        type=int,
        default=0,
        metavar="N",
        help="only the replication, N times with the instrumentation and N without",
    )
    parser.add_argument(
        "--profile-broker",
        type=Path,
        metavar="FILE",
        help="only the replication, with the broker under cProfile (stats written to FILE); "
        "prints its top entries",
    )
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="only the replication, under callgrind: the replicator's instructions per message",
    )
    parser.add_argument(
        "--callgrind-out",
        type=Path,
        metavar="DIR",
        help="with --callgrind: keep the two profiles in DIR (callgrind.N, for callgrind_annotate)",
    )
    parser.add_argument("--replicate-child", metavar="CONNECTION_STRING", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.replicate_child:
        replicate_child(args.replicate_child, args)
        return
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
