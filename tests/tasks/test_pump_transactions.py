"""The pump with a transactional pipeline against the broker: copies sent via the source and
completes in one transaction per batch. A crash between the sends and the commit leaves
neither (no duplicate once the batch comes again); a refused copy rolls its batch back."""

from __future__ import annotations

import asyncio
import contextlib
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage

from replication.pipeline import parse_pipelines
from replication.pipeline.model import BuiltPipeline
from replication.servicebus.transactions import Transaction
from replication.tasks.pump import PumpStats, Source, pump
from replication.tasks.targets import SenderPool
from tests.broker.conftest import BrokerHandle, make_config, receive_all

pytestmark = pytest.mark.timeout(120)

CONFIG = make_config({
    "src": {"MaxDeliveryCount": 2}, "dst": {}, "eu": {},
    "s-src": {"RequiresSession": True}, "s-dst": {"RequiresSession": True},
})  # fmt: skip


@pytest.fixture
def broker(broker_factory) -> BrokerHandle:  # type: ignore[no-untyped-def]
    return broker_factory(CONFIG)


def built(broker: BrokerHandle, body: str) -> BuiltPipeline:
    settings = {"Namespace": broker.connection_string}
    text = textwrap.dedent(body)
    [pipeline] = parse_pipelines(text, "pipelines.yaml", settings=settings).pipelines
    return pipeline.build(settings)


COPY = """\
    pipelines:
      - name: copy
        source: {connection: Namespace, queue: src}
        target: {connection: Namespace, queue: dst}
        transactional: true
"""


@contextlib.asynccontextmanager
async def running(broker: BrokerHandle, pipeline: BuiltPipeline, source: Source,
                  **options: Any) -> AsyncIterator[PumpStats]:  # fmt: skip
    stop = asyncio.Event()
    stats = PumpStats()
    pool = SenderPool(pipeline.targets)  # not used: the transaction has its own senders
    job = asyncio.create_task(pump(
        pipeline.task, broker.connection_string, source, pool, stop, stats=stats,
        transaction_targets=pipeline.transaction_targets(), max_wait=0.2, **options,
    ))  # fmt: skip
    try:
        yield stats
    finally:
        stop.set()
        await asyncio.wait_for(job, 30)
        await pool.close()


def send(broker: BrokerHandle, queue: str, messages: list[ServiceBusMessage]) -> None:
    with broker.client() as client, client.get_queue_sender(queue) as sender:
        sender.send_messages(messages)


async def wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


def expire_locks(broker: BrokerHandle, queue: str) -> None:
    def expire() -> None:
        assert broker.broker is not None
        held = broker.broker.queues[queue]
        # a dropped connection's locks too: they hold their messages until they expire
        for lock in [*held.locks.values(), *held.orphaned_locks.values()]:
            lock.until_ms = 0

    broker.call(expire)


async def test_a_transactional_pipeline_moves_every_message_once(broker: BrokerHandle) -> None:
    send(broker, "src", [ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(50)])
    async with running(broker, built(broker, COPY), Source("src"), max_batch=20) as stats:
        await wait_until(lambda: stats.completed == 50)
    assert broker.count("src") == 0
    copies = receive_all(broker, "dst")
    assert sorted(m.message_id for m in copies) == sorted(f"m{i}" for i in range(50))
    assert (stats.abandoned, stats.released) == (0, 0)


async def test_a_crash_before_the_commit_leaves_neither_copy_nor_complete(
    broker: BrokerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process dies after the copies went out and the completes were sent, before the
    commit: the connection drops, the broker rolls back. Once the locks run out the batch
    comes again and is replicated once: no duplicate at the target."""
    send(broker, "src", [ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(5)])
    reached = asyncio.Event()
    real_commit = Transaction.commit

    async def crash(self: Transaction) -> None:
        reached.set()
        self.connection.client.driver.transport.abort()  # type: ignore[union-attr]
        await asyncio.Event().wait()  # dead: never comes back

    pipeline = built(broker, COPY)
    monkeypatch.setattr(Transaction, "commit", crash)
    stats = PumpStats()
    job = asyncio.create_task(pump(
        pipeline.task, broker.connection_string, Source("src"), SenderPool({}),
        asyncio.Event(), stats=stats, transaction_targets=pipeline.transaction_targets(),
    ))  # fmt: skip
    await asyncio.wait_for(reached.wait(), 10)
    await asyncio.sleep(0.3)
    assert broker.count("dst") == 0  # the copies went with the transaction
    assert broker.count("src") == 5
    job.cancel()  # the process is gone
    with contextlib.suppress(asyncio.CancelledError):
        await job
    assert stats.completed == 0

    monkeypatch.setattr(Transaction, "commit", real_commit)
    expire_locks(broker, "src")
    async with running(broker, pipeline, Source("src")) as stats:
        await wait_until(lambda: stats.completed == 5)
    copies = receive_all(broker, "dst")
    assert sorted(m.message_id for m in copies) == [f"m{i}" for i in range(5)]


async def test_a_refused_copy_rolls_its_batch_back_whole(broker: BrokerHandle) -> None:
    """Messages for region 'xx' go to a queue that does not exist: their batch is rolled
    back (the good copies with it), the failed message abandoned (MaxDeliveryCount 2 then
    dead-letters it), the others released and done again: each good one arrives once."""
    pipeline = built(
        broker,
        """\
        pipelines:
          - name: route
            source: {connection: Namespace, queue: src}
            routes:
              - when: "region = 'eu'"
                target: {connection: Namespace, queue: eu}
              - when: "region = 'xx'"
                target: {connection: Namespace, queue: missing}
            default: {connection: Namespace, queue: dst}
            transactional: true
    """,
    )
    regions = ["eu", "us", "xx", "eu", "us"]
    send(broker, "src", [
        ServiceBusMessage(f"{i}", message_id=f"{r}-{i}", application_properties={"region": r})
        for i, r in enumerate(regions)
    ])  # fmt: skip
    async with running(broker, pipeline, Source("src"), max_batch=10) as stats:
        await wait_until(lambda: stats.completed == 4 and broker.count("src") == 0)
    assert stats.abandoned >= 2 and stats.released >= 4  # the whole batch, twice
    assert sorted(m.message_id for m in receive_all(broker, "eu")) == ["eu-0", "eu-3"]
    assert sorted(m.message_id for m in receive_all(broker, "dst")) == ["us-1", "us-4"]
    [dead] = receive_all(broker, "src/$DeadLetterQueue")
    assert (dead.message_id, dead.dead_letter_reason) == ("xx-2", "MaxDeliveryCountExceeded")


async def test_sessions_in_transactions_keep_their_order(broker: BrokerHandle) -> None:
    pipeline = built(
        broker,
        """\
        pipelines:
          - name: sessions
            source: {connection: Namespace, queue: s-src, sessions: true}
            target: {connection: Namespace, queue: s-dst}
            transactional: true
    """,
    )
    send(broker, "s-src", [
        ServiceBusMessage(f"{s}{i}", message_id=f"{s}{i}", session_id=s)
        for i in range(10) for s in ("a", "b", "c")
    ])  # fmt: skip
    source = Source("s-src", sessions=True)
    async with running(broker, pipeline, source, max_batch=4, session_workers=3) as stats:
        await wait_until(lambda: stats.completed == 30)
    for session in ("a", "b", "c"):
        got = receive_all(broker, "s-dst", session_id=session)
        assert [m.message_id for m in got] == [f"{session}{i}" for i in range(10)]


async def test_a_transactional_pump_refuses_what_cannot_be_one_transaction(
    broker: BrokerHandle,
) -> None:
    targets = {None: "dst"}
    with pytest.raises(ValueError, match="needs the amqp backend, not 'sdk'"):
        await pump(built(broker, COPY).task, broker.connection_string, Source("src"),
                   SenderPool({}), asyncio.Event(), backend="sdk",
                   transaction_targets=targets)  # fmt: skip
    with pytest.raises(ValueError, match=r"needs a queue source .*is a subscription"):
        await pump(built(broker, COPY).task, broker.connection_string,
                   Source("t", subscription="s"), SenderPool({}), asyncio.Event(),
                   transaction_targets=targets)  # fmt: skip
