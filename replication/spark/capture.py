"""Replaying Capture files: Avro containers of Capture records (``adapters.capture``).

Files are listed on the driver and read by executors (``fastavro``), one file per task, so a
large replay spreads over the cluster; each record becomes a message
(``adapters.capture.to_message``) and a row (``rows.SCHEMA``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..adapters.capture import CAPTURE_SCHEMA, to_message
from .rows import SCHEMA, to_row

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["CAPTURE_SCHEMA", "capture_files", "read_capture", "read_file"]


def capture_files(path: str | Path) -> list[str]:
    """A file, or every ``*.avro`` under a folder (sorted: Capture names sort by time)."""
    root = Path(path)
    if root.is_file():
        return [str(root)]
    if not root.is_dir():
        raise FileNotFoundError(f"no Capture file or folder at {root}")
    files = sorted(str(p) for p in root.rglob("*.avro"))
    if not files:
        raise FileNotFoundError(f"no *.avro files under {root}")
    return files


def read_file(path: str) -> Iterator[tuple[Any, ...]]:
    """The rows (``rows.SCHEMA``) of one Capture file."""
    from fastavro import reader

    with Path(path).open("rb") as handle:
        for record in reader(handle):
            assert isinstance(record, dict)  # Capture's schema: one record per event
            yield to_row(to_message(record))


def read_capture(spark: SparkSession, path: str | Path) -> DataFrame:
    """A DataFrame (``rows.SCHEMA``) of every record of the Capture files at ``path``."""
    files = capture_files(path)
    rdd = spark.sparkContext.parallelize(files, len(files)).flatMap(read_file)
    return spark.createDataFrame(rdd, SCHEMA)
