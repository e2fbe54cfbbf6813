"""The receive loop: peek-lock receivers on one entity, batches handed to a handler, locks
kept while it works, until stopped.

Every runner that receives until it is told to stop runs this loop: the task pump
(``pump.py``: steps, send, settle) and the local host's triggers (``host/trigger.py``: a
function called with the Functions host's semantics). What they do with a batch, and what a
failure means to them, are the ``Hooks``; the loop itself is the same:

- ``workers`` receivers side by side on one namespace (``AmqpSource`` or, for
  ``backend: sdk``, ``SdkSource``: the same interface). A session entity's worker takes the
  next available session (waiting ``max_wait``), keeps it until it runs dry (a receive that
  returns nothing) or the handler gives it back, then takes the next; a plain worker keeps
  its receiver until it fails or the loop stops.
- A ``LockKeeper`` per receiver renews the locks of the batch being handled and of what waits
  in the prefetch buffer (a session receiver: its session lock), for at most
  ``max_lock_renewal`` seconds per batch (host.json ``maxAutoLockRenewalDuration``; None: as
  long as it is held), on ``clock``.
- A receiver that cannot be opened or fails is reported to ``Hooks.failed``, which pauses
  (on ``clock``), raises, or ends the worker (a failover moved the source elsewhere).

Loops that stay apart, and why: the Spark executor's task (``spark/executor.py``) receives a
bounded share once and ends when the source runs dry (Spark plans the next task; it retries
a failed one), capping the link's credit to what the share still wants; the Spark data
source (``spark/holder.py``, ``spark/intake.py``) receives and *holds* its messages until
Spark's commit, settling nothing in the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from dataclasses import dataclass
from typing import Protocol

from ..clock import SYSTEM, Clock
from ..messages import Message
from ..servicebus.client import AmqpSource, NoSessionAvailable, SourceError
from ..servicebus.sdk_source import SdkSource, SourceReceiver
from .inflight import InFlight
from .locks import LockKeeper


class Hooks(Protocol):
    """What a runner does with what the loop receives."""

    def opened(self, receiver: SourceReceiver) -> contextlib.AbstractAsyncContextManager[None]:
        """Around a receiver's whole use (e.g. a session held for a settlement service)."""
        ...

    async def handle(self, receiver: SourceReceiver, batch: list[Message]) -> bool:
        """Handles and settles a batch (its locks are kept meanwhile); True: let this
        receiver go now (a session given back, so a message of it that failed comes first
        again for whoever takes the session next)."""
        ...

    async def failed(self, error: SourceError, draining: bool) -> bool:
        """A receiver could not be opened (``draining`` False) or failed while in use. May
        raise (a source that cannot work) or pause; True: this worker ends."""
        ...


@dataclass(slots=True)
class ReceiveLoop:
    """One entity's receive loop (see the module)."""

    namespace: AmqpSource | SdkSource
    path: str
    hooks: Hooks
    stop: asyncio.Event
    sessions: bool = False
    workers: int = 1
    prefetch: int = 100
    max_batch: int = 100
    max_wait: float = 1.0
    max_lock_renewal: float | None = None
    clock: Clock = SYSTEM
    batches_in_flight: int = 1
    """Batches of a receiver without a session handed to the handler side by side: the
    next is received and handled while the one before waits for its target. Handlers are
    started in receive order (a handler that sends takes its ``turns.SendTurns`` turn before
    its first ``await``, so its sends keep that order). A session's batches always go one
    after another."""

    async def run(self) -> None:
        """Until ``stop`` (or until every worker ended); a worker's error ends them all and
        is raised as itself (not as a group of one)."""
        if self.workers == 1:
            await self.worker()
            return
        try:
            async with asyncio.TaskGroup() as workers:
                for _ in range(self.workers):
                    workers.create_task(self.worker())
        except BaseExceptionGroup as group:
            raise group.exceptions[0] from None

    async def worker(self) -> None:
        while not self.stop.is_set():
            try:
                receiver = await self._open()
            except NoSessionAvailable:
                continue  # no session free right now
            except SourceError as exc:
                if await self.hooks.failed(exc, False):
                    return
                continue
            try:
                async with self.hooks.opened(receiver), self._keeper(receiver) as keeper:
                    await self.drain(receiver, keeper)
            except SourceError as exc:  # e.g. the link or the session lock was lost
                if await self.hooks.failed(exc, True):
                    return
            finally:
                await receiver.close()

    async def _open(self) -> SourceReceiver:
        if self.sessions:
            return await self.namespace.receiver(
                self.path, prefetch=self.prefetch, session=True, wait=self.max_wait
            )
        return await self.namespace.receiver(self.path, prefetch=self.prefetch)

    def _keeper(self, receiver: SourceReceiver) -> LockKeeper:
        """The receiver's lock keeper, running while ``async with`` holds it."""
        return LockKeeper(
            receiver,
            max_duration=self.max_lock_renewal,
            clock=self.clock.time,
            sleep=self.clock.sleep,
        )

    async def drain(self, receiver: SourceReceiver, keeper: LockKeeper) -> None:
        """Batches from one receiver until the loop stops, its session runs dry, or the
        handler lets it go."""
        if receiver.session_id is None and self.batches_in_flight > 1:
            await self._drain_overlapped(receiver, keeper)
            return
        while not self.stop.is_set():
            batch = await self._receive_unless_stopped(receiver)
            if not batch:
                if receiver.session_id is not None:
                    return  # the session went idle: let it go
                continue
            keeper.hold(batch)
            try:
                let_go = await self.hooks.handle(receiver, batch)
            finally:
                keeper.settled(batch)
            if let_go:
                return

    async def _drain_overlapped(self, receiver: SourceReceiver, keeper: LockKeeper) -> None:
        """``drain`` with up to ``batches_in_flight`` batches handled at once
        (``inflight.InFlight``). A handler's error stops the receiving: the others finish
        (copies sent, messages settled), then it is raised. Cancelled: the handlers are
        cancelled too, as ``drain``'s one is."""
        async with InFlight[Message](self.batches_in_flight) as flight:
            while not self.stop.is_set() and flight.going:
                # given back when the batch's handler finished
                batch = await flight.take(functools.partial(self._receive_unless_stopped, receiver))
                if not batch:
                    continue
                keeper.hold(batch)
                flight.start(self._handled(receiver, keeper, batch))

    async def _receive_unless_stopped(self, receiver: SourceReceiver) -> list[Message]:
        """The next batch, or nothing once ``stop`` is set: a stop does not wait out
        ``max_wait`` (the host's ``sessionIdleTimeout``), and while a batch beside it is let
        go at a stop, its messages must not come back into this receive and be let go twice."""
        if self.stop.is_set():
            return []
        receiving = asyncio.ensure_future(receiver.receive(self.max_batch, self.max_wait))
        stopping = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({receiving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not receiving.done():
                receiving.cancel()  # nothing taken yet: what arrives waits in the buffer
                await asyncio.wait({receiving})
        if receiving.cancelled():
            return []
        return receiving.result()

    async def _handled(
        self, receiver: SourceReceiver, keeper: LockKeeper, batch: list[Message]
    ) -> bool:
        try:
            return await self.hooks.handle(receiver, batch)
        finally:
            keeper.settled(batch)
