"""What a namespace holds of a drill: every message of the run at an entity, by peeking.

Peeking locks nothing and takes nothing, so reading the secondary does not change what it
holds (nor what a consumer there sees). Each message keeps what the figures need: its id,
when this namespace enqueued it, and, for a replicated copy, when the source had enqueued
it (the last entry of its ``repl-enqueue-time`` stamp: this hop). A session entity is
peeked one session at a time, for the sessions the drill used (Service Bus peeks a session
entity by session).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from ..messages import Message
from ..servicebus.client import AmqpSource
from ..servicebus.management import Management
from ..tasks.stamping import ENQUEUE_TIME, SEPARATOR

PAGE = 250
"""Messages asked for per peek request."""


@dataclass(frozen=True, slots=True)
class Copy:
    """One message at the entity."""

    message_id: str
    enqueued_at: float
    """Wall time this namespace enqueued it (its ``x-opt-enqueued-time``)."""
    source_enqueued_at: float | None
    """For a replicated copy: when the source enqueued it (``repl-enqueue-time``, last hop);
    None for a message sent here directly."""
    sequence_number: int | None = None


async def read_copies(
    connection_string: str, entity: str, prefix: str, sessions: Iterable[str | None] = (None,)
) -> list[Copy]:
    """Every message at ``entity`` whose id starts with ``prefix``, session by session
    (``None``: the entity without sessions), each in sequence order."""
    found: list[Copy] = []
    async with AmqpSource.from_connection_string(connection_string) as namespace:
        management = Management(await namespace.connection())
        for session in sessions:
            start = 1
            while True:
                page = await management.peek(
                    entity, PAGE, from_sequence_number=start, session_id=session
                )
                found += [_copy(m) for m in page if (m.message_id or "").startswith(prefix)]
                numbers = [m.sequence_number for m in page if m.sequence_number is not None]
                if len(page) < PAGE or not numbers:
                    break
                start = max(numbers) + 1
    return found


def _copy(message: Message) -> Copy:
    assert message.message_id is not None
    enqueued = message.enqueued_time
    if enqueued is None:
        raise ValueError(f"{message.message_id} was peeked without an enqueued time")
    return Copy(
        message.message_id,
        enqueued.timestamp(),
        source_enqueued_at(message.application_properties.get(ENQUEUE_TIME)),
        message.sequence_number,
    )


def source_enqueued_at(stamp: object) -> float | None:
    """The last hop's time in a ``repl-enqueue-time`` stamp (``...;2026-11-23T10:15:30.1Z``),
    as wall-clock seconds; None when there is no stamp."""
    if not isinstance(stamp, str) or not stamp:
        return None
    return datetime.fromisoformat(stamp.rsplit(SEPARATOR, 1)[-1]).timestamp()
