"""The typed ``$management`` helpers against the broker, with azure-servicebus as the oracle:
session state and session locks, scheduling and cancelling, deferred messages by sequence
number and their settlement, and a subscription's rules; errors come back as the
``SourceError`` their condition stands for."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage, ServiceBusSubQueue
from azure.servicebus.management import ServiceBusAdministrationClient

from replication.messages import Message
from replication.servicebus.client import (
    AmqpSource,
    EntityAlreadyExists,
    EntityNotFound,
    MessageLockLost,
    MessageNotFound,
    SessionLockLost,
    SourceError,
)
from replication.servicebus.management import Management, ManagementLock, lock_token
from replication.servicebus.rules import (
    FALSE_FILTER,
    CorrelationFilter,
    Rule,
    SqlAction,
    SqlFilter,
)
from tests.broker.conftest import BrokerHandle, make_config

pytestmark = pytest.mark.timeout(60)

CONFIG = make_config({
    "q": {},
    "s": {"RequiresSession": True},
    "short": {"LockDuration": "PT5S"},
}, topics={"events": {"Subscriptions": {"picky": {}}}})  # fmt: skip
SUBSCRIPTION = "events/Subscriptions/picky"


@pytest.fixture
def broker(broker_factory) -> BrokerHandle:  # type: ignore[no-untyped-def]
    return broker_factory(CONFIG)


@pytest.fixture
async def namespace(broker: BrokerHandle) -> AsyncIterator[AmqpSource]:
    async with AmqpSource.from_connection_string(broker.connection_string, timeout=10) as source:
        yield source


async def management_of(namespace: AmqpSource) -> Management:
    return Management(await namespace.connection())


async def sdk_send(broker: BrokerHandle, entity: str, *messages: ServiceBusMessage) -> None:
    async with broker.aio_client() as client:
        sender = client.get_topic_sender(entity) if entity == "events" else (
            client.get_queue_sender(entity)
        )  # fmt: skip
        async with sender:
            await sender.send_messages(list(messages))


# ---------------------------------------------------------------------------- sessions


async def test_session_state_set_by_us_is_what_the_sdk_reads(
    broker: BrokerHandle, namespace: AmqpSource
) -> None:
    await sdk_send(broker, "s", ServiceBusMessage("x", session_id="a"))
    management = await management_of(namespace)
    receiver = await namespace.receiver("s", session=True, session_id="a", wait=5)
    assert await management.get_session_state(receiver) is None
    await management.set_session_state(receiver, b"\x00step 3\xff")
    assert await management.get_session_state(receiver) == b"\x00step 3\xff"
    await receiver.close()

    async with (
        broker.aio_client() as client,
        client.get_queue_receiver("s", session_id="a", max_wait_time=5) as sdk,
    ):
        assert sdk.session is not None
        assert await sdk.session.get_state() == b"\x00step 3\xff"
        await sdk.session.set_state("set by the SDK")

    receiver = await namespace.receiver("s", session=True, session_id="a", wait=5)
    assert await management.get_session_state(receiver) == b"set by the SDK"
    await management.set_session_state(receiver, None)  # clears it
    assert await management.get_session_state(receiver) is None
    await management.set_session_state(receiver, "text is stored as UTF-8: é")
    assert await management.get_session_state(receiver) == "text is stored as UTF-8: é".encode()
    await receiver.close()


async def test_renewing_the_session_lock_moves_its_expiry(
    broker: BrokerHandle, namespace: AmqpSource
) -> None:
    await sdk_send(broker, "s", ServiceBusMessage("x", session_id="a"))
    management = await management_of(namespace)
    receiver = await namespace.receiver("s", session=True, session_id="a", wait=5)
    before = receiver.session_locked_until
    assert before is not None
    await asyncio.sleep(0.2)
    expiry = await management.renew_session_lock(receiver)
    assert expiry > before and receiver.session_locked_until == expiry
    assert expiry > datetime.now(UTC) + timedelta(seconds=50)  # the default 60 s lock
    await receiver.close()


async def test_session_requests_need_a_session_and_its_lock(
    broker: BrokerHandle, namespace: AmqpSource
) -> None:
    await sdk_send(broker, "s", ServiceBusMessage("x", session_id="a"))
    management = await management_of(namespace)
    plain = await namespace.receiver("q")
    with pytest.raises(ValueError, match="holds no session"):
        await management.get_session_state(plain)
    await plain.close()

    receiver = await namespace.receiver("s", session=True, session_id="a", wait=5)

    def expire() -> None:  # the lock runs out (what a stalled receiver meets)
        assert broker.broker is not None
        broker.broker.queues["s"].session_locks["a"].until_ms = 0

    broker.call(expire)
    with pytest.raises(SessionLockLost, match="set-session-state on s: 410") as caught:
        await management.set_session_state(receiver, b"too late")
    assert caught.value.condition == "com.microsoft:session-lock-lost"
    assert not caught.value.retryable
    with pytest.raises(SessionLockLost, match="renew-session-lock on s: 410"):
        await management.renew_session_lock(receiver)
    await receiver.close()


# ---------------------------------------------------------------------------- scheduling


async def test_scheduled_by_us_cancelled_by_the_sdk(
    broker: BrokerHandle, namespace: AmqpSource
) -> None:
    management = await management_of(namespace)
    when = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    numbers = await management.schedule_messages("q", [
        Message(body=b"later", message_id="m1", application_properties={"n": 1}),
        Message(body=b"later too", session_id=None, partition_key="pk"),
    ], when)  # fmt: skip
    assert len(numbers) == 2 and numbers[0] < numbers[1]

    async with broker.aio_client() as client:
        async with client.get_queue_receiver("q", max_wait_time=1) as receiver:
            peeked = await receiver.peek_messages(max_message_count=10)
            assert [(m.sequence_number, m.scheduled_enqueue_time_utc) for m in peeked] == [
                (n, when) for n in numbers
            ]
            assert peeked[0].message_id == "m1" and peeked[0].application_properties == {b"n": 1}
            assert peeked[1].message_id and peeked[1].partition_key == "pk"  # an id was made up
            assert await receiver.receive_messages(max_wait_time=0.5) == []  # not due yet
        async with client.get_queue_sender("q") as sender:
            await sender.cancel_scheduled_messages(numbers)
    assert broker.count("q") == 0


async def test_scheduled_by_the_sdk_cancelled_by_us(
    broker: BrokerHandle, namespace: AmqpSource
) -> None:
    when = datetime.now(UTC) + timedelta(hours=1)
    async with broker.aio_client() as client, client.get_queue_sender("q") as sender:
        numbers = await sender.schedule_messages(
            [ServiceBusMessage("a"), ServiceBusMessage("b")], when
        )
    management = await management_of(namespace)
    assert [m.sequence_number for m in await management.peek("q", 10)] == numbers
    await management.cancel_scheduled_messages("q", numbers[0])
    assert [m.sequence_number for m in await management.peek("q", 10)] == numbers[1:]
    await management.cancel_scheduled_messages("q", numbers[1:])
    assert await management.peek("q", 10) == []
    assert await management.schedule_messages("q", [], when) == []


async def test_a_scheduled_message_arrives_when_due(
    broker: BrokerHandle, namespace: AmqpSource
) -> None:
    management = await management_of(namespace)
    [number] = await management.schedule_messages(
        "q", Message(body=b"soon", message_id="soon"), datetime.now(UTC) + timedelta(seconds=1)
    )
    receiver = await namespace.receiver("q")
    [message] = await receiver.receive(1, 10)
    assert (message.message_id, message.sequence_number) == ("soon", number)
    receiver.complete([message])
    await receiver.close()


# ---------------------------------------------------------------------------- deferred


async def defer_with_sdk(broker: BrokerHandle, queue: str, *messages: ServiceBusMessage,
                         session_id: str | None = None) -> list[int]:  # fmt: skip
    """Sends ``messages`` and defers them with the SDK; their sequence numbers."""
    await sdk_send(broker, queue, *messages)
    async with (
        broker.aio_client() as client,
        client.get_queue_receiver(queue, session_id=session_id, max_wait_time=5) as receiver,
    ):
        got: list[ServiceBusReceivedMessage] = []
        while len(got) < len(messages):
            got += await receiver.receive_messages(max_message_count=10, max_wait_time=5)
        for message in got:
            await receiver.defer_message(message)
    return [m.sequence_number for m in got]  # type: ignore[misc]


async def test_deferred_messages_received_by_sequence_number_and_settled(
    broker: BrokerHandle, namespace: AmqpSource
) -> None:
    numbers = await defer_with_sdk(broker, "q", *(
        ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(3)
    ))  # fmt: skip
    management = await management_of(namespace)
    deferred = await management.receive_deferred_messages("q", numbers)
    assert [(m.message_id, m.body) for m in deferred] == [(f"m{i}", f"m{i}".encode())
                                                          for i in range(3)]  # fmt: skip
    assert all(isinstance(m.source, ManagementLock) and lock_token(m) for m in deferred)
    assert await management.settle(deferred[:1], "complete") == 1
    await management.settle(deferred[1:2], "dead-letter", reason="why", description="because")
    await management.settle(deferred[2:], "defer")  # deferred again: still there
    with pytest.raises(MessageLockLost, match="update-disposition on q: 410"):
        await management.settle(deferred[:1], "complete")  # settled already

    async with broker.aio_client() as client:
        async with client.get_queue_receiver(
            "q", sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=5
        ) as dead:
            [dead_lettered] = await dead.receive_messages(max_wait_time=5)
            assert (dead_lettered.message_id, dead_lettered.dead_letter_reason) == ("m1", "why")
            assert dead_lettered.dead_letter_error_description == "because"
            await dead.complete_message(dead_lettered)
        async with client.get_queue_receiver("q", max_wait_time=5) as receiver:
            [again] = await receiver.receive_deferred_messages([numbers[2]])
            assert again.message_id == "m2"
            await receiver.complete_message(again)
    assert broker.count("q") == 0


async def test_receive_and_delete_takes_deferred_messages(
    broker: BrokerHandle, namespace: AmqpSource
) -> None:
    numbers = await defer_with_sdk(broker, "q", ServiceBusMessage("gone", message_id="gone"))
    management = await management_of(namespace)
    [taken] = await management.receive_deferred_messages("q", numbers, receive_and_delete=True)
    assert taken.message_id == "gone" and taken.source is None
    assert broker.count("q") == 0
    with pytest.raises(MessageNotFound, match="receive-by-sequence-number on q: 404"):
        await management.receive_deferred_messages("q", numbers)
    assert await management.receive_deferred_messages("q", []) == []


async def test_deferred_session_messages_need_their_session(
    broker: BrokerHandle, namespace: AmqpSource
) -> None:
    numbers = await defer_with_sdk(
        broker, "s", ServiceBusMessage("in a", session_id="a", message_id="in-a"),
        session_id="a",
    )  # fmt: skip
    management = await management_of(namespace)
    receiver = await namespace.receiver("s", session=True, session_id="a", wait=5)
    [message] = await management.receive_deferred_messages("s", numbers, session=receiver)
    assert message.message_id == "in-a" and message.session_id == "a"
    assert await management.settle([message], "complete") == 1
    await receiver.close()
    assert broker.count("s") == 0


# ---------------------------------------------------------------------------- rules


async def test_rules_added_by_us_filter_what_the_sdk_receives(
    broker: BrokerHandle, namespace: AmqpSource
) -> None:
    management = await management_of(namespace)
    await management.remove_rule(SUBSCRIPTION, "$Default")
    await management.add_rule(SUBSCRIPTION, "red", SqlFilter("color = @c", {"@c": "red"}),
                              SqlAction("SET tagged = 'red rule'"))  # fmt: skip
    await management.add_rule(SUBSCRIPTION, Rule("vip", CorrelationFilter(
        subject="order", properties={"tier": "gold"},
    )))  # fmt: skip
    await sdk_send(
        broker, "events",
        ServiceBusMessage("1", message_id="red", application_properties={"color": "red"}),
        ServiceBusMessage("2", message_id="blue", application_properties={"color": "blue"}),
        ServiceBusMessage("3", message_id="gold", subject="order",
                          application_properties={"tier": "gold"}),
        ServiceBusMessage("4", message_id="silver", subject="order",
                          application_properties={"tier": "silver"}),
    )  # fmt: skip
    async with (
        broker.aio_client() as client,
        client.get_subscription_receiver("events", "picky", max_wait_time=2) as sub,
    ):
        got = await sub.receive_messages(max_message_count=10, max_wait_time=2)
        for message in got:
            await sub.complete_message(message)
    by_id = {m.message_id: m for m in got}
    assert sorted(by_id) == ["gold", "red"]
    assert by_id["red"].application_properties[b"tagged"] == b"red rule"
    assert b"tagged" not in by_id["gold"].application_properties


async def test_rules_listed_by_us_and_by_the_sdk(
    broker: BrokerHandle, namespace: AmqpSource
) -> None:
    management = await management_of(namespace)
    await management.add_rule(SUBSCRIPTION, "sql", SqlFilter("size > 3"), SqlAction("SET a = 1"))
    await management.add_rule(SUBSCRIPTION, "nothing", FALSE_FILTER)
    await management.add_rule(SUBSCRIPTION, Rule("corr", CorrelationFilter(
        correlation_id="c-1", content_type="application/json", properties={"n": 5},
    )))  # fmt: skip
    rules = {r.name: r for r in await management.list_rules(SUBSCRIPTION)}
    assert list(rules) == ["$Default", "sql", "nothing", "corr"]
    assert (rules["$Default"].filter, rules["$Default"].action) == (SqlFilter("1=1"), None)
    assert (rules["sql"].filter, rules["sql"].action) == (SqlFilter("size > 3"),
                                                          SqlAction("SET a = 1"))  # fmt: skip
    assert rules["nothing"].filter == SqlFilter("1=0")
    assert rules["corr"].filter == CorrelationFilter(
        correlation_id="c-1", content_type="application/json", properties={"n": 5}
    )
    assert [r.name for r in await management.list_rules(SUBSCRIPTION, skip=1, top=2)] == [
        "sql", "nothing",
    ]  # fmt: skip

    with ServiceBusAdministrationClient.from_connection_string(
        broker.connection_string, connection_verify=str(broker.data_dir / "tls" / "ca.pem"),
        retry_total=0,
    ) as admin:  # fmt: skip
        listed = {r.name: r for r in admin.list_rules("events", "picky")}
    assert list(listed) == ["$Default", "sql", "nothing", "corr"]
    assert listed["sql"].filter.sql_expression == "size > 3"
    assert listed["sql"].action.sql_expression == "SET a = 1"
    assert listed["corr"].filter.correlation_id == "c-1"
    assert listed["corr"].filter.properties == {"n": 5}


async def test_rule_errors_say_what_is_wrong(broker: BrokerHandle, namespace: AmqpSource) -> None:
    management = await management_of(namespace)
    await management.add_rule(SUBSCRIPTION, "once", SqlFilter("a = 1"))
    with pytest.raises(EntityAlreadyExists, match=r"add-rule on .*: 409 .*'once' already exists"):
        await management.add_rule(SUBSCRIPTION, "once", SqlFilter("a = 2"))
    with pytest.raises(EntityNotFound, match=r"remove-rule on .*: 404 no rule named 'never'"):
        await management.remove_rule(SUBSCRIPTION, "never")
    with pytest.raises(SourceError, match=r"add-rule on .*: 400 .*") as caught:
        await management.add_rule(SUBSCRIPTION, "typo", SqlFilter("a = = 1"))
    assert caught.value.condition == "com.microsoft:argument-error"
    with pytest.raises(SourceError, match=r"enumerate-rules on q: 400 .*not a subscription"):
        await management.list_rules("q")
    with pytest.raises(TypeError, match="give a Rule, or a name"):
        await management.add_rule(SUBSCRIPTION, Rule("x"), SqlFilter("a = 1"))
