"""The send retries' backoff, exactly: pauses on a ``ManualClock``, no sleeping.

A real target broker that is down (stopped: its port refuses connections) and comes back,
our AMQP sender with no retries of its own, ``send_ordered`` retrying with exponential
backoff and full jitter. The jitter's generator is seeded so each pause is known.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import pytest

import replication.tasks.sender as sender_module
from replication.clock import ManualClock
from replication.messages import Message
from replication.servicebus.client import SourceError
from replication.tasks.sender import SendPolicy, send_ordered
from replication.tasks.targets import SenderPool, Target
from tests.broker.conftest import BrokerHandle, make_config

pytestmark = pytest.mark.timeout(60)

SEED = 22


def jitter(caps: list[float]) -> object:
    """The pauses full jitter draws for these caps from the seeded generator (to the
    nanosecond: the clock adds and subtracts them)."""
    rng = random.Random(SEED)
    return pytest.approx([rng.uniform(0, cap) for cap in caps], abs=1e-9)


async def pauses_until(
    clock: ManualClock, done: asyncio.Future[object], on_pause: Callable[[int], None]
) -> list[float]:
    """Each pause the code under test takes on ``clock``, stepped over at once, until
    ``done``; ``on_pause(n)`` runs while the n-th pause (from 1) is being taken."""
    taken: list[float] = []
    deadline = time.monotonic() + 30
    while not done.done():
        if clock.sleeping:
            wake = clock.next_wake()
            assert wake is not None
            taken.append(wake)
            on_pause(len(taken))
            clock.advance(wake)
        assert time.monotonic() < deadline, f"no end after pauses {taken}"
        await asyncio.sleep(0.01)  # a connection attempt is real I/O
    return taken


async def test_a_refused_target_is_retried_with_doubling_jittered_pauses_until_it_is_back(
    broker_factory: Callable[..., BrokerHandle], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Backoff 1 s doubling up to 3 s, 5 attempts; the target is down for the first two
    attempts and back during the second pause: pauses of jitter(1 s), jitter(2 s), then the
    third attempt is accepted (and not one pause more)."""
    monkeypatch.setattr(sender_module, "random", random.Random(SEED))
    target = broker_factory(make_config({"dst": {}}))
    target.stop()  # down: its port refuses connections
    clock = ManualClock()
    pool = SenderPool({None: Target(target.connection_string, "dst")}, retry_total=0)
    policy = SendPolicy(attempts=5, backoff_initial=1.0, backoff_max=3.0)

    def back_in_the_second_pause(number: int) -> None:
        if number == 2:
            target.restart()

    try:
        sending = asyncio.ensure_future(
            send_ordered([Message(b"x", message_id="m-1")], pool, policy, clock=clock)
        )
        taken = await pauses_until(clock, sending, back_in_the_second_pause)
        result = await sending
    finally:
        await pool.close()
    assert result.errors == [None]
    assert taken == jitter([1.0, 2.0])
    assert target.message_ids("dst") == ["m-1"]


async def test_a_target_down_for_good_fails_after_the_attempts_with_capped_pauses(
    broker_factory: Callable[..., BrokerHandle], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five attempts, backoff 1 s doubling, capped at 3 s: four pauses drawn below 1, 2, 3
    and 3 s, then the refusal is the message's error."""
    monkeypatch.setattr(sender_module, "random", random.Random(SEED))
    target = broker_factory(make_config({"dst": {}}))
    target.stop()
    clock = ManualClock()
    pool = SenderPool({None: Target(target.connection_string, "dst")}, retry_total=0)
    policy = SendPolicy(attempts=5, backoff_initial=1.0, backoff_max=3.0)
    try:
        sending = asyncio.ensure_future(
            send_ordered([Message(b"x", message_id="m-1")], pool, policy, clock=clock)
        )
        taken = await pauses_until(clock, sending, lambda _: None)
        result = await sending
    finally:
        await pool.close()
    assert taken == jitter([1.0, 2.0, 3.0, 3.0])
    assert result.failed() == [0]
    error = result.errors[0]
    assert isinstance(error, SourceError) and error.retryable, error
    assert "ConnectionRefusedError" in str(error), error
