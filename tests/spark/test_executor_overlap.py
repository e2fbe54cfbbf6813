"""The executor's task handles two batches of a plain receiver side by side, and one batch at
a time for a session, on the worker's loop as Spark runs it (``worker.run_async``), without
Spark: the real broker, our receiver and sender.

Side by side, the target still has the messages in the order they were received and every
source message is completed once; how many batches were handled at once is observed by
wrapping ``process_batch`` (the real one runs).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage

from replication.failover.runtime import endpoint_host
from replication.spark import executor
from replication.spark.assignment import Assignment
from replication.spark.executor import BATCHES_IN_FLIGHT, Counts, PipelineJob, run_assignment
from replication.spark.worker import run_async
from tests.broker.conftest import BrokerHandle, make_config, receive_all

pytestmark = pytest.mark.timeout(120)

CONFIG = make_config({"src": {}, "dst": {}, "ssrc": {"RequiresSession": True}, "sdst": {}})
PIPELINES = """\
pipelines:
  - name: copy
    source: {connection: Bus, queue: src}
    target: {connection: Bus, queue: dst}
    batch_size: 10
  - name: sessions
    source: {connection: Bus, queue: ssrc, sessions: true}
    target: {connection: Bus, queue: sdst}
    batch_size: 10
"""


@pytest.fixture
def concurrency(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """[now, most]: how many ``process_batch`` calls of the executor run at once."""
    seen = [0, 0]
    real = executor.process_batch

    async def counted(*args: Any, **kwargs: Any) -> Any:
        seen[0] += 1
        seen[1] = max(seen[1], seen[0])
        try:
            return await real(*args, **kwargs)
        finally:
            seen[0] -= 1

    monkeypatch.setattr(executor, "process_batch", counted)
    yield seen


def moved(
    broker: BrokerHandle, pipeline: str, source: str, target: str, ids: list[str],
    session: str | None = None,
) -> Counts:  # fmt: skip
    """Sends ``ids`` to ``source``, runs one assignment of ``pipeline`` for all of them (one
    session slot when ``session`` is given) and checks that ``target`` got them in that
    order and ``source`` is empty; the task's counts."""
    with broker.client() as client, client.get_queue_sender(source) as sender:
        for start in range(0, len(ids), 100):
            sender.send_messages(
                [ServiceBusMessage(i, message_id=i, session_id=session) for i in ids[start:][:100]]
            )
    job = PipelineJob((PIPELINES, pipeline, json.dumps({"Bus": broker.connection_string}), None))
    namespace = endpoint_host(broker.connection_string)
    sessions = 0 if session is None else 1
    assignment = Assignment("run", 1, 0, namespace, source, sessions, len(ids), 5.0)
    counts = run_async(run_assignment(job, assignment))
    assert [str(m.message_id) for m in receive_all(broker, target)] == ids
    assert broker.count(source) == 0
    return counts


@pytest.mark.broker_config(CONFIG)
def test_a_plain_receiver_s_batches_overlap_and_keep_their_order(
    broker: BrokerHandle, concurrency: list[int]
) -> None:
    counts = moved(broker, "copy", "src", "dst", [f"m-{i:04d}" for i in range(600)])
    assert (counts.received, counts.completed, counts.forwarded) == (600, 600, 600)
    assert concurrency[1] == BATCHES_IN_FLIGHT == 2, "the batches did not overlap"


@pytest.mark.broker_config(CONFIG)
def test_a_session_s_batches_go_one_after_another(
    broker: BrokerHandle, concurrency: list[int]
) -> None:
    counts = moved(broker, "sessions", "ssrc", "sdst", [f"s-{i:03d}" for i in range(200)], "a")
    assert (counts.received, counts.completed) == (200, 200)
    assert concurrency[1] == 1, "a session's batches overlapped"
