"""The broker's time: ``replication.clock`` (the clock below every layer that waits), here
where the broker and its tests import it from."""

from ..clock import SYSTEM, Clock, ManualClock, SystemClock, now_ms

__all__ = ["SYSTEM", "Clock", "ManualClock", "SystemClock", "now_ms"]
