"""Topics and subscriptions with the unmodified sync ``azure-servicebus`` SDK.

A copy per matching subscription (SQL, correlation, true/false filters, rule actions),
subscription dead-letter queues, and every queue behaviour on subscriptions: locks, max
delivery count, TTL, defer, peek, scheduling and duplicate detection at the topic.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.exceptions import ServiceBusError

from replication.broker.clock import ManualClock

from .conftest import (
    DRAIN_PREFETCH,
    BrokerHandle,
    concurrently,
    make_config,
    nothing_more,
    receive_n,
    take_all,
    whole_ms,
)

pytestmark = pytest.mark.timeout(90)


def sql_rule(name: str, expression: str, action: str | None = None) -> dict[str, object]:
    props: dict[str, object] = {"FilterType": "Sql", "SqlFilter": {"SqlExpression": expression}}
    if action is not None:
        props["Action"] = {"SqlExpression": action}
    return {"Name": name, "Properties": props}


def correlation_rule(name: str, **fields: object) -> dict[str, object]:
    return {
        "Name": name,
        "Properties": {"FilterType": "Correlation", "CorrelationFilter": fields},
    }


TOPICS = {
    "orders": {
        "Properties": {
            "RequiresDuplicateDetection": True, "DuplicateDetectionHistoryTimeWindow": "PT1M",
        },
        "Subscriptions": {
            "all": {},
            "red": {"Rules": [sql_rule("red", "color = 'red' AND quantity > 10")]},
            "express": {"Rules": [correlation_rule("express", Label="express")]},
            "tagged": {"Rules": [
                sql_rule("tag", "EXISTS(color)", "SET sys.Label = 'tagged'; REMOVE quantity"),
                sql_rule("big", "quantity >= 100"),
                sql_rule("blue", "color = 'blue'"),
            ]},
            "none": {"Rules": [sql_rule("never", "1=0")]},
            "short": {"Properties": {
                "LockDuration": "PT5S", "MaxDeliveryCount": 2,
                "DefaultMessageTimeToLive": "PT3S", "DeadLetteringOnMessageExpiration": True,
            }, "Rules": [sql_rule("short", "sys.To = 'short'")]},
        },
    },
    "sessions": {"Subscriptions": {"ordered": {"Properties": {"RequiresSession": True}},
                                   "log": {}}},
}  # fmt: skip
CONFIG = make_config({"plain": {}}, topics=TOPICS)


def props_message(name: str, properties: dict[str, object]) -> ServiceBusMessage:
    return ServiceBusMessage(name, message_id=name, application_properties=properties)


def drain(broker: BrokerHandle, sub: str, *, topic: str = "orders") -> list:
    """Everything a subscription holds now, completed."""
    with (
        broker.client() as client,
        client.get_subscription_receiver(topic, sub, prefetch_count=DRAIN_PREFETCH) as receiver,
    ):
        return take_all(receiver, batch=50)


@pytest.mark.slow
@pytest.mark.broker_config(CONFIG)
def test_a_copy_per_matching_subscription(broker: BrokerHandle) -> None:
    messages = [
        props_message("a", {"color": "red", "quantity": 11}),
        props_message("b", {"color": "red", "quantity": 5}),
        ServiceBusMessage("c", message_id="c", subject="express"),
        props_message("d", {"color": "blue", "quantity": 150}),
    ]  # fmt: skip
    with broker.client() as client, client.get_topic_sender("orders") as sender:
        sender.send_messages(messages)
    every, red, express, none, tagged = concurrently(
        *(lambda sub=sub: drain(broker, sub) for sub in ("all", "red", "express", "none", "tagged"))
    )
    assert sorted(m.message_id for m in every) == ["a", "b", "c", "d"]
    assert [m.message_id for m in red] == ["a"]
    assert [m.message_id for m in express] == ["c"]
    assert none == []

    # rules with an action: a changed copy each, named by RuleName; rules without: one copy
    by_rule = sorted(
        (m.message_id, (m.application_properties or {}).get(b"RuleName", b"")) for m in tagged
    )
    assert by_rule == [
        ("a", b"tag"), ("b", b"tag"), ("d", b""), ("d", b"tag"),
    ]  # fmt: skip
    for message in tagged:
        props = message.application_properties or {}
        if props.get(b"RuleName") == b"tag":
            assert message.subject == "tagged"
            assert b"quantity" not in props
            assert props[b"color"] in (b"red", b"blue")
        else:  # the plain copy keeps the message as sent
            assert props[b"quantity"] == 150 and message.subject is None


@pytest.mark.broker_config(CONFIG)
def test_topic_duplicate_detection_and_sequence_numbers(broker: BrokerHandle) -> None:
    with broker.client() as client, client.get_topic_sender("orders") as sender:
        for _ in range(3):
            sender.send_messages(ServiceBusMessage("once", message_id="same-id"))
        sender.send_messages(ServiceBusMessage("other", message_id="other-id"))
    received = drain(broker, "all")
    assert [m.message_id for m in received] == ["same-id", "other-id"]
    assert [m.sequence_number for m in received] == [1, 2]


@pytest.mark.broker_config(CONFIG)
def test_subscription_dead_letter_queue_and_max_delivery(broker: BrokerHandle) -> None:
    with broker.client() as client:
        with client.get_topic_sender("orders") as sender:
            sender.send_messages([
                ServiceBusMessage("dl", message_id="dl", to="short"),
                ServiceBusMessage("md", message_id="md", to="short"),
            ])  # fmt: skip
        with client.get_subscription_receiver("orders", "short") as receiver:
            dl, md = receive_n(receiver, 2)
            receiver.dead_letter_message(dl, reason="bad order", error_description="no stock")
            receiver.abandon_message(md)
            (md,) = receive_n(receiver, 1)
            assert md.delivery_count == 1
            receiver.abandon_message(md)  # the second attempt: MaxDeliveryCount 2
            assert nothing_more(receiver)
        with client.get_subscription_receiver(
            "orders", "short", sub_queue=ServiceBusSubQueue.DEAD_LETTER
        ) as dlq:
            dead = {m.message_id: m for m in receive_n(dlq, 2)}
            for message in dead.values():
                dlq.complete_message(message)
    assert dead["dl"].dead_letter_reason == "bad order"
    assert dead["dl"].dead_letter_error_description == "no stock"
    assert dead["md"].dead_letter_reason == "MaxDeliveryCountExceeded"
    assert dead["md"].dead_letter_source == "orders/Subscriptions/short"


def test_subscription_lock_expiry_and_ttl(broker_factory: Callable[..., BrokerHandle]) -> None:
    """On a ``ManualClock``: the lock and the TTL run out when the test says, not after a
    sleep (real-time lock expiry and TTL: test_sdk_settlement)."""
    broker = broker_factory(CONFIG, clock=ManualClock())
    with broker.client() as client:
        with client.get_topic_sender("orders") as sender:
            sender.send_messages(ServiceBusMessage("locked", message_id="locked", to="short"))
        with client.get_subscription_receiver("orders", "short") as receiver:
            (first,) = receive_n(receiver, 1)
            assert first.locked_until_utc is not None
            lock_seconds = (first.locked_until_utc - datetime.now(UTC)).total_seconds()
            assert 3 < lock_seconds <= 5.5
        # not settled: the lock runs out (5 s) and then the TTL (3 s from the send) has
        # passed, so the message goes to the DLQ as expired rather than being redelivered
        broker.advance(6.5)
        with client.get_subscription_receiver(
            "orders", "short", sub_queue=ServiceBusSubQueue.DEAD_LETTER
        ) as dlq:
            (dead,) = receive_n(dlq, 1, timeout=10)
            dlq.complete_message(dead)
    assert dead.message_id == "locked"
    assert dead.dead_letter_reason == "TTLExpiredException"


@pytest.mark.broker_config(CONFIG)
def test_peek_defer_and_receive_deferred_on_a_subscription(broker: BrokerHandle) -> None:
    with broker.client() as client:
        with client.get_topic_sender("orders") as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(3)])
        with client.get_subscription_receiver("orders", "all") as receiver:
            peeked = receiver.peek_messages(max_message_count=10)
            assert [m.message_id for m in peeked] == ["m0", "m1", "m2"]
            first, *rest = receive_n(receiver, 3)
            receiver.defer_message(first)
            for message in rest:
                receiver.complete_message(message)
            (deferred,) = receiver.receive_deferred_messages([first.sequence_number])
            assert deferred.message_id == "m0"
            receiver.complete_message(deferred)
            assert receiver.peek_messages(max_message_count=10) == []


def test_scheduled_message_on_a_topic_and_cancel(
    broker_factory: Callable[..., BrokerHandle],
) -> None:
    """On the broker's ``ManualClock``: held back until its time, delivered from then on."""
    broker = broker_factory(CONFIG, clock=ManualClock())
    when = whole_ms(datetime.now(UTC) + timedelta(seconds=2))
    with broker.client() as client:
        with client.get_topic_sender("orders") as sender:
            scheduled = [ServiceBusMessage(i, message_id=i) for i in ("keep", "drop")]
            keep, drop = sender.schedule_messages(scheduled, when)
            sender.cancel_scheduled_messages(drop)
        with client.get_subscription_receiver("orders", "all") as receiver:
            broker.advance_to(when - timedelta(microseconds=500))
            assert nothing_more(receiver)
            broker.advance(0.001)  # half a millisecond after its time
            (message,) = receive_n(receiver, 1)
            receiver.complete_message(message)
    assert message.message_id == "keep"
    assert message.enqueued_time_utc >= when - timedelta(seconds=1)
    assert keep != drop


@pytest.mark.broker_config(CONFIG)
def test_wrong_directions_are_refused(broker: BrokerHandle) -> None:
    with broker.client(retry_total=0) as client:
        with (
            pytest.raises(ServiceBusError, match="receive from one of its subscriptions"),
            client.get_queue_receiver("orders") as receiver,
        ):
            receiver.receive_messages(max_wait_time=1)
        with (
            pytest.raises(ServiceBusError, match="send to its queue or topic"),
            client.get_queue_sender("orders/Subscriptions/all") as sender,
        ):
            sender.send_messages(ServiceBusMessage("x"))
        with (
            pytest.raises(ServiceBusError, match="could not be found"),
            client.get_subscription_receiver("orders", "nope") as receiver,
        ):
            receiver.receive_messages(max_wait_time=1)


@pytest.mark.broker_config(CONFIG)
def test_sessionless_message_to_a_topic_with_a_session_subscription(
    broker: BrokerHandle,
) -> None:
    """Service Bus takes the send: the session-enabled subscription dead-letters its copy
    ("Session ID is null", as its dead-letter docs list it), the others get theirs (the JS
    SDK's own note, azure-sdk-for-js #1118). A session-enabled queue refuses such a send
    (test_sessions.py)."""
    with broker.client(retry_total=0) as client:
        with client.get_topic_sender("sessions") as sender:
            sender.send_messages(ServiceBusMessage("no session", message_id="n"))
            sender.send_messages(ServiceBusMessage("with session", session_id="s1"))
        with client.get_subscription_receiver("sessions", "ordered", session_id="s1") as r:
            (message,) = receive_n(r, 1)
            r.complete_message(message)
        with client.get_subscription_receiver(
            "sessions", "ordered", sub_queue=ServiceBusSubQueue.DEAD_LETTER
        ) as r:
            (dead,) = receive_n(r, 1)
            r.complete_message(dead)
    assert str(message) == "with session"
    assert (dead.message_id, dead.dead_letter_reason) == ("n", "Session ID is null")
    assert dead.dead_letter_error_description == (
        "Session enabled entity doesn't allow a message whose session identifier is null."
    )
    logged = sorted(str(m) for m in drain(broker, "log", topic="sessions"))
    assert logged == ["no session", "with session"]


def test_rules_survive_a_restart_and_config_changes_win(broker_factory) -> None:  # type: ignore[no-untyped-def]
    """Rules come from Config.json; after a restart with the same config the same rules
    apply, and a config whose rules changed replaces them."""
    config = make_config(
        {}, topics={"t": {"Subscriptions": {"s": {"Rules": [sql_rule("r", "n > 1")]}}}}
    )
    broker = broker_factory(config)

    def numbers() -> list[int]:
        with broker.client() as client, client.get_topic_sender("t") as sender:
            sender.send_messages(
                [ServiceBusMessage(str(n), application_properties={"n": n}) for n in range(4)]
            )
        return sorted(int(str(m)) for m in drain(broker, "s", topic="t"))

    assert numbers() == [2, 3]
    broker.restart()
    assert numbers() == [2, 3]
    broker.restart(make_config(
        {}, topics={"t": {"Subscriptions": {"s": {"Rules": [sql_rule("r", "n < 2")]}}}}
    ))  # fmt: skip
    assert numbers() == [0, 1]


@pytest.mark.broker_config(CONFIG)
async def test_async_topic_sender_and_subscription_receiver(broker: BrokerHandle) -> None:
    async with broker.aio_client() as client:
        async with client.get_topic_sender("orders") as sender:
            await sender.send_messages([
                props_message("r1", {"color": "red", "quantity": 50}),
                props_message("b1", {"color": "blue", "quantity": 50}),
            ])  # fmt: skip
        async with client.get_subscription_receiver("orders", "red") as receiver:
            received = await receiver.receive_messages(max_message_count=5, max_wait_time=2)
            assert [m.message_id for m in received] == ["r1"]
            await receiver.complete_message(received[0])
        async with client.get_subscription_receiver("orders", "all") as receiver:
            received = []
            while len(received) < 2:
                received += await receiver.receive_messages(max_message_count=5, max_wait_time=2)
            for message in received:
                await receiver.complete_message(message)
    assert sorted(m.message_id for m in received) == ["b1", "r1"]
