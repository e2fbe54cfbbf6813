"""The broker's wire shortcuts against the general codec: a send split by the scanner is the
same as split by the decoder, and a delivery written by hand decodes to what it should."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replication.amqp import codec
from replication.amqp.message import DeliveryAnnotations, Header, Properties, encode_message
from replication.amqp.message import Message as AmqpMessage
from replication.amqp.types import symbol, timestamp
from replication.broker import wire
from replication.symbols import (
    DEAD_LETTER_SOURCE,
    ENQUEUE_SEQUENCE_NUMBER,
    ENQUEUED_TIME,
    LOCK_TOKEN,
    LOCKED_UNTIL,
    MESSAGE_STATE,
    SEQUENCE_NUMBER,
)
from tests.amqp.strategies import amqp_messages


@settings(max_examples=settings.default.max_examples * 3 // 2)  # 300 on CI, 75 at a desk
@given(amqp_messages(), st.booleans())
def test_parse_message_equals_the_general_decoder(message: AmqpMessage, sdk_tail: bool) -> None:
    payload = encode_message(message)
    if sdk_tail:  # the Python SDK writes delivery annotations after the bare message
        out = bytearray(payload)
        codec.encode_into(out, DeliveryAnnotations({symbol("x-tail"): 1}))
        payload = bytes(out)
    assert wire.parse_message(payload) == wire._decoded(payload)
    scanned = wire._scanned(payload)  # the shortcut read it itself
    assert scanned == wire._decoded(payload)
    # the properties rewritten where the scan found them, or by reading the sections again
    start, expires = 1_763_999_400_000, 1_764_000_000_000
    assert wire.with_expiry(scanned, start, expires) == wire.with_expiry(
        wire._decoded(payload), start, expires
    )


@pytest.mark.parametrize("sender_annotations", [{}, {symbol("x-opt-partition-key"): "pk"}])
@pytest.mark.parametrize(
    ("ttl_ms", "delivery_count", "sequence_number"),
    [(None, 0, 1), (100, 255, 127), (5000, 256, 128), (2**32, 70000, 2**40)],
)
def test_delivery_payload_decodes_to_its_values(
    sender_annotations: dict[str, object], ttl_ms: int | None, delivery_count: int,
    sequence_number: int,
) -> None:  # fmt: skip
    token = uuid.uuid4()
    payload = wire.delivery_payload(
        bare=encode_message(AmqpMessage(body=[b"body"])),
        sender_annotations=wire.encode_annotations(sender_annotations) or None,
        sequence_number=sequence_number, enqueued_ms=1_764_000_000_000,
        delivery_count=delivery_count, ttl_ms=ttl_ms, locked_until_ms=1_764_000_060_000,
        lock_token=token, state=2,
    )  # fmt: skip
    header, delivery_annotations, annotations, body = codec.decode_all(payload)
    assert delivery_annotations.value == {LOCK_TOKEN: token}
    assert header == Header(
        durable=True, ttl=ttl_ms if ttl_ms and ttl_ms < 2**32 else None,
        delivery_count=delivery_count,
    )  # fmt: skip
    assert annotations.value == {
        **sender_annotations,
        SEQUENCE_NUMBER: sequence_number, ENQUEUED_TIME: timestamp(1_764_000_000_000),
        ENQUEUE_SEQUENCE_NUMBER: sequence_number, LOCKED_UNTIL: timestamp(1_764_000_060_000),
        MESSAGE_STATE: 2,
    }  # fmt: skip
    assert body.value == b"body"


def test_the_brokers_dead_letter_source_replaces_a_stored_one() -> None:
    stored = {symbol(DEAD_LETTER_SOURCE): "old", symbol("x-pad"): "p" * 300}
    payload = wire.delivery_payload(
        bare=b"", sender_annotations=wire.encode_annotations(stored), sequence_number=1,
        enqueued_ms=0, delivery_count=0, ttl_ms=None, locked_until_ms=None, lock_token=None,
        dead_letter_source="q",
    )  # fmt: skip
    _, annotations = codec.decode_all(payload)
    assert annotations.value[DEAD_LETTER_SOURCE] == "q"
    assert annotations.value["x-pad"] == "p" * 300
    assert len(annotations.value) == 5


def test_a_message_id_goes_into_an_empty_properties_list_as_into_any_other() -> None:
    # proton writes an empty properties list (0x45) when no property is set
    bare = b"\x00\x53\x73\x45" + b"\x00\x53\x77\xa0\x04body"
    message = wire.parse_message(b"\x00\x53\x70\xc0\x02\x01\x41" + bare)
    assert message.properties_span == (0, 4)
    assert message.message_id is None

    wire.ensure_message_id(message)

    message_id = message.message_id
    assert message_id is not None and len(message_id) == 32
    expected, span = wire._with_properties(bare, Properties(message_id=message_id), (0, 4))
    assert (message.bare, message.properties_span) == (expected, span)
    assert message.size == len(message.bare) + 7
    properties, body = codec.decode_all(message.bare)
    assert properties == Properties(message_id=message_id)
    assert body.value == b"body"
