"""Auto-forwarding: ForwardTo and ForwardDeadLetteredMessagesTo, hop limit, no loops."""

from __future__ import annotations

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage, ServiceBusSubQueue

from replication.broker.config import ConfigError, parse_config

from .conftest import (
    DRAIN_PREFETCH,
    BrokerHandle,
    concurrently,
    make_config,
    receive_all,
    receive_n,
    take_all,
)

pytestmark = pytest.mark.timeout(60)

CONFIG = make_config(
    {
        "in": {"ForwardTo": "out"},
        "out": {},
        "to-topic": {"ForwardTo": "fan"},
        "dl-source": {"ForwardDeadLetteredMessagesTo": "dl-sink", "MaxDeliveryCount": 1},
        "dl-sink": {},
        "hop1": {"ForwardTo": "hop2"},
        "hop2": {"ForwardTo": "hop3"},
        "hop3": {"ForwardTo": "hop4"},
        "hop4": {"ForwardTo": "hop5"},
        "hop5": {"ForwardTo": "hop6"},
        "hop6": {},
        "sessions": {"RequiresSession": True},
        "to-sessions": {"ForwardTo": "sessions"},
    },
    topics={"fan": {"Subscriptions": {
        "copy": {},
        "onward": {"Properties": {"ForwardTo": "out"}},
    }}},
)  # fmt: skip


@pytest.mark.broker_config(CONFIG)
def test_forward_to_a_queue_keeps_the_message(broker: BrokerHandle) -> None:
    with broker.client() as client, client.get_queue_sender("in") as sender:
        sender.send_messages(ServiceBusMessage(
            b"payload", message_id="f1", application_properties={"k": "v"}, subject="s",
        ))  # fmt: skip
    (message,) = receive_all(broker, "out")
    assert (message.message_id, message.subject, b"".join(message.body)) == ("f1", "s", b"payload")
    assert message.application_properties == {b"k": b"v"}
    assert broker.count("in") == 0


@pytest.mark.broker_config(CONFIG)
def test_queue_to_topic_to_subscription_to_queue(broker: BrokerHandle) -> None:
    with broker.client() as client, client.get_queue_sender("to-topic") as sender:
        sender.send_messages(ServiceBusMessage("around", message_id="t1"))

    def copy() -> list[ServiceBusReceivedMessage]:
        with (
            broker.client() as client,
            client.get_subscription_receiver(
                "fan", "copy", prefetch_count=DRAIN_PREFETCH
            ) as receiver,
        ):
            return take_all(receiver)

    out, copied = concurrently(lambda: receive_all(broker, "out"), copy)
    assert [m.message_id for m in out] == ["t1"]
    assert [m.message_id for m in copied] == ["t1"]


@pytest.mark.broker_config(CONFIG)
def test_more_than_four_hops_dead_letters(broker: BrokerHandle) -> None:
    """hop1 -> hop2 -> hop3 -> hop4 -> hop5 are four transfers; hop5 may not forward again,
    so the message stays in hop5's dead-letter queue, with the reason Service Bus gives."""
    with broker.client() as client, client.get_queue_sender("hop1") as sender:
        sender.send_messages(ServiceBusMessage("far", message_id="h1"))
    hop6, (dead,) = concurrently(
        lambda: receive_all(broker, "hop6"),
        lambda: receive_all(broker, "hop5", sub_queue=ServiceBusSubQueue.DEAD_LETTER),
    )
    assert hop6 == []
    assert dead.message_id == "h1"
    assert dead.dead_letter_reason == "MaxTransferHopCountExceeded"


@pytest.mark.broker_config(CONFIG)
def test_forward_dead_lettered_messages(broker: BrokerHandle) -> None:
    with broker.client() as client:
        with client.get_queue_sender("dl-source") as sender:
            sender.send_messages([
                ServiceBusMessage("explicit", message_id="d1"),
                ServiceBusMessage("too often", message_id="d2"),
            ])  # fmt: skip
        with client.get_queue_receiver("dl-source") as receiver:
            d1, d2 = receive_n(receiver, 2)
            receiver.dead_letter_message(d1, reason="nope")
            receiver.abandon_message(d2)  # MaxDeliveryCount 1
    sunk, dead = concurrently(
        lambda: receive_all(broker, "dl-sink"),
        lambda: receive_all(broker, "dl-source", sub_queue=ServiceBusSubQueue.DEAD_LETTER),
    )
    sink = {m.message_id: m for m in sunk}
    assert sink["d1"].application_properties[b"DeadLetterReason"] == b"nope"
    assert sink["d2"].application_properties[b"DeadLetterReason"] == b"MaxDeliveryCountExceeded"
    assert {m.dead_letter_source for m in sink.values()} == {"dl-source"}
    assert dead == []


@pytest.mark.broker_config(CONFIG)
def test_forwarding_a_sessionless_message_into_a_session_queue_dead_letters_it(
    broker: BrokerHandle,
) -> None:
    with broker.client() as client, client.get_queue_sender("to-sessions") as sender:
        sender.send_messages(ServiceBusMessage("lost?", message_id="n1"))
    (dead,) = receive_all(broker, "sessions", sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    assert (dead.message_id, dead.dead_letter_reason) == ("n1", "Session ID is null")


def test_forwarding_loops_are_refused_at_load() -> None:
    config = make_config(
        {"a": {"ForwardTo": "b"}, "b": {"ForwardTo": "t"}},
        topics={"t": {"Subscriptions": {"s": {"Properties": {"ForwardTo": "a"}}}}},
    )
    loop = r"forwarding loop: a -> b -> t -> t/Subscriptions/s -> a"
    with pytest.raises(ConfigError, match=loop):
        parse_config(config)
