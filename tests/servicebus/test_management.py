"""``$management`` over our AMQP connection against the broker: lock renewal keeps a message
(and a session) ours past its lock duration; peek shows messages without locking them;
errors come back with the service's status."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage

from replication.clock import ManualClock
from replication.servicebus.client import AmqpConnection, AmqpSource, SourceError
from replication.servicebus.endpoint import Endpoint
from replication.servicebus.management import Management, lock_token
from tests.broker.conftest import BrokerHandle, make_config

pytestmark = pytest.mark.timeout(60)

CONFIG = make_config({
    "short": {"LockDuration": "PT5S"},
    "s-short": {"LockDuration": "PT5S", "RequiresSession": True},
}, topics={"news": {"Subscriptions": {"all": {}}}})  # fmt: skip


def send(broker: BrokerHandle, queue: str, messages: list[ServiceBusMessage]) -> None:
    with broker.client() as client, client.get_queue_sender(queue) as sender:
        sender.send_messages(messages)


@pytest.mark.parametrize("queue", ["short", "s-short"])
async def test_renewed_locks_outlast_the_lock_duration(broker_factory, queue: str) -> None:  # type: ignore[no-untyped-def]
    """Renewed every 2 s for 8 s on the broker's ``ManualClock`` (a 5 s lock): each renewal
    gives 5 s from then, and completing at the end works."""
    clock = ManualClock()
    broker: BrokerHandle = broker_factory(CONFIG, clock=clock)
    session = "s1" if queue == "s-short" else None
    send(broker, queue, [ServiceBusMessage(f"m{i}", message_id=f"m{i}", session_id=session)
                         for i in range(3)])  # fmt: skip
    endpoint = Endpoint.from_connection_string(broker.connection_string)
    async with AmqpSource(endpoint) as source:
        receiver = await source.receiver(queue, session=session is not None, wait=5)
        batch = await receiver.receive(3, 5)
        assert len(batch) == 3 and all(lock_token(m) for m in batch)
        management = Management(await source.connection())
        for _ in range(4):  # 8 s in all: past the 5 s lock duration
            await asyncio.to_thread(broker.advance, 2)  # expires what was not renewed
            expiry = await management.renew_locks(receiver, batch)
            assert expiry.timestamp() == pytest.approx(clock.time() + 5, abs=0.001)
        assert receiver.complete(batch) == 3
        await asyncio.sleep(0.3)
        await receiver.close()
    assert broker.count(queue) == 0  # completed: the locks were still ours


async def test_a_refused_request_says_why(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker: BrokerHandle = broker_factory(CONFIG)
    endpoint = Endpoint.from_connection_string(broker.connection_string)
    async with AmqpSource(endpoint) as source:
        management = Management(await source.connection())
        with pytest.raises(SourceError, match=r"renew-lock on short: 410 .* TrackingId:\w+_G0"):
            await management.request("short", "com.microsoft:renew-lock",
                                     {"lock-tokens": [uuid.uuid4()]})  # fmt: skip


async def test_replies_go_to_the_link_the_request_names(broker_factory) -> None:  # type: ignore[no-untyped-def]
    """Two management clients on one connection, each with its own reply link on the same
    node: each answer goes to the link its request's ``reply-to`` names (seed 000), not to
    the node's last reply link (the first client would wait for an answer forever)."""
    broker: BrokerHandle = broker_factory(CONFIG)
    endpoint = Endpoint.from_connection_string(broker.connection_string)
    async with AmqpSource(endpoint, timeout=5) as source:
        connection = await source.connection()
        first, second = Management(connection), Management(connection)
        for management in (first, second, first, second):
            with pytest.raises(SourceError, match="renew-lock on short: 410"):
                await management.request("short", "com.microsoft:renew-lock",
                                         {"lock-tokens": [uuid.uuid4()]})  # fmt: skip


async def test_a_connection_without_a_token_is_closed_after_the_grace_period(
    broker_factory, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Seed 000: a valid token must be put within 20 s of connecting (1 s here), even by a
    connection that holds nothing but its ``$cbs`` links; one that did stays open."""
    from replication.broker import cbs

    monkeypatch.setattr(cbs, "TOKEN_GRACE_SECONDS", 1.0)
    broker: BrokerHandle = broker_factory(CONFIG)
    endpoint = Endpoint.from_connection_string(broker.connection_string)
    idle = await AmqpConnection.open(endpoint, timeout=5)
    authorized = await AmqpConnection.open(endpoint, timeout=5)
    await authorized.authorize("short")
    try:
        await asyncio.wait_for(idle.client.driver.closed.wait(), 10)
        assert not authorized.closed
    finally:
        await idle.close()
        await authorized.close()


async def test_peek_shows_messages_in_order_and_locks_nothing(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker: BrokerHandle = broker_factory(CONFIG)
    send(broker, "short", [ServiceBusMessage(f"body {i}", message_id=f"m{i}",
                                             application_properties={"n": i})
                           for i in range(5)])  # fmt: skip
    async with AmqpSource(Endpoint.from_connection_string(broker.connection_string)) as source:
        management = Management(await source.connection())
        first = await management.peek("short", 3)
        assert [(m.message_id, m.body, m.application_properties) for m in first] == [
            (f"m{i}", f"body {i}".encode(), {"n": i}) for i in range(3)
        ]
        sequence = [m.sequence_number for m in first]
        assert sequence == sorted(sequence) and all(m.source is None for m in first)
        rest = await management.peek("short", 10, from_sequence_number=sequence[-1] + 1)
        assert [m.message_id for m in rest] == ["m3", "m4"]
        assert await management.peek("short", 10, from_sequence_number=10_000) == []
        receiver = await source.receiver("short")
        taken = await receiver.receive(5, 5)
        assert [m.message_id for m in taken] == [f"m{i}" for i in range(5)]  # none was locked
        assert [m.delivery_count for m in taken] == [0] * 5  # and peeking is no delivery
        receiver.complete(taken)
        await receiver.close()


async def test_peek_into_one_session_leaves_it_free(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker: BrokerHandle = broker_factory(CONFIG)
    send(broker, "s-short", [ServiceBusMessage(f"{s}{i}", message_id=f"{s}{i}", session_id=s)
                             for i in range(3) for s in ("a", "b")])  # fmt: skip
    async with AmqpSource(Endpoint.from_connection_string(broker.connection_string)) as source:
        management = Management(await source.connection())
        peeked = await management.peek("s-short", 10, session_id="b")
        assert [(m.message_id, m.session_id) for m in peeked] == [(f"b{i}", "b") for i in range(3)]
        everything = await management.peek("s-short", 10)  # no session: across all of them
        assert len(everything) == 6
        receiver = await source.receiver("s-short", session=True, session_id="b", wait=5)
        assert receiver.session_id == "b"  # the peek did not lock the session
        await receiver.close()


async def test_peek_reads_dead_letters_and_subscriptions(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker: BrokerHandle = broker_factory(CONFIG)
    send(broker, "short", [ServiceBusMessage("x", message_id=f"m{i}") for i in range(2)])
    with broker.client() as client:
        with client.get_topic_sender("news") as sender:
            sender.send_messages(ServiceBusMessage("headline", message_id="n0"))
        with client.get_queue_receiver("short", max_wait_time=2) as receiver:
            [first] = receiver.receive_messages(max_message_count=1)
            receiver.dead_letter_message(first, reason="bad", error_description="for the test")
    async with AmqpSource(Endpoint.from_connection_string(broker.connection_string)) as source:
        management = Management(await source.connection())
        [dead] = await management.peek("short/$DeadLetterQueue", 10)
        assert (dead.message_id, dead.dead_letter_reason, dead.dead_letter_description) == (
            "m0", "bad", "for the test",
        )  # fmt: skip
        assert [m.message_id for m in await management.peek("short", 10)] == ["m1"]
        [news] = await management.peek("news/Subscriptions/all", 10)
        assert (news.message_id, news.body) == ("n0", b"headline")


class _Stingy(Management):
    """Gives at most two messages per reply, as a service may (it promises no more)."""

    def __init__(self, connection: AmqpConnection) -> None:
        super().__init__(connection)
        self.asked: list[dict[str, Any]] = []

    async def request(self, path: str, operation: str, body: dict[str, Any]) -> dict[str, Any]:
        self.asked.append(dict(body))
        reply = await super().request(path, operation, body)
        return {**reply, "messages": (reply.get("messages") or [])[:2]}


async def test_peek_asks_again_when_a_reply_holds_fewer(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker: BrokerHandle = broker_factory(CONFIG)
    send(broker, "short", [ServiceBusMessage("x", message_id=f"m{i}") for i in range(5)])
    async with AmqpSource(Endpoint.from_connection_string(broker.connection_string)) as source:
        management = _Stingy(await source.connection())
        peeked = await management.peek("short", 4)
        assert [m.message_id for m in peeked] == ["m0", "m1", "m2", "m3"]
        assert [b["message-count"] for b in management.asked] == [4, 2]
        everything = await management.peek("short", 100)
        assert [m.message_id for m in everything] == [f"m{i}" for i in range(5)]


async def test_peek_heads_tell_what_the_sdk_s_peek_tells_without_the_bodies(broker_factory) -> None:  # type: ignore[no-untyped-def]
    """Sequence number, enqueued time, state (active, deferred, scheduled) and time to live
    of each message, as azure-servicebus's peek reads them (the oracle)."""
    from datetime import UTC, datetime, timedelta

    from replication.servicebus.management import ACTIVE, DEFERRED, SCHEDULED, PeekedHead

    broker: BrokerHandle = broker_factory(CONFIG)
    with broker.client() as client:
        with client.get_queue_sender("short") as sender:
            sender.schedule_messages(
                ServiceBusMessage(b"x" * 5000, message_id="later"),
                datetime.now(UTC) + timedelta(hours=1),
            )
            sender.send_messages(
                [
                    ServiceBusMessage("d", message_id="d"),
                    ServiceBusMessage("t", message_id="t", time_to_live=timedelta(seconds=90)),
                ]
            )
        with client.get_queue_receiver("short") as receiver:
            (deferred,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            receiver.defer_message(deferred)
        with client.get_queue_receiver("short") as browser:  # a fresh one peeks from the head
            oracle = browser.peek_messages(10)
    endpoint = Endpoint.from_connection_string(broker.connection_string)
    async with AmqpSource(endpoint) as source:
        heads = await Management(await source.connection()).peek_heads("short", 10)
    expected = [
        PeekedHead(
            m.sequence_number,
            round(m.enqueued_time_utc.timestamp() * 1000),
            int(m.state),
            None if m.time_to_live is None else round(m.time_to_live.total_seconds() * 1000),
        )
        for m in oracle
    ]
    assert heads == expected
    assert [h.state for h in heads] == [SCHEDULED, DEFERRED, ACTIVE]
    assert heads[2].ttl_ms == 90_000 and not heads[2].expired(heads[2].enqueued_ms + 89_999)
    assert heads[2].expired(heads[2].enqueued_ms + 90_000)
