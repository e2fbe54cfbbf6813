"""Keeps the peek-locks of what a receiver holds, so slow work costs no delivery.

A message's lock runs from its arrival: in the prefetch buffer, in a batch a function or a
task is working on, in a batch that waits for an unreachable target. Letting it lapse makes
Service Bus deliver the message again (a duplicate, a delivery counted and, after
MaxDeliveryCount, a healthy message dead-lettered). ``LockKeeper`` renews, with one
``renew-lock`` request per round, the lock of every message its receiver holds (taken and
not settled, or still unread in the prefetch buffer) when half of its lock time is gone;
a session receiver renews its session lock instead. Work handed to someone else may be
limited (``max_duration``: host.json ``maxAutoLockRenewalDuration``); the buffer never is.
An ``SdkReceiver`` (``backend: sdk``) is kept the same way, renewing through the SDK (one
call per message); the SDK does not show its prefetch buffer, so only a session lock
covers that.

Time is an input: ``clock`` (Unix seconds, the clock lock expiries are written in) and
``sleep`` are the keeper's.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..messages import Message
from ..servicebus import sdk_source
from ..servicebus.client import AmqpConnection, SourceError
from ..servicebus.management import Management, lock_key
from ..servicebus.sdk_source import SdkManagement, SdkReceiver, SourceReceiver

log = logging.getLogger("replication.tasks.locks")

FIRST_RENEWAL = 2.5
"""Seconds after arrival when a lock of unknown expiry is renewed (Service Bus's shortest
LockDuration is 5 s)."""
IDLE_LOOK = 1.0
"""How often the prefetch buffer is looked at for new arrivals."""

_managements: weakref.WeakKeyDictionary[AmqpConnection, Management] = weakref.WeakKeyDictionary()


def management_for(connection: AmqpConnection) -> Management:
    """One ``$management`` client per connection (its links are opened per entity)."""
    management = _managements.get(connection)
    if management is None:
        management = _managements[connection] = Management(connection)
    return management


def management_of(receiver: SourceReceiver) -> Management | SdkManagement:
    """Where ``receiver``'s locks are renewed: ``$management`` on its connection, or the
    SDK receiver's own calls (``backend: sdk``)."""
    if isinstance(receiver, SdkReceiver):
        return receiver.management
    return management_for(receiver.connection)


async def renew_on(
    management: Management | SdkManagement, receiver: SourceReceiver, messages: list[Message]
) -> datetime:
    """Renews ``messages``' locks (none: the session lock) through ``management``, which
    ``management_of(receiver)`` paired with the receiver's backend."""
    renew: Callable[[Any, list[Message]], Awaitable[datetime]] = management.renew_locks
    return await renew(receiver, messages)


def held_key(message: Message) -> bytes | None:
    """The lock of a message from either backend's receiver (its delivery tag)."""
    return lock_key(message) or sdk_source.lock_key(message)


@dataclass(slots=True)
class _Held:
    message: Message
    since: float
    renewed: float
    until: float
    limited: bool

    @property
    def renew_at(self) -> float:
        return self.renewed + (self.until - self.renewed) / 2


class LockKeeper:
    """Renews the locks of one receiver's held messages until they are settled."""

    def __init__(
        self,
        receiver: SourceReceiver,
        *,
        max_duration: float | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        management: Management | SdkManagement | None = None,
    ) -> None:
        self.receiver = receiver
        self.max_duration = max_duration
        self.clock = clock
        self.sleep = sleep
        self.management = management or management_of(receiver)
        self.renewals = 0
        """Renew requests that succeeded (for tests and metrics)."""
        self._held: dict[bytes, _Held] = {}
        """By lock (the delivery tag: computing lock tokens cost 15 µs a message)."""
        self._session_renewed = clock()
        locked = receiver.session_locked_until
        self._session_until = locked.timestamp() if locked else self._session_renewed + 5.0
        self._session_given_up = False
        self._changed = asyncio.Event()
        self._wake_at = 0.0
        """When the running keeper looks next: a hold whose renewal falls later needs no
        wake-up (a batch a few milliseconds apart would otherwise wake it each time)."""
        self._task: asyncio.Task[None] | None = None

    # -- what is held

    def hold(self, messages: Iterable[Message], *, limited: bool = True) -> None:
        """Keeps these messages' locks (``limited``: for at most ``max_duration``)."""
        now = self.clock()
        first = float("inf")
        unknown = now + 2 * FIRST_RENEWAL
        locked, until = None, unknown  # the last expiry read: a batch's mostly share one
        for message in messages:
            token = held_key(message)
            if token is None:
                continue
            held = self._held.get(token)
            if held is None:
                if message.locked_until is not locked:
                    locked = message.locked_until
                    until = _seconds(locked, unknown)
                held = self._held[token] = _Held(message, now, now, until, limited)
            else:
                held.limited = limited
                held.since = now
            renew_at = held.renew_at
            if renew_at < first:
                first = renew_at
        if first < self._wake_at or self._session_given_up:
            self._wake()

    def settled(self, messages: Iterable[Message]) -> None:
        """No longer held (settled, or given up)."""
        for message in messages:
            token = held_key(message)
            if token is not None:
                self._held.pop(token, None)

    @property
    def held(self) -> int:
        return len(self._held)

    # -- running

    def start(self) -> LockKeeper:
        self._task = asyncio.create_task(self.run(), name=f"locks {self.receiver.path}")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                if _cancelling():  # the caller is being cancelled too: let that through
                    raise

    async def __aenter__(self) -> LockKeeper:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def run(self) -> None:
        """Renews what is due, then sleeps until the next renewal (or a new arrival)."""
        while self.receiver.is_open:
            self._look_at_buffer()
            now = self.clock()
            try:
                if self.receiver.session_id is not None:
                    next_at = await self._keep_session(now)
                else:
                    next_at = await self._keep_messages(now)
            except SourceError as exc:  # the link or connection is gone: the locks with it
                log.warning("renewing locks on %s failed: %s", self.receiver.path, exc)
                next_at = now + IDLE_LOOK
            except Exception:  # a keeper that died would let every lock lapse: go on
                log.exception("renewing locks on %s failed", self.receiver.path)
                next_at = now + IDLE_LOOK
            self._wake_at = min(next_at, now + IDLE_LOOK)
            await self._wait(self._wake_at - now)
            self._wake_at = 0.0  # looking now: whatever is held meanwhile is seen

    def _look_at_buffer(self) -> None:
        unread = [m for m in self.receiver.unread() if held_key(m) not in self._held]
        if unread:
            self.hold(unread, limited=False)

    async def _keep_session(self, now: float) -> float:
        """The session lock covers its messages, held or prefetched. With ``max_duration``
        it is no longer renewed while a batch has been held for longer than that (as the
        message locks of a plain receiver would lapse)."""
        renew_at = self._session_renewed + (self._session_until - self._session_renewed) / 2
        overdue = self._overdue(now)
        if overdue is not None:
            if not self._session_given_up:
                self._session_given_up = True
                log.info(
                    "%s: session %r no longer renewed (%s held %.0f s, "
                    "maxAutoLockRenewalDuration %g s)",
                    self.receiver.path,
                    self.receiver.session_id,
                    overdue.message.message_id,
                    now - overdue.since,
                    self.max_duration,
                )
            return now + IDLE_LOOK
        self._session_given_up = False
        if now >= renew_at:
            until = await renew_on(self.management, self.receiver, [])
            self._session_renewed, self._session_until = now, until.timestamp()
            self.receiver.session_locked_until = until
            self.renewals += 1
            renew_at = now + (self._session_until - now) / 2
        return renew_at

    def _overdue(self, now: float) -> _Held | None:
        """A held message whose renewal time (``max_duration``) is up, if any."""
        return next((held for held in self._held.values() if self._expired(held, now)), None)

    def _expired(self, held: _Held, now: float) -> bool:
        """Handed on for longer than ``max_duration``: its lock is no longer renewed."""
        return (
            self.max_duration is not None
            and held.limited
            and (now - held.since > self.max_duration)
        )

    async def _keep_messages(self, now: float) -> float:
        for token, held in list(self._held.items()):
            if self._expired(held, now):
                log.info(
                    "%s: lock of %s no longer renewed (held %.0f s, "
                    "maxAutoLockRenewalDuration %g s)",
                    self.receiver.path,
                    held.message.message_id,
                    now - held.since,
                    self.max_duration,
                )
                del self._held[token]
        due = [t for t, h in self._held.items() if h.renew_at <= now]
        if due:
            await self._renew(due, now)
        return min((h.renew_at for h in self._held.values()), default=now + IDLE_LOOK)

    async def _renew(self, tokens: list[bytes], now: float) -> None:
        tokens = [t for t in tokens if t in self._held]  # settled while a request was out
        if not tokens:
            return
        messages = [self._held[t].message for t in tokens]
        try:
            until = await renew_on(self.management, self.receiver, messages)
        except SourceError as exc:
            if exc.retryable and not lock_lost(exc):
                raise
            if len(tokens) > 1:  # one lost lock fails the whole request: one at a time
                for token in tokens:
                    await self._renew([token], now)
                return
            log.info(
                "%s: the lock of %s is lost (%s)", self.receiver.path, messages[0].message_id, exc
            )
            self._held.pop(tokens[0], None)
            return
        self.renewals += 1
        for token in tokens:
            held = self._held.get(token)
            if held is not None:
                held.renewed, held.until = now, max(until.timestamp(), now + 1.0)

    async def _wait(self, seconds: float) -> None:
        """Until ``seconds`` passed or something was held. The helpers are cancelled, not
        awaited: awaiting one while ``stop`` cancels this task would swallow that cancel
        (the helper's CancelledError is the one that arrives), and the keeper ran on."""
        changed = asyncio.ensure_future(self._changed.wait())
        pause = asyncio.ensure_future(self.sleep(max(seconds, 0.0)))
        try:
            await asyncio.wait({changed, pause}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
            pause.cancel()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _seconds(value: datetime | None, default: float) -> float:
    return value.timestamp() if value is not None else default


def lock_lost(error: SourceError) -> bool:
    """The answer Service Bus gives for a lock (or session) that is gone."""
    text = f"{error.condition or ''} {error}".lower()
    return "lock" in text or "410" in text or "not-found" in text
