"""The recovery point at a source, measured on a real broker with the real SDK.

The broker and the probe share one ``ManualClock`` that starts on a whole second, so the
broker's millisecond stamps are exact and the age the probe reports is exactly the time the
test let pass since the oldest message was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusMessage
from prometheus_client import generate_latest

from replication import metrics
from replication.clock import ManualClock
from replication.failover import Failover
from replication.failover.base import Resolution
from replication.ncrontab import parse_schedule
from replication.tasks.pump import PumpStats, Source, pump
from replication.tasks.recovery_point import RecoveryPoint, RecoveryPointProbe
from replication.tasks.targets import SenderPool, Target
from replication.tasks.task import ReplicationTask
from tests.broker.conftest import BrokerHandle, make_config
from tests.waiting import until

pytestmark = pytest.mark.timeout(120)

CONFIG = make_config(
    {"src": {}, "dst": {}},
    topics={"events": {"Subscriptions": {"router": {}}}},
)
LISTEN_KEY, SEND_KEY = "bGlzdGVuLW9ubHkta2V5LWZvci10ZXN0cw==", "c2VuZC1vbmx5LWtleQ=="
LISTEN_ONLY = make_config(
    {"src": {}},
    rules=[
        {"Name": "listen", "Key": LISTEN_KEY, "Rights": ["Listen"]},
        {"Name": "send", "Key": SEND_KEY, "Rights": ["Send"]},
    ],
)


def exact_clock() -> ManualClock:
    """Near the real time (the SDK checks lock expiries against it), on a whole second."""
    return ManualClock(start=float(round(time.time())))


def send(broker: BrokerHandle, queue: str, *ids: str) -> None:
    with broker.client() as client, client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(i, message_id=i) for i in ids])


def gauges(pipeline: str, source: str) -> tuple[float, float]:
    return (
        metrics.RPO_SECONDS.labels(pipeline, source).value(),
        metrics.RPO_MESSAGES.labels(pipeline, source).value(),
    )


@contextlib.asynccontextmanager
async def pumping(
    broker: BrokerHandle, pipeline: str, clock: ManualClock, **options: object
) -> AsyncIterator[PumpStats]:
    """The pipeline ``src`` -> ``dst`` running (the task pump)."""
    stop, stats = asyncio.Event(), PumpStats()
    pool = SenderPool({None: Target(broker.connection_string, "dst")})
    task = ReplicationTask(f"{pipeline}-function", pipeline=pipeline)
    job = asyncio.create_task(
        pump(
            task,
            broker.connection_string,
            Source("src"),
            pool,
            stop,
            stats=stats,
            clock=clock,
            **options,
        )  # type: ignore[arg-type]
    )
    try:
        yield stats
    finally:
        stop.set()
        await asyncio.wait_for(job, 30)
        await pool.close()


async def test_rpo_is_the_age_of_the_oldest_unreplicated_message_and_0_once_drained(
    broker_factory: Callable[..., BrokerHandle],
) -> None:
    """A stopped pipeline: eight messages wait, the first sent 42.125 s ago; the probe says
    exactly that, /metrics shows it, and after the pipeline drained the source: 0 and 0."""
    clock = exact_clock()
    broker = broker_factory(CONFIG, clock=clock)
    send(broker, "src", *(f"old-{i}" for i in range(5)))
    broker.advance(40.0)
    send(broker, "src", "new-0", "new-1", "new-2")
    broker.advance(2.125)
    probe = RecoveryPointProbe("rpo-drain", "src", None, broker.connection_string, clock=clock)
    try:
        point = await probe.record()
        assert point == RecoveryPoint(42.125, 8, at_least=False, counted_by="management")
        assert gauges("rpo-drain", "src") == (42.125, 8)
        exposed = generate_latest(metrics.REGISTRY).decode()
        assert 'replication_rpo_seconds{pipeline="rpo-drain",source="src"} 42.125' in exposed
        assert 'replication_rpo_messages{pipeline="rpo-drain",source="src"} 8.0' in exposed

        async with pumping(broker, "rpo-drain", clock) as stats:
            await until(lambda: stats.completed == 8, "the pipeline drained the source")
        assert broker.count("dst") == 8
        assert await probe.record() == RecoveryPoint(0.0, 0, False, "management")
        assert gauges("rpo-drain", "src") == (0.0, 0)
    finally:
        await probe.close()


async def test_a_scheduled_message_does_not_count_and_peeking_stops_at_its_limit(
    broker_factory: Callable[..., BrokerHandle],
) -> None:
    """A queue's peek shows a scheduled message (first in sequence here); it is not there
    yet, so neither count includes it. Counted by peeking, a count that reaches the limit is
    a lower bound."""
    clock = exact_clock()
    broker = broker_factory(CONFIG, clock=clock)
    with broker.client() as client, client.get_queue_sender("src") as sender:
        later = ServiceBusMessage("later", message_id="later")
        sender.schedule_messages(later, datetime.now(UTC) + timedelta(hours=1))
    broker.advance(1.0)
    send(broker, "src", *(f"m{i}" for i in range(7)))
    broker.advance(3.5)
    connection = broker.connection_string

    def probe(**options: object) -> RecoveryPointProbe:
        return RecoveryPointProbe("rpo-peek", "src", None, connection, clock=clock, **options)  # type: ignore[arg-type]

    probes = [probe(), probe(count="peek"), probe(count="peek", peek_limit=5)]
    try:
        points = [await p.measure() for p in probes]
    finally:
        for p in probes:
            await p.close()
    assert points == [
        RecoveryPoint(3.5, 7, at_least=False, counted_by="management"),
        RecoveryPoint(3.5, 7, at_least=False, counted_by="peek"),
        RecoveryPoint(3.5, 4, at_least=True, counted_by="peek"),  # 5 peeked, one scheduled
    ]


async def test_an_expired_message_does_not_count_even_before_the_broker_removes_it(
    broker_factory: Callable[..., BrokerHandle],
) -> None:
    """Its time to live ran out: it goes at the next receive whatever anyone does, so losing
    the source would lose nothing of it (a peek may still show it until then)."""
    clock = exact_clock()
    broker = broker_factory(CONFIG, clock=clock)
    with broker.client() as client, client.get_queue_sender("src") as sender:
        sender.send_messages(ServiceBusMessage("brief", time_to_live=timedelta(seconds=5)))
    broker.advance(2.0)
    send(broker, "src", "lasting")
    clock.advance(8.0)  # not swept: the broker still holds the expired one
    probe = RecoveryPointProbe(
        "rpo-ttl", "src", None, broker.connection_string, clock=clock, count="peek"
    )
    try:
        assert await probe.measure() == RecoveryPoint(8.0, 1, False, "peek")
    finally:
        await probe.close()


async def test_a_subscription_counts_what_waits_what_is_locked_and_what_is_deferred(
    broker_factory: Callable[..., BrokerHandle],
) -> None:
    """Locked and deferred messages are not replicated (a deferred one never will be by the
    pipeline: it is lost with the source); a scheduled one is not there yet (a topic keeps
    it until its time). Both ways of counting agree."""
    clock = exact_clock()
    broker = broker_factory(CONFIG, clock=clock)
    with broker.client() as client:
        with client.get_topic_sender("events") as sender:
            sender.schedule_messages(
                ServiceBusMessage("later", message_id="later"),
                datetime.now(UTC) + timedelta(hours=1),
            )
            sender.send_messages([ServiceBusMessage(i, message_id=i) for i in ("a", "b")])
        broker.advance(1.0)
        with client.get_subscription_receiver("events", "router") as receiver:
            (first,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            receiver.defer_message(first)
            broker.advance(9.0)
            (held,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            assert held.message_id == "b"  # locked by this receiver while probed
            points = []
            for count in ("auto", "peek"):
                probe = RecoveryPointProbe(
                    "rpo-sub",
                    "events",
                    "router",
                    broker.connection_string,
                    clock=clock,
                    count=count,  # type: ignore[arg-type]
                )
                try:
                    points.append(await probe.record())
                finally:
                    await probe.close()
            receiver.complete_message(held)
    assert points == [
        RecoveryPoint(10.0, 2, False, "management"),
        RecoveryPoint(10.0, 2, False, "peek"),
    ]
    assert gauges("rpo-sub", "events/subscriptions/router") == (10.0, 2)


async def test_without_the_manage_right_the_probe_counts_by_peeking(
    broker_factory: Callable[..., BrokerHandle], caplog: pytest.LogCaptureFixture
) -> None:
    clock = exact_clock()
    broker = broker_factory(LISTEN_ONLY, clock=clock)
    listen = broker.connection_string_for("listen", LISTEN_KEY)
    sending = broker.connection_string_for("send", SEND_KEY)
    with broker.client(conn_str=sending) as client, client.get_queue_sender("src") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(3)])
    broker.advance(5.0)
    caplog.set_level(logging.WARNING, "replication.tasks.recovery_point")
    auto = RecoveryPointProbe("rpo-listen", "src", None, listen, clock=clock)
    insisting = RecoveryPointProbe(
        "rpo-listen-api", "src", None, listen, clock=clock, count="management"
    )
    try:
        assert await auto.record() == RecoveryPoint(5.0, 3, False, "peek")
        assert await auto.record() == RecoveryPoint(5.0, 3, False, "peek")
        warned = [r.getMessage() for r in caplog.records if "no Manage right" in r.getMessage()]
        assert len(warned) == 1  # asked once, then it counts by peeking
        assert await insisting.record() is None  # refused: the gauges keep what they had
        assert ("rpo-listen-api", "src") not in metrics.RPO_SECONDS.values()
        assert any("cannot probe src" in r.getMessage() for r in caplog.records)
    finally:
        await auto.close()
        await insisting.close()


class Switchable:
    """A resolver whose answer the test moves (a DNS alias flipped by an operator)."""

    def __init__(self, host: str) -> None:
        self.host = host

    def resolve(self) -> Resolution:
        return Resolution(self.host)

    def invalidate(self) -> None:
        pass

    def describe(self) -> str:
        return f"switchable {self.host}"


async def test_the_probe_reads_where_the_failover_resolves_now(
    broker_factory: Callable[..., BrokerHandle],
) -> None:
    clock = exact_clock()
    primary = broker_factory(CONFIG, clock=clock)
    secondary = broker_factory(CONFIG, clock=clock)
    send(primary, "src", "p1", "p2", "p3")
    primary.advance(4.0)  # one clock: both brokers see it
    send(secondary, "src", "s1")
    primary.advance(1.0)
    resolver = Switchable("primary.example")
    hosts = {
        "primary.example": f"127.0.0.1:{primary.port}",
        "secondary.example": f"127.0.0.1:{secondary.port}",
    }
    failover = Failover(
        "rpo/source",
        resolver,
        primary.connection_string,
        host_map=hosts,
        recheck_interval=30.0,
        clock=clock,
    )
    probe = RecoveryPointProbe("rpo-failover", "src", None, failover, clock=clock)
    try:
        assert await probe.record() == RecoveryPoint(5.0, 3, False, "management")
        resolver.host = "secondary.example"
        await failover.recheck(force=True)
        assert await probe.record() == RecoveryPoint(1.0, 1, False, "management")
    finally:
        await probe.close()


async def test_the_pump_probes_its_source_on_the_schedule(
    broker_factory: Callable[..., BrokerHandle],
) -> None:
    """A deferred message is at the source for good (the pump cannot receive it): the pump's
    probe reports it at start and again at each occurrence of its schedule on the clock."""
    clock = exact_clock()
    start = clock.time()
    broker = broker_factory(CONFIG, clock=clock)
    send(broker, "src", "stuck")
    with broker.client() as client, client.get_queue_receiver("src") as receiver:
        (stuck,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        receiver.defer_message(stuck)
    broker.advance(2.0)
    every_ten = parse_schedule("*/10 * * * * *")
    async with pumping(broker, "rpo-pump", clock, rpo_schedule=every_ten):
        await until(lambda: gauges("rpo-pump", "src") == (2.0, 1), "the probe at start")
        due = every_ten.next_after(clock.time())
        wait = due - clock.time()
        await until(lambda: any(abs(w - wait) < 1e-6 for w in clock.wakes()), "probe asleep")
        broker.advance(due - clock.time())
        await until(lambda: gauges("rpo-pump", "src") == (due - start, 1), "the next probe")
