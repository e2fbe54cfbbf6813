"""Batch handlers side by side: the next batch is received while the one before waits for
its target's answer.

A receive loop that handles one batch at a time leaves its process idle for every send's
round trip (the target's durable write). ``InFlight`` lets up to ``limit`` handlers run at
once: the loop takes a slot and receives into it (``take``), starts the handler for what it
received and goes on receiving; a slot comes back when its handler ends. The first handler
error, or a handler that says to let the receiver go, ends the receiving: the handlers
already started finish (copies sent, messages settled), then that error is raised. Used by
the pump's receive loop (``receiving.ReceiveLoop`` with ``batches_in_flight``) and by the
Spark executor's task (``spark/executor.py``); their handlers keep send order with
``turns.SendTurns``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class InFlight(Generic[T]):
    """Up to ``limit`` batch handlers at once (see the module), as an async context: on the
    way out it waits for every handler started (cancels them first when the loop was
    cancelled) and raises the first one's error, unless an error of the loop's own is on
    its way out already."""

    __slots__ = ("_failed", "_handling", "_let_go", "_slots")

    def __init__(self, limit: int) -> None:
        self._slots = asyncio.Semaphore(max(1, limit))
        self._handling: set[asyncio.Task[bool]] = set()
        self._failed: list[BaseException] = []
        self._let_go = False

    @property
    def going(self) -> bool:
        """False once a handler failed or said to let the receiver go: receive no more."""
        return not (self._failed or self._let_go)

    async def take(self, receive: Callable[[], Awaitable[list[T]]]) -> list[T]:
        """Waits for a free slot and fills it with what ``receive`` brings; ``[]`` (and the
        slot free again) when nothing came or the handlers stopped going meanwhile."""
        await self._slots.acquire()
        batch: list[T] = []
        try:
            if self.going:
                batch = await receive()
        finally:
            if not batch:
                self._slots.release()
        return batch

    def start(self, handler: Coroutine[Any, Any, bool]) -> None:
        """Runs ``handler`` in the slot the last ``take`` filled; its True means: let the
        receiver go."""
        task = asyncio.create_task(handler)
        self._handling.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[bool]) -> None:
        self._handling.discard(task)
        self._slots.release()
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self._failed.append(error)
        elif task.result():
            self._let_go = True

    async def __aenter__(self) -> InFlight[T]:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: object
    ) -> None:
        if isinstance(error, asyncio.CancelledError):
            for task in self._handling:
                task.cancel()
        if self._handling:
            await asyncio.wait(set(self._handling))
        if error is None and self._failed:
            raise self._failed[0]
