"""Locks and outages in the task pump (issue 18): a batch in flight keeps its locks.

Real brokers, the real SDK, the pump on the test's loop. A batch whose send takes longer
than the source's LockDuration (5 s) is not delivered again (AMQP backend with its
``LockKeeper``, plain and session sources, and the SDK backend with ``AutoLockRenewer``);
a target broker SIGKILLed during a steady stream holds the batch in flight (the breaker)
instead of spending its deliveries; ``Breaker`` on a fake clock; ``LockKeeper`` alone.

Delivery counts are the AMQP header's ``delivery-count``, 0 on a first delivery (Service
Bus's ``DeliveryCount`` 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient

from replication.amqp.client import ReceivedMessage
from replication.clock import ManualClock
from replication.messages import Message
from replication.servicebus.client import AmqpSource
from replication.servicebus.management import lock_token
from replication.tasks.breaker import Breaker, Breakers, TargetUnavailable
from replication.tasks.locks import LockKeeper
from replication.tasks.pump import PumpStats, Source, pump
from replication.tasks.sender import SenderFor, SendPolicy
from replication.tasks.steps import BoundStep, StepOptions
from replication.tasks.targets import SenderPool, Target
from replication.tasks.task import ReplicationTask
from tests.broker.conftest import (
    BrokerHandle,
    BrokerProcess,
    QuickCloseClient,
    connection_string,
    make_config,
    receive_n,
    take_all,
)
from tests.clock_steps import step, ticking
from tests.ports import unused_port
from tests.waiting import until

pytestmark = pytest.mark.timeout(180)

LOCK = {"LockDuration": "PT5S", "MaxDeliveryCount": 3}
SLOW = 12.0
"""How long the slow batch's send takes on a ``ManualClock``: more than two lock periods."""
SLOW_REAL = 6.0
"""The same in real time (the smoke test): a second longer than a lock period (5 s, the
least Service Bus allows), so the first batch's locks are renewed at least once or lapse."""


# ---------------------------------------------------------------------- helpers


class Running:
    """A pump running in the background: its counts, and waiting that fails if it died."""

    def __init__(self, job: asyncio.Task[PumpStats], stats: PumpStats) -> None:
        self.job = job
        self.stats = stats

    async def until(self, predicate: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.job.done():
                self.job.result()  # raises what ended the pump
                raise AssertionError("the pump stopped")
            assert time.monotonic() < deadline, f"timed out; pump: {self.stats}"
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def running(
    task: ReplicationTask,
    source_connection: str | AsyncServiceBusClient,
    source: Source,
    sender_for: SenderFor,
    **options: Any,
) -> AsyncIterator[Running]:
    stop = asyncio.Event()
    stats = PumpStats()
    job = asyncio.create_task(
        pump(task, source_connection, source, sender_for, stop, stats=stats, **options)
    )
    try:
        yield Running(job, stats)
    finally:
        stop.set()
        await asyncio.wait_for(job, 30)


class SlowFirstBatch:
    """A ``sender_for`` whose first use takes ``delay`` seconds (a slow step or target), on
    ``clock`` when given."""

    def __init__(self, pool: SenderPool, delay: float, clock: ManualClock | None = None) -> None:
        self.pool = pool
        self.delay = delay
        self.clock = clock
        self.slowed = False
        self.slept = False

    @contextlib.asynccontextmanager
    async def __call__(self, name: str | None) -> AsyncIterator[Any]:
        if not self.slowed:
            self.slowed = True
            await (self.clock.sleep if self.clock else asyncio.sleep)(self.delay)
            self.slept = True
        async with self.pool(name) as sender:
            yield sender


def recording(seen: list[tuple[str | None, int | None]]) -> BoundStep:
    """A step that notes (message-id, delivery count) of every message the pump processes."""

    def note(message: Message) -> list[Message]:
        seen.append((message.message_id, message.delivery_count))
        return [message]

    return BoundStep("record", StepOptions(), note)


def send(broker: BrokerHandle, queue: str, messages: list[ServiceBusMessage]) -> None:
    with broker.client() as client, client.get_queue_sender(queue) as sender:
        sender.send_messages(messages)


def receive_all(connection: str, queue: str, session_id: str | None = None) -> list[Any]:
    with (
        QuickCloseClient.from_connection_string(connection) as client,
        client.get_queue_receiver(queue, session_id=session_id, prefetch_count=100) as receiver,
    ):
        return take_all(receiver)


def dead_lettered(broker: BrokerHandle, queue: str) -> int:
    return broker.count(f"{queue}/$DeadLetterQueue")


# ---------------------------------------------------------------------- a slow batch


@pytest.mark.parametrize(
    ("backend", "sessions", "real_time"),
    [
        ("amqp", False, False),
        ("amqp", True, False),
        ("sdk", False, False),
        ("sdk", True, False),
        ("sdk", False, True),
    ],
    ids=["amqp-plain", "amqp-session", "sdk-plain", "sdk-session", "sdk-plain-real-time"],
)
@pytest.mark.slow
async def test_slow_batch_keeps_its_locks(
    broker_factory: Callable[..., BrokerHandle], backend: str, sessions: bool, real_time: bool
) -> None:
    """The first batch's send takes 12 s, the source's LockDuration is 5 s: every message
    is processed once, with its first delivery, arrives at the target once (in session
    order), and the source ends empty with nothing dead-lettered.

    The broker, the pump (its ``LockKeeper``) and the slow send share a ``ManualClock``,
    stepped a second at a time (``step_clock``). One case is the real-time smoke test
    (6 s, what it measures: the keeper renewing on real time, and the SDK, which judges
    a message's lock by the real time, settling and renewing it after its first expiry).

    AMQP: 3 batches' worth (max_batch 5, prefetch 10 waiting behind the slow batch, or
    three sessions of 5 with 2 workers), so the prefetch buffer's locks are kept too. SDK:
    what the SDK prefetches is not renewable (see ``pump``), so each receiver's messages
    fit its first batch."""
    sessions_queue = {"RequiresSession": True} if sessions else {}
    config = make_config({"src": {**LOCK, **sessions_queue}, "dst": sessions_queue})
    # a minute ahead of the real time: the SDK judges locks by the real time, and the clock
    # stands still while the test sets up
    clock = None if real_time else ManualClock(time.time() + 60)
    broker = broker_factory(config, clock=clock)
    groups = ["a", "b", "c"] if sessions else ["m"]
    per_group = 5 if sessions else (15 if backend == "amqp" else 5)
    max_batch = 5 if backend == "amqp" else 10
    messages = [
        ServiceBusMessage(f"{g}:{i}", message_id=f"{g}-{i}", session_id=g if sessions else None)
        for g in groups
        for i in range(per_group)
    ]
    send(broker, "src", messages)
    cs = broker.connection_string
    seen: list[tuple[str | None, int | None]] = []
    task = ReplicationTask("slow", steps=[recording(seen)])
    pool = SenderPool({None: Target(cs, "dst")})
    slow = SlowFirstBatch(pool, SLOW_REAL if real_time else SLOW, clock)
    # the SDK retries "no session available" with backoff (~15 s to stop): not here
    client = AsyncServiceBusClient.from_connection_string(cs, retry_total=0)
    on_clock = {} if clock is None else {"clock": clock}
    stopping = asyncio.Event()

    def needs_time() -> bool:
        """The slow send, and stopping (a session worker waits for the next session on the
        broker's clock)."""
        return (slow.slowed and not slow.slept) or stopping.is_set()

    try:
        async with (
            contextlib.nullcontext() if clock is None else ticking(broker, "src", needs_time),
            running(
                task,
                client if backend == "sdk" else cs,
                Source("src", sessions=sessions),
                slow,
                backend=backend,
                max_batch=max_batch,
                session_workers=2,
                **on_clock,
            ) as run,
        ):
            await run.until(lambda: run.stats.completed == len(messages), timeout=90)
            await asyncio.sleep(1)  # time for a redelivery to show, were there one
            stopping.set()
    finally:
        await pool.close()
        await client.close()
    assert slow.slowed
    assert run.stats.received == len(messages), run.stats
    assert (run.stats.abandoned, run.stats.dead_lettered) == (0, 0)
    assert sorted(m for m, _ in seen) == sorted(str(m.message_id) for m in messages)
    assert {count for _, count in seen} == {0}, seen
    arrived = []
    for group in groups if sessions else [None]:
        got = await asyncio.to_thread(receive_all, cs, "dst", group)
        if group is not None:
            assert [m.message_id for m in got] == [f"{group}-{i}" for i in range(per_group)]
        arrived += got
    assert Counter(m.message_id for m in arrived) == Counter(m.message_id for m in messages)
    assert broker.count("src") == 0
    assert dead_lettered(broker, "src") == 0


async def test_a_slow_batch_is_not_overtaken_by_the_next(
    broker_factory: Callable[..., BrokerHandle],
) -> None:
    """A plain source's first batch takes a second longer to send: the batches behind it
    wait, so the target gets the messages in the order they were read (one batch in flight
    per receiver; two would let the next overtake a slow one)."""
    broker = broker_factory(make_config({"src": {}, "dst": {}}))
    sent = [ServiceBusMessage(f"{i}", message_id=f"m-{i}") for i in range(20)]
    send(broker, "src", sent)
    cs = broker.connection_string
    pool = SenderPool({None: Target(cs, "dst")})
    slow = SlowFirstBatch(pool, 1.0)
    try:
        async with running(ReplicationTask("in-order"), cs, Source("src"), slow,
                           backend="amqp", max_batch=5) as run:  # fmt: skip
            await run.until(lambda: run.stats.completed == len(sent))
    finally:
        await pool.close()
    got = await asyncio.to_thread(receive_all, cs, "dst")
    assert [m.message_id for m in got] == [m.message_id for m in sent]


async def test_an_sdk_session_pump_with_no_session_stops_at_once(
    broker_factory: Callable[..., BrokerHandle],
) -> None:
    """With the SDK's default retries, asking for the next session when there is none took
    about 20 s of backoff before the worker saw ``stop``; it asks without them now."""
    broker = broker_factory(make_config({"src": {"RequiresSession": True}, "dst": {}}))
    client = AsyncServiceBusClient.from_connection_string(broker.connection_string)
    pool = SenderPool({None: Target(broker.connection_string, "dst")})
    stop = asyncio.Event()
    job = asyncio.create_task(pump(
        ReplicationTask("idle"), client, Source("src", sessions=True), pool, stop,
        backend="sdk", max_wait=1.0, session_workers=1,
    ))  # fmt: skip
    try:
        await asyncio.sleep(2.5)  # a few rounds of "no session available"
        stop.set()
        await asyncio.wait_for(job, 6)  # was ~20 s: TimeoutError
    finally:
        job.cancel()
        await pool.close()
        await client.close()


@pytest.mark.parametrize("backend", ["amqp", "sdk"])
async def test_a_stop_does_not_wait_out_a_receive(
    broker_factory: Callable[..., BrokerHandle], backend: str
) -> None:
    """One batch at a time from an empty queue, each receive waiting up to an hour for a
    message: ``stop`` ends the receive in progress (a host's stop took its
    ``sessionIdleTimeout`` before)."""
    broker = broker_factory(make_config({"src": {}, "dst": {}}))
    client = AsyncServiceBusClient.from_connection_string(broker.connection_string)
    pool = SenderPool({None: Target(broker.connection_string, "dst")})
    stop = asyncio.Event()
    job = asyncio.create_task(
        pump(
            ReplicationTask("idle"),
            client if backend == "sdk" else broker.connection_string,
            Source("src"),
            pool,
            stop,
            backend=backend,
            max_wait=3600,
            batches_in_flight=1,
            session_workers=1,
        )
    )

    def receiving() -> bool:
        assert broker.broker is not None
        return any(peer.consumers for peer in broker.broker.peers.values())

    try:
        await until(lambda: broker.call(receiving) or job.done(), "a receiver on src")
        stop.set()
        await asyncio.wait_for(job, 30)  # was an hour: TimeoutError
    finally:
        job.cancel()
        await pool.close()
        await client.close()


# ---------------------------------------------------------------------- a target outage


async def test_target_outage_holds_the_batch(
    broker_factory: Callable[..., BrokerHandle],
    broker_process: Callable[..., BrokerProcess],
    record_property: Callable[[str, object], None],
) -> None:
    """A steady stream (10 msgs/s) into a source with LockDuration 5 s and MaxDeliveryCount
    3; the target broker (its own process) is SIGKILLed for 100 s, 20 lock periods (the
    issue's figure), almost seven times what MaxDeliveryCount allows, then restarted on its
    port with its data: every message is at the target, each was delivered once (no lock
    ran out), nothing was abandoned or dead-lettered, the source ends empty.

    The source broker and the pump (lock keeper, send retries, breaker probes) share a
    ``ManualClock``: the 100 s pass in steps of a second, each once the keeper renewed
    what was about to run out (``step``). The stream, the kill and the restart are real.
    Sends fail fast (no SDK retries, 2 attempts) so the breaker opens at once and probes
    every 1, 2, 4 s (capped at 4 s here, so the end comes soon after the restart)."""
    clock = ManualClock()
    source = broker_factory(make_config({"src": LOCK}), clock=clock)
    target = broker_process(make_config({"dst": {}}))
    sent: list[str] = []
    streaming = asyncio.Event()
    streaming.set()

    async def stream() -> None:
        async with (
            AsyncServiceBusClient.from_connection_string(source.connection_string) as client,
            client.get_queue_sender("src") as sender,
        ):
            while streaming.is_set():
                message_id = f"m-{len(sent)}"
                await sender.send_messages(ServiceBusMessage(message_id, message_id=message_id))
                sent.append(message_id)
                await asyncio.sleep(0.1)

    seen: list[tuple[str | None, int | None]] = []
    task = ReplicationTask(
        "outage", steps=[recording(seen)],
        policy=SendPolicy(attempts=2, backoff_initial=0.1, backoff_max=0.5),
    )  # fmt: skip
    pool = SenderPool({None: Target(target.connection_string, "dst")}, retry_total=0)
    breakers = Breakers(clock=clock.monotonic, sleep=clock.sleep, max_probe_interval=4.0)
    recovering = asyncio.Event()
    feeder = asyncio.create_task(stream())
    try:
        async with (
            ticking(source, "src", recovering.is_set),
            running(task, source.connection_string, Source("src"), pool, max_batch=20,
                    breakers=breakers, clock=clock) as run,
        ):  # fmt: skip
            await run.until(lambda: run.stats.completed >= 20)
            await asyncio.to_thread(target.kill)
            for _ in range(100):
                await step(source, "src")
            assert breakers(None).is_open, "the outage was not noticed"
            assert run.stats.abandoned == 0
            await asyncio.to_thread(target.start)
            recovering.set()  # the breaker's next probe, on the clock, finds it back
            await run.until(lambda: not breakers(None).is_open)
            streaming.clear()
            await feeder
            await run.until(lambda: source.count("src") == 0, timeout=60)
    finally:
        streaming.clear()
        await asyncio.gather(feeder, return_exceptions=True)
        await pool.close()
    arrived = Counter(
        m.message_id
        for m in await asyncio.to_thread(receive_all, connection_string(target.port), "dst")
    )
    assert set(arrived) == set(sent), f"lost: {sorted(set(sent) - set(arrived))}"
    duplicates = sum(arrived.values()) - len(arrived)  # allowed (at-least-once), counted
    record_property("sent", len(sent))
    record_property("duplicates", duplicates)
    logging.getLogger(__name__).info("outage: %d sent, %d duplicates", len(sent), duplicates)
    assert breakers(None).trips >= 1 and not breakers(None).is_open
    assert {count for _, count in seen} == {0}, "a lock ran out: delivered again"
    assert run.stats.abandoned == 0 and run.stats.dead_lettered == 0
    assert dead_lettered(source, "src") == 0
    assert source.count("src") == 0


@pytest.mark.parametrize(
    ("backend", "sessions"),
    [("amqp", False), ("amqp", True), ("sdk", False), ("sdk", True)],
    ids=["amqp-plain", "amqp-session", "sdk-plain", "sdk-session"],
)
async def test_stop_during_an_outage_gives_the_held_batch_back(
    broker_factory: Callable[..., BrokerHandle], backend: str, sessions: bool
) -> None:
    """The target never answers (nobody listens on its port); the pump stops while its
    batch waits for the breaker: the batch is given back without a delivery counted
    (released; an SDK session receiver leaves it to go back with the session), and the
    session is free again. An SDK plain receiver cannot release: it abandons (one delivery
    counted, as documented in ``pump``)."""
    broker = broker_factory(make_config({"src": {**LOCK, "RequiresSession": sessions}}))
    session_id = "s" if sessions else None
    send(
        broker,
        "src",
        [ServiceBusMessage(f"{i}", message_id=f"r-{i}", session_id=session_id) for i in range(5)],
    )
    task = ReplicationTask("down", policy=SendPolicy(attempts=1))
    pool = SenderPool({None: Target(connection_string(unused_port()), "dst")}, retry_total=0)
    breakers = Breakers()
    client = AsyncServiceBusClient.from_connection_string(broker.connection_string, retry_total=0)
    try:
        async with running(
            task, client, Source("src", sessions=sessions), pool, breakers=breakers, backend=backend
        ) as run:
            await run.until(lambda: breakers(None).is_open and run.stats.received == 5)
    finally:
        await pool.close()
        await client.close()
    abandons = backend == "sdk" and not sessions
    given_back = (0, 5) if abandons else (5, 0)
    assert (run.stats.released, run.stats.abandoned, run.stats.completed) == (*given_back, 0)
    with (
        broker.client() as sync_client,
        sync_client.get_queue_receiver("src", session_id=session_id, max_wait_time=5) as receiver,
    ):
        back = receive_n(receiver, 5)
        assert sorted(m.message_id for m in back) == [f"r-{i}" for i in range(5)]
        assert {m.delivery_count for m in back} == {1 if abandons else 0}
        for message in back:
            receiver.complete_message(message)
    assert dead_lettered(broker, "src") == 0


# ---------------------------------------------------------------------- Breaker, fake time


class FakeTime:
    """A clock and a sleep for the breaker: time moves only when ``advance`` says so."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._count = 0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        future = asyncio.get_running_loop().create_future()
        self._count += 1
        heapq.heappush(self._sleepers, (self.now + seconds, self._count, future))
        await future

    @staticmethod
    async def settle() -> None:
        """Lets every task run until it waits (nothing here waits on real time)."""
        for _ in range(50):
            await asyncio.sleep(0)

    async def advance(self) -> float:
        """Moves the clock to the next sleeper's wake-up time and wakes all that are due."""
        await self.settle()
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)  # cancelled: the breaker changed first
        assert self._sleepers, "nobody sleeps: everyone is stuck"
        self.now = max(self.now, self._sleepers[0][0])
        while self._sleepers and self._sleepers[0][0] <= self.now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)
        await self.settle()
        return self.now


async def test_breaker_probes_one_at_a_time_backing_off_then_releases_everyone() -> None:
    """Tripped at 0 s: one sender at a time probes, after pauses of 1, 2, 4, 8 s, then 8 s
    (the cap); the target is back at 40 s, so the probe at 47 s succeeds and the other
    waiting senders go at that very moment."""
    clock = FakeTime()
    breaker = Breaker("dst", clock=clock.clock, sleep=clock.sleep, max_probe_interval=8.0)
    attempts: list[tuple[float, int]] = []
    back_at = 40.0

    async def sender(number: int) -> float:
        """What ``send_ordered`` does with a breaker: wait for a turn, send, report."""
        while True:
            await breaker.turn()
            attempts.append((clock.now, number))
            if clock.now < back_at:
                breaker.failed(ConnectionError("connection refused"))
                continue
            breaker.answered()
            return clock.now

    breaker.trip(ConnectionError("connection refused"))
    senders = [asyncio.create_task(sender(n)) for n in range(3)]
    for _ in range(100):
        if all(s.done() for s in senders):
            break
        await clock.advance()
    done = [await s for s in senders]
    probes = [at for at, _ in attempts[:-2]]  # one sender at each time: one at a time
    assert probes == [1, 3, 7, 15, 23, 31, 39, 47]
    pauses = [later - earlier for earlier, later in zip([0.0, *probes], probes, strict=False)]
    assert pauses == [1, 2, 4, 8, 8, 8, 8, 8]
    assert done == [47, 47, 47]
    assert not breaker.is_open and breaker.trips == 1


async def test_breaker_closed_lets_senders_through_and_stop_releases_waiters() -> None:
    clock = FakeTime()
    breakers = Breakers(clock=clock.clock, sleep=clock.sleep)
    breaker = breakers("dst")
    await asyncio.wait_for(breaker.turn(), 1)  # closed: at once
    breaker.trip(ConnectionError("connection refused"))
    assert breakers.open() == [breaker]
    waiters = [asyncio.create_task(breaker.turn()) for _ in range(3)]
    await clock.advance()  # the 1 s pause is over: one of them probes, the others wait
    probing = [w for w in waiters if w.done()]
    assert len(probing) == 1
    breaker.failed(ConnectionError("connection refused"))
    await clock.settle()
    assert not any(w.done() for w in waiters if w not in probing)
    breakers.stop()
    await clock.settle()
    for waiter in waiters:
        if waiter in probing:
            continue
        with pytest.raises(TargetUnavailable, match=r"target dst unreachable since 1\.0 s"):
            await waiter
    with pytest.raises(TargetUnavailable, match="connection refused"):
        await breaker.turn()


async def test_breaker_waiter_can_be_cancelled_at_any_point() -> None:
    """A sender waiting for its turn ends when cancelled, however far it got after a wake-up
    (the same swallowed cancel as ``LockKeeper.stop``'s)."""
    for steps in range(12):
        clock = FakeTime()
        breaker = Breaker("dst", clock=clock.clock, sleep=clock.sleep)
        breaker.trip(ConnectionError("connection refused"))
        waiter = asyncio.create_task(breaker.turn())
        await clock.settle()
        breaker.failed(ConnectionError("connection refused"))  # wakes it up
        for _ in range(steps):
            await asyncio.sleep(0)
        waiter.cancel()
        await clock.settle()
        assert waiter.cancelled(), f"the waiter waited on after a cancel ({steps} steps)"


async def test_a_cancelled_probe_hands_the_probe_to_the_next_sender() -> None:
    """A prober cancelled before its send got an answer (an invocation ended by
    functionTimeout) must not leave the breaker waiting for it for ever."""
    from replication.tasks.sender import SendPolicy, _send_with_retries

    clock = FakeTime()
    breaker = Breaker("dst", clock=clock.clock, sleep=clock.sleep)
    breaker.trip(ConnectionError("connection refused"))
    hanging = asyncio.Event()

    class Hangs:
        async def send_messages(self, batch: object) -> None:
            await hanging.wait()

    class Answers:
        async def send_messages(self, batch: object) -> None:
            return None

    policy = SendPolicy(attempts=1)
    prober = asyncio.create_task(_send_with_retries(Hangs(), [], policy, "dst", breaker))
    await clock.advance()  # the first probe is due at 1 s: the prober takes it, and hangs
    other = asyncio.create_task(_send_with_retries(Answers(), [], policy, "dst", breaker))
    await clock.settle()
    assert not other.done()  # waits for the probe
    prober.cancel()
    await clock.settle()
    assert other.done() and other.result() is None
    assert not breaker.is_open


# ---------------------------------------------------------------------- LockKeeper


class FakeReceiver:
    """What ``LockKeeper`` reads of an ``AmqpReceiver``."""

    def __init__(self, session_id: str | None, locked_until: datetime | None) -> None:
        self.path = "q"
        self.is_open = True
        self.session_id = session_id
        self.session_locked_until = locked_until
        self.connection = None

    def unread(self) -> list[Message]:
        return []


class FakeManagement:
    """Renews every lock it is asked to for ``lock`` seconds, noting when."""

    def __init__(self, clock: FakeTime, lock: float = 5.0) -> None:
        self.clock = clock
        self.lock = lock
        self.renewed: list[tuple[float, list[str | None]]] = []

    async def renew_locks(self, receiver: Any, messages: Any) -> datetime:
        self.renewed.append((self.clock.now, [m.message_id for m in messages]))
        return datetime.fromtimestamp(self.clock.now + self.lock, UTC)


def locked_message(message_id: str, until: float) -> Message:
    message = Message(message_id=message_id, locked_until=datetime.fromtimestamp(until, UTC))
    delivery = SimpleNamespace(tag=uuid.uuid4().bytes_le)
    message.source = ReceivedMessage(message, delivery, None)
    return message


@pytest.mark.parametrize("sessions", [False, True], ids=["plain", "session"])
async def test_lock_keeper_renews_at_half_time_until_max_duration(sessions: bool) -> None:
    """Fake time from 1000 s, locks of 5 s: renewed when half the lock time is gone (2.5,
    5, 7.5, 10 s after the hold), and no more once the batch has been held for longer than
    ``max_duration`` (12 s; host.json ``maxAutoLockRenewalDuration``). A session receiver
    renews its session lock (the request names no message) on the same schedule."""
    clock = FakeTime()
    clock.now = 1000.0
    receiver = FakeReceiver("s" if sessions else None, datetime.fromtimestamp(1005, UTC))
    management = FakeManagement(clock)
    keeper = LockKeeper(
        receiver, max_duration=12.0, clock=clock.clock, sleep=clock.sleep, management=management
    )
    batch = [locked_message("a", 1005.0), locked_message("b", 1005.0)]
    keeper.start()
    keeper.hold(batch)
    while clock.now < 1030:
        await clock.advance()
    assert [at for at, _ in management.renewed] == [1002.5, 1005, 1007.5, 1010]
    asked = [] if sessions else ["a", "b"]
    assert all(ids == asked for _, ids in management.renewed)
    assert keeper.renewals == 4
    keeper.settled(batch)
    receiver.is_open = False
    await keeper.stop()


async def test_lock_keeper_renews_as_long_as_held_without_max_duration() -> None:
    clock = FakeTime()
    clock.now = 1000.0
    management = FakeManagement(clock)
    keeper = LockKeeper(
        FakeReceiver(None, None), clock=clock.clock, sleep=clock.sleep, management=management
    )
    batch = [locked_message("a", 1005.0)]
    async with keeper:
        keeper.hold(batch)
        while clock.now < 1100:
            await clock.advance()
        assert len(management.renewed) == 40  # every 2.5 s for 100 s
        keeper.settled(batch)
        while clock.now < 1110:
            await clock.advance()
        assert len(management.renewed) == 40
        assert keeper.held == 0


async def test_lock_keeper_stops_at_any_point_of_its_loop() -> None:
    """``stop`` ends the keeper however far it got after a wake-up (a cancel that came while
    it tidied up after one was swallowed, and the keeper ran on: a pump that never stopped)."""
    for steps in range(12):
        clock = FakeTime()
        clock.now = 1000.0
        keeper = LockKeeper(
            FakeReceiver(None, None),
            clock=clock.clock,
            sleep=clock.sleep,
            management=FakeManagement(clock),
        ).start()
        await clock.settle()
        keeper.hold([locked_message("a", 1005.0)])  # wakes it up
        for _ in range(steps):
            await asyncio.sleep(0)
        stopping = asyncio.create_task(keeper.stop())
        await clock.settle()  # nothing waits on real time: a keeper that stops is gone now
        assert stopping.done(), f"the keeper ran on after stop ({steps} steps after a wake)"
        await stopping


@pytest.mark.parametrize("sessions", [False, True], ids=["plain", "session"])
async def test_lock_keeper_keeps_held_and_prefetched_locks(
    broker_factory: Callable[..., BrokerHandle], sessions: bool
) -> None:
    """One message taken and held, two waiting in the prefetch buffer, for 8 s with a 5 s
    LockDuration on a ``ManualClock`` the broker and the keeper share: the keeper renewed
    (the message locks, or the session lock), the broker still holds the locks past their
    first expiry, and completing the three works; nothing came twice. Real-time renewal:
    ``test_slow_batch_keeps_its_locks``."""
    clock = ManualClock()
    broker = broker_factory(make_config({"q": {**LOCK, "RequiresSession": sessions}}), clock=clock)
    session_id = "s" if sessions else None
    send(
        broker,
        "q",
        [ServiceBusMessage(f"{i}", message_id=f"k-{i}", session_id=session_id) for i in range(3)],
    )
    async with AmqpSource.from_connection_string(broker.connection_string) as namespace:
        receiver = await namespace.receiver("q", prefetch=10, session=sessions, wait=5)
        try:
            held = await receiver.receive(1, 5)
            deadline = time.monotonic() + 5
            while len(receiver.unread()) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert [m.message_id for m in held] == ["k-0"] and len(receiver.unread()) == 2
            first_expiry = held[0].locked_until
            assert first_expiry is not None
            async with LockKeeper(receiver, clock=clock.time, sleep=clock.sleep) as keeper:
                keeper.hold(held)
                await until(lambda: clock.sleeping, "the keeper asleep")
                for second in range(8):  # the keeper looks once a second at most
                    await asyncio.to_thread(broker.advance, 1.0)  # expires what was not renewed
                    await until(
                        lambda: (clock.next_wake() or 0) > 0, f"the keeper asleep ({second})"
                    )
                assert keeper.renewals >= 2
                assert keeper.held == 3  # the batch and the buffer

                def lock_until() -> int:
                    assert broker.broker is not None
                    queue = broker.broker.queues["q"]
                    if sessions:
                        return queue.session_locks["s"].until_ms
                    return queue.locks[lock_token(held[0])].until_ms  # type: ignore[index]

                until_ms = broker.call(lock_until)
                assert until_ms / 1000 > first_expiry.timestamp() + 2.5
                assert until_ms / 1000 > clock.time()
                rest = await receiver.receive(10, 0.5)
                assert [m.message_id for m in rest] == ["k-1", "k-2"]
                everything = held + rest
                assert {m.delivery_count for m in everything} == {0}
                assert receiver.complete(everything) == 3
                keeper.settled(everything)
                assert keeper.held == 0
            deadline = time.monotonic() + 10
            while broker.count("q") and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert broker.count("q") == 0
            assert await receiver.receive(10, 0.5) == []
        finally:
            await receiver.close()
