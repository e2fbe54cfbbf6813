"""The broker's time: ``replication.clock`` (the clock below every layer that waits), here
where the broker and its tests import it from."""

from __future__ import annotations

import time

from ..clock import SYSTEM, Clock, ManualClock, SystemClock
from ..clock import now_ms as clock_now_ms

__all__ = ["SYSTEM", "Clock", "ManualClock", "SystemClock", "now_ms"]


def now_ms(clock: Clock) -> int:
    """``replication.clock.now_ms``, compiled with the broker: it is read for every message
    sent, delivered and settled, and a call into the plain Python module (two frames for the
    system clock) cost more than the reading (issue 42)."""
    if clock is SYSTEM:
        return int(time.time() * 1000)
    return clock_now_ms(clock)
