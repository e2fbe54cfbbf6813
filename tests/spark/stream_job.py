"""A ``servicebus`` stream in a process of its own, for the test that kills its driver.

``python -m tests.spark.stream_job <connection string> <queue> <checkpoint> <marker>``: reads
the queue on executors (``local[2]``) into ``foreachBatch``; the first batch writes the
message ids it read to ``marker`` and then waits, between ``read`` and Spark's commit,
until the test kills the process.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def main(connection: str, queue: str, checkpoint: str, marker: str) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from replication.spark import register

    spark = (
        SparkSession.builder.master("local[2]").appName("replication-killed-driver")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate()
    )  # fmt: skip
    register(spark)

    def batch(frame: Any, batch_id: int) -> None:
        ids = [row.message_id for row in frame.collect()]
        written = Path(f"{marker}.part")
        written.write_text(json.dumps(ids))
        written.replace(marker)  # whole or not there: the test reads it as soon as it exists
        time.sleep(600)  # killed here: read, not committed

    stream = (
        spark.readStream.format("servicebus").option("connectionString", connection)
        .option("queue", queue).option("maxMessagesPerTrigger", "200").load()
    )  # fmt: skip
    query = stream.writeStream.foreachBatch(batch).option("checkpointLocation", checkpoint).start()
    query.awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:5])
