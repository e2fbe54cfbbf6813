"""python-qpid-proton as a broker client (SASL PLAIN), alone and mixed with the SDK.

Proton is a plain AMQP 1.0 client with no Service Bus knowledge, so what it sees is what
the broker really puts on the wire: the bare message kept byte for byte, the annotations
the broker adds, and the outcomes it understands.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.amqp import AmqpMessageBodyType
from proton import ConnectionException, Delivery, Message, symbol
from proton.utils import LinkDetached

from replication.clock import ManualClock

from .conftest import BrokerHandle, body_bytes, nothing_more, proton_connection, receive_n, send

pytestmark = pytest.mark.timeout(60)

TIMEOUT = 5


def connect(broker: BrokerHandle, **kwargs: Any) -> Any:
    return proton_connection(broker.port, **kwargs)  # RootManageSharedAccessKey / SAS_KEY_VALUE


def test_proton_send_and_receive(broker: BrokerHandle) -> None:
    conn = connect(broker)
    try:
        sender = conn.create_sender("q")
        for i in range(3):
            delivery = sender.send(Message(body=f"proton {i}", id=f"p{i}"))
            assert delivery.remote_state == Delivery.ACCEPTED
        receiver = conn.create_receiver("q", credit=10)
        got = []
        for _ in range(3):
            got.append(receiver.receive(timeout=TIMEOUT))
            receiver.accept()
        assert [(m.body, m.id) for m in got] == [(f"proton {i}", f"p{i}") for i in range(3)]
        seqs = [m.annotations[symbol("x-opt-sequence-number")] for m in got]
        assert seqs == [1, 2, 3]
    finally:
        conn.close()
    assert broker.count("q") == 0


def test_sdk_message_received_by_proton(broker: BrokerHandle) -> None:
    send(
        broker, "q",
        ServiceBusMessage(
            b"from the sdk",
            message_id="sdk-1",
            correlation_id="corr-1",
            subject="subj",
            content_type="text/plain",
            to="dest",
            reply_to="replies",
            application_properties={"text": "v", "int": 7, "float": 2.5, "flag": True},
            time_to_live=timedelta(minutes=2),
        ),
    )  # fmt: skip
    conn = connect(broker)
    try:
        receiver = conn.create_receiver("q", credit=1)
        message = receiver.receive(timeout=TIMEOUT)
        receiver.accept()
    finally:
        conn.close()
    assert bytes(message.body) == b"from the sdk"
    assert message.id == "sdk-1"
    assert message.correlation_id == "corr-1"
    assert message.subject == "subj"
    assert message.content_type == "text/plain"
    assert message.address == "dest"
    assert message.reply_to == "replies"
    assert message.properties == {"text": "v", "int": 7, "float": 2.5, "flag": True}
    assert message.ttl == 120.0
    assert message.delivery_count == 0
    annotations = message.annotations
    assert annotations[symbol("x-opt-sequence-number")] == 1
    assert symbol("x-opt-enqueued-time") in annotations
    assert symbol("x-opt-locked-until") in annotations
    assert broker.count("q") == 0


def test_proton_message_received_by_sdk(broker: BrokerHandle) -> None:
    conn = connect(broker)
    try:
        sender = conn.create_sender("q")
        sender.send(
            Message(
                body=b"binary from proton", id="pr-1", correlation_id="pc-1",
                subject="proton-subject", content_type="application/octet-stream",
                address="q", reply_to="proton-replies", ttl=60.0,
                properties={"s": "text", "i": 5, "f": 1.25, "b": False},
            )
        )  # fmt: skip
        sender.send(Message(body="a string value", id="pr-2"))
    finally:
        conn.close()
    with broker.client() as client, client.get_queue_receiver("q") as receiver:
        first, second = receive_n(receiver, 2)
        assert body_bytes(first) == b"binary from proton"
        assert first.message_id == "pr-1"
        assert first.correlation_id == "pc-1"
        assert first.subject == "proton-subject"
        assert first.content_type == "application/octet-stream"
        assert first.to == "q"
        assert first.reply_to == "proton-replies"
        assert first.application_properties == {b"s": b"text", b"i": 5, b"f": 1.25, b"b": False}
        assert first.time_to_live == timedelta(seconds=60)
        assert first.delivery_count == 0
        assert first.sequence_number == 1
        assert second.message_id == "pr-2"
        # An AMQP value body; the SDK hands back its strings as bytes.
        assert second.body_type == AmqpMessageBodyType.VALUE
        assert second.body == b"a string value"
        assert second.sequence_number == 2
        receiver.complete_message(first)
        receiver.complete_message(second)
    assert broker.count("q") == 0


def test_large_message_both_ways(broker: BrokerHandle) -> None:
    big = bytes(range(256)) * 800  # 200 KiB: several frames each way
    send(broker, "q", ServiceBusMessage(big, message_id="big-sdk"))
    conn = connect(broker)
    try:
        receiver = conn.create_receiver("q", credit=1)
        message = receiver.receive(timeout=TIMEOUT)
        receiver.accept()
        assert bytes(message.body) == big
        assert message.id == "big-sdk"
        conn.create_sender("q").send(Message(body=big, id="big-proton"))
    finally:
        conn.close()
    with broker.client() as client, client.get_queue_receiver("q") as receiver:
        (message,) = receive_n(receiver, 1)
        assert body_bytes(message) == big
        assert message.message_id == "big-proton"
        receiver.complete_message(message)


def test_proton_outcomes_release_and_reject(broker: BrokerHandle) -> None:
    send(broker, "q", ServiceBusMessage("unwanted", message_id="m"))
    conn = connect(broker)
    try:
        receiver = conn.create_receiver("q", credit=1)
        first = receiver.receive(timeout=TIMEOUT)
        assert (first.id, first.delivery_count) == ("m", 0)
        receiver.release(delivered=False)  # released: back at once, no attempt counted
        again = receiver.receive(timeout=TIMEOUT)
        assert (again.id, again.delivery_count) == ("m", 0)
        receiver.reject()  # rejected: dead-lettered
    finally:
        conn.close()
    with broker.client() as client:
        with client.get_queue_receiver("q") as receiver:
            assert nothing_more(receiver)
        with client.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            (dead,) = receive_n(dlq, 1)
            assert dead.message_id == "m"
            assert dead.dead_letter_source == "q"
            dlq.complete_message(dead)
    assert broker.count("q") == 0


def test_proton_reads_the_dead_letter_queue(broker: BrokerHandle) -> None:
    send(broker, "q", ServiceBusMessage("doomed", message_id="dd"))
    with broker.client() as client, client.get_queue_receiver("q") as receiver:
        (message,) = receive_n(receiver, 1)
        receiver.dead_letter_message(message, reason="why", error_description="because")
    conn = connect(broker)
    try:
        receiver = conn.create_receiver("q/$DeadLetterQueue", credit=1)
        dead = receiver.receive(timeout=TIMEOUT)
        receiver.accept()
    finally:
        conn.close()
    assert dead.id == "dd"
    assert dead.properties["DeadLetterReason"] == "why"
    assert dead.properties["DeadLetterErrorDescription"] == "because"
    assert dead.annotations[symbol("x-opt-deadletter-source")] == "q"
    assert broker.count("q/$DeadLetterQueue") == 0


def test_proton_connection_close_keeps_its_locks_until_they_expire(broker_factory: Any) -> None:
    broker: BrokerHandle = broker_factory(clock=ManualClock())
    send(broker, "q", ServiceBusMessage("held by proton", message_id="held"))
    conn = connect(broker)
    receiver = conn.create_receiver("q", credit=1)
    assert receiver.receive(timeout=TIMEOUT).id == "held"
    conn.close()  # without settling
    with broker.client() as client, client.get_queue_receiver("q") as sdk_receiver:
        assert nothing_more(sdk_receiver)
        broker.advance(61)
        (message,) = receive_n(sdk_receiver, 1, timeout=3)
        assert (message.message_id, message.delivery_count) == ("held", 1)
        sdk_receiver.complete_message(message)


def test_a_second_proton_receiver_on_one_address_fails_at_once(broker_factory: Any) -> None:
    """proton's BlockingConnection names a receiver's link by its address, so a second
    receiver on the same queue in one connection reuses the name: it hears at once instead
    of waiting out its timeout on a session ended under it, and nothing held is lost."""
    broker: BrokerHandle = broker_factory(clock=ManualClock())
    send(broker, "q", ServiceBusMessage("held", message_id="held"))
    conn = connect(broker, timeout=30)
    first = conn.create_receiver("q", credit=1)
    assert first.receive(timeout=TIMEOUT).id == "held"
    started = time.monotonic()
    with pytest.raises(ConnectionException, match="link name already attached"):
        conn.create_receiver("q", credit=1)  # proton drops the connection on our refusal
    assert time.monotonic() - started < 10  # not the 30 s timeout: an answer came
    conn.close()
    broker.advance(61)  # the first receiver's lock, held past its connection
    with broker.client() as client, client.get_queue_receiver("q") as sdk_receiver:
        (message,) = receive_n(sdk_receiver, 1, timeout=3)
        assert message.message_id == "held"
        sdk_receiver.complete_message(message)


def test_proton_unknown_queue_and_dead_letter_sends_are_refused(broker: BrokerHandle) -> None:
    conn = connect(broker)
    try:
        with pytest.raises(LinkDetached, match="amqp:not-found"):
            conn.create_sender("no-such-queue")
        with pytest.raises(LinkDetached, match="amqp:not-found"):
            conn.create_receiver("no-such-queue")
        with pytest.raises(LinkDetached, match="amqp:not-allowed"):
            conn.create_sender("q/$DeadLetterQueue")
    finally:
        conn.close()


def test_anonymous_without_a_token_is_refused(broker: BrokerHandle) -> None:
    conn = connect(broker, user=None)
    try:
        with pytest.raises(LinkDetached, match="amqp:unauthorized-access"):
            conn.create_sender("q")
    finally:
        conn.close()
    assert broker.count("q") == 0
