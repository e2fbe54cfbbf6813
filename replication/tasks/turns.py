"""Sends in the order batches were received, while the batches themselves overlap.

A pump that works on two batches at once (``ReceiveLoop.batches_in_flight``) prepares the
next batch (steps, stamps) while the one before waits for its target's answer. What it must
not do is let the later batch's copies reach a target first. ``SendTurns`` hands each batch
a turn when it is taken (in receive order) and lets the turns go one after another: a turn
ends when its holder says so (``process_batch``: once the copies are on their links, or,
for messages of a session or partition key, once the targets accepted them) or however
its send ended (sent, failed, cancelled), and never before the turn ahead of it.
"""

from __future__ import annotations

import asyncio


class SendTurns:
    """Turns taken in call order, served one at a time in the same order."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: asyncio.Future[None] | None = None

    def take(self) -> Turn:
        """The next turn: call it where the batch's order is decided (as it is received,
        before any ``await``), use it around the send."""
        before, mine = self._last, asyncio.get_running_loop().create_future()
        self._last = mine
        return Turn(before, mine)


class Turn:
    """One batch's turn to send: ``async with turn:`` waits for the turns before it and
    ends this one on the way out; ``end()`` ends it without sending (idempotent)."""

    __slots__ = ("_before", "_mine")

    def __init__(self, before: asyncio.Future[None] | None, mine: asyncio.Future[None]) -> None:
        self._before, self._mine = before, mine

    async def __aenter__(self) -> None:
        if self._before is not None:
            try:
                await asyncio.shield(self._before)  # a cancelled waiter leaves it alone
            except BaseException:
                self.end()  # no __aexit__ after a failed __aenter__: end it here
                raise

    async def __aexit__(self, *exc_info: object) -> None:
        self.end()

    def end(self) -> None:
        """Ends this turn once every turn before it ended (so a batch cancelled while
        waiting does not let the next one overtake the one still sending)."""
        before, mine = self._before, self._mine
        if mine.done():
            return
        if before is None or before.done():
            mine.set_result(None)
        else:
            before.add_done_callback(lambda _: self.end())
