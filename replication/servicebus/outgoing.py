"""A ``Message`` as Service Bus receives it from a sender: the bytes ``azure-servicebus`` would
put on the wire for the same message, without building an SDK message first.

What the SDK writes (docs/sdk-wire-notes.md section 3), and so what this writes:

- a header only with a time to live (``ttl`` in ms);
- message annotations ``x-opt-partition-key`` (only without a session id, as ``to_sdk``
  does) and ``x-opt-scheduled-enqueue-time`` (a timestamp);
- properties: message-id (a new ``str(uuid4())`` when the message has none, as the SDK's
  constructor makes one), to, subject, reply-to, correlation-id, content-type, group-id (the
  session id), reply-to-group-id;
- application properties with string keys; ints as AMQP int when they fit 32 bits (the SDK's
  ``encode_int``), else long; bytes values as strings when they are UTF-8 (the SDK decodes
  them, for parity with uamqp; it fails on other bytes, which go as binary here);
- the body as one data section.

A batch is one transfer of message-format ``0x80013700`` whose data sections are the encoded
messages, in an envelope carrying the first message's message-id, session id and partition
key, as the SDK sends it.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from ..amqp import codec
from ..amqp.message import Header, Properties, _enc_string_keyed_map
from ..amqp.types import int32, timestamp
from ..messages import Message
from .symbols import PARTITION_KEY, SCHEDULED_ENQUEUE_TIME

BATCH_FORMAT = 0x80013700
"""message-format of a Service Bus batch: each data section holds one encoded message."""
_INT32 = range(-(2**31), 2**31)


def encode(message: Message) -> bytes:
    out = bytearray()
    if message.time_to_live is not None:
        ttl = int(message.time_to_live.total_seconds() * 1000)
        Header._amqp_encode(out, Header(ttl=ttl))  # type: ignore[attr-defined]
    annotations = _annotations(message)
    if annotations:
        out += b"\x00\x53\x72"
        codec.encode_symbol_keyed_map(out, annotations)
    Properties._amqp_encode(out, Properties(  # type: ignore[attr-defined]
        message_id=message.message_id if message.message_id is not None else str(uuid.uuid4()),
        to=message.to, subject=message.subject, reply_to=message.reply_to,
        correlation_id=message.correlation_id, content_type=message.content_type,
        group_id=message.session_id, reply_to_group_id=message.reply_to_session_id,
    ))  # fmt: skip
    if message.application_properties:
        out += b"\x00\x53\x74"
        _enc_string_keyed_map(out, {
            key: _property(value) for key, value in message.application_properties.items()
        })  # fmt: skip
    out += b"\x00\x53\x75"
    codec._enc_binary(out, message.body)
    return bytes(out)


def encode_batch(messages: list[Message], encoded: list[bytes]) -> bytes:
    """One transfer for several messages (``encoded`` are theirs, in order)."""
    first = messages[0]
    out = bytearray()
    if first.session_id is None and first.partition_key is not None:
        out += b"\x00\x53\x72"
        codec.encode_symbol_keyed_map(out, {PARTITION_KEY: first.partition_key})
    if first.message_id is not None or first.session_id is not None:
        Properties._amqp_encode(out, Properties(  # type: ignore[attr-defined]
            message_id=first.message_id, group_id=first.session_id,
        ))  # fmt: skip
    for payload in encoded:
        out += b"\x00\x53\x75"
        codec._enc_binary(out, payload)
    return bytes(out)


def _annotations(message: Message) -> dict[Any, Any]:
    annotations: dict[Any, Any] = {}
    if message.session_id is None and message.partition_key is not None:
        annotations[PARTITION_KEY] = message.partition_key
    when = message.scheduled_enqueue_time
    if when is not None:
        annotations[SCHEDULED_ENQUEUE_TIME] = timestamp.from_datetime(when)
    return annotations


def _property(value: Any) -> Any:
    if type(value) is int and value in _INT32:
        return int32(value)
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(value)
    if isinstance(value, datetime):
        return timestamp.from_datetime(value)
    return value
