"""Times to live as receivers read them, and expiry on the broker's clock.

The .NET, Java and JavaScript SDKs read TimeToLive as ``absolute-expiry-time -
creation-time`` when both are present (azure-sdk-for-net#40916, azure-sdk-for-js#28178,
azure-sdk-for-java#11354); the Python SDK reads the header ``ttl``. The broker writes the
instant a message expires into ``absolute-expiry-time`` ("authoritative on output") and the
instant its TTL counts from (enqueued or scheduled time) into ``creation-time``, so both ways
read back the TTL in force, exactly; ``tests/broker/test_js_client.py`` checks the JS SDK.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage

from replication.broker.clock import ManualClock, now_ms

from .conftest import BrokerHandle, make_config, proton_connection, receive_n

pytestmark = pytest.mark.timeout(60)

TEN_MINUTES = timedelta(minutes=10)
CONFIG = make_config(
    {"q": {}, "short": {"DefaultMessageTimeToLive": "PT5M"}},
    topics={"t": {"Subscriptions": {"s": {}}}},
)

StartBroker = Callable[..., BrokerHandle]


@pytest.fixture
def broker(broker_factory: StartBroker) -> BrokerHandle:
    """A broker on a ``ManualClock``: expiry and schedules move only when the test says."""
    return broker_factory(CONFIG, clock=ManualClock())


def clock_now(broker: BrokerHandle) -> datetime:
    """The broker's clock, in the whole milliseconds it stamps messages with."""
    assert broker.clock is not None
    return datetime.fromtimestamp(now_ms(broker.clock) / 1000, UTC)


def ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def times(message: ServiceBusReceivedMessage) -> dict[str, Any]:
    """What each SDK derives a TTL and an expiry from."""
    properties = message.raw_amqp_message.properties
    assert properties is not None and message.enqueued_time_utc is not None
    created, expires = properties.creation_time, properties.absolute_expiry_time
    return {
        "header ttl": message.time_to_live,
        "expiry - creation": None if None in (created, expires) else expires - created,
        "expiry - enqueued": None if expires is None else expires - ms(message.enqueued_time_utc),
    }


def exactly(ttl: timedelta) -> dict[str, Any]:
    millis = round(ttl.total_seconds() * 1000)
    return {"header ttl": ttl, "expiry - creation": millis, "expiry - enqueued": millis}


def receive_one(broker: BrokerHandle, queue: str, **kwargs: Any) -> ServiceBusReceivedMessage:
    with broker.client() as client, client.get_queue_receiver(queue, **kwargs) as receiver:
        (message,) = receive_n(receiver, 1, timeout=5)
        receiver.complete_message(message)
        return message


def test_a_ttl_reads_back_exactly_whatever_the_sender_s_clock_said(broker: BrokerHandle) -> None:
    with broker.client() as client, client.get_queue_sender("q") as sender:
        message = ServiceBusMessage("hello", time_to_live=TEN_MINUTES)
        assert message.raw_amqp_message.properties is not None
        message.raw_amqp_message.properties.creation_time -= 3_600_000  # a sender an hour behind
        message.raw_amqp_message.properties.absolute_expiry_time -= 3_600_000
        sender.send_messages(message)
    received = receive_one(broker, "q")
    assert times(received) == exactly(TEN_MINUTES)
    assert received.enqueued_time_utc == clock_now(broker)


def test_a_message_without_creation_time_gets_one(broker: BrokerHandle) -> None:
    """Proton writes only the header ttl: the broker's pair is what receivers read."""
    from proton import Message

    conn = proton_connection(broker.port)
    try:
        conn.create_sender("q").send(Message(body="proton", ttl=TEN_MINUTES.total_seconds()))
    finally:
        conn.close()
    assert times(receive_one(broker, "q")) == exactly(TEN_MINUTES)


def test_a_ttl_past_49_days_is_kept_in_the_properties(broker: BrokerHandle) -> None:
    """The header ttl is a uint32 of ms: the SDKs cap it there and carry the rest in the
    properties, which the broker then takes (and delivers no header ttl it cannot hold)."""
    from proton import Message

    sixty_days = 60 * 24 * 3600_000
    created = ms(clock_now(broker)) - 5_000
    conn = proton_connection(broker.port)
    try:
        conn.create_sender("q").send(
            Message(
                body="long",
                ttl=0xFFFFFFFF / 1000,
                creation_time=created / 1000,
                expiry_time=(created + sixty_days) / 1000,
            )
        )
    finally:
        conn.close()
    received = times(receive_one(broker, "q"))
    assert received == {
        "header ttl": None,
        "expiry - creation": sixty_days,
        "expiry - enqueued": sixty_days,
    }


def test_the_entity_default_lowers_or_supplies_the_ttl(broker: BrokerHandle) -> None:
    with broker.client() as client, client.get_queue_sender("short") as sender:
        sender.send_messages(ServiceBusMessage("longer", time_to_live=TEN_MINUTES))
        sender.send_messages(ServiceBusMessage("none"))
    with broker.client() as client, client.get_queue_receiver("short") as receiver:
        received = receive_n(receiver, 2, timeout=5)
        for message in received:
            receiver.complete_message(message)
    assert [times(m) for m in received] == [exactly(timedelta(minutes=5))] * 2


def test_a_message_that_never_expires_keeps_the_sender_s_creation_time(
    broker: BrokerHandle,
) -> None:
    from proton import Message

    conn = proton_connection(broker.port)
    try:
        conn.create_sender("q").send(Message(body="forever", creation_time=1_700_000_000.0))
    finally:
        conn.close()
    properties = receive_one(broker, "q").raw_amqp_message.properties
    assert properties is not None
    assert (properties.creation_time, properties.absolute_expiry_time) == (1_700_000_000_000, None)


def test_a_scheduled_message_lives_its_ttl_from_its_scheduled_time(broker: BrokerHandle) -> None:
    scheduled = clock_now(broker) + timedelta(minutes=5)
    with broker.client() as client, client.get_queue_sender("q") as sender:
        sender.schedule_messages(ServiceBusMessage("later", time_to_live=TEN_MINUTES), scheduled)
        with client.get_queue_receiver("q") as receiver:
            (peeked,) = receiver.peek_messages(1)
    assert peeked.time_to_live == TEN_MINUTES
    broker.advance(300)  # due: it is enqueued as of its scheduled time
    with broker.client() as client, client.get_queue_receiver("q") as receiver:
        (message,) = receive_n(receiver, 1, timeout=5)
        assert message.enqueued_time_utc == scheduled
        assert times(message) == exactly(TEN_MINUTES)
        receiver.abandon_message(message)
    broker.advance(TEN_MINUTES.total_seconds() - 0.001)
    assert broker.count("q") == 1
    broker.advance(0.001)
    assert broker.count("q") == 0


def test_a_scheduled_topic_message_keeps_its_ttl_in_the_subscription(
    broker: BrokerHandle,
) -> None:
    scheduled = clock_now(broker) + timedelta(minutes=5)
    with broker.client() as client, client.get_topic_sender("t") as sender:
        sender.schedule_messages(ServiceBusMessage("later", time_to_live=TEN_MINUTES), scheduled)
    broker.advance(300)
    with broker.client() as client, client.get_subscription_receiver("t", "s") as receiver:
        (message,) = receive_n(receiver, 1, timeout=5)
        receiver.complete_message(message)
    assert times(message) == exactly(TEN_MINUTES)
