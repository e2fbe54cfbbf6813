"""A circuit breaker per target: an outage holds messages instead of spending their deliveries.

When a send to a target fails for good with an outage-like error (connection refused, timed
out, the namespace busy), abandoning the source messages would make Service Bus redeliver
them once per lock period and, after MaxDeliveryCount, dead-letter healthy messages. So the
target's breaker opens instead: every sender of that target waits (the source messages stay
locked, their locks kept by whoever holds them), and one waiter at a time probes with its
real send after a pause that doubles up to ``max_probe_interval``. The first send that gets
an answer closes the breaker and everyone sends again. A breaker that is ``stop``ped (the
runner shuts down) lets its waiters go with ``TargetUnavailable``.

Time is an input: ``clock`` and ``sleep`` are the breaker's, so tests drive it exactly.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger("replication.tasks.breaker")

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]
FIRST_PROBE_INTERVAL = 1.0
MAX_PROBE_INTERVAL = 30.0
"""Seconds to the first probe of an open breaker, and the most it waits between probes."""


class TargetUnavailable(ConnectionError):
    """The target stayed unreachable until the breaker was stopped (the runner shuts down)."""


class Breaker:
    """One target's health as its senders saw it: closed (send) or open (wait, probe)."""

    def __init__(
        self,
        name: str,
        *,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        first_probe_interval: float = FIRST_PROBE_INTERVAL,
        max_probe_interval: float = MAX_PROBE_INTERVAL,
    ) -> None:
        self.name = name
        self.clock = clock
        self.sleep = sleep
        self.first_probe_interval = first_probe_interval
        self.max_probe_interval = max_probe_interval
        self.opened_at: float | None = None
        """When the current outage was noticed (None: closed)."""
        self.last_error: BaseException | None = None
        self.trips = 0
        """Outages seen (for metrics and tests)."""
        self._interval = first_probe_interval
        self._next_probe = 0.0
        self._probing = False
        self._stopped = False
        self._changed = asyncio.Event()

    @property
    def is_open(self) -> bool:
        return self.opened_at is not None

    def trip(self, error: BaseException) -> None:
        """A send failed for good with an outage: hold this target's messages from now on."""
        self.last_error = error
        if self.opened_at is None:
            self.opened_at = self.clock()
            self.trips += 1
            self._interval = self.first_probe_interval
            log.warning(
                "target %s is unreachable (%r): holding its messages, probing every %g-%g s",
                self.name,
                error,
                self.first_probe_interval,
                self.max_probe_interval,
            )
        self._probe_failed()

    def answered(self) -> None:
        """A send got an answer (accepted, or refused for a reason of its own): reachable."""
        if self.opened_at is not None:
            log.warning(
                "target %s is reachable again after %.1f s",
                self.name,
                self.clock() - self.opened_at,
            )
            self.opened_at = None
            self.last_error = None
        self._probing = False
        self._wake()

    def failed(self, error: BaseException) -> None:
        """A probe failed with an outage error: wait longer before the next one."""
        self.last_error = error
        self._probe_failed()

    def gave_up(self) -> None:
        """The prober was cancelled before its send got an answer: someone else probes
        (else every sender of this target would wait for a probe that never ends)."""
        self._probing = False
        self._wake()

    def stop(self) -> None:
        """Lets every waiter go (``TargetUnavailable``): the runner is shutting down."""
        self._stopped = True
        self._wake()

    async def turn(self) -> None:
        """Returns when the caller may send: at once while closed; while open, when the
        breaker closed or when it is this caller's turn to probe."""
        while self.opened_at is not None:
            if self._stopped:
                raise TargetUnavailable(
                    f"target {self.name} unreachable since "
                    f"{self.clock() - self.opened_at:.1f} s: {self.last_error!r}"
                )
            wait = self._next_probe - self.clock()
            if not self._probing and wait <= 0:
                self._probing = True
                return
            changed = asyncio.ensure_future(self._changed.wait())
            pause = asyncio.ensure_future(
                self.sleep(max(wait, 0.0) if not self._probing else self.max_probe_interval)
            )
            try:
                await asyncio.wait({changed, pause}, return_when=asyncio.FIRST_COMPLETED)
            finally:  # cancelled, not awaited: awaiting one could swallow our own cancel
                changed.cancel()
                pause.cancel()

    def _probe_failed(self) -> None:
        self._probing = False
        self._next_probe = self.clock() + self._interval
        self._interval = min(self._interval * 2, self.max_probe_interval)
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


class Breakers:
    """The breakers of one runner's targets, made on first use (keyed by target name)."""

    def __init__(
        self,
        *,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        first_probe_interval: float = FIRST_PROBE_INTERVAL,
        max_probe_interval: float = MAX_PROBE_INTERVAL,
    ) -> None:
        self._make = functools.partial(
            Breaker,
            clock=clock,
            sleep=sleep,
            first_probe_interval=first_probe_interval,
            max_probe_interval=max_probe_interval,
        )
        self._breakers: dict[str | None, Breaker] = {}
        self._stopped = False

    def __call__(self, target: str | None) -> Breaker:
        breaker = self._breakers.get(target)
        if breaker is None:
            name = "(default target)" if target is None else target
            breaker = self._breakers[target] = self._make(name)
            if self._stopped:  # first used by a batch still finishing after stop
                breaker.stop()
        return breaker

    def open(self) -> list[Breaker]:
        return [b for b in self._breakers.values() if b.is_open]

    def stop(self) -> None:
        """Stops every breaker, and those made from now on."""
        self._stopped = True
        for breaker in self._breakers.values():
            breaker.stop()
