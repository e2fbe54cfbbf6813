"""Spark tests: one real SparkSession in ``local[2]`` for the whole run (starting the JVM is
the slow part), and the broker fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.broker.conftest import (  # noqa: F401  (fixtures, found by name)
    broker,
    broker_factory,
    pytest_configure,
)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    import os
    import sys

    from pyspark.sql import SparkSession

    # the Python workers must be this interpreter (with pyarrow and this package)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from replication.spark import register

    session = (
        SparkSession.builder.master("local[2]")
        .appName("replication-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    register(session)
    yield session
    session.stop()
