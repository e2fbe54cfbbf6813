"""Benchmark: a pipeline on Spark against the local host's task pump, and Spark's scaling.

    python bench/spark.py [--messages 20000] [--size 256] [--per-trigger 5000]

Starts the embedded broker as a subprocess, then on the same ``--messages`` messages:

1. local host: the task pump (the trigger loop the local host runs) replicates src -> dst;
2. Spark ``local[1]`` and ``local[2]``: ``python -m replication spark``'s job
   (``SparkPipeline.stream`` with AvailableNow: the driver plans assignments, each task
   receives, runs the pipeline, sends and settles on its own link) on the same copy
   pipeline, each in a fresh session; the clock runs from the query start to its end (the
   JVM start and Spark's first-job warm-up, a trivial ``mapInArrow`` job, are not counted).

Prints msgs/s for each, the ratio Spark local[2] / local host, and the scaling ratio
local[2] / local[1].
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from replication import __version__  # noqa: E402
from replication.spark.runner import SparkPipeline, session  # noqa: E402


def _bench_replication() -> Any:
    """bench/replication.py (its broker, loading and pump run), loaded under another name:
    ``replication`` is the package."""
    spec = importlib.util.spec_from_file_location("bench_replication",
                                                  ROOT / "bench" / "replication.py")  # fmt: skip
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PIPELINE = """\
pipelines:
  - name: copy
    source: {connection: Bus, queue: src}
    target: {connection: Bus, queue: dst}
"""


def _identity(batches: Any) -> Any:
    yield from batches


def warm_up(spark: Any) -> float:
    """One small mapInArrow job: Spark starts its Python worker daemon and loads its classes
    on the first job (6 s here), a one-time cost of the session like the JVM start."""
    started = time.perf_counter()
    spark.range(1000).mapInArrow(_identity, "id long").collect()
    return time.perf_counter() - started


def spark_run(master: str, connection_string: str, folder: Path, count: int,
              per_trigger: int) -> float:  # fmt: skip
    from replication.pipeline import load_pipelines

    settings = {"Bus": connection_string}
    pipeline = load_pipelines(folder / "pipelines.yaml", settings=settings).get("copy")
    spark = session(master)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        warm_up(spark)
        started = time.perf_counter()
        SparkPipeline(spark, pipeline, folder / "pipelines.yaml", settings).stream(
            folder / f"checkpoint-{master}", available_now=True, max_per_trigger=per_trigger
        )
        return time.perf_counter() - started
    finally:
        spark.stop()


def main(argv: list[str] | None = None) -> None:
    bench_replication = _bench_replication()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--per-trigger", type=int, default=5000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        folder = Path(tmp)
        (folder / "pipelines.yaml").write_text(PIPELINE)
        process, connection_string = bench_replication.start_broker(folder)
        try:
            items = bench_replication.messages(args.messages, args.size)
            results: dict[str, float] = {}
            asyncio.run(bench_replication.send_all(connection_string, "src", items, 100))
            host = asyncio.run(
                bench_replication.replicate(
                    connection_string, args.messages, 100, 1, "amqp", "amqp"
                )
            )
            results["local host (task pump)"] = args.messages / host
            for master in ("local[1]", "local[2]"):
                asyncio.run(bench_replication.send_all(connection_string, "src", items, 100))
                elapsed = spark_run(master, connection_string, folder, args.messages,
                                    args.per_trigger)  # fmt: skip
                results[f"spark {master}"] = args.messages / elapsed
        finally:
            process.terminate()
            process.wait(20)
    print(f"replication {__version__}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs; {args.messages:,} x {args.size} B, copy pipeline")  # fmt: skip
    for name, rate in results.items():
        print(f"{name}: {rate:,.0f} msgs/s")
    host_rate = results["local host (task pump)"]
    print(f"ratio spark local[2] / local host: {results['spark local[2]'] / host_rate:.2f}")
    print(f"scaling local[2] / local[1]: "
          f"{results['spark local[2]'] / results['spark local[1]']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
