"""How many of a group's messages its next send takes: a count, and an estimated size.

A target refuses a batch over its size limit (Service Bus Standard: 256 KiB); the estimate
errs large (framing per property and message, ``BATCH_OVERHEAD`` for the envelope), and a
batch whose estimate was short anyway is refused by the sender and sent again in smaller
ones (``sender``). Compiled with the hot path ([tool.replication.native]): it reads every
message sent.
"""

from __future__ import annotations

from typing import Any

from ..messages import Message

BATCH_OVERHEAD = 5 * 1024
"""Room left in a batch for the envelope and each message's framing (estimated sizes)."""
MESSAGE_OVERHEAD = 128


def estimated_size(message: Message) -> int:
    """The bytes ``message`` takes in a batch, about (more rather than less)."""
    size = len(message.body) + MESSAGE_OVERHEAD
    properties: dict[Any, Any] = message.application_properties
    for key, value in properties.items():
        size += len(str(key)) + len(str(value)) + 8
    for text in (
        message.message_id,
        message.session_id,
        message.correlation_id,
        message.subject,
        message.content_type,
        message.to,
        message.reply_to,
        message.partition_key,
    ):
        if text:
            size += len(text)
    return size


def batch_count(messages: list[Message], max_messages: int, max_bytes: int) -> int:
    """How many of ``messages``, from the first, fit ``max_messages`` and ``max_bytes`` by
    their estimated sizes (the first always does: a message too large for any batch is the
    sender's to refuse)."""
    limit = max_bytes - BATCH_OVERHEAD
    size = count = 0
    for message in messages:
        if count >= max_messages:
            break
        estimate = estimated_size(message)
        if count and size + estimate > limit:
            break
        size += estimate
        count += 1
    return count
