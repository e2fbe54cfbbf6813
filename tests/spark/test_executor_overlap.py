"""The executor's task handles two batches of a plain receiver side by side, and one batch at
a time for a session, on the worker's loop as Spark runs it (``worker.run_async``), without
Spark: the real broker, our receiver and sender.

Side by side, the target still has the messages in the order they were received and every
source message is completed once; how many batches were handled at once is observed by
wrapping ``process_batch`` (the real one runs), and the next batch sends once the one before
is on the wire, without waiting for its answer (the worker's sender pool wrapped so that the
first answer is held). A task whose ``max_seconds`` have passed takes no new batch (the
clock is the task's input).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage

from replication.failover.runtime import endpoint_host
from replication.spark import executor
from replication.spark.assignment import Assignment
from replication.spark.executor import BATCHES_IN_FLIGHT, Counts, PipelineJob, run_assignment
from replication.spark.worker import run_async
from replication.tasks.breaker import Breakers
from replication.tasks.targets import SenderPool, Target
from tests.broker.conftest import BrokerHandle, make_config, receive_all
from tests.tasks.held_sends import HeldSends

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


def job_of(broker: BrokerHandle, pipeline: str) -> PipelineJob:
    return PipelineJob((PIPELINES, pipeline, json.dumps({"Bus": broker.connection_string}), None))


def on_worker(job: PipelineJob, assignment: Assignment) -> Counts:
    return run_async(run_assignment(job, assignment))


HOLD = 10.0
"""Seconds a test waits for a second batch to send while the first one's answer is held."""


def moved(
    broker: BrokerHandle, pipeline: str, source: str, target: str, ids: list[str],
    session: str | None = None, run: Callable[[PipelineJob, Assignment], Counts] = on_worker,
) -> Counts:  # fmt: skip
    """Sends ``ids`` to ``source``, runs one assignment of ``pipeline`` for all of them (one
    session slot when ``session`` is given) with ``run`` and checks that ``target`` got them
    in that order and ``source`` is empty; the task's counts."""
    with broker.client() as client, client.get_queue_sender(source) as sender:
        for start in range(0, len(ids), 100):
            sender.send_messages(
                [ServiceBusMessage(i, message_id=i, session_id=session) for i in ids[start:][:100]]
            )
    job = job_of(broker, pipeline)
    namespace = endpoint_host(broker.connection_string)
    sessions = 0 if session is None else 1
    assignment = Assignment("run", 1, 0, namespace, source, sessions, len(ids), 5.0)
    counts = run(job, assignment)
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
def test_a_plain_receiver_s_next_batch_sends_before_the_one_before_is_answered(
    broker: BrokerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task's senders count what the targets accepted (``Counts.forwarded``); counting
    must not keep the next batch waiting for the answer to the one before (it did: the
    counting sender dropped the "on the wire" signal, and a task moved ~20% fewer messages
    a second than the local host's pump)."""
    held: list[HeldSends] = []

    def pool_for(key: Any, targets: dict[str | None, Target], backend: Any = "amqp") -> Any:
        held.append(HeldSends(SenderPool(targets, backend=backend)))
        return held[-1], Breakers()

    async def run(job: PipelineJob, assignment: Assignment) -> tuple[Counts, bool]:
        """The task, and whether its second batch sent while the first answer was held."""
        task = asyncio.create_task(run_assignment(job, assignment))
        try:
            async with asyncio.timeout(HOLD):
                while not held:
                    await asyncio.sleep(0.01)
                await held[0].second_started.wait()
            overlapped = True
        except TimeoutError:
            overlapped = False
        finally:
            if held:
                held[0].release.set()
        return await task, overlapped

    monkeypatch.setattr(executor, "pool_for", pool_for)
    overlapped = [False]

    def running(job: PipelineJob, assignment: Assignment) -> Counts:
        counts, overlapped[0] = run_async(run(job, assignment))
        return counts

    try:
        counts = moved(broker, "copy", "src", "dst", [f"h-{i:03d}" for i in range(30)], run=running)
    finally:
        for sends in held:
            run_async(sends.pool.close())
    assert (counts.received, counts.completed, counts.forwarded) == (30, 30, 30)
    assert overlapped[0], "the second batch waited for the answer to the first"


@pytest.mark.broker_config(CONFIG)
def test_a_session_s_batches_go_one_after_another(
    broker: BrokerHandle, concurrency: list[int]
) -> None:
    counts = moved(broker, "sessions", "ssrc", "sdst", [f"s-{i:03d}" for i in range(200)], "a")
    assert (counts.received, counts.completed) == (200, 200)
    assert concurrency[1] == 1, "a session's batches overlapped"


@pytest.mark.broker_config(CONFIG)
def test_a_task_takes_no_new_batch_once_its_seconds_are_up(broker: BrokerHandle) -> None:
    """``max_seconds`` 30: the clock reads 0 at the start and before the first batch, then 31;
    the task finishes and settles the one batch (``batch_size`` 10) it took and gives back
    the rest of its share untouched."""
    ids = [f"t-{i:03d}" for i in range(100)]
    with broker.client() as client, client.get_queue_sender("src") as sender:
        sender.send_messages([ServiceBusMessage(i, message_id=i) for i in ids])
    assignment = Assignment("run", 1, 0, endpoint_host(broker.connection_string), "src", 0,
                            len(ids), 5.0, max_seconds=30.0)  # fmt: skip
    readings = iter([0.0, 0.0])
    counts = run_async(run_assignment(job_of(broker, "copy"), assignment,
                                      clock=lambda: next(readings, 31.0)))  # fmt: skip
    assert (counts.received, counts.completed, counts.forwarded) == (10, 10, 10)
    assert [str(m.message_id) for m in receive_all(broker, "dst")] == ids[:10]
    assert broker.count("src") == 90  # the prefetched rest was released, not lost
    untimed = dataclasses.replace(assignment, batch=2, max_seconds=None, max_messages=90)
    counts = run_async(run_assignment(job_of(broker, "copy"), untimed, clock=lambda: 31.0))
    assert counts.completed == 90 and broker.count("src") == 0  # no bound: the whole share
