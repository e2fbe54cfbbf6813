"""The core flows with the asyncio SDK (``azure.servicebus.aio``): send, receive, complete,
abandon, dead-letter, defer, peek, renew, schedule and cancel. The broker runs on its own
loop in another thread; the client runs on the test's loop."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from azure.core.credentials import AzureSasCredential
from azure.servicebus import (
    ServiceBusMessage,
    ServiceBusMessageState,
    ServiceBusReceivedMessage,
    ServiceBusSubQueue,
)
from azure.servicebus.aio import ServiceBusReceiver

from replication.broker.auth import EMULATOR_KEY, EMULATOR_RULE_NAME
from replication.broker.clock import ManualClock
from replication.servicebus.sas import generate_sas_token

from .conftest import BrokerHandle, QuickCloseAsyncClient, body_bytes, whole_ms

pytestmark = pytest.mark.timeout(60)


def now() -> datetime:
    return datetime.now(UTC)


async def receive_n(
    receiver: ServiceBusReceiver, count: int, timeout: float = 10.0
) -> list[ServiceBusReceivedMessage]:
    received: list[ServiceBusReceivedMessage] = []
    deadline = time.monotonic() + timeout
    while len(received) < count and time.monotonic() < deadline:
        received += await receiver.receive_messages(
            max_message_count=count - len(received), max_wait_time=1
        )
    assert len(received) == count, f"received {len(received)} of {count} messages"
    return received


async def nothing_more(receiver: ServiceBusReceiver, wait: float = 0.5) -> bool:
    return await receiver.receive_messages(max_message_count=10, max_wait_time=wait) == []


async def test_send_receive_complete(broker: BrokerHandle) -> None:
    async with broker.aio_client() as client:
        before = now()
        async with client.get_queue_sender("q") as sender:
            await sender.send_messages(
                ServiceBusMessage(
                    "async hello", message_id="a1", correlation_id="c1", subject="s",
                    content_type="text/plain", to="t", reply_to="r",
                    application_properties={"k": "v", "n": 3, "f": 0.5, "b": True},
                    time_to_live=timedelta(minutes=1),
                )
            )  # fmt: skip
            await sender.send_messages([ServiceBusMessage(f"list {i}") for i in range(2)])
            batch = await sender.create_message_batch()
            for i in range(3):
                batch.add_message(ServiceBusMessage(f"batch {i}"))
            await sender.send_messages(batch)
        async with client.get_queue_receiver("q") as receiver:
            messages = await receive_n(receiver, 6)
            received_at = now()
            assert [str(m) for m in messages] == [
                "async hello", "list 0", "list 1", "batch 0", "batch 1", "batch 2",
            ]  # fmt: skip
            first = messages[0]
            assert (first.message_id, first.correlation_id, first.subject) == ("a1", "c1", "s")
            assert (first.content_type, first.to, first.reply_to) == ("text/plain", "t", "r")
            assert first.application_properties == {b"k": b"v", b"n": 3, b"f": 0.5, b"b": True}
            assert first.time_to_live == timedelta(minutes=1)
            assert first.delivery_count == 0
            assert first.enqueued_time_utc is not None
            assert abs((first.enqueued_time_utc - before).total_seconds()) <= 2
            assert first.locked_until_utc is not None
            lock_left = (first.locked_until_utc - received_at).total_seconds()
            assert abs(lock_left - 60) <= 2
            seqs = [m.sequence_number for m in messages]
            assert seqs == list(range(1, 7))
            for m in messages:
                await receiver.complete_message(m)
            assert await nothing_more(receiver)
            assert await receiver.peek_messages(max_message_count=10, sequence_number=1) == []
    assert broker.count("q") == 0


async def test_async_iteration(broker: BrokerHandle) -> None:
    async with broker.aio_client() as client:
        async with client.get_queue_sender("q") as sender:
            await sender.send_messages([ServiceBusMessage(f"it {i}") for i in range(3)])
        got = []
        async with client.get_queue_receiver("q", max_wait_time=1) as receiver:
            async for message in receiver:
                got.append(str(message))
                await receiver.complete_message(message)
                if len(got) == 3:
                    break
    assert got == ["it 0", "it 1", "it 2"]
    assert broker.count("q") == 0


async def test_abandon_increments_delivery_count(broker: BrokerHandle) -> None:
    async with broker.aio_client() as client:
        async with client.get_queue_sender("q") as sender:
            await sender.send_messages(ServiceBusMessage("retry me", message_id="ab"))
        async with client.get_queue_receiver("q") as receiver:
            (first,) = await receive_n(receiver, 1)
            await receiver.abandon_message(first)
            (second,) = await receive_n(receiver, 1)
            assert second.message_id == "ab"
            assert second.sequence_number == first.sequence_number
            assert (first.delivery_count, second.delivery_count) == (0, 1)
            await receiver.complete_message(second)


async def test_dead_letter(broker: BrokerHandle) -> None:
    async with broker.aio_client() as client:
        async with client.get_queue_sender("q") as sender:
            await sender.send_messages(ServiceBusMessage("bad", message_id="dl"))
        async with client.get_queue_receiver("q") as receiver:
            (message,) = await receive_n(receiver, 1)
            await receiver.dead_letter_message(
                message, reason="async-reason", error_description="async description"
            )
            assert await nothing_more(receiver)
        async with client.get_queue_receiver(
            "q", sub_queue=ServiceBusSubQueue.DEAD_LETTER
        ) as receiver:
            (dead,) = await receive_n(receiver, 1)
            assert dead.message_id == "dl"
            assert dead.dead_letter_reason == "async-reason"
            assert dead.dead_letter_error_description == "async description"
            assert dead.dead_letter_source == "q"
            await receiver.complete_message(dead)
    assert broker.count("q/$DeadLetterQueue") == 0


async def test_max_delivery_count(broker: BrokerHandle) -> None:
    async with broker.aio_client() as client:
        async with client.get_queue_sender("dlq-test") as sender:
            await sender.send_messages(ServiceBusMessage("twice", message_id="mx"))
        async with client.get_queue_receiver("dlq-test") as receiver:
            for _ in range(2):
                (message,) = await receive_n(receiver, 1)
                await receiver.abandon_message(message)
            assert await nothing_more(receiver)
        async with client.get_queue_receiver(
            "dlq-test", sub_queue=ServiceBusSubQueue.DEAD_LETTER
        ) as receiver:
            (dead,) = await receive_n(receiver, 1)
            assert (dead.message_id, dead.dead_letter_reason) == ("mx", "MaxDeliveryCountExceeded")
            await receiver.complete_message(dead)


async def test_defer_and_receive_deferred(broker: BrokerHandle) -> None:
    async with broker.aio_client() as client:
        async with client.get_queue_sender("q") as sender:
            await sender.send_messages(ServiceBusMessage("later", message_id="df"))
        async with client.get_queue_receiver("q") as receiver:
            (message,) = await receive_n(receiver, 1)
            await receiver.defer_message(message)
            assert await nothing_more(receiver)
            (deferred,) = await receiver.receive_deferred_messages([message.sequence_number])
            assert deferred.message_id == "df"
            assert deferred.state == ServiceBusMessageState.DEFERRED
            assert deferred.lock_token is not None
            await receiver.complete_message(deferred)
    assert broker.count("q") == 0


async def test_peek(broker: BrokerHandle) -> None:
    async with broker.aio_client() as client:
        async with client.get_queue_sender("q") as sender:
            await sender.send_messages([ServiceBusMessage(f"pk{i}") for i in range(4)])
        async with client.get_queue_receiver("q") as receiver:
            peeked = await receiver.peek_messages(max_message_count=10)
            assert [str(m) for m in peeked] == ["pk0", "pk1", "pk2", "pk3"]
            tail = await receiver.peek_messages(max_message_count=10, sequence_number=3)
            assert [m.sequence_number for m in tail] == [3, 4]
            messages = await receive_n(receiver, 4)
            assert [m.delivery_count for m in messages] == [0, 0, 0, 0]
            for m in messages:
                await receiver.complete_message(m)


async def test_renew_lock(broker_factory: Callable[..., BrokerHandle]) -> None:
    """On the broker's ``ManualClock``: renewed 1.5 s in, the 5 s lock ends 5 s from then."""
    clock = ManualClock()
    broker = broker_factory(clock=clock)
    async with broker.aio_client() as client:
        async with client.get_queue_sender("short-lock") as sender:
            await sender.send_messages(ServiceBusMessage("renew"))
        async with client.get_queue_receiver("short-lock") as receiver:
            (message,) = await receive_n(receiver, 1)
            original = message.locked_until_utc
            assert original is not None
            broker.advance(1.5)
            renewed = await receiver.renew_message_lock(message)
            assert renewed.timestamp() == pytest.approx(clock.time() + 5, abs=0.001)
            assert (renewed - original).total_seconds() == pytest.approx(1.5, abs=0.001)
            await receiver.complete_message(message)


async def test_schedule_and_cancel(broker_factory: Callable[..., BrokerHandle]) -> None:
    """On the broker's ``ManualClock``: held back until its time, delivered from then on."""
    broker = broker_factory(clock=ManualClock())
    async with (
        broker.aio_client() as client,
        client.get_queue_sender("q") as sender,
        client.get_queue_receiver("q") as receiver,
    ):
        when = whole_ms(now() + timedelta(seconds=2.5))
        keep, drop = await sender.schedule_messages(
            [ServiceBusMessage("keep"), ServiceBusMessage("drop")], when
        )
        await sender.cancel_scheduled_messages(drop)
        (peeked,) = await receiver.peek_messages(max_message_count=10, sequence_number=1)
        assert (str(peeked), peeked.state) == ("keep", ServiceBusMessageState.SCHEDULED)
        broker.advance_to(when - timedelta(microseconds=500))
        assert await nothing_more(receiver)
        broker.advance(0.001)  # half a millisecond after its time
        (message,) = await receive_n(receiver, 1)
        assert (str(message), message.sequence_number) == ("keep", keep)
        await receiver.complete_message(message)
        assert await nothing_more(receiver)
    assert broker.count("q") == 0


async def test_sas_credential(broker: BrokerHandle) -> None:
    token = generate_sas_token(
        broker.audience(), EMULATOR_RULE_NAME, EMULATOR_KEY, int(time.time()) + 600
    )
    credential = AzureSasCredential(token)
    async with QuickCloseAsyncClient(broker.endpoint, credential, use_tls=False) as c:
        async with c.get_queue_sender("q") as sender:
            await sender.send_messages(ServiceBusMessage(b"\x00sas\xff"))
        async with c.get_queue_receiver("q") as receiver:
            (message,) = await receive_n(receiver, 1)
            assert body_bytes(message) == b"\x00sas\xff"
            await receiver.complete_message(message)
