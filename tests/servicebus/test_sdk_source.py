"""``SdkSource``/``SdkReceiver``: azure-servicebus behind ``AmqpSource``'s interface, against
the real broker. What both backends share runs in tests/host over both; here is what is the
SDK adapter's own: its errors as ours, and the places where the SDK cannot do what our AMQP
receiver does (release, properties changed on abandon), done the closest correct way."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage

from replication.broker.clock import ManualClock
from replication.servicebus.client import AuthenticationError, NoSessionAvailable, SourceError
from replication.servicebus.sdk_source import SdkReceiver, SdkSource, lock_token, split_path
from replication.tasks.locks import LockKeeper, lock_lost
from tests.broker.conftest import BrokerHandle, make_config
from tests.waiting import until

pytestmark = pytest.mark.timeout(120)

CONFIG = make_config({
    "plain": {"LockDuration": "PT5S"}, "s": {"RequiresSession": True, "LockDuration": "PT5S"},
})  # fmt: skip


def send(broker: BrokerHandle, queue: str, count: int, **fields: Any) -> None:
    with broker.client() as client, client.get_queue_sender(queue) as sender:
        sender.send_messages(
            [ServiceBusMessage(f"m{n}", message_id=f"m{n}", **fields) for n in range(count)]
        )


async def receive_all(receiver: SdkReceiver, count: int) -> list[Any]:
    out: list[Any] = []
    for _ in range(20):
        out += await receiver.receive(count - len(out), 1.0)
        if len(out) >= count:
            break
    assert len(out) == count, [m.message_id for m in out]
    return out


def test_paths_name_what_the_sdk_names() -> None:
    assert split_path("orders") == ("orders", None, False)
    assert split_path("events/Subscriptions/audit") == ("events", "audit", False)
    assert split_path("orders/$DeadLetterQueue") == ("orders", None, True)
    assert split_path("events/subscriptions/audit/$deadletterqueue") == ("events", "audit", True)


@pytest.mark.broker_config(CONFIG)
async def test_errors_are_ours(broker: BrokerHandle) -> None:
    """A wrong key is an ``AuthenticationError`` (not retryable), a missing entity is
    ``amqp:not-found`` (not retryable), no free session is ``NoSessionAvailable``."""
    wrong = broker.connection_string_for("RootManageSharedAccessKey", "not-the-key")
    async with SdkSource.from_connection_string(wrong, retry_total=0) as source:
        with pytest.raises(AuthenticationError, match="cannot receive from plain") as caught:
            await source.receiver("plain")
        assert not caught.value.retryable
    async with SdkSource.from_connection_string(broker.connection_string) as source:
        with pytest.raises(SourceError, match="cannot receive from nowhere") as missing:
            await source.receiver("nowhere")
        assert missing.value.condition == "amqp:not-found" and not missing.value.retryable
        with pytest.raises(NoSessionAvailable, match=r"no session of s within 0\.5 s"):
            await source.receiver("s", session=True, wait=0.5)


@pytest.mark.broker_config(CONFIG)
async def test_a_session_receiver_releases_by_giving_the_session_back(
    broker: BrokerHandle,
) -> None:
    """No released outcome in the SDK: a session's messages are left unsettled and go back
    with the session when the receiver closes, with no delivery counted."""
    send(broker, "s", 3, session_id="a")
    async with SdkSource.from_connection_string(broker.connection_string) as source:
        receiver = await source.receiver("s", session=True, wait=2.0)
        assert receiver.session_id == "a" and receiver.session_locked_until is not None
        batch = await receive_all(receiver, 3)
        assert receiver.release(batch) == 3
        await receiver.close()
        again = await source.receiver("s", session=True, wait=2.0)
        batch = await receive_all(again, 3)
        assert [(m.message_id, m.delivery_count) for m in batch] == [
            ("m0", 0), ("m1", 0), ("m2", 0),
        ]  # fmt: skip
        assert again.complete(batch) == 3
        await again.close()  # what is queued goes out first
    assert broker.count("s") == 0


@pytest.mark.broker_config(CONFIG)
async def test_a_plain_receiver_abandons_what_it_cannot_release(
    broker: BrokerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    """A plain SDK receiver has no way to give a message back without counting a delivery:
    release abandons. Abandon cannot change properties through the SDK: they are dropped
    with a warning, the message is abandoned unchanged."""
    send(broker, "plain", 2)
    async with SdkSource.from_connection_string(broker.connection_string) as source:
        receiver = await source.receiver("plain", prefetch=10)
        first, second = await receive_all(receiver, 2)
        assert receiver.release([first]) == 1
        with caplog.at_level(logging.WARNING, "replication.servicebus.sdk_source"):
            assert receiver.abandon([second], {"why": "told to"}) == 1
        assert "cannot modify properties on abandon; why dropped" in caplog.text
        again = await receive_all(receiver, 2)  # the settlements went out before this receive
        assert sorted((m.message_id, m.delivery_count) for m in again) == [("m0", 1), ("m1", 1)]
        assert all("why" not in m.application_properties for m in again)
        receiver.complete(again)
        await receiver.close()
    assert broker.count("plain") == 0


async def test_locks_are_kept_through_the_sdk_and_found_after_settling(
    broker_factory: Callable[..., BrokerHandle],
) -> None:
    """``LockKeeper`` renews an SDK receiver's held messages (LockDuration 5 s, held 7 s on
    a ``ManualClock`` the broker and the keeper share); their lock tokens stay known after
    settlement (the SDK forgets them), so the keeper lets them go. Real-time renewal:
    tests/tasks/test_pump_locks.py ``test_slow_batch_keeps_its_locks``."""
    clock = ManualClock()
    broker = broker_factory(CONFIG, clock=clock)
    send(broker, "plain", 2)
    async with SdkSource.from_connection_string(broker.connection_string) as source:
        receiver = await source.receiver("plain", prefetch=2)
        batch = await receive_all(receiver, 2)
        async with LockKeeper(receiver, clock=clock.time, sleep=clock.sleep) as keeper:
            keeper.hold(batch)
            await until(lambda: clock.sleeping, "the keeper asleep")
            for second in range(7):  # the keeper looks once a second at most
                await asyncio.to_thread(broker.advance, 1.0)  # expires what was not renewed
                await until(lambda: (clock.next_wake() or 0) > 0, f"the keeper asleep ({second})")
            assert keeper.renewals >= 1
            assert broker.call(lambda: len(broker.broker.queues["plain"].locks)) == 2
            tokens = [lock_token(m) for m in batch]
            assert receiver.complete(batch) == 2
            await receiver.receive(1, 0.2)  # the completes go out first
            assert [lock_token(m) for m in batch] == tokens
            keeper.settled(batch)
            assert keeper.held == 0
        with pytest.raises(SourceError, match="plain: cannot renew the lock of m0") as caught:
            await receiver.management.renew_locks(receiver, batch)
        assert lock_lost(caught.value)
        await receiver.close()
    assert broker.count("plain") == 0
