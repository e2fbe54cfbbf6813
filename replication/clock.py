"""Time, given to whatever waits or expires: the broker (locks, TTL, schedules, session waits,
transaction timeouts, token grace, idle entities), the local host's triggers (retry pauses,
lock renewal) and failover (re-check intervals, cached resolutions).

``SystemClock`` is the real time. ``ManualClock`` moves only when told (``advance``), and
wakes what sleeps on it then, so a test of a five-second lock, a thirty-second re-check or a
ten-second retry pause advances the clock and looks, exactly and at once, instead of
sleeping. Network timeouts (a peer that never finishes its TLS handshake, an attach nobody
answers, a batch that waits for messages to arrive) stay on the event loop's own clock: they
guard sockets, not messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds since the epoch (what message times and locks are made of)."""
        ...

    def monotonic(self) -> float:
        """Seconds that only move forward (what waits and timeouts are measured in)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Returns once ``seconds`` have passed on this clock."""
        ...

    def blocking_sleep(self, seconds: float) -> None:
        """Blocks the calling thread until ``seconds`` have passed on this clock (synchronous
        code run in a worker thread: the DNS resolver's retries)."""
        ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def blocking_sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class ManualClock:
    """Stands still until ``advance``; starts at the real wall time (so what clients compute
    from the broker's timestamps still makes sense). ``advance`` may be called from another
    thread than the loops whose tasks sleep on it (a broker on its own thread), and threads
    may sleep on it too (``blocking_sleep``)."""

    def __init__(self, start: float | None = None) -> None:
        self._wall = time.time() if start is None else start
        self._monotonic = 1_000.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []
        self._blocked: list[float] = []
        """When each thread in ``blocking_sleep`` is due."""
        self._moved = threading.Condition()

    def time(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._monotonic

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        sleeper = (self._monotonic + seconds, asyncio.get_running_loop().create_future())
        self._sleepers.append(sleeper)
        try:
            await sleeper[1]
        finally:
            with contextlib.suppress(ValueError):
                self._sleepers.remove(sleeper)

    def blocking_sleep(self, seconds: float) -> None:
        with self._moved:
            due = self._monotonic + max(seconds, 0.0)
            self._blocked.append(due)
            try:
                while self._monotonic < due:
                    self._moved.wait()
            finally:
                self._blocked.remove(due)

    @property
    def sleeping(self) -> int:
        """Tasks and threads sleeping on this clock now (a test waits for the code to get
        there)."""
        return len(self._due())

    def next_wake(self) -> float | None:
        """Seconds until the first sleeper is due, or None when nobody sleeps."""
        due = self._due()
        return max(0.0, min(due) - self._monotonic) if due else None

    def wakes(self) -> list[float]:
        """Seconds until each sleeper is due, soonest first (a test waits for one of them
        to be asleep before it advances the clock past its time)."""
        return sorted(max(0.0, at - self._monotonic) for at in self._due())

    def _due(self) -> list[float]:
        with self._moved:
            threads = [at for at in self._blocked if at > self._monotonic]
        return [at for at, future in self._sleepers if not future.done()] + threads

    def advance(self, seconds: float) -> None:
        """Moves both clocks on and wakes the sleepers that are due (a task runs when its
        loop next gets to it, a thread at once)."""
        if seconds < 0:
            raise ValueError("time does not go back")
        with self._moved:
            self._wall += seconds
            self._monotonic += seconds
            self._moved.notify_all()
        for at, future in list(self._sleepers):
            if at <= self._monotonic and not future.done():
                future.get_loop().call_soon_threadsafe(_wake, future)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


SYSTEM = SystemClock()


def now_ms(clock: Clock) -> int:
    """The clock's wall time in milliseconds (the unit the store and the queues use)."""
    return int(clock.time() * 1000)


async def wait_event(event: asyncio.Event, seconds: float, clock: Clock = SYSTEM) -> bool:
    """Waits until ``event`` is set or ``seconds`` passed on ``clock``; True when it was set
    (a pause that ``stop`` cuts short)."""
    if event.is_set():
        return True
    waiting = asyncio.ensure_future(event.wait())
    pause = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait({waiting, pause}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
        pause.cancel()
    return event.is_set()
