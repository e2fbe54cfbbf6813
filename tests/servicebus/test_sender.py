"""Our sender against the SDK as the oracle: the same ``Message`` sent through
``servicebus.sender`` and through ``azure-servicebus`` (``to_sdk``) arrives the same, as the
SDK reads it back; plus what the sender does with sizes, refusals and lost links."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.servicebus.aio import ServiceBusClient

from replication.adapters.amqp import encode, property_value
from replication.amqp.codec import decode_all
from replication.amqp.message import ApplicationProperties
from replication.amqp.types import int32
from replication.messages import Message, from_received, to_sdk
from replication.servicebus.client import AmqpSource
from replication.servicebus.sender import MESSAGE_SIZE_EXCEEDED, AmqpSender, SendError
from tests.broker.conftest import BrokerHandle, make_config

CONFIG = make_config({"q": {}, "s": {"RequiresSession": True}, "small": {}})
WHEN = datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)
PROPERTIES: dict[str, Any] = {
    "text": "héllo", "small": 7, "negative": -3, "ratio": 0.25, "flag": False,
    "raw": b"utf-8 bytes", "id": uuid.UUID(int=5), "when": WHEN,
}  # fmt: skip
COMPARED = (
    "body", "message_id", "session_id", "partition_key", "correlation_id", "subject",
    "content_type", "reply_to", "reply_to_session_id", "to", "time_to_live",
    "scheduled_enqueue_time", "application_properties",
)  # fmt: skip


def full(message_id: str, session_id: str | None = None) -> Message:
    return Message(
        body=b"\x00body\xff", message_id=message_id, session_id=session_id,
        partition_key=None if session_id else "pk", correlation_id="corr", subject="subj",
        content_type="application/x", reply_to="replies", reply_to_session_id="rs", to="someone",
        time_to_live=timedelta(minutes=90), scheduled_enqueue_time=WHEN,
        application_properties=dict(PROPERTIES),
    )  # fmt: skip


async def receive(broker: BrokerHandle, queue: str, count: int, **options: Any) -> list[Message]:
    async with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        receiver = client.get_queue_receiver(queue, max_wait_time=5, **options)
        async with receiver:
            got = await receiver.receive_messages(max_message_count=count, max_wait_time=5)
            for message in got:
                await receiver.complete_message(message)
    return sorted((from_received(m) for m in got), key=lambda m: str(m.message_id))


@pytest.mark.broker_config(CONFIG)
@pytest.mark.parametrize(("queue", "session"), [("q", None), ("s", "session-1")])
async def test_a_message_arrives_as_the_sdk_would_have_sent_it(
    broker: BrokerHandle, queue: str, session: str | None
) -> None:
    async with AmqpSource.from_connection_string(broker.connection_string) as namespace:
        await AmqpSender(namespace, queue).send_messages(full("ours", session))
    async with (
        ServiceBusClient.from_connection_string(broker.connection_string) as client,
        client.get_queue_sender(queue) as sender,
    ):
        await sender.send_messages(to_sdk(full("sdk", session)))
    options = {"session_id": session} if session else {}
    ours, sdk = await receive(broker, queue, 2, **options)
    assert (ours.message_id, sdk.message_id) == ("ours", "sdk")
    for name in COMPARED[2:]:
        assert getattr(ours, name) == getattr(sdk, name), name
    assert ours.body == sdk.body == b"\x00body\xff"


@pytest.mark.broker_config(CONFIG)
async def test_a_batch_is_one_transfer_and_keeps_order(broker: BrokerHandle) -> None:
    messages = [Message(body=f"m{i}".encode(), message_id=f"m{i}") for i in range(50)]
    async with AmqpSource.from_connection_string(broker.connection_string) as namespace:
        sender = AmqpSender(namespace, "q")
        await sender.send_messages(messages)
        assert sender.max_message_size == 256 * 1024  # the broker's link says so
    got = await receive(broker, "q", 50)
    assert sorted(m.message_id for m in got) == sorted(m.message_id for m in messages)
    assert broker.message_ids("q") == []


def test_application_properties_use_the_sdk_s_types_but_bytes_stay_binary() -> None:
    properties = {**PROPERTIES, "big": 2**40}  # the SDK cannot send this one ("int invalid")
    sections = decode_all(encode(Message(application_properties=properties)))
    (props,) = [s.value for s in sections if isinstance(s, ApplicationProperties)]
    assert isinstance(props["small"], int32) and props["small"] == 7
    # binary, which a received binary value must stay (the SDK sends UTF-8 bytes as a string)
    assert type(props["raw"]) is bytes and props["raw"] == b"utf-8 bytes"
    assert props["big"] == 2**40 and props["when"].to_datetime() == WHEN
    assert isinstance(property_value(7), int32)  # AMQP int, as the SDK's encode_int
    assert not isinstance(property_value(2**40), int32)


@pytest.mark.broker_config(CONFIG)
async def test_too_large_and_refused_sends_raise_send_error(broker: BrokerHandle) -> None:
    async with AmqpSource.from_connection_string(broker.connection_string) as namespace:
        sender = AmqpSender(namespace, "small")
        with pytest.raises(SendError, match="exceed") as too_large:
            await sender.send_messages([Message(body=b"x" * 200_000)] * 2)
        assert too_large.value.condition == MESSAGE_SIZE_EXCEEDED
        assert not too_large.value.retryable
        with pytest.raises(SendError, match=r"not-found|could not be found") as missing:
            await AmqpSender(namespace, "no-such-queue").send_messages(Message(b"x"))
        assert not missing.value.retryable
        await sender.send_messages(Message(b"still fine"))
    assert broker.count("small") == 1


@pytest.mark.broker_config(CONFIG)
async def test_a_lost_connection_is_reopened_on_the_next_send(broker: BrokerHandle) -> None:
    async with AmqpSource.from_connection_string(broker.connection_string) as namespace:
        sender = AmqpSender(namespace, "q")
        await sender.send_messages(Message(b"one", message_id="one"))
        connection = await namespace.connection()
        await connection.client.close()  # as if the network dropped it
        await sender.send_messages(Message(b"two", message_id="two"))
    assert sorted(m.message_id for m in await receive(broker, "q", 2)) == ["one", "two"]
