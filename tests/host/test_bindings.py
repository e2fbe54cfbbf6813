"""The binding data the local host writes for a delivery, read back by the extension's own
converter (``azurefunctions-extensions-bindings-servicebus``), as the worker reads it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusReceivedMessage

from replication.amqp.message import Message, Properties, encode_message
from replication.amqp.types import char, decimal128
from replication.broker import wire
from replication.host import bindings

ENQUEUED_MS = 1_764_000_000_000
LOCKED_UNTIL_MS = ENQUEUED_MS + 30_000


def delivery(lock_token: uuid.UUID | None) -> bytes:
    """What the broker sends for one message (peek-lock: with a lock token)."""
    return wire.delivery_payload(
        bare=encode_message(Message(body=[b"body"], properties=Properties(message_id="m-1"))),
        sender_annotations=None,
        sequence_number=7,
        enqueued_ms=ENQUEUED_MS,
        delivery_count=2,
        ttl_ms=60_000,
        locked_until_ms=LOCKED_UNTIL_MS,
        lock_token=lock_token,
    )


def decoded(content: bytes) -> ServiceBusReceivedMessage:
    (message,) = bindings.decode([content], True, list[ServiceBusReceivedMessage])
    return message


@pytest.mark.parametrize("sent_with_token", [True, False])
def test_the_extension_reads_every_section_of_a_delivery(sent_with_token: bool) -> None:
    token = uuid.uuid4()
    content = bindings.binding_content(delivery(token if sent_with_token else None), token)

    message = decoded(content)

    # one lock token in the content: the delivery's own annotations give way to the head
    assert content.count(b"x-opt-lock-token") == 1
    assert message.lock_token == token
    assert message.raw_amqp_message.delivery_annotations == {b"x-opt-lock-token": token}
    assert message.message_id == "m-1"
    assert b"".join(message.body) == b"body"
    # the header and the message annotations come through whole, the delivery counted as
    # the .NET SDK counts it: the AMQP delivery-count (2 earlier tries) plus this one
    assert message.delivery_count == 3
    assert message.time_to_live == timedelta(seconds=60)
    assert message.sequence_number == 7
    assert message.enqueued_time_utc == datetime.fromtimestamp(ENQUEUED_MS / 1000, UTC)
    assert message.locked_until_utc == datetime.fromtimestamp(LOCKED_UNTIL_MS / 1000, UTC)
    assert b"x-opt-lock-token" not in message.raw_amqp_message.annotations


def test_what_the_extension_cannot_decode_is_named() -> None:
    """uamqp cannot decode AMQP decimals or chars (.NET's ``decimal`` and ``char``
    properties); the extension's error says only "Cannot decode bytes"."""
    token = uuid.uuid4()
    for value, kind in ((decimal128(bytes(16)), "decimal128"), (char("a"), "char")):
        properties = {"ok": 1, "nested": [{"v": value}]}
        bare = encode_message(
            Message(
                body=[b"x"],
                properties=Properties(message_id="m"),
                application_properties=properties,
            )
        )
        payload = wire.delivery_payload(
            bare=bare,
            sender_annotations=None,
            sequence_number=1,
            enqueued_ms=ENQUEUED_MS,
            delivery_count=0,
            ttl_ms=None,
            locked_until_ms=LOCKED_UNTIL_MS,
            lock_token=token,
        )
        with pytest.raises(ValueError, match=rf"{bindings.DECODE_FAILED}: Cannot decode bytes"):
            decoded(bindings.binding_content(payload, token))
        why = f"application property 'nested' holds an AMQP {kind}, which uamqp cannot decode"
        assert bindings.undecodable(payload) == why
    assert bindings.undecodable(delivery(token)) is None
    assert bindings.undecodable(b"\x00\x53") is not None  # no AMQP message at all
