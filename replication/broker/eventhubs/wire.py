"""Event Hubs event layout on the wire: what the broker keeps of a sent event, and the
delivery a consumer gets.

An event is kept as the sender's delivery-annotations and message-annotations (its
partition key among them) and its bare message byte for byte; a delivery is the sender's
delivery annotations (with the partition's runtime metric appended, for a consumer that
asked for it), a message-annotations section with the service's ``x-opt-sequence-number``
(long), ``x-opt-offset`` (string), ``x-opt-enqueued-time`` (timestamp) appended to the
sender's entries, then the same bare bytes. Nothing is re-encoded on the way through. (Event
Hubs hands a sender's delivery annotations to its consumers: azure-eventhub's live tests
check it, ``tests/livetest/synctests/test_send.py``; the Python SDK writes them after the
bare message, where they are found here.)
"""

from __future__ import annotations

import struct
from typing import Any

from ...amqp import codec, scan
from ...amqp.types import symbol, timestamp
from ...symbols import ENQUEUED_TIME, PARTITION_KEY, SEQUENCE_NUMBER
from .. import wire
from .log import Event, PartitionState

OFFSET = symbol("x-opt-offset")
_SERVICE_KEYS = frozenset({SEQUENCE_NUMBER, ENQUEUED_TIME, OFFSET})
"""What the service stamps on delivery: a sender's own values are dropped."""
_ANNOTATIONS_SECTION = b"\x00\x53\x72"
_DELIVERY_ANNOTATIONS_SECTION = b"\x00\x53\x71"
_LAST_SEQUENCE_NUMBER = symbol("last_enqueued_sequence_number")
_LAST_OFFSET = symbol("last_enqueued_offset")
_LAST_ENQUEUED_TIME = symbol("last_enqueued_time_utc")
_RETRIEVAL_TIME = symbol("runtime_info_retrieval_time_utc")


def partition_key_of(annotations: dict[Any, Any]) -> str | None:
    """The ``x-opt-partition-key`` a sender set, as text."""
    value = annotations.get(PARTITION_KEY)
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def stored_event(
    message: wire.IncomingMessage, partition_key: str | None, payload: bytes = b""
) -> tuple[str | None, bytes | None, bytes]:
    """``(partition key, annotations sections, bare message)`` as the log keeps an event:
    the delivery-annotations section the sender wrote in ``payload`` (the message's bytes),
    then its message annotations, in which the key the event was routed by is written when
    they lack one."""
    annotations = {k: v for k, v in message.annotations.items() if k not in _SERVICE_KEYS}
    key = partition_key_of(annotations)
    if key is None and partition_key is not None:
        annotations[PARTITION_KEY] = key = partition_key
    section = wire.encode_annotations(annotations) if annotations else b""
    section = _delivery_annotations_in(payload) + section
    return key, section or None, message.bare


def _delivery_annotations_in(payload: bytes) -> bytes:
    """The delivery-annotations section of one encoded message, wherever it is, or b""."""
    pos = 0
    while pos < len(payload):
        start, pos = pos, codec.skip_at(payload, pos)
        if payload.startswith(_DELIVERY_ANNOTATIONS_SECTION, start):
            return payload[start:pos]
    return b""


def _symbol(value: Any) -> bytes:
    out = bytearray()
    codec.encode_into(out, value)
    return bytes(out)


_SEQUENCE_NUMBER_KEY = _symbol(SEQUENCE_NUMBER)
_OFFSET_KEY = _symbol(OFFSET)
_ENQUEUED_TIME_KEY = _symbol(ENQUEUED_TIME)
_pack_int64 = struct.Struct(">Bq").pack


def delivery_payload(event: Event, last: PartitionState | None = None, now_ms: int = 0) -> bytes:
    """The bytes a consumer receives for ``event``; with ``last`` (a consumer that asked for
    ``com.microsoft:enable-receiver-runtime-metric``) delivery annotations say where the
    partition ends, as of ``now_ms``."""
    out = bytearray()
    annotations = event.annotations or b""
    delivery_count, delivery_pairs = 0, bytearray()
    if annotations.startswith(_DELIVERY_ANNOTATIONS_SECTION):  # the sender's
        end = codec.skip_at(annotations, 0)
        delivery_count, entries = scan.map_items(annotations, len(_DELIVERY_ANNOTATIONS_SECTION))
        delivery_pairs += entries
        annotations = annotations[end:]
    if last is not None:
        metric = {
            _LAST_SEQUENCE_NUMBER: last.last_sequence_number,
            _LAST_OFFSET: str(last.last_offset),
            _LAST_ENQUEUED_TIME: timestamp(last.last_enqueued_ms),
            _RETRIEVAL_TIME: timestamp(now_ms),
        }
        for name, value in metric.items():
            codec.encode_into(delivery_pairs, name)
            codec.encode_into(delivery_pairs, value)
        delivery_count += 2 * len(metric)
    if delivery_count:
        out += _DELIVERY_ANNOTATIONS_SECTION
        codec.write_compound(out, delivery_pairs, delivery_count, 0xC1)
    count, pairs = 0, bytearray()
    if annotations:
        count, entries = scan.map_items(annotations, len(_ANNOTATIONS_SECTION))
        pairs += entries
    pairs += _SEQUENCE_NUMBER_KEY
    pairs += _pack_int64(0x81, event.sequence_number)
    pairs += _OFFSET_KEY
    codec.encode_into(pairs, str(event.offset))
    pairs += _ENQUEUED_TIME_KEY
    pairs += _pack_int64(0x83, event.enqueued_ms)
    out += _ANNOTATIONS_SECTION
    codec.write_compound(out, pairs, count + 6, 0xC1)
    out += event.bare
    return bytes(out)
