"""Benchmark: a pipeline on Spark against the local host's task pump, and Spark's scaling.

    python bench/spark.py [--messages 1200000] [--size 1024] [--per-trigger N] [--pairs 3]
                          [--size-messages 40000] [--size-per-trigger 20000]
                          [--heavy-messages 30000] [--heavy-per-trigger 10000]
                          [--no-cluster] [--skip-sizes] [--skip-heavy]

Each run gets a fresh embedded broker (a subprocess, queues ``src`` -> ``dst``, loaded
untimed: the first of a size through the SDK, the next ones on a copy of its store) and one
of two pipelines: ``copy`` (replicate as it is) and ``heavy`` (the same with
a transform step that costs about 1 ms of CPU per message, ``bench/steps/spark_heavy.py``, so the
executors and not the broker bound the throughput):

1. local host: the task pump (the trigger loop the local host runs) replicates src -> dst
   with ``copy``; and two pumps, each in a process of its own taking half (what a second
   Python process gives on this machine, its broker on the same cores, without Spark);
2. Spark ``local[1]`` and ``local[2]``: ``python -m replication spark --available-now`` as a
   subprocess (the driver plans assignments, each task receives, runs the pipeline, sends
   and settles on its own link), ``copy`` and ``heavy``. The pump, the two pumps and
   ``local[2]`` with ``copy`` run ``--pairs`` times, in turn (every other time in reverse
   order): on a shared machine one configuration's rate drifts by up to a fifth from one
   run to the next, so the ratios reported are medians, with each pair's;
3. a standalone cluster (``tests/spark/cluster.py``: a master and two 1-core workers as
   separate processes, the wheel built from this checkout, ``spark-submit ...
   spark_submit.py``): one worker (``spark.cores.max=1``) and two workers, ``copy`` and
   ``heavy``;
4. on the two-worker cluster, ``--size-messages`` messages of 1 KiB and of 64 KiB
   (``--size-per-trigger`` per micro-batch): the driver's CPU per 10,000 messages.

``--per-trigger`` is the runner's ``--max-messages-per-trigger`` (default: the runner's,
200,000 per task slot, and its 30 s bound; ``--messages`` is three such micro-batches on
``local[2]``). Spark's figures are steady state: from the end of the first
micro-batch to the end of the last (the batch lines the runner logs), so the JVM start, the
Python workers' start and the first batch are the start-up, reported apart (process start
-> end of the first batch). CPU seconds come from /proc (user + system) over the same
window: the broker's process, the driver's (spark-submit's JVM and its Python processes:
the driver, the planner) and the executors' (the Python workers, and on the cluster the
executor JVMs; in local mode the executors' JVM side is the driver's JVM, counted there).
The broker is one Python process with one event loop: near 1.0 core busy it is the
bottleneck; so is the machine when all processes together keep its cores busy (the "busy"
column, and the CPU pressure line: how much of the run some runnable process waited for a
CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from replication import __version__, native  # noqa: E402
from replication.gc_tuning import collect_garbage_for_throughput  # noqa: E402
from tests.spark.cluster import (  # noqa: E402
    Process,
    StandaloneCluster,
    build_wheel,
    cmdline,
    cpu_seconds,
    process_tree,
    spark_env,
    submit,
)

PIPELINES = """\
pipelines:
  - name: copy
    source: {connection: Bus, queue: src}
    target: {connection: Bus, queue: dst}
  - name: heavy
    description: copy, with about 1 ms of CPU per message (bench/steps/spark_heavy.py)
    source: {connection: Bus, queue: src}
    steps:
      - transform: {callable: "spark_heavy:pseudonymise", callable_takes: message}
    target: {connection: Bus, queue: dst}
"""
HEAVY_STEP = ROOT / "bench" / "steps" / "spark_heavy.py"
"""In a folder of its own: on PYTHONPATH it must not shadow anything (bench/replication.py
would shadow the package)."""
BATCH_LINE = re.compile(
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO replication\.spark: [\w-]+-0: batch "
    r"(\d+), (\d+) messages in"
)
TEMPLATES: Path | None = None
"""Where ``Broker`` keeps its loaded stores (``main`` points it into its work folder); None:
every broker is loaded through the SDK."""
BIG_TASK = "contains a task of very large size"
PYTHON_WORKER = "pyspark.daemon"
"""In a process's command line: pyspark's worker daemon or a Python worker it forked."""
SAMPLE_EVERY = 0.25


def _bench_replication() -> Any:
    """bench/replication.py (its broker, loading and pump run), loaded under another name:
    ``replication`` is the package."""
    spec = importlib.util.spec_from_file_location("bench_replication",
                                                  ROOT / "bench" / "replication.py")  # fmt: skip
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCH = _bench_replication()


class CpuClock:
    """CPU seconds of a changing set of processes: the last value seen of each pid, so the
    ones that ended still count."""

    def __init__(self) -> None:
        self.last: dict[int, float] = {}

    def sample(self, pids: list[int]) -> float:
        for pid in pids:
            self.last[pid] = max(cpu_seconds([pid]), self.last.get(pid, 0.0))
        return sum(self.last.values())


@dataclass
class Run:
    name: str
    messages: int
    started: float = 0.0
    batches: list[tuple[float, int, int]] = field(default_factory=list)
    """(time, batch id, messages) per logged micro-batch with messages."""
    samples: list[tuple[float, float, float, float]] = field(default_factory=list)
    """(time, driver CPU, executors CPU, broker CPU)."""
    big_task: bool = False

    def at(self, when: float, column: int) -> float:
        """CPU of ``column`` (1 driver, 2 executors, 3 broker) at ``when``, interpolated."""
        before = [s for s in self.samples if s[0] <= when]
        after = [s for s in self.samples if s[0] >= when]
        if not before:
            return after[0][column]
        if not after:
            return before[-1][column]
        a, b = before[-1], after[0]
        if b[0] == a[0]:
            return a[column]
        return a[column] + (b[column] - a[column]) * (when - a[0]) / (b[0] - a[0])

    @property
    def startup(self) -> float:
        return self.batches[0][0] - self.started

    @property
    def window(self) -> tuple[float, float, int]:
        """Start, end and messages of the steady state (after the first batch)."""
        steady = self.batches[1:]
        if not steady:
            raise RuntimeError(f"{self.name}: one micro-batch only, no steady state")
        return self.batches[0][0], steady[-1][0], sum(m for _, _, m in steady)

    @property
    def rate(self) -> float:
        start, end, messages = self.window
        return messages / (end - start)

    def cpu(self, column: int) -> float:
        """CPU seconds of ``column`` in the steady window."""
        start, end, _ = self.window
        return self.at(end, column) - self.at(start, column)

    def per_batch(self, column: int) -> float:
        return self.cpu(column) / (len(self.batches) - 1)

    def per_10k(self, column: int) -> float:
        return self.cpu(column) * 10_000 / self.window[2]

    def cores(self, column: int) -> float:
        start, end, _ = self.window
        return self.cpu(column) / (end - start)


def cpu_pressure() -> float:
    """Microseconds in which some runnable task waited for a CPU (/proc/pressure/cpu)."""
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return 0.0
    return float(some.rsplit("total=", 1)[1])


def _epoch(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def watch(run: Run, process: Process, broker: int, executors: list[int]) -> Run:
    """Samples CPU and reads the batch lines until ``process`` ends."""
    clocks = (CpuClock(), CpuClock(), CpuClock())
    python_worker: dict[int, bool] = {}
    run.started = time.time()
    log = process.log.open("rb")
    pending = b""
    while True:
        ended = process.popen.poll() is not None
        now = time.time()
        tree = process_tree(process.pid)
        worker_pids = [p for root in executors for p in process_tree(root)]
        for pid in tree:  # local mode; a worker stays one (an ending one has no cmdline)
            python_worker[pid] = python_worker.get(pid, False) or PYTHON_WORKER in cmdline(pid)
        worker_pids += [p for p in tree if python_worker[p]]
        workers = set(worker_pids)
        driver_pids = [p for p in tree if p not in workers]
        run.samples.append((now, clocks[0].sample(driver_pids), clocks[1].sample(worker_pids),
                            clocks[2].sample([broker])))  # fmt: skip
        pending += log.read()
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace")
            found = BATCH_LINE.search(line)  # Spark's console progress bar may come first
            if found and int(found.group(3)):
                run.batches.append((_epoch(found.group(1)), int(found.group(2)),
                                    int(found.group(3))))  # fmt: skip
            run.big_task = run.big_task or BIG_TASK in line
        if ended:
            break
        time.sleep(SAMPLE_EVERY)
    log.close()
    if process.popen.returncode != 0:
        raise RuntimeError(f"{run.name} failed:\n{process.output()[-4000:]}")
    received = sum(m for _, _, m in run.batches)
    if received != run.messages:
        print(f"  ! {run.name}: the batch lines count {received} of {run.messages} messages")
    print(f"  (done) {row(run.name, run)}", flush=True)  # kept if a later run fails
    return run


class Broker:
    """A fresh embedded broker (a subprocess) with ``count`` messages of ``size`` in src: the
    first one of a ``count`` and ``size`` is loaded through the SDK and its stopped store kept
    as a template (``TEMPLATES``); the next ones start on a copy of it (sending a million
    messages takes minutes, copying their store seconds)."""

    def __init__(self, folder: Path, count: int, size: int) -> None:
        folder.mkdir(parents=True)
        self.folder = folder
        template = None if TEMPLATES is None else TEMPLATES / f"{count}x{size}"
        if template is not None and template.is_dir():
            shutil.copytree(template, folder / "data")
            self.start()
        else:
            self.start()
            per = max(1, min(100, 200_000 // max(size, 1)))
            messages = BENCH.messages(count, size)
            asyncio.run(BENCH.send_all(self.connection_string, "src", messages, per))
            if template is not None:
                self.stop()  # a clean shutdown: the store is whole, the copy is too
                shutil.copytree(folder / "data", template)
                self.start()
        app = folder / "app"
        app.mkdir()
        (app / "pipelines.yaml").write_text(PIPELINES)
        (app / "local.settings.json").write_text(
            json.dumps({"Values": {"Bus": self.connection_string}})
        )
        self.app = app

    def start(self) -> None:
        # 40,000 x 64 KiB is past Service Bus's default 1 GB queue: a premium-sized queue
        self.process, self.connection_string = BENCH.start_broker(self.folder, max_size_mb=8192)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(20)

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder / "data")  # a million messages is a gigabyte; the logs stay

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pump_run(work: Path, count: int, size: int) -> tuple[float, float]:
    """Messages/s of the local host's task pump, and the broker's cores busy meanwhile."""
    with Broker(work / "broker-pump", count, size) as broker:
        before = cpu_seconds([broker.pid])
        elapsed = pump_seconds(broker.connection_string, count)
        print(f"  (done) local host (task pump): {count / elapsed:,.0f} msgs/s", flush=True)
        return count / elapsed, (cpu_seconds([broker.pid]) - before) / elapsed


def pump_seconds(connection_string: str, count: int) -> float:
    """Seconds for the task pump (batches of 100, our AMQP stack) to move ``count``, with the
    cycle collector tuned as the local host (and Spark's workers) tune theirs."""
    collect_garbage_for_throughput()
    return float(asyncio.run(BENCH.replicate(connection_string, count, 100, 1, "amqp", "amqp")))


PUMP_CHILD = "--pump-child"
SHARE_SLACK = 1_000
"""Messages each of several pumps leaves of its share: one that takes its last batch past
its share (a prefetch) must not leave the other short of its own."""


def pumps_run(work: Path, count: int, size: int, processes: int = 2) -> float:
    """Messages/s of ``processes`` task pumps, each in a process of its own, on one src: what
    more Python processes give on this machine without Spark (from the first one's start to
    the last one's end)."""
    with Broker(work / "broker-pumps", count, size) as broker:
        share = count // processes - SHARE_SLACK
        command = [sys.executable, __file__, PUMP_CHILD, broker.connection_string, str(share)]
        children = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True) for _ in range(processes)]  # fmt: skip
        try:
            for child in children:  # imported and ready: started together
                assert child.stdout is not None
                if child.stdout.readline().strip() != "ready":
                    raise RuntimeError("a pump process did not start (its error is above)")
            for child in children:
                assert child.stdin is not None
                child.stdin.write("go\n")
                child.stdin.flush()
            outputs = [child.communicate()[0] for child in children]
        finally:
            for child in children:  # none left waiting for "go" on a closed broker
                child.kill()
        if any(child.returncode for child in children):
            raise RuntimeError("a pump process failed (its error is above)")
        spans = [[float(x) for x in output.split()] for output in outputs]
        rate = share * processes / (max(end for _, end in spans) - min(s for s, _ in spans))
        print(f"  (done) {processes} pump processes: {rate:,.0f} msgs/s", flush=True)
        return rate


def pump_child(connection_string: str, share: int) -> None:
    """One of ``pumps_run``'s processes: prints its start and end (``perf_counter`` is the
    system's monotonic clock here, one for all processes)."""
    print("ready", flush=True)
    sys.stdin.readline()
    elapsed = pump_seconds(connection_string, share)
    end = time.perf_counter()
    print(end - elapsed, end, flush=True)


def trigger_args(per_trigger: int | None) -> list[str]:
    return [] if per_trigger is None else ["--max-messages-per-trigger", str(per_trigger)]


def local_run(
    work: Path, master: str, count: int, size: int, per_trigger: int | None,
    pipeline: str = "copy",
) -> Run:  # fmt: skip
    with Broker(work / f"broker-{pipeline}-{master}", count, size) as broker:
        command = [sys.executable, "-m", "replication", "spark", "--pipeline", pipeline, "--dir",
                   str(broker.app), "--master", master, "--available-now", "--no-brokers",
                   *trigger_args(per_trigger)]  # fmt: skip
        path = os.pathsep.join([str(ROOT), str(HEAVY_STEP.parent)])  # replication/ first
        env = spark_env(broker.folder / "spark", PYTHONPATH=path)
        process = Process(command, broker.folder / "driver.log", env, broker.app)
        try:
            return watch(Run(f"spark {master}", count), process, broker.pid, [])
        finally:
            process.kill()


def cluster_run(
    work: Path, cluster: StandaloneCluster, wheel: Path, name: str, count: int, size: int,
    per_trigger: int | None, conf: dict[str, str] | None = None, pipeline: str = "copy",
) -> Run:  # fmt: skip
    with Broker(work / f"broker-{name}", count, size) as broker:
        process = submit(cluster.url, wheel, broker.app, broker.folder / "driver.log",
                         "--available-now", *trigger_args(per_trigger), conf=conf,
                         pipeline=pipeline, py_files=[HEAVY_STEP],
                         env={"PYTHONPATH": str(HEAVY_STEP.parent)})  # fmt: skip
        try:
            workers = [w.pid for w in cluster.workers]
            return watch(Run(name, count), process, broker.pid, workers)
        finally:
            process.kill()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [PUMP_CHILD]:
        pump_child(argv[1], int(argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--per-trigger", type=int, default=None,
                        help="messages per micro-batch (default: the runner's)")  # fmt: skip
    parser.add_argument("--size-messages", type=int, default=40_000,
                        help="messages of the 1 KiB / 64 KiB driver CPU runs")  # fmt: skip
    parser.add_argument("--size-per-trigger", type=int, default=20_000)
    parser.add_argument("--heavy-messages", type=int, default=30_000,
                        help="messages of the heavy pipeline's scaling runs")  # fmt: skip
    parser.add_argument("--heavy-per-trigger", type=int, default=10_000)
    parser.add_argument("--pairs", type=int, default=3,
                        help="pump, two pumps and local[2] runs in turn (medians)")  # fmt: skip
    parser.add_argument("--no-cluster", action="store_true", help="local runs only")
    parser.add_argument("--skip-sizes", action="store_true", help="no 1 KiB / 64 KiB runs")
    parser.add_argument("--skip-heavy", action="store_true", help="no heavy pipeline runs")
    args = parser.parse_args(argv)
    runs: dict[str, Run] = {}
    started, pressure = time.time(), cpu_pressure()
    heavy = (args.heavy_messages, args.size, args.heavy_per_trigger)
    global TEMPLATES
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        work = Path(tmp)
        TEMPLATES = work / "templates"
        pairs = [pair(work / f"pair-{i}", i, args) for i in range(max(1, args.pairs))]
        for i, done in enumerate(pairs):
            runs[f"local[2] #{i + 1}"] = done.spark
        runs["local[1]"] = local_run(work, "local[1]", args.messages, args.size, args.per_trigger)
        if not args.skip_heavy:
            for master in ("local[1]", "local[2]"):
                runs[f"heavy {master}"] = local_run(work, master, *heavy, pipeline="heavy")
        if not args.no_cluster:
            wheel = build_wheel(work / "wheel")
            with StandaloneCluster(work / "cluster", workers=2, cores=1) as cluster:
                one = {"spark.cores.max": "1"}
                runs["1 worker"] = cluster_run(work, cluster, wheel, "1-worker", args.messages,
                                               args.size, args.per_trigger, one)  # fmt: skip
                runs["2 workers"] = cluster_run(
                    work, cluster, wheel, "2-workers", args.messages, args.size, args.per_trigger
                )
                if not args.skip_heavy:
                    runs["heavy 1 worker"] = cluster_run(work, cluster, wheel, "heavy-1-worker",
                                                         *heavy, one, "heavy")  # fmt: skip
                    runs["heavy 2 workers"] = cluster_run(work, cluster, wheel, "heavy-2-workers",
                                                          *heavy, None, "heavy")  # fmt: skip
                for size in () if args.skip_sizes else (1024, 64 * 1024):
                    runs[f"{size // 1024} KiB"] = cluster_run(
                        work, cluster, wheel, f"size-{size}", args.size_messages, size,
                        args.size_per_trigger,
                    )  # fmt: skip
    waited = (cpu_pressure() - pressure) / 1e6 / (time.time() - started)
    report(args, pairs, runs, waited)


@dataclass
class Pair:
    """The pump, two pump processes and ``local[2]``, one after another."""

    pump: float
    """msgs/s"""
    pump_broker: float
    """The broker's cores busy during the pump run."""
    pumps: float
    """msgs/s of two pump processes."""
    spark: Run


def pair(work: Path, index: int, args: argparse.Namespace) -> Pair:
    """The pump, two pump processes and ``local[2]`` copy runs; odd pairs in reverse order."""
    count, size = args.messages, args.size
    runs: list[Callable[[], Any]] = [
        lambda: pump_run(work, count, size),
        lambda: pumps_run(work, count, size),
        lambda: local_run(work, "local[2]", count, size, args.per_trigger),
    ]
    order = [2, 1, 0] if index % 2 else [0, 1, 2]
    done = {i: runs[i]() for i in order}
    rate, broker = done[0]
    return Pair(rate, broker, done[1], done[2])


def row(name: str, run: Run) -> str:
    busy = sum(run.cores(column) for column in (1, 2, 3))
    warning = "  task-size warning!" if run.big_task else ""
    return (f"{name:<16} {run.startup:9.1f} {run.rate:9,.0f} {len(run.batches):8d} "
            f"{run.cores(3):7.2f} {busy:6.2f} {run.per_10k(1):10.2f} {run.per_batch(1):12.2f} "
            f"{run.per_10k(2):10.2f}{warning}")  # fmt: skip


def report(args: argparse.Namespace, pairs: list[Pair], runs: dict[str, Run],
           waited: float) -> None:  # fmt: skip
    print(
        f"replication {__version__}, Python {platform.python_version()}, {os.cpu_count()} "
        f"CPUs; {args.messages:,} x {args.size} B, copy pipeline, "
        f"{args.per_trigger or 'the runner default of messages'} per trigger; heavy: "
        f"{args.heavy_messages:,}, {args.heavy_per_trigger:,} per trigger; {native.STATE}"
    )
    pumps = ", ".join(f"{p.pump:,.0f}" for p in pairs)
    brokers = ", ".join(f"{p.pump_broker:.2f}" for p in pairs)
    print(f"local host (task pump): {pumps} msgs/s, broker {brokers} cores")
    print(f"two pump processes: {', '.join(f'{p.pumps:,.0f}' for p in pairs)} msgs/s")
    print(f"{'run':<16} {'start-up':>9} {'steady':>9} {'batches':>8} {'broker':>7} {'busy':>6} "
          f"{'driver':>10} {'driver':>12} {'executors':>10}")  # fmt: skip
    print(f"{'':<16} {'s':>9} {'msgs/s':>9} {'':>8} {'cores':>7} {'cores':>6} "
          f"{'CPU s/10k':>10} {'CPU s/batch':>12} {'CPU s/10k':>10}")  # fmt: skip
    for name, run in runs.items():
        print(row(name, run))
    for label, ratios in (
        ("spark local[2] / local host (steady)", [p.spark.rate / p.pump for p in pairs]),
        ("two pump processes / local host", [p.pumps / p.pump for p in pairs]),
        ("spark local[2] / two pump processes", [p.spark.rate / p.pumps for p in pairs]),
    ):
        print(f"ratio {label}, median of {len(ratios)}: {median(ratios):.2f} "
              f"(each: {', '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip
    local2 = median([p.spark.rate for p in pairs])
    print(f"scaling copy, local[1] -> local[2] (median): {local2 / runs['local[1]'].rate:.2f}")
    for label, one, two in (
        ("heavy, local[1] -> local[2]", "heavy local[1]", "heavy local[2]"),
        ("copy, 1 worker -> 2 workers", "1 worker", "2 workers"),
        ("heavy, 1 worker -> 2 workers", "heavy 1 worker", "heavy 2 workers"),
    ):
        if one in runs and two in runs:
            print(f"scaling {label}: {runs[two].rate / runs[one].rate:.2f}")
    if "1 KiB" in runs:
        small, large = runs["1 KiB"], runs["64 KiB"]
        print(f"driver CPU s per 10,000 messages ({args.size_messages:,} per run, "
              f"{args.size_per_trigger:,} per trigger): 1 KiB {small.per_10k(1):.2f}, 64 KiB "
              f"{large.per_10k(1):.2f} (executors: {small.per_10k(2):.2f}, "
              f"{large.per_10k(2):.2f})")  # fmt: skip
    print(f"CPU pressure: some runnable process waited for a CPU {waited:.0%} of the run "
          "(this run's processes and any other load on the machine)")  # fmt: skip
    if any(run.big_task for run in runs.values()):
        print("Spark warned of a task of very large size")
    else:
        print("no task-size warning in any run's log")


if __name__ == "__main__":
    main()
