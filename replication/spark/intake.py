"""The driver's receivers: messages received and locked until their micro-batch is committed.

Spark runs a Python stream reader's ``latestOffset`` / ``partitions`` / ``commit`` in one
long-lived Python process next to the driver; ``read`` runs on executors and must be
stateless. So the peek-lock receivers live here, in the driver's process, on an asyncio loop
of their own (a daemon thread): ``take`` receives and locks, the message contents travel to
the executors inside the planned partitions, and ``complete`` settles them once Spark has
committed the micro-batch (after the sink wrote it). Locks are renewed in the background
while messages are held. If the driver dies, nothing is completed: the locks lapse and
Service Bus delivers the messages again (at-least-once).

Sessions: up to ``max_concurrent_sessions`` session receivers are held; a session with
nothing in flight that stayed empty through one ``take`` is let go, so other sessions get
their turn. A session's messages are received in order by its one receiver.

Why this is not ``tasks.receiving.ReceiveLoop``: the driver pulls (``take``) when Spark plans a
micro-batch and settles (``complete``) when Spark commits one, calls apart in time; nothing
is handled or settled inside a receive loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Coroutine, Iterable
from concurrent.futures import Future
from typing import Any, TypeVar

from ..messages import Message
from ..servicebus.client import AmqpReceiver, AmqpSource, NoSessionAvailable, SourceError
from ..servicebus.endpoint import Endpoint
from ..servicebus.management import Management
from .options import Options

log = logging.getLogger("replication.spark")
T = TypeVar("T")
SESSION_ACCEPT_WAIT = 0.2
"""Seconds to wait for another free session in one ``take`` (more come on the next one)."""
FOLLOW_UP_WAIT = 0.2
"""Seconds a ``take`` that has messages waits for more before it returns."""


class LoopThread:
    """An asyncio loop in a daemon thread; ``run`` submits a coroutine and waits for it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = 120.0) -> T:
        return self.submit(coro).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class Intake:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.endpoint = Endpoint.from_connection_string(options.connection_string)
        self.thread = LoopThread("servicebus-intake")
        self.source: AmqpSource | None = None
        self.receivers: list[AmqpReceiver] = []
        self.held: dict[int, list[Message]] = {}
        """id(receiver) -> messages received on it and not settled yet."""
        self._idle: set[int] = set()
        self._renewer: asyncio.Task[None] | None = None
        self._managements: dict[int, Management] = {}
        """id(connection) -> its management links."""

    # ------------------------------------------------------------------ the driver's calls

    def take(self, limit: int) -> list[Message]:
        """Receives up to ``limit`` messages (waiting up to ``receiveWait`` for the first);
        they stay locked until ``complete`` or ``release``."""
        return self.thread.run(self._take(limit))

    def complete(self, messages: Iterable[Message]) -> int:
        return self.thread.run(self._settle(list(messages), "complete"))

    def release(self, messages: Iterable[Message]) -> int:
        """Gives messages back without counting a delivery (a graceful stop)."""
        return self.thread.run(self._settle(list(messages), "release"))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.thread.run(self._close(), timeout=30)
        self.thread.close()

    # ------------------------------------------------------------------ on the loop

    async def _open(self) -> AmqpSource:
        if self.source is None:
            self.source = AmqpSource(self.endpoint)
            self._renewer = asyncio.get_running_loop().create_task(self._renew())
        return self.source

    async def _take(self, limit: int) -> list[Message]:
        source = await self._open()
        self.receivers = [r for r in self.receivers if r.is_open]
        if not self.options.sessions:
            if not self.receivers:
                self.receivers.append(
                    await source.receiver(self.options.path, prefetch=self.options.prefetch)
                )
            return await self._receive(self.receivers[0], limit, self.options.receive_wait)
        while True:
            await self._accept_sessions(source)
            taken: list[Message] = []
            let_go = 0
            for receiver in list(self.receivers):
                if len(taken) >= limit:
                    break
                wait = self.options.receive_wait if not taken else 0.05
                batch = await self._receive(receiver, limit - len(taken), wait)
                taken += batch
                if not batch and not self.held.get(id(receiver)):
                    await self._let_go(receiver)
                    let_go += 1
            if taken or not let_go:
                return taken  # else: sessions ran dry and were let go; take others now

    async def _accept_sessions(self, source: AmqpSource) -> None:
        while len(self.receivers) < self.options.max_concurrent_sessions:
            try:
                receiver = await source.receiver(
                    self.options.path,
                    prefetch=self.options.prefetch,
                    session=True,
                    wait=SESSION_ACCEPT_WAIT,
                )
            except NoSessionAvailable:
                return
            self.receivers.append(receiver)

    async def _receive(self, receiver: AmqpReceiver, limit: int, wait: float) -> list[Message]:
        """Up to ``limit`` messages: waits ``wait`` for the first, then keeps taking while
        more arrive within ``FOLLOW_UP_WAIT`` (one receive returns at most the prefetch, and
        a micro-batch of a few hundred messages would spend its time on Spark's overhead)."""
        try:
            batch = await receiver.receive(min(limit, 5000), wait)
            while batch and len(batch) < limit:
                more = await receiver.receive(min(limit - len(batch), 5000), FOLLOW_UP_WAIT)
                if not more:
                    break
                batch += more
        except SourceError as exc:  # the link is gone: its locks with it (redelivered)
            log.warning("receiving from %s failed: %s", self.options.path, exc)
            self.held.pop(id(receiver), None)
            await self._let_go(receiver)
            return []
        self.held.setdefault(id(receiver), []).extend(batch)
        return batch

    async def _let_go(self, receiver: AmqpReceiver) -> None:
        if receiver in self.receivers:
            self.receivers.remove(receiver)
        self.held.pop(id(receiver), None)
        await receiver.close()

    async def _settle(self, messages: list[Message], how: str) -> int:
        chosen = {id(m) for m in messages}
        done = 0
        for receiver in list(self.receivers):
            mine = [m for m in self.held.get(id(receiver), []) if id(m) in chosen]
            if not mine:
                continue
            done += receiver.complete(mine) if how == "complete" else receiver.release(mine)
            self.held[id(receiver)] = [m for m in self.held[id(receiver)] if id(m) not in chosen]
        return done

    async def _renew(self) -> None:
        """Renews the locks of held messages (or the session locks) every
        ``lockRenewInterval`` seconds while the intake is open."""
        while True:
            await asyncio.sleep(self.options.lock_renew_interval)
            for receiver in list(self.receivers):
                held = self.held.get(id(receiver))
                if not held and receiver.session_id is None:
                    continue
                connection = receiver.connection
                management = self._managements.get(id(connection))
                if management is None or management.connection is not connection:
                    management = self._managements[id(connection)] = Management(connection)
                try:
                    await management.renew_locks(receiver, held or [])
                except SourceError as exc:
                    log.warning("renewing locks on %s failed: %s", self.options.path, exc)

    async def _close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
        for receiver in list(self.receivers):
            held = self.held.get(id(receiver))
            if held:
                receiver.release(held)
            await receiver.close()
        self.receivers.clear()
        self.held.clear()
        if self.source is not None:
            await self.source.close()
