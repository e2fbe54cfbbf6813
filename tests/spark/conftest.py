"""Spark tests: one real SparkSession in ``local[2]`` for the whole run (starting the JVM is
the slow part), and the broker fixtures."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from tests.broker.conftest import (  # noqa: F401  (fixtures, found by name)
    broker,
    broker_factory,
)
from tests.broker.conftest import pytest_configure as _broker_markers
from tests.spark.support import JVM_OPTIONS, JVM_SESSION


def pytest_configure(config: pytest.Config) -> None:
    _broker_markers(config)
    config.addinivalue_line(
        "markers",
        "cluster: starts a Spark standalone cluster of separate processes (test_cluster.py, "
        "about 2 minutes; deselect with -m 'not cluster')",
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    import os
    import sys

    from pyspark import SparkConf, SparkContext
    from pyspark.errors import PySparkRuntimeError
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    # the Python workers must be this interpreter (with pyarrow and this package)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from replication.spark import register

    conf = (
        SparkConf()
        .setMaster("local[2]")
        .setAppName("replication-tests")
        .set("spark.ui.enabled", "false")
        .set("spark.sql.shuffle.partitions", "2")
        .set("spark.sql.session.timeZone", "UTC")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.driver.extraJavaOptions", JVM_OPTIONS)
    )
    try:
        gateway = launch_gateway(conf, popen_kwargs=JVM_SESSION)
    except PySparkRuntimeError as exc:  # a JVM launch lost to a fork race (tests/conftest.py)
        if "JAVA_GATEWAY_EXITED" not in str(exc):
            raise
        warnings.warn(f"the Spark JVM did not start, starting it once more: {exc}", stacklevel=1)
        gateway = launch_gateway(conf, popen_kwargs=JVM_SESSION)
    session = SparkSession(SparkContext(conf=conf, gateway=gateway))
    register(session)
    yield session
    session.stop()
