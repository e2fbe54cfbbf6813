"""Transactions and send-via on our Service Bus client, against the broker (its side:
tests/broker/test_transactions.py): what a commit makes visible together, what a rollback
leaves, and the errors of a transaction used wrongly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusMessage

from replication.messages import Message
from replication.servicebus.client import AmqpReceiver, AmqpSource
from replication.servicebus.management import Management
from replication.servicebus.sender import AmqpSender, SendError
from replication.servicebus.transactions import TransactionError, TransactionState
from tests.broker.conftest import BrokerHandle, make_config, receive_all

pytestmark = pytest.mark.timeout(60)

CONFIG = make_config({"src": {}, "dest": {}, "other": {}})


@pytest.fixture
def broker(broker_factory) -> BrokerHandle:  # type: ignore[no-untyped-def]
    return broker_factory(CONFIG)


@pytest.fixture
async def namespace(broker: BrokerHandle) -> AsyncIterator[AmqpSource]:
    async with AmqpSource.from_connection_string(broker.connection_string, timeout=5) as source:
        yield source


def send(broker: BrokerHandle, queue: str, *ids: str) -> None:
    with broker.client() as client, client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"body {i}", message_id=i) for i in ids])


async def received(
    namespace: AmqpSource, queue: str, count: int
) -> tuple[AmqpReceiver, list[Message]]:
    receiver = await namespace.receiver(queue, prefetch=count)
    batch: list[Message] = []
    while len(batch) < count:
        more = await receiver.receive(count - len(batch), 5)
        assert more, f"only {len(batch)} of {count} messages arrived from {queue}"
        batch += more
    return receiver, batch


def expire_locks(broker: BrokerHandle, queue: str) -> None:
    """The locks of ``queue``'s messages run out now (what a stalled consumer meets)."""

    def expire() -> None:
        assert broker.broker is not None
        for lock in broker.broker.queues[queue].locks.values():
            lock.until_ms = 0

    broker.call(expire)


def ids(messages: list[object]) -> list[str | None]:
    return [getattr(m, "message_id", None) for m in messages]


# ---------------------------------------------------------------------------- commit / rollback


async def test_commit_makes_the_copies_and_the_complete_visible_together(
    broker: BrokerHandle, namespace: AmqpSource
) -> None:
    send(broker, "src", "a", "b")
    receiver, batch = await received(namespace, "src", 2)
    sender = AmqpSender(namespace, "dest", via="src")
    management = Management(await namespace.connection())
    async with namespace.transaction() as txn:
        await sender.send_messages([m.copy() for m in batch], transaction=txn)
        assert receiver.complete(batch, transaction=txn) == 2
        await asyncio.sleep(0.2)  # the broker has both by now: neither shows before commit
        assert await management.peek("dest", 10) == []
        assert broker.count("src") == 2
    assert txn.state is TransactionState.COMMITTED
    assert broker.count("src") == 0
    assert ids(receive_all(broker, "dest")) == ["a", "b"]
    await receiver.close()


async def test_an_exception_rolls_back_the_sends_and_the_settlements(
    broker: BrokerHandle, namespace: AmqpSource
) -> None:
    send(broker, "src", "a")
    receiver, batch = await received(namespace, "src", 1)
    sender = AmqpSender(namespace, "dest", via="src")
    with pytest.raises(RuntimeError, match="the step failed"):
        async with namespace.transaction() as txn:
            await sender.send_messages(batch[0].copy(), transaction=txn)
            receiver.complete(batch, transaction=txn)
            raise RuntimeError("the step failed")
    assert txn.state is TransactionState.ROLLED_BACK
    assert broker.count("dest") == 0
    assert broker.count("src") == 1  # still there, and still locked: the complete never was
    assert await receiver.receive(1, 0.3) == []
    expire_locks(broker, "src")  # once the lock runs out, it comes again
    [again] = await receiver.receive(1, 5)
    assert (again.message_id, again.delivery_count) == ("a", 1)
    receiver.complete([again])
    await receiver.close()


async def test_rollback_by_hand_and_abandon_dead_letter_in_a_transaction(
    broker: BrokerHandle, namespace: AmqpSource
) -> None:
    send(broker, "src", "keep", "drop")
    receiver, [keep, drop] = await received(namespace, "src", 2)
    async with namespace.transaction() as txn:
        receiver.abandon([keep], transaction=txn)
        receiver.dead_letter(drop, "bad", "a reason", transaction=txn)
        await txn.rollback()  # ended in the block: nothing is committed after it
    assert txn.state is TransactionState.ROLLED_BACK
    assert broker.count("src") == 2
    expire_locks(broker, "src")
    again = await receiver.receive(2, 5)
    async with namespace.transaction() as txn:
        receiver.abandon([m for m in again if m.message_id == "keep"], transaction=txn)
        receiver.dead_letter(next(m for m in again if m.message_id == "drop"), "bad",
                             "a reason", transaction=txn)  # fmt: skip
    [dead] = receive_all(broker, "src/$DeadLetterQueue")
    assert (dead.message_id, dead.dead_letter_reason) == ("drop", "bad")
    [kept] = await receiver.receive(1, 5)
    assert (kept.message_id, kept.delivery_count) == ("keep", 2)  # abandoned: counted
    receiver.complete([kept])
    await receiver.close()


async def test_a_lost_lock_rolls_the_whole_commit_back(
    broker: BrokerHandle, namespace: AmqpSource
) -> None:
    """The copy is sent, but the source's complete is refused (its lock ran out): the
    commit rolls back rather than leave a copy whose source comes again."""
    send(broker, "src", "late")
    receiver, batch = await received(namespace, "src", 1)
    sender = AmqpSender(namespace, "dest", via="src")
    expire_locks(broker, "src")
    with pytest.raises(TransactionError, match=r"rolled back: settling 1 message.* of src was "
                       r"refused: .*expired") as caught:  # fmt: skip
        async with namespace.transaction() as txn:
            await sender.send_messages(batch[0].copy(), transaction=txn)
            receiver.complete(batch, transaction=txn)
    assert caught.value.condition == "com.microsoft:message-lock-lost"
    assert txn.state is TransactionState.ROLLED_BACK
    assert broker.count("dest") == 0
    [again] = await receiver.receive(1, 5)
    assert again.message_id == "late"
    receiver.complete([again])
    await receiver.close()


# ---------------------------------------------------------------------------- send-via


async def test_send_via_reaches_the_destination_only_on_commit(
    broker: BrokerHandle, namespace: AmqpSource
) -> None:
    sender = AmqpSender(namespace, "dest", via="src")
    await sender.send_messages(Message(body=b"now", message_id="plain"))  # no transaction
    management = Management(await namespace.connection())
    async with namespace.transaction() as txn:
        await sender.send_messages(
            [Message(body=b"later", message_id=f"t{i}") for i in range(3)], transaction=txn
        )
        assert ids(await management.peek("dest", 10)) == ["plain"]
    assert ids(await management.peek("dest", 10)) == ["plain", "t0", "t1", "t2"]
    assert await management.peek("src", 10) == []  # nothing stays in the via entity
    await sender.close()


async def test_send_via_to_a_missing_destination_says_so(namespace: AmqpSource) -> None:
    sender = AmqpSender(namespace, "nowhere", via="src")
    with pytest.raises(SendError, match=r"cannot send to nowhere via src: .*'nowhere' could "
                       "not be found") as caught:  # fmt: skip
        await sender.send_messages(Message(body=b"x"))
    assert caught.value.condition == "amqp:not-found"


async def test_scheduled_cancel_and_deferred_settle_in_a_transaction(
    broker: BrokerHandle, namespace: AmqpSource
) -> None:
    management = Management(await namespace.connection())
    [number] = await management.schedule_messages(
        "other", Message(body=b"x", message_id="scheduled"), datetime.now(UTC) + timedelta(hours=1)
    )
    with pytest.raises(RuntimeError, match="changed my mind"):
        async with namespace.transaction() as txn:
            await management.cancel_scheduled_messages("other", number, transaction=txn)
            raise RuntimeError("changed my mind")
    assert ids(await management.peek("other", 10)) == ["scheduled"]
    async with namespace.transaction() as txn:
        await management.cancel_scheduled_messages("other", [number], transaction=txn)
        assert ids(await management.peek("other", 10)) == ["scheduled"]
    assert await management.peek("other", 10) == []

    send(broker, "src", "deferred")
    receiver, batch = await received(namespace, "src", 1)
    receiver.defer(batch)
    [message] = await management.receive_deferred_messages("src", batch[0].sequence_number or 0)
    async with namespace.transaction() as txn:
        await management.settle([message], "complete", transaction=txn)
        assert broker.count("src") == 1
    assert broker.count("src") == 0
    await receiver.close()


# ---------------------------------------------------------------------------- misuse


async def test_a_discharged_transaction_cannot_be_used_again(
    broker: BrokerHandle, namespace: AmqpSource
) -> None:
    send(broker, "src", "a")
    receiver, batch = await received(namespace, "src", 1)
    sender = AmqpSender(namespace, "dest")
    management = Management(await namespace.connection())
    async with namespace.transaction() as txn:
        pass  # an empty transaction commits fine
    assert txn.state is TransactionState.COMMITTED
    with pytest.raises(TransactionError, match=r"transaction \w+ was committed: declare a new"):
        await sender.send_messages(Message(body=b"x"), transaction=txn)
    with pytest.raises(TransactionError, match="was committed"):
        receiver.complete(batch, transaction=txn)
    with pytest.raises(TransactionError, match="was committed"):
        await management.cancel_scheduled_messages("dest", 1, transaction=txn)
    with pytest.raises(TransactionError, match="was committed"):
        await txn.commit()
    await txn.rollback()  # a no-op once discharged
    assert txn.state is TransactionState.COMMITTED
    assert broker.count("dest") == 0
    receiver.complete(batch)
    await receiver.close()


async def test_a_transaction_belongs_to_its_connection(
    broker: BrokerHandle, namespace: AmqpSource
) -> None:
    async with AmqpSource.from_connection_string(broker.connection_string) as elsewhere:
        sender = AmqpSender(elsewhere, "dest")
        with pytest.raises(TransactionError, match="belongs to another connection"):
            async with namespace.transaction() as txn:
                await sender.send_messages(Message(body=b"x"), transaction=txn)
        assert txn.state is TransactionState.ROLLED_BACK
    assert broker.count("dest") == 0


async def test_a_lost_connection_rolls_the_transaction_back(
    broker: BrokerHandle, namespace: AmqpSource
) -> None:
    sender = AmqpSender(namespace, "dest")
    txn_scope = namespace.transaction()
    txn = await txn_scope.__aenter__()
    await sender.send_messages(Message(body=b"x", message_id="lost"), transaction=txn)
    await txn.connection.close()  # as a dropped connection: the broker rolls back
    with pytest.raises(TransactionError, match=r"connection of transaction .* was lost"):
        await txn_scope.__aexit__(None, None, None)
    assert txn.state is TransactionState.ROLLED_BACK
    assert broker.count("dest") == 0
