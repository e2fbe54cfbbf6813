"""``python -m replication spark``: a configured pipeline on Spark Structured Streaming.

Reads the same ``local.settings.json`` (or the environment) and ``pipelines.yaml`` as the
local host. Per pipeline source one streaming query (one checkpoint folder per source): the
driver plans assignments (``pipeline_source``), each executor task receives its share,
runs the pipeline's steps, sends and settles on its own link (``executor``), as the local
host does; an event hub source's tasks each read one partition's range of sequence numbers
and run it through the steps (``eventhub_pipeline``: nothing to settle, the offsets in the
checkpoint are the progress); the rows are the tasks' counts and the lag of their copies,
for the driver's metrics (``progress``), written to Spark's ``noop`` sink.
``--available-now`` processes what is there and stops; otherwise it runs until Ctrl-C (the
query stops between micro-batches; what a task had not settled is given back).
``--replay PATH`` sends the records of Capture files through the pipeline instead (a batch
job: the steps in ``mapInArrow``, the ``servicebus`` sink). Nothing here assumes local
mode: on a cluster the same module runs under ``spark-submit`` (``--master`` is then
ignored in favour of the submit's).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from ..broker.server import Broker
    from ..pipeline import Pipeline
    from .intake import LoopThread

log = logging.getLogger("replication.spark")

PER_SLOT = 200_000
"""Default messages per micro-batch per task slot. A micro-batch costs Spark's driver CPU
(its JVM: planning, the offset and commit logs, progress; 0.6-1.3 CPU s on ``local[2]``)
and about 0.4 s in which no task runs, whatever its size, and no body passes through the
driver, so batches can be large: on ``local[2]`` 10,000 per slot ran 1.6 s batches of which
0.3-0.37 s were between the tasks; with 50,000 per slot the boundary still cost about 0.8 s
of a 7 s batch (``bench/spark.py``, figures in ``spark/README.md``). ``MAX_SECONDS`` bounds
a batch in time, so a slow source does not stretch it to minutes. A task settles batch by
batch as it goes and ends when the source runs dry, so a large share holds no more locks
than a small one and keeps an idle stream no busier."""

EVENTS_PER_SLOT = 50_000
"""Default events per micro-batch per task slot of an event hub source: its ranges are fixed
when planned (no time bound), so they keep the earlier default."""

MAX_SECONDS = 30.0
"""Default seconds after which a task takes no new batch (``maxSecondsPerTrigger``): how
long a micro-batch with a backlog lasts at most, give or take its last batch, and so how
often progress lines and metrics move."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pipeline", required=True, help="the pipeline (by name) to run")
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path.cwd(),
        help="the app folder (pipelines.yaml, local.settings.json)",
    )
    parser.add_argument("--settings", type=Path, help="local.settings.json to use")
    parser.add_argument(
        "--master", default=None, help="Spark master (default: local[2], or what spark-submit set)"
    )
    parser.add_argument(
        "--available-now", action="store_true", help="process what is at the source now, then stop"
    )
    parser.add_argument(
        "--checkpoint",
        help="checkpoint folder or URI, e.g. abfss://... on a cluster "
        "(default: <dir>/.replication/spark/<pipeline>)",
    )
    parser.add_argument(
        "--replay",
        metavar="PATH",
        help="replay Capture Avro files (a file or folder) through the pipeline",
    )
    parser.add_argument(
        "--max-messages-per-trigger",
        type=int,
        default=None,
        help=f"messages per micro-batch (default {PER_SLOT:,} per task slot of the cluster; "
        f"an event hub source's events, {EVENTS_PER_SLOT:,} per slot)",
    )
    parser.add_argument(
        "--max-seconds-per-trigger",
        type=_positive_seconds,
        default=MAX_SECONDS,
        help="seconds after which a micro-batch's tasks take no new batch of messages "
        f"(default {MAX_SECONDS:g})",
    )
    parser.add_argument(
        "--no-brokers",
        action="store_true",
        help="do not start embedded brokers for local emulator connections",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve the Prometheus /metrics of the streams on this port "
        "(0: any free port; default: not served)",
    )
    parser.add_argument("--log-level", default="INFO")


def _positive_seconds(text: str) -> float:
    """argparse's type for a number of seconds more than 0 (as ``maxSecondsPerTrigger``)."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give more than 0 seconds")
    return seconds


def run(args: argparse.Namespace) -> int:
    from ..host.settings import SettingsError, load_settings
    from ..pipeline import PipelineConfigError, load_pipelines

    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:  # local.settings.json (the environment wins, as with Functions), else the environment
        settings, _ = load_settings(args.dir, args.settings)
    except SettingsError:
        settings = dict(os.environ)
    path = args.dir / settings.get("REPLICATION_PIPELINES", "pipelines.yaml")
    try:
        pipeline = load_pipelines(path, settings=settings).get(args.pipeline)
        pipeline.refuse_transactional("spark")  # executors settle outside any transaction
    except (PipelineConfigError, KeyError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    brokers = None if args.no_brokers else _embedded_brokers(args.dir, pipeline, settings)
    if args.metrics_port is not None:
        _serve_metrics(args.metrics_port)
    spark = session(args.master)
    try:
        job = SparkPipeline(spark, pipeline, path, settings)
        if args.replay:
            job.replay(args.replay)
            return 0
        checkpoint = args.checkpoint or args.dir / ".replication" / "spark" / pipeline.name
        job.stream(
            checkpoint,
            available_now=args.available_now,
            max_per_trigger=args.max_messages_per_trigger,
            max_seconds=args.max_seconds_per_trigger,
        )
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        spark.stop()
        if brokers is not None:
            brokers.close()


def session(master: str | None) -> SparkSession:
    """A SparkSession with the servicebus source registered. Workers run this interpreter
    (with this package and pyarrow) unless PYSPARK_PYTHON says otherwise."""
    from pyspark.sql import SparkSession

    from . import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("replication")
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started this driver
    if not under_submit:
        # pyspark launched from python counts as its shell, whose console progress bar
        # ("[Stage 3:> (0 + 2) / 2]", redrawn with \r) runs into the log lines; the runner's
        # "batch N" lines and metrics are the progress (spark-submit leaves it off anyway)
        builder = builder.master(master or "local[2]").config(
            "spark.ui.showConsoleProgress", "false"
        )
    spark = builder.config("spark.sql.session.timeZone", "UTC").getOrCreate()
    register(spark)
    return spark


class SparkPipeline:
    def __init__(
        self, spark: SparkSession, pipeline: Pipeline, path: Path, settings: dict[str, str]
    ) -> None:
        from .pipeline import PipelineRef

        self.spark = spark
        self.pipeline = pipeline
        self.settings = settings
        self.ref = PipelineRef(
            path.read_text(encoding="utf-8"), pipeline.name, settings, str(path.parent)
        )

    def sink_options(self) -> dict[str, str]:
        text, name, settings_json, base_dir = (
            self.ref.text,
            self.ref.name,
            self.ref.settings_json,
            self.ref.base_dir,
        )
        options = {"pipeline": text, "pipelineName": name, "settings": settings_json}
        if base_dir:
            options["pipelineDir"] = base_dir
        return options

    def source_options(
        self, index: int, max_per_trigger: int | None = None, max_seconds: float = MAX_SECONDS
    ) -> dict[str, str]:
        """The ``servicebus-pipeline`` stream of source ``index``: the pipeline itself (its
        source's namespace is resolved on the driver every micro-batch), one assignment per
        task slot of the cluster; ``max_per_trigger`` defaults to ``PER_SLOT`` per slot,
        ``max_seconds`` bounds each task. An event hub's tasks read the ranges of sequence
        numbers the driver planned, which no clock may cut short: ``EVENTS_PER_SLOT``."""
        slots = max(1, int(self.spark.sparkContext.defaultParallelism))
        if self.pipeline.sources[index].is_event_hub:  # one task per partition's range
            events = max_per_trigger or EVENTS_PER_SLOT * slots
            return {**self.sink_options(), "source": str(index), "maxEventsPerTrigger": str(events)}
        messages = max_per_trigger or PER_SLOT * slots
        return {
            **self.sink_options(),
            "source": str(index),
            "numPartitions": str(slots),
            "maxMessagesPerTrigger": str(messages),
            "maxSecondsPerTrigger": str(max_seconds),
        }

    def source_format(self, index: int) -> str:
        """``eventhubs-pipeline`` for an event hub source (``eventhub_pipeline.py``), else
        ``servicebus-pipeline`` (``pipeline_source.py``)."""
        if self.pipeline.sources[index].is_event_hub:
            return "eventhubs-pipeline"
        return "servicebus-pipeline"

    def planned(self, frame: DataFrame, index: int = 0) -> DataFrame:
        from .pipeline import OUTPUT_SCHEMA, plan_function

        return frame.mapInArrow(plan_function(self.ref, index), OUTPUT_SCHEMA)

    def query_name(self, index: int) -> str:
        return f"{self.pipeline.name}-{index}"

    def stream(
        self,
        checkpoint: Path | str,
        *,
        available_now: bool,
        max_per_trigger: int | None = None,
        max_seconds: float = MAX_SECONDS,
    ) -> None:
        """One query per source until they end (AvailableNow) or Ctrl-C; progress goes to
        the log and the metrics (``progress.PipelineProgress``). Executors receive, run the
        steps, send and settle (``executor.run_assignment``); the query's rows are their
        counts, observed for the metrics and written to Spark's ``noop`` sink. Meanwhile
        the driver probes the sources' recovery point (``recovery.RecoveryPoints``)."""
        from .progress import PipelineProgress, observe
        from .recovery import RecoveryPoints

        names = {self.query_name(i) for i in range(len(self.pipeline.sources))}
        listener = PipelineProgress(self.pipeline.name, names)
        self.spark.streams.addListener(listener)
        queries = []
        recovery = RecoveryPoints.for_pipeline(self.pipeline, self.settings)
        if recovery is not None:  # on the driver: peeks, no bodies kept (``recovery.py``)
            recovery.start()
        try:
            for index in range(len(self.pipeline.sources)):
                source = self.source_options(index, max_per_trigger, max_seconds)
                counts = (
                    self.spark.readStream.format(self.source_format(index)).options(**source).load()
                )
                location = _child(checkpoint, f"source-{index}")
                writer = (
                    observe(counts, self.query_name(index))
                    .writeStream.format("noop")
                    .option("checkpointLocation", location)
                    .queryName(self.query_name(index))
                )
                writer = writer.trigger(availableNow=True) if available_now else writer
                queries.append(writer.start())
                log.info(
                    "%s: streaming source %d (%s), checkpoint %s",
                    self.pipeline.name,
                    index,
                    self.pipeline.sources[index].describe(),
                    location,
                )
            _watch(queries)
        finally:
            for query in queries:
                if query.isActive:
                    query.stop()
            if recovery is not None:
                recovery.stop()
            if not listener.wait_for(queries):
                log.warning(
                    "%s: the last micro-batch's counts did not reach the metrics in time",
                    self.pipeline.name,
                )
            self.spark.streams.removeListener(listener)

    def replay(self, path: str) -> int:
        from .capture import read_capture

        frame = read_capture(self.spark, path)
        planned = self.planned(frame).cache()
        count = planned.count()
        planned.write.format("servicebus").options(**self.sink_options()).mode("append").save()
        log.info("%s: replayed %d output message(s) from %s", self.pipeline.name, count, path)
        return count


def _child(base: Path | str, name: str) -> str:
    """``base/name`` for a local folder or a URI (``abfss://...``, ``dbfs:/...``, which
    ``Path`` would mangle)."""
    return f"{str(base).rstrip('/')}/{name}"


def _watch(queries: list[StreamingQuery]) -> None:
    """Waits until the queries all end; the first failure is raised."""
    while any(q.isActive for q in queries):
        time.sleep(0.5)
        if any(q.exception() is not None for q in queries):
            break
    for query in queries:
        error = query.exception()
        if error is not None:
            raise RuntimeError(f"query {query.name} failed: {error}")


def _serve_metrics(port: int) -> None:
    from .metrics_server import serve_metrics

    server = serve_metrics(port)
    log.info("metrics on http://127.0.0.1:%d/metrics", server.server_port)


class _Brokers:
    def __init__(self, thread: LoopThread, brokers: list[Broker]) -> None:
        self.thread = thread
        self.brokers = brokers

    def close(self) -> None:
        for broker in self.brokers:
            self.thread.run(broker.stop())
        self.thread.close()


def _embedded_brokers(
    directory: Path, pipeline: Pipeline, settings: dict[str, str]
) -> _Brokers | None:
    """Local emulator connections with nothing listening get an embedded broker (as
    ``start`` does), so the same config runs on Spark on one machine."""
    from ..host.embedded import plan_brokers, served, start_brokers
    from .intake import LoopThread

    plan = plan_brokers([pipeline], settings)
    if all(served(port) for port in plan):
        return None
    thread = LoopThread("embedded-brokers")
    brokers = thread.run(start_brokers(plan, directory / ".replication"))
    for broker in brokers:
        log.info("embedded broker on localhost:%d", broker.port)
    return _Brokers(thread, brokers)


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``spark-submit spark_submit.py --pipeline NAME ...`` on a cluster."""
    parser = argparse.ArgumentParser(prog="spark_submit.py", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
