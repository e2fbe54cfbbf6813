"""A sender pool that holds the first send's answer: the messages are on the wire (and at the
target) while the sending code does not know yet that they were accepted. Used by the
pump's tests (``test_batches_in_flight.py``) and the Spark executor's
(``tests/spark/test_executor_overlap.py``): the next batch must send meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from replication.messages import Message
from replication.servicebus.sender import SendError
from replication.tasks.sender import AsyncSender, send_batch
from replication.tasks.targets import SenderPool


class HeldSends:
    """A ``SenderFor`` over the real pool: records each send (start, end, message ids) and
    holds the first one's answer until ``release`` is set: its messages are on the wire
    (and at the target), but the pump does not know yet that they were accepted."""

    def __init__(self, pool: SenderPool, *, first_fails_once: bool = False) -> None:
        self.pool = pool
        self.first_fails_once = first_fails_once
        """The first send says its messages are on the wire, waits for ``release``, then
        fails with a transient error (a link lost before the answer) and is retried."""
        self.release = asyncio.Event()
        self.second_started = asyncio.Event()
        self.log: list[tuple[str, list[str]]] = []

    @contextlib.asynccontextmanager
    async def __call__(self, target: str | None) -> AsyncIterator[AsyncSender]:
        async with self.pool(target) as sender:
            yield _Recording(self, sender)


class _Recording:
    reports_queued = True  # passes the real sender's "on the wire" on

    def __init__(self, sends: HeldSends, sender: Any) -> None:
        self.sends, self.sender = sends, sender

    async def send_messages(
        self, messages: list[Message], queued: Callable[[], None] | None = None
    ) -> None:
        sends = self.sends
        ids = [str(m.message_id) for m in messages]
        first = not sends.log
        sends.log.append(("start", ids))
        if not first:
            sends.second_started.set()
        elif sends.first_fails_once:
            if queued is not None:
                queued()
            await sends.release.wait()
            sends.log.append(("failed", ids))
            raise SendError("the link was lost before the answer", "amqp:connection:forced")
        await send_batch(self.sender, messages, queued)
        if first:
            await sends.release.wait()
        sends.log.append(("end", ids))
