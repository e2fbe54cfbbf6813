"""Entity properties that Service Bus enforces and the broker now does too:
``MaxSizeInMegabytes`` (a full entity refuses sends with QuotaExceeded; dead letters and
session state count), ``AutoDeleteOnIdle`` (an unused entity goes away; an open link or a
scheduled message is use) and ``absolute-expiry-time`` on what a receiver gets ("ignored on
input, authoritative on output")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage
from azure.servicebus.amqp import AmqpAnnotatedMessage
from azure.servicebus.exceptions import (
    MessagingEntityNotFoundError,
    ServiceBusQuotaExceededError,
)
from azure.servicebus.management import ServiceBusAdministrationClient

from .conftest import BrokerHandle, concurrently, make_config

MB = 1024 * 1024
BODY = b"x" * (200 * 1024)


def admin(broker: BrokerHandle) -> ServiceBusAdministrationClient:
    return ServiceBusAdministrationClient.from_connection_string(
        broker.connection_string, connection_verify=str(broker.data_dir / "tls" / "ca.pem"),
        retry_total=0,
    )  # fmt: skip


def send_until_refused(broker: BrokerHandle, *, queue: str = "", topic: str = "") -> int:
    """Sends 200 KB messages until the entity refuses one; returns how many were taken."""
    with broker.client(retry_total=0) as client:
        sender = client.get_topic_sender(topic) if topic else client.get_queue_sender(queue)
        with sender:
            for sent in range(20):
                try:
                    sender.send_messages(ServiceBusMessage(BODY, session_id="s"))
                except ServiceBusQuotaExceededError as exc:
                    assert f"Max entity size in bytes: {MB}" in str(exc)
                    return sent
    raise AssertionError("the entity never refused a send")


# ---------------------------------------------------------------------- MaxSizeInMegabytes


def test_a_full_queue_refuses_sends_until_messages_are_taken(broker_factory: Any) -> None:
    broker = broker_factory(make_config({"small": {"MaxSizeInMegabytes": 1}}))
    taken = send_until_refused(broker, queue="small")
    assert taken == 6  # 6 x 200 KB crosses 1 MB; the seventh is refused
    assert broker.count("small") == taken
    with broker.client() as client, client.get_queue_receiver("small") as receiver:
        for message in receiver.receive_messages(max_message_count=1, max_wait_time=5):
            receiver.complete_message(message)
    assert send_until_refused(broker, queue="small") == 1  # room for one again


def test_dead_letters_count_against_the_queue(broker_factory: Any) -> None:
    broker = broker_factory(make_config({"small": {"MaxSizeInMegabytes": 1}}))
    send_until_refused(broker, queue="small")
    with broker.client() as client, client.get_queue_receiver("small") as receiver:
        for message in receiver.receive_messages(max_message_count=6, max_wait_time=5):
            receiver.dead_letter_message(message, reason="kept")
    assert broker.count("small") == 0
    assert send_until_refused(broker, queue="small") == 0


def test_session_state_counts_against_the_queue(broker_factory: Any) -> None:
    broker = broker_factory(
        make_config({"sessions": {"MaxSizeInMegabytes": 1, "RequiresSession": True}})
    )

    def set_state(session: str, state: bytes | None) -> None:
        with (
            broker.client() as client,
            client.get_queue_receiver("sessions", session_id=session) as receiver,
        ):
            receiver.session.set_state(state)

    concurrently(*(lambda n=n: set_state(f"s{n}", BODY) for n in range(6)))
    assert send_until_refused(broker, queue="sessions") == 0
    set_state("s0", None)
    assert send_until_refused(broker, queue="sessions") == 1


def test_a_topic_counts_every_subscription(broker_factory: Any) -> None:
    subscriptions = {"Subscriptions": {"a": {}, "b": {}}, "Properties": {"MaxSizeInMegabytes": 1}}
    broker = broker_factory(make_config({}, topics={"t": subscriptions}))
    assert send_until_refused(broker, topic="t") == 3  # each message is held twice


def test_the_quota_is_reported_and_changed_through_the_management_api(
    broker_factory: Any,
) -> None:
    broker = broker_factory(make_config({"q": {}}))
    with admin(broker) as client:
        assert client.get_queue("q").max_size_in_megabytes == 1024
        queue = client.get_queue("q")
        queue.max_size_in_megabytes = 2048
        client.update_queue(queue)
        assert client.get_queue("q").max_size_in_megabytes == 2048
    entity = broker.call(lambda: broker.broker.entities["q"])
    assert entity.settings.max_size_mb == 2048


def test_a_small_config_quota_survives_an_update_that_echoes_it(broker_factory: Any) -> None:
    broker = broker_factory(make_config({"small": {"MaxSizeInMegabytes": 1}}))
    with admin(broker) as client:
        queue = client.get_queue("small")
        assert queue.max_size_in_megabytes == 1
        queue.lock_duration = timedelta(seconds=30)
        client.update_queue(queue)  # sends MaxSizeInMegabytes 1 back: not a Service Bus size
        assert client.get_queue("small").max_size_in_megabytes == 1
        queue.max_size_in_megabytes = 3
        with pytest.raises(HttpResponseError, match="MaxSizeInMegabytes: must be one of"):
            client.update_queue(queue)


def test_a_refused_scheduled_message_gets_the_management_error(broker_factory: Any) -> None:
    broker = broker_factory(make_config({"small": {"MaxSizeInMegabytes": 1}}))
    send_until_refused(broker, queue="small")
    when = datetime.now(UTC) + timedelta(hours=1)
    with (
        broker.client(retry_total=0) as client,
        client.get_queue_sender("small") as sender,
        pytest.raises(ServiceBusQuotaExceededError, match="maximum entity size"),
    ):
        sender.schedule_messages(ServiceBusMessage(b"later"), when)


# ---------------------------------------------------------------------- AutoDeleteOnIdle


def test_an_idle_entity_is_deleted_after_its_auto_delete_on_idle(broker_factory: Any) -> None:
    broker = broker_factory(make_config({}, topics={"t": {}}))
    idle = timedelta(minutes=5)
    with admin(broker) as client:
        for name in ("temp", "linked", "scheduled", "forever"):
            client.create_queue(name, auto_delete_on_idle=idle if name != "forever" else None)
        client.create_subscription("t", "temp-sub", auto_delete_on_idle=idle)
        assert client.get_queue("temp").auto_delete_on_idle == idle
    with broker.client() as sb, sb.get_queue_receiver("linked") as receiver:
        with sb.get_queue_sender("scheduled") as sender:
            sender.schedule_messages(
                ServiceBusMessage(b"later"), datetime.now(UTC) + timedelta(hours=1)
            )
        receiver.peek_messages(1)  # the link is open from here on

        def delete_idle(after: timedelta) -> list[str]:
            later = broker.call(broker.broker.now_ms) + int(after.total_seconds() * 1000)
            return broker.call(lambda: broker.broker.delete_idle(later))

        assert delete_idle(idle - timedelta(seconds=5)) == []
        assert sorted(delete_idle(idle + timedelta(seconds=1))) == [
            "t/Subscriptions/temp-sub",
            "temp",
        ]

    with admin(broker) as client:
        with pytest.raises(ResourceNotFoundError, match="Queue 'temp' does not exist"):
            client.get_queue("temp")
        with pytest.raises(
            ResourceNotFoundError,
            match="The messaging entity 't/Subscriptions/temp-sub' could not be found",
        ):
            client.get_subscription("t", "temp-sub")
        assert {q.name for q in client.list_queues()} == {"linked", "scheduled", "forever"}
    with (
        broker.client(retry_total=0) as sb,
        pytest.raises(
            MessagingEntityNotFoundError, match="The messaging entity 'temp' could not be found"
        ),
        sb.get_queue_sender("temp") as sender,
    ):
        sender.send_messages(ServiceBusMessage(b"gone"))


def test_use_resets_the_idle_time(broker_factory: Any) -> None:
    broker = broker_factory(make_config({}))
    with admin(broker) as client:
        client.create_queue("temp", auto_delete_on_idle=timedelta(minutes=5))
    start = broker.call(broker.broker.now_ms)
    with broker.client() as sb, sb.get_queue_sender("temp") as sender:
        sender.send_messages(ServiceBusMessage(b"use"))
    sent = broker.call(lambda: broker.broker.entities["temp"].accessed_ms)
    assert sent >= start
    assert broker.call(lambda: broker.broker.delete_idle(sent + 5 * 60_000 - 1)) == []
    assert broker.call(lambda: broker.broker.delete_idle(sent + 5 * 60_000)) == ["temp"]


# ---------------------------------------------------------------------- absolute-expiry-time


def expiry_of(message: ServiceBusReceivedMessage) -> int | None:
    value = message.raw_amqp_message.properties.absolute_expiry_time
    return None if value is None else int(value)


def enqueued_ms(message: ServiceBusReceivedMessage) -> int:
    assert message.enqueued_time_utc is not None
    return int(message.enqueued_time_utc.timestamp() * 1000)


def test_received_messages_carry_the_broker_s_absolute_expiry_time(broker_factory: Any) -> None:
    broker = broker_factory(
        make_config({"plain": {}, "hour": {"DefaultMessageTimeToLive": "PT1H"}})
    )
    made_up = AmqpAnnotatedMessage(
        data_body=b"no ttl", properties={"absolute_expiry_time": 1_000, "message_id": "made-up"}
    )
    with broker.client() as client:
        with client.get_queue_sender("plain") as sender:
            sender.send_messages(ServiceBusMessage(b"ten", time_to_live=timedelta(minutes=10)))
            sender.send_messages(ServiceBusMessage(b"never"))
            sender.send_messages(made_up)
        with client.get_queue_sender("hour") as sender:
            sender.send_messages(ServiceBusMessage(b"default"))
            sender.send_messages(ServiceBusMessage(b"capped", time_to_live=timedelta(hours=2)))
        received: dict[bytes, ServiceBusReceivedMessage] = {}
        for queue in ("plain", "hour"):
            with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
                for message in receiver.receive_messages(max_message_count=3, max_wait_time=5):
                    received[b"".join(message.body)] = message
                    receiver.complete_message(message)
    ten, never = received[b"ten"], received[b"never"]
    assert expiry_of(ten) == enqueued_ms(ten) + 10 * 60_000
    assert expiry_of(never) is None
    assert expiry_of(received[b"no ttl"]) is None  # the sender's value is not the broker's
    for body in (b"default", b"capped"):
        assert expiry_of(received[body]) == enqueued_ms(received[body]) + 3_600_000
    assert ten.expires_at_utc is not None
    assert int(ten.expires_at_utc.timestamp() * 1000) == expiry_of(ten)
