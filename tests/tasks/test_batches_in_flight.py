"""Batches side by side in the pump (``batches_in_flight``), and the send turns that keep
their order.

``SendTurns`` alone on the test's loop; then the pump against a real broker, its real
target sender (ours) wrapped so that a test can hold the answer to a send: a batch without
session or partition key sends once the one before is on the wire, without waiting for
its answer (the overlap is what the setting is for), and the target has them in the order
they were received; a batch whose messages carry a session id waits for the answer to the
one before (a failed send must not be overtaken); a handler that fails stops the
receiving, the batch beside it still finishes, and the error reaches the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage

from replication.failover import HOST_MAP_SETTING, FailoverSpec
from replication.messages import Message
from replication.servicebus.client import AmqpSource
from replication.servicebus.endpoint import Endpoint
from replication.servicebus.sdk_source import SourceReceiver
from replication.tasks.pump import PumpStats, Source, pump
from replication.tasks.receiving import ReceiveLoop
from replication.tasks.targets import SenderPool, Target
from replication.tasks.task import ReplicationTask
from replication.tasks.turns import SendTurns
from tests.broker.conftest import BrokerHandle, make_config, receive_all
from tests.tasks.held_sends import HeldSends

pytestmark = pytest.mark.timeout(120)

CONFIG = make_config({"src": {}, "dst": {}})


# ---------------------------------------------------------------------- SendTurns


async def test_turns_are_served_in_the_order_they_were_taken() -> None:
    turns = SendTurns()
    first, second, third = turns.take(), turns.take(), turns.take()
    entered: list[str] = []

    async def use(name: str, turn: Any, release: asyncio.Event | None = None) -> None:
        async with turn:
            entered.append(name)
            if release is not None:
                await release.wait()

    release = asyncio.Event()
    jobs = [asyncio.create_task(use("third", third)), asyncio.create_task(use("second", second))]
    holder = asyncio.create_task(use("first", first, release))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert entered == ["first"], "a later turn went while the first was held"
    release.set()
    await asyncio.gather(holder, *jobs)
    assert entered == ["first", "second", "third"]


async def test_a_turn_cancelled_while_waiting_does_not_let_the_next_overtake() -> None:
    turns = SendTurns()
    first, second, third = turns.take(), turns.take(), turns.take()
    entered: list[str] = []
    release = asyncio.Event()

    async def hold_first() -> None:
        async with first:
            entered.append("first")
            await release.wait()

    async def enter(name: str, turn: Any) -> None:
        async with turn:
            entered.append(name)

    holder = asyncio.create_task(hold_first())
    waiting = asyncio.create_task(enter("second", second))
    last = asyncio.create_task(enter("third", third))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await asyncio.sleep(0)
    assert entered == ["first"], "the third went while the first still held its turn"
    release.set()
    await asyncio.gather(holder, last)
    assert entered == ["first", "third"]


async def test_a_turn_ended_unused_passes_on_in_order() -> None:
    turns = SendTurns()
    first, second, third = turns.take(), turns.take(), turns.take()
    second.end()  # e.g. a batch whose copies are on the wire (ends in its order)
    entered: list[str] = []

    async def enter(name: str, turn: Any) -> None:
        async with turn:
            entered.append(name)

    last = asyncio.create_task(enter("third", third))
    await asyncio.sleep(0)
    assert entered == [], "the third went before the first"
    await enter("first", first)
    await last
    assert entered == ["first", "third"]


# ---------------------------------------------------------------------- the pump


def load(broker: BrokerHandle, count: int, session: str | None = None) -> list[str]:
    ids = [f"m-{i:03d}" for i in range(count)]
    with broker.client() as client, client.get_queue_sender("src") as sender:
        sender.send_messages([ServiceBusMessage(i, message_id=i, session_id=session) for i in ids])
    return ids


@contextlib.asynccontextmanager
async def pumping(
    broker: BrokerHandle, sends: HeldSends, **options: Any
) -> AsyncIterator[PumpStats]:
    stop, stats = asyncio.Event(), PumpStats()
    job = asyncio.create_task(
        pump(ReplicationTask("overlap"), broker.connection_string, Source("src"), sends, stop,
             stats=stats, max_batch=10, prefetch=40, **options)
    )  # fmt: skip
    try:
        yield stats
    finally:
        sends.release.set()  # a held send would keep the pump from stopping
        stop.set()
        await asyncio.wait_for(job, 30)


async def until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


NAMESPACE = "overlap-test-example-com.servicebus.windows.net"


def dst(broker: BrokerHandle, failover: bool) -> Target:
    """The broker's dst, as it is or behind a failover (which resolves to this broker): a
    failover target's sender lends a sender per send and must pass "on the wire" on."""
    if not failover:
        return Target(broker.connection_string, "dst")
    settings = {HOST_MAP_SETTING: f"{NAMESPACE}=127.0.0.1:{broker.port}"}
    spec = FailoverSpec.model_validate({"static": NAMESPACE})
    return Target(broker.connection_string, "dst",
                  spec.build("overlap/target", broker.connection_string, settings))  # fmt: skip


@pytest.mark.parametrize("failover", [False, True], ids=["target", "failover-target"])
@pytest.mark.broker_config(CONFIG)
async def test_a_batch_without_keys_sends_while_the_one_before_is_held(
    broker: BrokerHandle, failover: bool
) -> None:
    ids = load(broker, 30)
    pool = SenderPool({None: dst(broker, failover)})
    sends = HeldSends(pool)
    try:
        async with pumping(broker, sends, batches_in_flight=2) as stats:
            # the first send's answer is held; the second batch must not wait for it
            await asyncio.wait_for(sends.second_started.wait(), 20)
            sends.release.set()
            await until(lambda: stats.completed == 30)
    finally:
        await pool.close()
    assert [str(m.message_id) for m in receive_all(broker, "dst")] == ids
    assert broker.count("src") == 0


@pytest.mark.broker_config(CONFIG)
async def test_one_batch_at_a_time_when_asked(broker: BrokerHandle) -> None:
    load(broker, 30)
    pool = SenderPool({None: Target(broker.connection_string, "dst")})
    sends = HeldSends(pool)
    try:
        async with pumping(broker, sends, batches_in_flight=1) as stats:
            await until(lambda: stats.received >= 10)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(sends.second_started.wait(), 1.0)
            sends.release.set()
            await until(lambda: stats.completed == 30)
    finally:
        await pool.close()


@pytest.mark.broker_config(CONFIG)
async def test_a_session_s_messages_keep_their_order_across_batches_side_by_side(
    broker: BrokerHandle,
) -> None:
    """The source is a plain queue whose messages carry a session id (the target may need
    it in order). The first batch's send is on the wire, then fails with a transient error
    and is retried: the second batch, received and planned meanwhile, sends only after the
    first was accepted (sending once the first was on the wire would overtake its retry)."""
    ids = load(broker, 30, session="s-1")
    pool = SenderPool({None: Target(broker.connection_string, "dst")})
    sends = HeldSends(pool, first_fails_once=True)
    try:
        async with pumping(broker, sends, batches_in_flight=2) as stats:
            await until(lambda: stats.received >= 20)  # the second batch is being handled
            for _ in range(20):
                await asyncio.sleep(0)
            assert not sends.second_started.is_set(), "the second batch overtook the first"
            sends.release.set()
            await until(lambda: stats.completed == 30)
    finally:
        await pool.close()
    assert [what for what, _ in sends.log][:3] == ["start", "failed", "start"]
    assert sends.log[2][1] == sends.log[0][1], "the retry of the first batch did not come next"
    assert [str(m.message_id) for m in receive_all(broker, "dst")] == ids


class _FailingSecond:
    """Hooks that handle batches slowly and fail the second one."""

    def __init__(self) -> None:
        self.handled: list[list[str]] = []
        self.release = asyncio.Event()
        self.calls = 0

    @contextlib.asynccontextmanager
    async def opened(self, receiver: SourceReceiver) -> AsyncIterator[None]:
        yield

    async def handle(self, receiver: SourceReceiver, batch: list[Message]) -> bool:
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("the second batch failed")
        await self.release.wait()
        receiver.complete(batch)
        self.handled.append([str(m.message_id) for m in batch])
        return False

    async def failed(self, error: Any, draining: bool) -> bool:
        raise AssertionError(f"not a receiver failure: {error!r}")


@pytest.mark.broker_config(CONFIG)
async def test_a_failed_handler_stops_receiving_and_the_one_beside_it_finishes(
    broker: BrokerHandle,
) -> None:
    load(broker, 30)
    hooks = _FailingSecond()
    stop = asyncio.Event()
    async with AmqpSource(Endpoint.from_connection_string(broker.connection_string)) as ns:
        loop = ReceiveLoop(ns, "src", hooks, stop, max_batch=10, batches_in_flight=2)
        job = asyncio.create_task(loop.run())
        await until(lambda: hooks.calls >= 2)
        hooks.release.set()
        with pytest.raises(RuntimeError, match="the second batch failed"):
            await asyncio.wait_for(job, 20)
    assert len(hooks.handled) == 1 and len(hooks.handled[0]) == 10
    assert hooks.calls == 2, "a batch was taken after the failure"
