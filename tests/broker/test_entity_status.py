"""An entity's ``Status`` is enforced, with the errors Service Bus gives: Disabled refuses
sends and receives, SendDisabled sends, ReceiveDisabled receives; links already open are
detached when the status changes; Active again lets everything through."""

from __future__ import annotations

from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import MessagingEntityDisabledError
from azure.servicebus.management import EntityStatus, ServiceBusAdministrationClient

from .conftest import BrokerHandle, make_config

CONFIG = make_config({"q": {}}, topics={"t": {"Subscriptions": {"s": {}}}})


def admin(broker: BrokerHandle) -> ServiceBusAdministrationClient:
    return ServiceBusAdministrationClient.from_connection_string(
        broker.connection_string, connection_verify=str(broker.data_dir / "tls" / "ca.pem"),
        retry_total=0,
    )  # fmt: skip


def set_status(broker: BrokerHandle, status: Any, entity: str = "queue") -> None:
    with admin(broker) as client:
        if entity == "queue":
            queue = client.get_queue("q")
            queue.status = status
            client.update_queue(queue)
        elif entity == "topic":
            topic = client.get_topic("t")
            topic.status = status
            client.update_topic(topic)
        else:
            subscription = client.get_subscription("t", "s")
            subscription.status = status
            client.update_subscription("t", subscription)


def can_send(broker: BrokerHandle, queue: str = "q") -> bool:
    try:
        with broker.client(retry_total=0) as client, client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage(b"x"))
    except MessagingEntityDisabledError as exc:
        assert "sending to it is not allowed" in str(exc)
        return False
    return True


def can_receive(broker: BrokerHandle) -> bool:
    with broker.client(retry_total=0) as client:
        try:
            with client.get_queue_receiver("q", max_wait_time=1) as receiver:
                for message in receiver.receive_messages(max_wait_time=1):
                    receiver.complete_message(message)
        except MessagingEntityDisabledError:
            return False
    return True


@pytest.mark.parametrize(
    "status, send, receive",
    [
        (EntityStatus.DISABLED, False, False),
        (EntityStatus.SEND_DISABLED, False, True),
        (EntityStatus.RECEIVE_DISABLED, True, False),
        (EntityStatus.ACTIVE, True, True),
    ],
)
def test_a_queue_status_refuses_what_it_says(
    broker_factory: Any, status: Any, send: bool, receive: bool
) -> None:
    broker: BrokerHandle = broker_factory(CONFIG)
    set_status(broker, status)
    with admin(broker) as client:
        assert client.get_queue("q").status == status
    assert can_send(broker) is send
    assert can_receive(broker) is receive
    set_status(broker, EntityStatus.ACTIVE)
    assert can_send(broker) and can_receive(broker)


def test_an_open_sender_is_detached_when_its_queue_is_disabled(broker_factory: Any) -> None:
    """The SDK's link is detached; its retry attaches again and is refused for good."""
    broker: BrokerHandle = broker_factory(CONFIG)
    with broker.client(retry_backoff_factor=0.01) as client, client.get_queue_sender("q") as sender:
        sender.send_messages(ServiceBusMessage(b"before"))
        set_status(broker, EntityStatus.SEND_DISABLED)
        with pytest.raises(MessagingEntityDisabledError, match=r"SendDisabled.* TrackingId:"):
            sender.send_messages(ServiceBusMessage(b"after"))
    assert broker.count("q") == 1


def test_a_disabled_topic_refuses_sends_and_a_disabled_subscription_receives(
    broker_factory: Any,
) -> None:
    broker: BrokerHandle = broker_factory(CONFIG)
    set_status(broker, EntityStatus.DISABLED, "topic")
    with (
        pytest.raises(MessagingEntityDisabledError, match="Disabled"),
        broker.client(retry_total=0) as client,
        client.get_topic_sender("t") as sender,
    ):
        sender.send_messages(ServiceBusMessage(b"x"))
    set_status(broker, EntityStatus.ACTIVE, "topic")
    set_status(broker, EntityStatus.RECEIVE_DISABLED, "subscription")
    with (
        broker.client(retry_total=0) as client,
        client.get_topic_sender("t") as sender,
    ):
        sender.send_messages(ServiceBusMessage(b"x"))  # the topic takes it
        with pytest.raises(MessagingEntityDisabledError, match="ReceiveDisabled"):  # noqa: SIM117
            with client.get_subscription_receiver("t", "s", max_wait_time=1) as receiver:
                receiver.receive_messages(max_wait_time=1)
