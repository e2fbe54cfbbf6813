"""Batch handlers side by side: the next batch is received while the one before waits for
its target's answer.

A receive loop that handles one batch at a time leaves its process idle for every send's
round trip (the target's durable write). ``InFlight`` lets up to ``limit`` handlers run at
once: the loop takes a slot before it receives, starts the handler for what it received and
goes on receiving; a slot comes back when its handler ends. The first handler error, or a
handler that says to let the receiver go, ends the receiving: the handlers already started
finish (copies sent, messages settled) and ``raise_failure`` raises that error. Used by the receive
loop of the pump and the host's triggers (``receiving.ReceiveLoop``) and by the Spark
executor's task (``spark/executor.py``); their handlers keep send order with
``turns.SendTurns``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class InFlight:
    """Up to ``limit`` batch handlers at once (see the module)."""

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

    async def slot(self) -> None:
        """Waits for a free slot; give it back with ``release`` when nothing was received."""
        await self._slots.acquire()

    def release(self) -> None:
        self._slots.release()

    def start(self, handler: Coroutine[Any, Any, bool]) -> None:
        """Runs ``handler`` in the slot taken; its True means: let the receiver go."""
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

    def cancel(self) -> None:
        """The loop was cancelled: so are its handlers."""
        for task in self._handling:
            task.cancel()

    async def close(self) -> None:
        """Waits for every handler started (call it in ``finally``: it raises nothing)."""
        if self._handling:
            await asyncio.wait(set(self._handling))

    def raise_failure(self) -> None:
        """Raises the first handler's error, if one failed."""
        if self._failed:
            raise self._failed[0]
