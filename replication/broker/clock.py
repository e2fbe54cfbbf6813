"""The broker's time, given to it: lock expiry, TTL, scheduled messages, session waits,
transaction timeouts, token grace and idle entities all read it here.

``SystemClock`` is the real time. ``ManualClock`` moves only when told (``advance``), so a
test of a five-second lock or a one-second TTL advances the clock and looks, exactly and at
once, instead of sleeping. Network timeouts (a peer that never finishes its TLS handshake or
HTTP headers) stay on the event loop's own clock: they guard sockets, not messages.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds since the epoch (what message times and locks are made of)."""
        ...

    def monotonic(self) -> float:
        """Seconds that only move forward (what waits and timeouts are measured in)."""
        ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """Stands still until ``advance``; starts at the real wall time (so what clients compute
    from the broker's timestamps still makes sense)."""

    def __init__(self, start: float | None = None) -> None:
        self._wall = time.time() if start is None else start
        self._monotonic = 1_000.0

    def time(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time does not go back")
        self._wall += seconds
        self._monotonic += seconds


SYSTEM = SystemClock()


def now_ms(clock: Clock) -> int:
    """The clock's wall time in milliseconds (the unit the store and the queues use)."""
    return int(clock.time() * 1000)
