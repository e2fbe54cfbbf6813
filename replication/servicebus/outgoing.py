"""A batch of messages as one transfer, the way ``azure-servicebus`` sends a batch.

A batch is one transfer of message-format ``0x80013700`` whose data sections are the encoded
messages (``adapters.amqp.encode``), in an envelope carrying the first message's
message-id, session id and partition key, as the SDK sends it.
"""

from __future__ import annotations

from ..amqp import codec
from ..amqp.composite import encoder
from ..amqp.message import Properties
from ..messages import Message
from ..symbols import PARTITION_KEY

BATCH_FORMAT = 0x80013700
"""message-format of a Service Bus batch: each data section holds one encoded message."""

_write_properties = encoder(Properties)


def encode_batch(
    messages: list[Message], encoded: list[bytes], *, event_hub: bool = False
) -> bytes:
    """One transfer for several messages (``encoded`` are theirs, in order); ``event_hub``:
    the envelope carries the partition key beside a session id, as for an event hub."""
    first = messages[0]
    out = bytearray()
    if first.partition_key is not None and (first.session_id is None or event_hub):
        out += b"\x00\x53\x72"
        codec.encode_symbol_keyed_map(out, {PARTITION_KEY: first.partition_key})
    if first.message_id is not None or first.session_id is not None:
        _write_properties(
            out,
            Properties(
                message_id=first.message_id,
                group_id=first.session_id,
            ),
        )
    for payload in encoded:
        out += b"\x00\x53\x75"
        codec._enc_binary(out, payload)
    return bytes(out)
