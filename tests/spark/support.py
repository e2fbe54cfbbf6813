"""What the Spark tests share: filling a queue, data source options, one AvailableNow stream
from a queue to a queue, and reading a target back."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from azure.servicebus import ServiceBusMessage

from tests.broker.conftest import REPO_ROOT, BrokerHandle, take_all

JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""The tests' JVMs live for seconds to minutes and run most of Spark's code a few times: the
C2 compiler's work never pays back, and on two shared cores it competes with the tests.
C1 only and the one-thread collector: a ``local[2]`` session and two small jobs took 18-20 s
of wall time instead of 29-36 s (load average 8-10). Benchmarks keep the JVM's defaults."""
JVM_ENV = {"JAVA_TOOL_OPTIONS": JVM_OPTIONS}
"""``JVM_OPTIONS`` for every JVM started in an environment (a driver's, a cluster's)."""
JVM_SESSION = {"start_new_session": True}
"""How the tests' ``local[2]`` JVM is started (pyspark's ``launch_gateway(popen_kwargs=)``):
in a session of its own, as a cluster's processes are (``cluster.Process``) and as a driver
is under spark-submit's launchers. A streaming query starts a Python process for its
reader that must connect back within 10 s: ``PythonWorkerFactory.createSimpleWorker``
waits ``Selector.select(10000)``, hard-coded in Spark 4.3, with no setting. Linux's
autogroup scheduler shares the CPU between sessions, so with two CPU-burning processes of
other sessions beside the suite, everything in the suite's one session (six xdist workers,
their brokers, the JVM and its Python processes) got a third of the machine, and that
process, which imports pyspark and pyarrow (0.45 CPU-s), took more than 10 s: five Spark
tests failed with "Python worker failed to connect back" in each such run. In a session
of its own the JVM and the processes it starts get their own share."""


def driver_env(**more: str) -> dict[str, str]:
    """The environment of a Spark driver a test starts in a process of its own: this
    checkout's package, this interpreter for the Python workers, ``JVM_ENV``."""
    return dict(
        os.environ, PYTHONPATH=str(REPO_ROOT), PYSPARK_PYTHON=sys.executable, **JVM_ENV, **more
    )


def fill(broker: BrokerHandle, queue: str, messages: list[ServiceBusMessage]) -> None:
    with broker.client() as client, client.get_queue_sender(queue) as sender:
        for start in range(0, len(messages), 250):
            sender.send_messages(messages[start : start + 250])


def options(broker: BrokerHandle, queue: str | None = None, **more: Any) -> dict[str, str]:
    entity = {"queue": queue} if queue else {}
    return {"connectionString": broker.connection_string, **entity,
            **{k: str(v) for k, v in more.items()}}  # fmt: skip


def stream_available_now(
    spark: Any, source: dict[str, str], target: dict[str, str], checkpoint: Path
) -> Any:
    """Runs a servicebus -> servicebus stream until the source is drained; returns the ended
    query (its exception is None when it passed)."""
    stream = spark.readStream.format("servicebus").options(**source).load()
    query = (
        stream.writeStream.format("servicebus").options(**target)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination(240)
    assert query.exception() is None, query.exception()
    return query


def text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def received_messages(broker: BrokerHandle, queue: str) -> list[Any]:
    """Takes (and completes) everything at a queue."""
    with broker.client() as client, client.get_queue_receiver(queue) as receiver:
        return take_all(receiver, batch=200)


def properties(message: Any) -> dict[str, Any]:
    return {text(k): text(v) for k, v in (message.application_properties or {}).items()}
