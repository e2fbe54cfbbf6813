"""The drill's producer: one message at a time at a steady rate, each retried until accepted.

Message ``n`` is due ``n / rate`` seconds after the start (on the drill's clock) and is
sent then, or at once when an earlier one held the producer up (an outage): what a steady
source of orders does, so the figures say how long it was held up and where its messages
went. One send at a time, so which namespace accepted which message is known exactly
(``send`` says it), and the moment of each accept too. A failed attempt is tried again
after ``RETRY_PAUSE``; the failover client re-resolves on its errors, as it does for the
pipelines. What is still not accepted ``GIVE_UP_AFTER`` seconds past the end is reported
as never sent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ..clock import Clock
from ..messages import Message

log = logging.getLogger("replication.drill")

RETRY_PAUSE = 0.05
"""Seconds between the attempts at one message."""
GIVE_UP_AFTER = 10.0
"""Seconds past the end of the drill a message is still retried for."""

SendOne = Callable[[Message], Awaitable[str]]
"""Sends one message; returns the namespace (host) that accepted it, raises when none did."""


@dataclass(frozen=True, slots=True)
class Accepted:
    message_id: str
    namespace: str
    """The host of the namespace that accepted it (as the failover resolved it)."""
    sent_at: float
    """Wall time the accepted attempt began."""
    accepted_at: float
    """Wall time the accept came back."""
    elapsed: float
    """Seconds from the start of the drill to the accept (the clock's monotonic time)."""
    attempts: int


@dataclass(slots=True)
class Production:
    """What the producer was told, in the order it sent."""

    accepted: list[Accepted] = field(default_factory=list)
    unsent: list[str] = field(default_factory=list)
    """Message-ids made but never accepted (still failing when it gave up)."""


class Producer:
    def __init__(
        self,
        run_id: str,
        send: SendOne,
        clock: Clock,
        *,
        rate: float,
        duration: float,
        sessions: int = 0,
    ) -> None:
        if rate <= 0 or duration <= 0:
            raise ValueError("the rate and the duration must be more than 0")
        self.run_id = run_id
        self.send = send
        self.clock = clock
        self.rate = rate
        self.duration = duration
        self.sessions = sessions
        """Session ids to spread the messages over (0: none, for a queue without sessions)."""
        self.production = Production()

    def message(self, number: int) -> Message:
        """Message ``number``: its id and session say which drill and which place in it."""
        session = session_id(self.run_id, number % self.sessions) if self.sessions else None
        body = json.dumps({"drill": self.run_id, "number": number}).encode()
        return Message(
            body,
            message_id=message_id(self.run_id, number),
            session_id=session,
            content_type="application/json",
        )

    async def run(self, start: float) -> Production:
        """Produces from ``start`` (the clock's monotonic time) for ``duration`` seconds."""
        give_up = start + self.duration + GIVE_UP_AFTER
        number = 0
        while (due := number / self.rate) < self.duration:
            wait = start + due - self.clock.monotonic()
            if wait > 0:
                await self.clock.sleep(wait)
            await self._deliver(self.message(number), start, give_up)
            number += 1
        return self.production

    async def _deliver(self, message: Message, start: float, give_up: float) -> None:
        assert message.message_id is not None
        attempts = 0
        while True:
            attempts += 1
            sent_at = self.clock.time()
            try:
                namespace = await self.send(message)
            except Exception as exc:
                if self.clock.monotonic() >= give_up:
                    log.warning(
                        "drill: %s not accepted after %d attempts (%s)",
                        message.message_id,
                        attempts,
                        exc,
                    )
                    self.production.unsent.append(message.message_id)
                    return
                log.debug("drill: %s attempt %d failed: %s", message.message_id, attempts, exc)
                await self.clock.sleep(RETRY_PAUSE)
                continue
            self.production.accepted.append(
                Accepted(
                    message.message_id,
                    namespace,
                    sent_at,
                    self.clock.time(),
                    self.clock.monotonic() - start,
                    attempts,
                )
            )
            return


def message_id(run_id: str, number: int) -> str:
    return f"drill-{run_id}-{number:06d}"


def session_id(run_id: str, index: int) -> str:
    return f"drill-{run_id}-s{index}"


def id_prefix(run_id: str) -> str:
    """What every message-id of the run starts with (``inventory`` keeps only those)."""
    return f"drill-{run_id}-"
