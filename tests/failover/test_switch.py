"""Failing over in the middle of a stream: real brokers standing for sb1 and sb2, a real DNS
server (or a real file), the real SDK, the task library's pump.

Nothing may be lost: every message ends up in sb1 or sb2 at least once (duplicates are
allowed where a batch was sent but its acknowledgement was lost in the switch).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage

from replication import metrics
from replication.clock import ManualClock
from replication.failover import HOST_MAP_SETTING, FailoverSpec
from replication.tasks.breaker import Breakers
from replication.tasks.pump import PumpStats, Source, pump
from replication.tasks.sender import SendPolicy
from replication.tasks.targets import SenderPool, Target
from replication.tasks.task import ReplicationTask
from tests.broker.conftest import BrokerHandle, make_config

pytestmark = pytest.mark.timeout(180)

COUNT = 5000
ALIAS = "servicebus.test.example.com"
SB1 = "sb1-test-example-com.servicebus.windows.net"
SB2 = "sb2-test-example-com.servicebus.windows.net"
CONFIG = make_config({"src": {}, "dst": {}})


def fill(broker: BrokerHandle, queue: str, ids: list[str]) -> None:
    with broker.client() as client, client.get_queue_sender(queue) as sender:
        for start in range(0, len(ids), 250):
            sender.send_messages([ServiceBusMessage(b"x" * 64, message_id=i)
                                  for i in ids[start : start + 250]])  # fmt: skip


async def wait_until(predicate: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(predicate):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


def host_map(sb1: BrokerHandle, sb2: BrokerHandle) -> dict[str, str]:
    return {HOST_MAP_SETTING: f"{SB1}=127.0.0.1:{sb1.port};{SB2}=127.0.0.1:{sb2.port}"}


class HoldAfter:
    """A ``sender_for`` whose sends after the first ``batches`` wait until ``until()`` (the
    pump replicates faster than a DNS re-check: without this it could drain sb1 first)."""

    def __init__(self, pool: SenderPool, batches: int, until: Callable[[], bool]) -> None:
        self.pool, self.batches, self.until, self.calls = pool, batches, until, 0

    @contextlib.asynccontextmanager
    async def __call__(self, name: str | None) -> AsyncIterator[Any]:
        self.calls += 1
        while self.calls > self.batches and not self.until():
            await asyncio.sleep(0.05)
        async with self.pool(name) as sender:
            yield sender


async def replicate_through_flip(
    src: BrokerHandle, sb1: BrokerHandle, spec: FailoverSpec, settings: dict[str, str],
    flip: Callable[[], None], hold: float = 0.0,
) -> int:  # fmt: skip
    """Replicates src/src to the failover target (starting on sb1), calls ``flip`` once a
    tenth of the stream arrived, runs until the source is empty; returns the switches.
    ``hold``: seconds the sends lent after the flip wait (a target's failover re-checks on
    a send once its interval has passed: a pump that moves the rest of the stream faster
    than that would leave nothing to send once it does)."""
    failover = spec.build("stream/target", sb1.connection_string, settings)
    pool = SenderPool({None: Target(sb1.connection_string, "dst", failover)})
    flipped_at: list[float] = []
    held = HoldAfter(pool, COUNT, lambda: time.monotonic() >= flipped_at[0] + hold)
    stop = asyncio.Event()
    job = asyncio.create_task(
        pump(ReplicationTask("stream"), src.connection_string, Source("src"), held, stop)
    )
    try:
        await wait_until(lambda: sb1.count("dst") >= COUNT // 10)
        flip()
        flipped_at.append(time.monotonic())
        held.batches = held.calls
        await wait_until(lambda: src.count("src") == 0)
    finally:
        stop.set()
        await asyncio.wait_for(job, 30)
        await pool.close()
    return failover.switches


def check_nothing_lost(first: list[str | None], second: list[str | None]) -> None:
    expected = {f"m-{i}" for i in range(COUNT)}
    assert expected - set(first) - set(second) == set()
    assert second, "replication did not continue on sb2"
    assert f"m-{COUNT - 1}" in second  # the end of the stream went to sb2
    assert len(set(first) | set(second)) == COUNT


async def test_a_cname_flip_mid_stream_moves_replication_to_sb2(
    broker_factory: Callable[..., BrokerHandle], dns_server: object
) -> None:
    """A planned failover: sb1 stays up, the periodic re-check sees the new CNAME."""
    src, sb1, sb2 = (broker_factory(CONFIG) for _ in range(3))
    fill(src, "src", [f"m-{i}" for i in range(COUNT)])
    spec = FailoverSpec.model_validate({
        "dns": {"alias": ALIAS, "nameserver": dns_server.address, "timeout": 1},  # type: ignore[attr-defined]
        "recheck_interval": 0.3,
    })  # fmt: skip
    # TTL 0: the flip is seen at the next re-check, however fast the stream runs
    dns_server.set_cname(ALIAS, "sb1.test.example.com", ttl=0)  # type: ignore[attr-defined]
    before = metrics.FAILOVERS.labels("stream/target").value()

    def flip() -> None:
        dns_server.set_cname(ALIAS, "sb2.test.example.com", ttl=0)  # type: ignore[attr-defined]

    switches = await replicate_through_flip(src, sb1, spec, host_map(sb1, sb2), flip, hold=0.3)
    assert switches == 1
    assert metrics.FAILOVERS.labels("stream/target").value() == before + 1
    check_nothing_lost(sb1.message_ids("dst"), sb2.message_ids("dst"))


async def test_a_file_flip_with_sb1_gone_moves_replication_to_sb2(
    broker_factory: Callable[..., BrokerHandle], tmp_path: Path
) -> None:
    """An outage: sb1 stops, sends fail with connection refused, the file says sb2."""
    src, sb1, sb2 = (broker_factory(CONFIG) for _ in range(3))
    fill(src, "src", [f"m-{i}" for i in range(COUNT)])
    primary = tmp_path / "share" / "primary.txt"
    primary.parent.mkdir()
    primary.write_text(f"# the primary namespace\n{SB1}\n")
    spec = FailoverSpec.model_validate({"file": {"path": str(primary)}, "recheck_interval": 60})

    def flip() -> None:
        primary.write_text(f"# failed over\n{SB2}\n")
        sb1.stop()

    switches = await replicate_through_flip(src, sb1, spec, host_map(sb1, sb2), flip)
    assert switches == 1
    sb1.restart()
    check_nothing_lost(sb1.message_ids("dst"), sb2.message_ids("dst"))


async def test_a_failover_source_finishes_its_batch_then_reads_sb2(
    broker_factory: Callable[..., BrokerHandle], dns_server: object
) -> None:
    """Consumers fail over too: the pump reads the alias; after the flip it settles what it
    holds on sb1 and goes on with sb2's messages. What it left on sb1 is still there (its
    sends wait for the switch after the first five batches, so some are left)."""
    sb1, sb2, dst = (broker_factory(CONFIG) for _ in range(3))
    half = 3 * COUNT // 5
    fill(sb1, "src", [f"m-{i}" for i in range(half)])
    fill(sb2, "src", [f"m-{i}" for i in range(half, COUNT)])
    dns_server.set_cname(ALIAS, "sb1.test.example.com", ttl=0)  # type: ignore[attr-defined]
    spec = FailoverSpec.model_validate({
        "dns": {"alias": ALIAS, "nameserver": dns_server.address, "timeout": 1},  # type: ignore[attr-defined]
        "recheck_interval": 0.3,
    })  # fmt: skip
    source = spec.build("stream/source", sb1.connection_string, host_map(sb1, sb2))
    pool = SenderPool({None: Target(dst.connection_string, "dst")})
    held = HoldAfter(pool, 5, lambda: source.switches >= 1)
    stop = asyncio.Event()
    job = asyncio.create_task(pump(ReplicationTask("stream"), source, Source("src"), held, stop))
    try:
        await wait_until(lambda: dst.count("dst") >= COUNT // 10)
        dns_server.set_cname(ALIAS, "sb2.test.example.com", ttl=1)  # type: ignore[attr-defined]
        await wait_until(lambda: sb2.count("src") == 0)
    finally:
        stop.set()
        await asyncio.wait_for(job, 30)
        await pool.close()
    assert source.switches == 1
    copied = set(dst.message_ids("dst"))
    left_on_sb1 = set(sb1.message_ids("src"))
    assert {f"m-{i}" for i in range(half, COUNT)} <= copied
    assert {f"m-{i}" for i in range(half)} <= copied | left_on_sb1
    assert left_on_sb1, "the flip came after sb1 was drained: the test proves nothing"


@pytest.fixture
def silent_dns() -> Iterator[str]:
    """A DNS server address that never answers (a bound UDP socket nobody reads)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{sock.getsockname()[1]}"


async def test_a_dead_dns_server_is_retried_never_a_crash_and_loses_nothing(
    broker_factory: Callable[..., BrokerHandle], silent_dns: str,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Source and target behind a DNS server that does not answer: the pump keeps trying
    (warnings say why), sends fail as retryable, and every message stays at the source.

    The source's failover runs on a ``ManualClock``: each resolution is three questions
    that time out (0.1 s each, the socket's real time) with pauses of 0.2 and 0.4 s
    between them, then the pump waits 1 s and resolves again, exactly, three times."""
    src, sb1 = (broker_factory(CONFIG) for _ in range(2))
    fill(src, "src", [f"m-{i}" for i in range(20)])
    spec = FailoverSpec.model_validate(
        {"dns": {"alias": ALIAS, "nameserver": silent_dns, "timeout": 0.1}}
    )
    # a failover source that cannot resolve: no crash, just warnings and retries
    clock = ManualClock()
    source = spec.build("dead/source", src.connection_string, clock=clock)
    pool = SenderPool({None: Target(sb1.connection_string, "dst")})
    stop = asyncio.Event()
    job = asyncio.create_task(
        pump(ReplicationTask("dead"), source, Source("src"), pool, stop, clock=clock)
    )
    pauses: list[float] = []
    deadline = time.monotonic() + 30
    while caplog.text.count("dead/source: cannot resolve") < 3:
        assert not job.done(), job
        assert time.monotonic() < deadline, f"pauses so far: {pauses}"
        wake = clock.next_wake()
        if wake is not None:
            pauses.append(round(wake, 6))
            clock.advance(wake)
        await asyncio.sleep(0.005)  # a question is real I/O
    assert pauses == [0.2, 0.4, 1.0, 0.2, 0.4, 1.0, 0.2, 0.4]
    assert not job.done()
    stop.set()
    await asyncio.wait_for(job, 10)
    assert "dead/source: cannot resolve (no answer from DNS server" in caplog.text
    # a failover target that cannot resolve: its breaker opens and holds the batch (nothing
    # abandoned, no delivery spent); stopping gives the batch back: nothing is lost
    target = spec.build("dead/target", sb1.connection_string)
    pool = SenderPool({None: Target(sb1.connection_string, "dst", target)})
    stop = asyncio.Event()
    task = ReplicationTask("dead", policy=SendPolicy(attempts=2, backoff_initial=0.01))
    stats = PumpStats()
    breakers = Breakers()
    job = asyncio.create_task(pump(task, src.connection_string, Source("src"), pool, stop,
                                   stats=stats, breakers=breakers))  # fmt: skip
    await wait_until(lambda: breakers(None).is_open and stats.received > 0, timeout=30)
    stop.set()
    await asyncio.wait_for(job, 10)
    await pool.close()
    assert (stats.completed, stats.abandoned) == (0, 0)
    assert stats.released == stats.received
    assert sorted(src.message_ids("src")) == sorted(f"m-{i}" for i in range(20))
    assert sb1.count("dst") == 0
