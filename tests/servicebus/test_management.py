"""``$management`` over our AMQP connection against the broker: lock renewal keeps a message
(and a session) ours past its lock duration; errors come back with the service's status."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusMessage

from replication.servicebus.client import AmqpConnection, AmqpSource, SourceError
from replication.servicebus.endpoint import Endpoint
from replication.servicebus.management import Management, lock_token
from tests.broker.conftest import BrokerHandle, make_config

pytestmark = pytest.mark.timeout(60)

CONFIG = make_config({
    "short": {"LockDuration": "PT5S"},
    "s-short": {"LockDuration": "PT5S", "RequiresSession": True},
})  # fmt: skip


def send(broker: BrokerHandle, queue: str, messages: list[ServiceBusMessage]) -> None:
    with broker.client() as client, client.get_queue_sender(queue) as sender:
        sender.send_messages(messages)


@pytest.mark.parametrize("queue", ["short", "s-short"])
async def test_renewed_locks_outlast_the_lock_duration(broker_factory, queue: str) -> None:  # type: ignore[no-untyped-def]
    broker: BrokerHandle = broker_factory(CONFIG)
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
            await asyncio.sleep(2)
            expiry = await management.renew_locks(receiver, batch)
            assert expiry > datetime.now(UTC) + timedelta(seconds=4)
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
    from replication.broker import server

    monkeypatch.setattr(server, "TOKEN_GRACE_SECONDS", 1.0)
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
