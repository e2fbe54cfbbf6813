"""Sending and receiving with the unmodified sync ``azure-servicebus`` SDK through the broker.

Every way the SDK sends (one message, a list, a batch), every property a message carries,
the annotations the broker adds (sequence number, enqueued time, lock expiry, delivery
count), and the three ways the SDK authenticates (connection string, named key, SAS).
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusMessageBatch,
    ServiceBusReceiveMode,
)

from replication.amqp.transport import ConnectionDriver
from replication.broker.auth import EMULATOR_KEY, EMULATOR_RULE_NAME
from replication.servicebus.sas import generate_sas_token

from ..wire_witness import watch_writes
from .conftest import BrokerHandle, QuickCloseClient, body_bytes, nothing_more, receive_n

pytestmark = pytest.mark.timeout(60)

APP_PROPERTIES = {
    "text": "héllo",
    "int": 42,
    "negative": -7,
    "float": 1.5,
    "flag": True,
    "off": False,
    "blob": b"raw bytes",  # the SDK sends bytes values as strings (UTF-8 decoded)
}
RECEIVED_APP_PROPERTIES = {
    # The SDK hands received keys and string values back as bytes (documented behaviour).
    b"text": "héllo".encode(),
    b"int": 42,
    b"negative": -7,
    b"float": 1.5,
    b"flag": True,
    b"off": False,
    b"blob": b"raw bytes",
}


def now() -> datetime:
    return datetime.now(UTC)


def assert_close(actual: datetime | None, expected: datetime, tolerance: float = 2.0) -> None:
    assert actual is not None
    assert abs((actual - expected).total_seconds()) <= tolerance, (actual, expected)


def test_send_single_receive_complete_default_client(broker: BrokerHandle) -> None:
    """The SDK exactly as an application uses it: default client settings."""
    with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        with client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage("hello", message_id="m-1"))
        with client.get_queue_receiver("q") as receiver:
            (message,) = receive_n(receiver, 1)
            assert str(message) == "hello"
            assert body_bytes(message) == b"hello"
            assert message.message_id == "m-1"
            receiver.complete_message(message)
            assert nothing_more(receiver)
    assert broker.count("q") == 0


def test_all_properties_round_trip(broker: BrokerHandle) -> None:
    sent = ServiceBusMessage(
        b"payload \x00\xff",
        message_id="id-1",
        correlation_id="corr-1",
        subject="the-subject",
        content_type="application/octet-stream",
        to="someone",
        reply_to="reply-queue",
        application_properties=APP_PROPERTIES,
        time_to_live=timedelta(minutes=5),
    )
    with broker.client() as client:
        before = now()
        with client.get_queue_sender("q") as sender:
            sender.send_messages(sent)
        with client.get_queue_receiver("q", max_wait_time=3) as receiver:
            (message,) = receive_n(receiver, 1)
            received_at = now()
            assert body_bytes(message) == b"payload \x00\xff"
            assert message.message_id == "id-1"
            assert message.correlation_id == "corr-1"
            assert message.subject == "the-subject"
            assert message.content_type == "application/octet-stream"
            assert message.to == "someone"
            assert message.reply_to == "reply-queue"
            assert message.session_id is None
            assert message.reply_to_session_id is None
            assert message.application_properties == RECEIVED_APP_PROPERTIES
            assert message.time_to_live == timedelta(minutes=5)
            assert message.delivery_count == 0
            assert message.sequence_number is not None and message.sequence_number >= 1
            assert message.enqueued_sequence_number == message.sequence_number
            assert_close(message.enqueued_time_utc, before)
            assert message.expires_at_utc is not None
            assert message.enqueued_time_utc is not None
            assert_close(
                message.expires_at_utc, message.enqueued_time_utc + timedelta(minutes=5), 0.01
            )
            # q has the default lock duration: one minute.
            assert_close(message.locked_until_utc, received_at + timedelta(minutes=1))
            assert message.lock_token is not None
            assert message.dead_letter_reason is None
            assert message.dead_letter_source is None
            receiver.complete_message(message)


def test_string_body_and_no_properties(broker: BrokerHandle) -> None:
    with broker.client() as client:
        with client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage("just text"))
        with client.get_queue_receiver("q", max_wait_time=3) as receiver:
            (message,) = receive_n(receiver, 1)
            assert str(message) == "just text"
            assert message.message_id is not None
            uuid.UUID(message.message_id)  # the SDK assigns one to every message it sends
            assert message.application_properties is None
            assert message.time_to_live is None
            assert message.expires_at_utc is None
            receiver.complete_message(message)


def test_send_list_arrives_in_order_with_increasing_sequence_numbers(broker: BrokerHandle) -> None:
    with broker.client() as client:
        with client.get_queue_sender("q") as sender:
            sender.send_messages(
                [ServiceBusMessage(f"m{i}", message_id=f"id{i}") for i in range(5)]
            )
        with client.get_queue_receiver("q") as receiver:
            messages = receive_n(receiver, 5)
            assert [str(m) for m in messages] == [f"m{i}" for i in range(5)]
            assert [m.message_id for m in messages] == [f"id{i}" for i in range(5)]
            seqs = [m.sequence_number for m in messages]
            assert seqs == sorted(seqs) and len(set(seqs)) == 5
            raw = [m.raw_amqp_message.annotations[b"x-opt-sequence-number"] for m in messages]
            assert raw == seqs
            for m in messages:
                receiver.complete_message(m)


def test_send_batch(broker: BrokerHandle) -> None:
    with broker.client() as client:
        with client.get_queue_sender("q") as sender:
            batch = sender.create_message_batch()
            assert isinstance(batch, ServiceBusMessageBatch)
            for i in range(10):
                batch.add_message(
                    ServiceBusMessage(f"b{i}", application_properties={"index": i}, subject="batch")
                )
            sender.send_messages(batch)
            sender.send_messages(ServiceBusMessage("after"))
        with client.get_queue_receiver("q") as receiver:
            messages = receive_n(receiver, 11)
            assert [str(m) for m in messages] == [f"b{i}" for i in range(10)] + ["after"]
            assert [m.application_properties for m in messages[:10]] == [
                {b"index": i} for i in range(10)
            ]
            assert {m.subject for m in messages[:10]} == {"batch"}
            seqs = [m.sequence_number for m in messages]
            assert seqs == list(range(seqs[0], seqs[0] + 11))
            for m in messages:
                receiver.complete_message(m)


def test_sequence_numbers_increase_across_sends(broker: BrokerHandle) -> None:
    with broker.client() as client:
        with client.get_queue_sender("q") as sender:
            for i in range(3):
                sender.send_messages(ServiceBusMessage(f"s{i}"))
        with client.get_queue_receiver("q") as receiver:
            first = receive_n(receiver, 3)
            for m in first:
                receiver.complete_message(m)
        with client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage("later"))
        with client.get_queue_receiver("q") as receiver:
            (later,) = receive_n(receiver, 1)
            receiver.complete_message(later)
    seqs = [m.sequence_number for m in first]
    assert seqs == [1, 2, 3]
    assert later.sequence_number == 4  # never reused, even after the queue emptied


def test_delivery_metadata_on_short_lock_queue(broker: BrokerHandle) -> None:
    with broker.client() as client:
        before = now()
        with client.get_queue_sender("short-lock") as sender:
            sender.send_messages(ServiceBusMessage("x"))
        with client.get_queue_receiver("short-lock") as receiver:
            (message,) = receive_n(receiver, 1)
            received_at = now()
            assert message.delivery_count == 0
            assert_close(message.enqueued_time_utc, before)
            assert_close(message.locked_until_utc, received_at + timedelta(seconds=5))
            locked_until = message.raw_amqp_message.annotations[b"x-opt-locked-until"]
            assert message.locked_until_utc is not None
            assert locked_until == int(message.locked_until_utc.timestamp() * 1000)
            # The lock token is the delivery tag read as a little-endian UUID.
            tag = bytes(message._delivery_tag)
            assert str(message.lock_token) == str(uuid.UUID(bytes_le=tag))
            # and, as Service Bus sends it too, a delivery annotation, not a message one
            raw = message.raw_amqp_message
            assert raw.delivery_annotations == {b"x-opt-lock-token": message.lock_token}
            assert b"x-opt-lock-token" not in raw.annotations
            receiver.complete_message(message)


def test_named_key_credential(broker: BrokerHandle) -> None:
    credential = AzureNamedKeyCredential(EMULATOR_RULE_NAME, EMULATOR_KEY)
    with QuickCloseClient(broker.endpoint, credential, use_tls=False) as client:
        with client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage("named", message_id="nk"))
        with client.get_queue_receiver("q") as receiver:
            (message,) = receive_n(receiver, 1)
            assert (str(message), message.message_id) == ("named", "nk")
            receiver.complete_message(message)


def test_sas_credential(broker: BrokerHandle) -> None:
    token = generate_sas_token(
        broker.audience("q"), EMULATOR_RULE_NAME, EMULATOR_KEY, int(time.time()) + 3600
    )
    with QuickCloseClient(broker.endpoint, AzureSasCredential(token), use_tls=False) as client:
        with client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage("sas", message_id="sas-1"))
        with client.get_queue_receiver("q") as receiver:
            (message,) = receive_n(receiver, 1)
            assert (str(message), message.message_id) == ("sas", "sas-1")
            receiver.complete_message(message)


def test_receive_and_delete(broker: BrokerHandle) -> None:
    with broker.client() as client:
        with client.get_queue_sender("q") as sender:
            sender.send_messages([ServiceBusMessage(f"rd{i}") for i in range(3)])
        with client.get_queue_receiver(
            "q", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        ) as receiver:
            messages = receive_n(receiver, 3)
            assert [str(m) for m in messages] == ["rd0", "rd1", "rd2"]
            assert all(m.locked_until_utc is None for m in messages)
            assert all(m.lock_token is None for m in messages)
        assert broker.count("q") == 0
        with client.get_queue_receiver("q") as receiver:
            assert receiver.peek_messages(max_message_count=10) == []
            assert nothing_more(receiver)


def test_receive_and_delete_commits_the_delete_before_the_transfer(
    broker: BrokerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At-most-once: when a receive-and-delete transfer reaches the socket, its delete is
    already on disk (read through a second SQLite connection, which sees committed rows
    only), so a crash can lose the message but never deliver it twice. The witness sits where
    the broker's bytes leave (the asyncio shell, plain Python even when the broker is
    compiled)."""
    witness = sqlite3.connect(broker.data_dir / "messages.db", check_same_thread=False)
    seen_on_disk: list[int] = []

    def seen(driver: ConnectionDriver, data: bytes) -> None:
        if driver.connection.server and b"rad-order" in data:
            (count,) = witness.execute(
                "SELECT count(*) FROM message WHERE message_id LIKE 'rad-order-%'"
            ).fetchone()
            seen_on_disk.append(count)

    watch_writes(monkeypatch, seen)
    with broker.client() as client:
        with client.get_queue_sender("q") as sender:
            sender.send_messages(
                [ServiceBusMessage(f"rad-order {i}", message_id=f"rad-order-{i}") for i in range(5)]
            )
        with client.get_queue_receiver(
            "q", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, prefetch_count=5
        ) as receiver:
            assert len(receive_n(receiver, 5)) == 5
    witness.close()
    assert seen_on_disk and set(seen_on_disk) == {0}


def test_prefetch_200_in_order(broker: BrokerHandle) -> None:
    total = 200
    with broker.client() as client:
        with client.get_queue_sender("q") as sender:
            for start in range(0, total, 50):
                batch = sender.create_message_batch()
                for i in range(start, start + 50):
                    batch.add_message(ServiceBusMessage(f"p{i}"))
                sender.send_messages(batch)
        with client.get_queue_receiver("q", prefetch_count=50) as receiver:
            received = receive_n(receiver, total, timeout=30)
            for message in received:
                receiver.complete_message(message)
            assert nothing_more(receiver)
    assert [str(m) for m in received] == [f"p{i}" for i in range(total)]
    seqs = [m.sequence_number for m in received]
    assert seqs == list(range(seqs[0], seqs[0] + total))
    assert broker.count("q") == 0


def test_wrong_entity_raises_not_found(broker: BrokerHandle) -> None:
    from azure.servicebus.exceptions import MessagingEntityNotFoundError

    with (
        broker.client(retry_total=0) as client,
        pytest.raises(
            MessagingEntityNotFoundError,
            match="The messaging entity 'no-such-queue' could not be found",
        ),
        client.get_queue_sender("no-such-queue") as sender,
    ):
        sender.send_messages(ServiceBusMessage("x"))


def test_messages_survive_restart(broker: BrokerHandle) -> None:
    with broker.client() as client, client.get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage(f"r{i}", message_id=f"r{i}") for i in range(3)])
    broker.restart()
    with broker.client() as client:
        with client.get_queue_receiver("q") as receiver:
            messages = receive_n(receiver, 3)
            assert [m.message_id for m in messages] == ["r0", "r1", "r2"]
            assert [m.sequence_number for m in messages] == [1, 2, 3]
            for m in messages:
                receiver.complete_message(m)
        with client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage("after restart"))
        with client.get_queue_receiver("q") as receiver:
            (after,) = receive_n(receiver, 1)
            assert after.sequence_number == 4
            receiver.complete_message(after)
