"""The ``servicebus`` data source on an executor: receive, yield rows, hold until the commit.

``read_assignment`` is what ``read(assignment)`` runs in a Spark Python worker (README
"(b)"). On the worker's loop (``worker.run_async``) and its connection to the namespace
(``worker.source_for``) it opens a peek-lock receiver, or accepts up to ``sessions``
next-available sessions, and receives up to the assignment's share (waiting ``max_wait``
for the first message, then taking what follows within ``FOLLOW_UP_WAIT``); a
``LockKeeper`` per receiver renews the message locks, or the session lock, from then on.
The receivers then stop asking for more (no credit; what was prefetched is released), the
read registers with the driver's commit service (``commits.py``, address in the
assignment), and yields one row per message (``rows.to_row``).

When Spark has taken every row, the receivers and their unsettled messages stay with a
holder: a task on the worker's loop, alive between Spark's tasks because Spark reuses
Python workers. It long-polls the commit service for its ``{run, batch}``:

- ``committed``: completes the messages on the link that received them, closes it (a
  session receiver gives its session back);
- ``release`` or ``unknown`` (another attempt of the slot registered too, a newer run, a
  batch that ended without a commit), or the service unreachable for one lock duration:
  closes the link, which gives the messages back without counting a delivery.

If the task stops taking rows (it failed, or was cancelled), the read gives its messages
back at once and unregisters. A session is held until the commit, so no other task reads
it before the messages in hand are settled, and what comes back comes first, in order.
``Trigger.AvailableNow``: messages enqueued after the cutoff are released untouched.

Why this is not ``tasks.receiving.ReceiveLoop``: that loop hands each batch to a handler that
settles it before the next receive; a read here receives its share once and *holds* every
message, unsettled, past the end of the Spark task, until the driver's verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import os
import uuid
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..clock import SYSTEM, Clock
from ..messages import Message
from ..servicebus.client import (
    AmqpReceiver,
    AmqpSource,
    MessageLockLost,
    SessionLockLost,
    SourceError,
)
from ..tasks.locks import LockKeeper
from .assignment import Assignment
from .commits import COMMITTED, OPEN, UNKNOWN
from .options import Options
from .rows import to_row
from .worker import next_sessions, run_async, source_for

log = logging.getLogger("replication.spark")

FOLLOW_UP_WAIT = 0.2
"""Seconds a read that has messages waits for more before it ends."""
LONG_POLL = 10.0
"""Seconds one verdict request may wait at the service."""
REGISTER_FOR = 10.0
"""Seconds a read tries to reach the commit service before it gives its messages back."""
DEFAULT_LOCK = 30.0
"""Seconds of unreachable service a holder tolerates when the lock duration is unknown."""
UNREACHABLE = "unreachable"
LINKS_LOST = "links lost"

_CALLS = ThreadPoolExecutor(max_workers=32, thread_name_prefix="servicebus-commits")
"""Blocking HTTP calls to the commit service (long polls: not the loop's default pool)."""
_HOLDING: set[asyncio.Task[None]] = set()
"""This worker's holders (a reference each, so they are not collected while they wait)."""


class CommitServiceUnreachable(RuntimeError):
    """The driver's commit service could not be reached (or did not know the batch)."""


@dataclass
class _Held:
    receiver: AmqpReceiver
    keeper: LockKeeper
    messages: list[Message] = field(default_factory=list)


class Reading:
    """One task attempt's read of an assignment: its receivers, messages and registration."""

    def __init__(self, options: Options, assignment: Assignment, clock: Clock = SYSTEM) -> None:
        """``clock``: what the lock renewals, the registration's retries and the holder's
        patience with an unreachable service are timed by."""
        if not assignment.commit_service:
            raise ValueError("an assignment of the servicebus source names its commit service")
        self.options = options
        self.assignment = assignment
        self.clock = clock
        self.holder = uuid.uuid4().hex
        self.held: list[_Held] = []
        self.remaining = assignment.max_messages
        self.prefetch = max(1, min(options.prefetch, assignment.max_messages))
        self.lock_duration = DEFAULT_LOCK
        self._lock_known = False
        self.late = 0
        self.errors = 0

    @property
    def messages(self) -> list[Message]:
        return [m for held in self.held for m in held.messages]

    @property
    def path_of_holder(self) -> str:
        a = self.assignment
        return f"/{a.run}/{a.batch}/{a.slot}/{self.holder}"

    # ------------------------------------------------------------------ receiving

    async def receive(self) -> None:
        """Receives the share, stops the receivers' credit, registers (see the module);
        gives everything back and raises when the commit service says no or cannot be
        reached, or the source cannot be read at all."""
        source = source_for(self.options.connection_string)
        try:
            if self.assignment.sessions:
                try:
                    async with asyncio.TaskGroup() as slots:
                        for _ in range(self.assignment.sessions):
                            slots.create_task(self._session_slot(source))
                except BaseExceptionGroup as group:  # a slot's error, not a group of one
                    raise group.exceptions[0] from None
            else:
                await self._plain(source)
            for held in self.held:
                _stop_credit(held.receiver)
            await self._register()
        except BaseException:
            await self.give_back()
            raise

    async def _plain(self, source: AmqpSource) -> None:
        try:
            receiver = await source.receiver(self.assignment.path, prefetch=self.prefetch)
        except SourceError as exc:
            self._failed(exc, "cannot receive from")
            return
        await self._drain(self._keep(receiver), self.assignment.max_wait)

    async def _session_slot(self, source: AmqpSource) -> None:
        """Accepts next-available sessions one after another while the share lasts; each
        session that gave messages is held until the commit."""
        if self.remaining <= 0:
            return
        path, wait = self.assignment.path, self.assignment.max_wait
        sessions = next_sessions(source, path, self.prefetch, wait, self._failed)
        async with contextlib.aclosing(sessions):
            async for receiver in sessions:
                held = self._keep(receiver)
                late = await self._drain(held, self.assignment.max_wait)
                if not held.messages:
                    await self._drop(held)
                if late or self.remaining <= 0:
                    return  # late: the rest of it is too

    def _keep(self, receiver: AmqpReceiver) -> _Held:
        keeper = LockKeeper(receiver, clock=self.clock.time, sleep=self.clock.sleep)
        held = _Held(receiver, keeper.start())
        self.held.append(held)
        return held

    async def _drain(self, held: _Held, wait: float) -> bool:
        """Receives on one receiver until the share is taken or nothing more comes; True
        when it ended on a message enqueued after the cutoff."""
        receiver = held.receiver
        while self.remaining > 0:
            want = min(self.remaining, self.prefetch)
            self.remaining -= want  # reserved: session slots receive side by side
            receiver.link.credit = min(self.prefetch, self.remaining)  # top-ups: no more
            batch: list[Message] = []
            try:
                batch = await receiver.receive(want, wait)
            except SourceError as exc:
                self._failed(exc, "receiving failed on")
                await self._drop(held)  # what it held comes again
                return False
            finally:
                self.remaining += want - len(batch)
            if not batch:
                return False
            wait = FOLLOW_UP_WAIT
            if not held.messages:
                self._learn_lock_duration(receiver, batch[0])
            cutoff = self.assignment.cutoff
            late = [m for m in batch if cutoff is not None and _after(m, cutoff)]
            if late:
                gone = {id(m) for m in late}
                batch = [m for m in batch if id(m) not in gone]
                self.late += receiver.release(late)
                self.remaining += len(late)
            held.messages += batch
            held.keeper.hold(batch, limited=False)
            if late:
                return True
        return False

    def _learn_lock_duration(self, receiver: AmqpReceiver, first: Message) -> None:
        """The entity's lock duration, about: what is left of a fresh lock."""
        until = receiver.session_locked_until or first.locked_until
        if until is not None and not self._lock_known:
            self._lock_known = True
            self.lock_duration = max(5.0, until.timestamp() - self.clock.time())

    def _failed(self, exc: SourceError, what: str) -> None:
        lost = isinstance(exc, MessageLockLost | SessionLockLost)
        if not exc.retryable and not lost:
            raise exc
        self.errors += 1
        log.warning(
            "%s %s (batch %d, slot %d): %s",
            what,
            self.assignment.path,
            self.assignment.batch,
            self.assignment.slot,
            exc,
        )

    async def _register(self) -> None:
        deadline = self.clock.monotonic() + REGISTER_FOR
        while True:
            try:
                answer = await self._call("PUT", f"?messages={len(self.messages)}", 15.0)
                break
            except (OSError, http.client.HTTPException, ValueError) as exc:
                if self.clock.monotonic() >= deadline:
                    raise CommitServiceUnreachable(
                        f"cannot reach the driver's commit service at "
                        f"{self.assignment.commit_service} ({exc}); where executors cannot "
                        "reach the driver, set the source's option receiveOn to 'driver'"
                    ) from exc
                await self.clock.sleep(0.5)
        if answer != OPEN:
            raise CommitServiceUnreachable(
                f"batch {self.assignment.batch} is not open at the driver ({answer}): "
                "its messages were given back"
            )

    # ------------------------------------------------------------------ holding

    async def hold(self) -> None:
        """Waits for the verdict, then completes or gives back (see the module)."""
        batch, slot = self.assignment.batch, self.assignment.slot
        try:
            verdict = await self._verdict() if self.messages else UNKNOWN
            if verdict == COMMITTED:
                done = sum(h.receiver.complete(h.messages) for h in self.held)
                log.debug("batch %d slot %d: completed %d message(s)", batch, slot, done)
                await self._close_all()
                return
            if self.messages:
                log.info(
                    "batch %d slot %d: %s, %d message(s) given back",
                    batch,
                    slot,
                    verdict,
                    len(self.messages),
                )
            await self.give_back(unregister=verdict in (UNREACHABLE, LINKS_LOST))
        except asyncio.CancelledError:
            await self.give_back()
            raise
        except Exception:  # a background task: nobody else would see it
            log.exception(
                "holding batch %d slot %d failed; its messages are given back", batch, slot
            )
            await self.give_back()

    async def _verdict(self) -> str:
        unreachable_since: float | None = None
        while True:
            if not any(h.receiver.is_open for h in self.held):
                return LINKS_LOST  # the locks went with the links: nothing to settle
            try:
                answer = await self._call("GET", f"?wait={LONG_POLL:g}", LONG_POLL + 15.0)
            except (OSError, http.client.HTTPException, ValueError) as exc:
                now = self.clock.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since >= self.lock_duration:
                    log.warning(
                        "the driver's commit service at %s was unreachable for %.0f s (%s)",
                        self.assignment.commit_service,
                        now - unreachable_since,
                        exc,
                    )
                    return UNREACHABLE
                await self.clock.sleep(1.0)
                continue
            unreachable_since = None
            if answer != OPEN:
                return answer

    async def give_back(self, *, unregister: bool = False) -> None:
        """Releases every held message (no delivery counted) and closes the receivers;
        ``unregister``: tells the commit service this read holds nothing any more."""
        for held in self.held:
            if held.messages:
                held.receiver.release(held.messages)
        await self._close_all()
        if unregister:
            with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
                await self._call("DELETE", "", 5.0)

    async def _drop(self, held: _Held) -> None:
        if held in self.held:
            self.held.remove(held)
        if held.messages:
            held.receiver.release(held.messages)
        await held.keeper.stop()
        await held.receiver.close()

    async def _close_all(self) -> None:
        held, self.held = self.held, []
        for one in held:
            await one.keeper.stop()
            await one.receiver.close()

    async def _call(self, method: str, query: str, timeout: float) -> str:
        address = str(self.assignment.commit_service)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            _CALLS, _request, address, method, self.path_of_holder + query, timeout
        )


def _request(address: str, method: str, path: str, timeout: float) -> str:
    """One call to the commit service (``http.client``: no proxy from the environment)."""
    host, _, port = address.rpartition(":")
    connection = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise ValueError(f"the commit service answered {response.status}: {body[:200]!r}")
        return str(json.loads(body)["verdict"])
    finally:
        connection.close()


def _stop_credit(receiver: AmqpReceiver) -> None:
    """No more credit granted on this link; what was prefetched and not taken goes back.
    The credit still outstanding is left to the link's close, which takes it back and waits
    for the service's answer (``AmqpReceiver.close``): what arrives until then waits in the
    buffer (its locks kept) and is released there."""
    link = receiver.link
    link.credit = 0
    if receiver.is_open:
        link.release_unread()


def _after(message: Message, cutoff: float) -> bool:
    enqueued = message.enqueued_time
    return enqueued is not None and enqueued.timestamp() > cutoff


def _check_reuse() -> None:
    from pyspark import TaskContext

    if TaskContext.get() is not None and not os.environ.get("SPARK_REUSE_WORKER"):
        raise RuntimeError(
            "the servicebus source holds messages in the Python worker until Spark's commit: "
            "set spark.python.worker.reuse to true (the default), or the source's option "
            "receiveOn to 'driver'"
        )


async def _spawn(coro: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    _HOLDING.add(task)
    task.add_done_callback(_HOLDING.discard)


def read_assignment(
    options: Options, assignment: Assignment, clock: Clock = SYSTEM
) -> Iterator[tuple[Any, ...]]:
    """The rows of one assignment; the messages stay held until the commit (see the module;
    ``clock``: as ``Reading`` takes it)."""
    _check_reuse()
    reading = Reading(options, assignment, clock)
    run_async(reading.receive())
    if reading.late or reading.errors:
        log.info(
            "batch %d slot %d: %d message(s), %d late, %d receiver error(s)",
            assignment.batch,
            assignment.slot,
            len(reading.messages),
            reading.late,
            reading.errors,
        )
    handed_over = False
    try:
        for message in reading.messages:
            yield to_row(message)
        handed_over = True
    finally:
        if handed_over:
            run_async(_spawn(reading.hold()))
        else:  # the task stopped taking rows: they will not be written
            run_async(reading.give_back(unregister=True))
