"""Stepping a ``ManualClock`` that a broker and the code under test share, without letting
a lock run out that the code under test would have renewed in time.

The broker judges locks by the clock; a lock keeper renews them when half their time is
gone, over the network, which takes real time. ``step`` moves the clock only once every
lock at the queue outlives the step, so a renewal in flight is waited for; a keeper that
renews nothing lets its locks run out (after ``GIVE_UP``), and the test's counts show it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from replication.clock import ManualClock
from tests.broker.conftest import BrokerHandle

GIVE_UP = (10.0, 0.5)
"""Seconds of real time and of this process's CPU after which a renewal is given up on.
The keeper, the SDK and the broker run in this process: real time alone ran out before a
live keeper's renewal got its turn in a CI run beside two CPU burners (a step let a lock
run out: 102 receives of 40 messages). Half a CPU second is far more than a renewal takes,
so a keeper that renews nothing still shows in the counts."""


async def step(broker: BrokerHandle, queue: str) -> None:
    """Moves the broker's ``ManualClock`` on by a second, once no lock at ``queue`` would
    run out within it (see the module)."""
    clock = broker.clock
    assert isinstance(clock, ManualClock)

    def soonest() -> float:
        assert broker.broker is not None
        q = broker.broker.queues[queue]
        until = [lock.until_ms for lock in q.locks.values()]
        until += [lock.until_ms for lock in q.session_locks.values()]
        return min(until, default=float("inf")) / 1000 - clock.time()

    since = time.monotonic(), time.process_time()
    while await asyncio.to_thread(broker.call, soonest) <= 1.0:
        if time.monotonic() - since[0] > GIVE_UP[0] and time.process_time() - since[1] > GIVE_UP[1]:
            break
        await asyncio.sleep(0.01)
    await asyncio.to_thread(broker.advance, 1.0)
    await asyncio.sleep(0.01)  # the wake-ups run on this loop


@contextlib.asynccontextmanager
async def ticking(
    broker: BrokerHandle, queue: str, when: Callable[[], bool]
) -> AsyncIterator[None]:
    """``step``s the shared clock while the block runs and ``when()`` says so. Only then:
    clients judge some of the broker's times by their own clock (a token's grace period,
    for one)."""

    async def tick() -> None:
        while True:
            if when():
                await step(broker, queue)
            else:
                await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    try:
        yield
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
