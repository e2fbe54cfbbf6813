"""Batch reads: what is at an entity now (peek), or take it (receive-and-delete).

Peek goes through ``$management`` ``peek-message`` from sequence number 0 onwards and
changes nothing at the source. ``receive`` settles every message as it is read: a batch
job cannot complete after its sink committed (Spark has no such hook for batch reads), so
this mode is at-most-once by design; streaming reads are the at-least-once way.
"""

from __future__ import annotations

from ..messages import Message
from ..servicebus.client import AmqpSource
from ..servicebus.endpoint import Endpoint
from ..servicebus.management import Management
from .options import Options

PEEK_PAGE = 250


async def read_entity(options: Options) -> list[Message]:
    endpoint = Endpoint.from_connection_string(options.connection_string)
    async with AmqpSource(endpoint) as source:
        if options.mode == "peek":
            return await _peek(source, options)
        return await _take(source, options)


async def _peek(source: AmqpSource, options: Options) -> list[Message]:
    management = Management(await source.connection())
    found: list[Message] = []
    next_sequence = 0
    while len(found) < options.max_messages:
        count = min(PEEK_PAGE, options.max_messages - len(found))
        page = await management.peek(options.path, count, from_sequence_number=next_sequence)
        if not page:
            break
        found += page
        next_sequence = max(m.sequence_number or 0 for m in page) + 1
    return found


async def _take(source: AmqpSource, options: Options) -> list[Message]:
    receiver = await source.receiver(options.path, prefetch=options.prefetch)
    found: list[Message] = []
    try:
        while len(found) < options.max_messages:
            batch = await receiver.receive(
                min(options.batch_size * 10, options.max_messages - len(found)),
                options.receive_wait,
            )
            if not batch:
                break
            receiver.complete(batch)
            found += batch
    finally:
        await receiver.close()
    return found
