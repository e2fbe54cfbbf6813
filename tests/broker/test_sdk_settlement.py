"""Peek-lock settlement with the sync SDK: complete, abandon, defer, dead-letter, lock expiry,
MaxDeliveryCount, time to live, duplicate detection, scheduling, dropped connections."""

from __future__ import annotations

import contextlib
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.servicebus import (
    ServiceBusMessage,
    ServiceBusMessageState,
    ServiceBusReceivedMessage,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import MessageLockLostError

from replication.broker.clock import ManualClock

from .conftest import BrokerHandle, dead_letters, nothing_more, receive_n, send, whole_ms

pytestmark = pytest.mark.timeout(60)


def now() -> datetime:
    return datetime.now(UTC)


# ---------------------------------------------------------------------------- complete / abandon


def test_complete_removes_the_message(broker: BrokerHandle) -> None:
    send(broker, "q", ServiceBusMessage("done", message_id="c1"), ServiceBusMessage("stays"))
    with broker.client() as client, client.get_queue_receiver("q") as receiver:
        first, second = receive_n(receiver, 2)
        receiver.complete_message(first)
        receiver.abandon_message(second)
        (again,) = receive_n(receiver, 1)
        assert str(again) == "stays"  # only the abandoned one comes back
        receiver.complete_message(again)
        assert nothing_more(receiver)
        assert receiver.peek_messages(max_message_count=10) == []
    assert broker.count("q") == 0


def test_abandon_redelivers_with_incremented_delivery_count(broker: BrokerHandle) -> None:
    send(broker, "q", ServiceBusMessage("again", message_id="a1"))
    with broker.client() as client, client.get_queue_receiver("q") as receiver:
        counts, seqs = [], []
        for _ in range(3):
            (message,) = receive_n(receiver, 1)
            assert message.message_id == "a1"
            counts.append(message.delivery_count)
            seqs.append(message.sequence_number)
            receiver.abandon_message(message)
        (message,) = receive_n(receiver, 1)
        receiver.complete_message(message)
    assert counts == [0, 1, 2]
    assert message.delivery_count == 3
    assert len(set(seqs)) == 1 and message.sequence_number == seqs[0]


def test_abandoned_message_keeps_its_place_in_order(broker: BrokerHandle) -> None:
    send(broker, "q", *(ServiceBusMessage(f"o{i}") for i in range(3)))
    with broker.client() as client, client.get_queue_receiver("q") as receiver:
        (first,) = receive_n(receiver, 1)
        assert str(first) == "o0"
        receiver.abandon_message(first)
        messages = receive_n(receiver, 3)
        assert [str(m) for m in messages] == ["o0", "o1", "o2"]
        for m in messages:
            receiver.complete_message(m)


def test_competing_receivers_get_each_message_once(broker: BrokerHandle) -> None:
    send(broker, "q", *(ServiceBusMessage(f"c{i}") for i in range(20)))
    with (
        broker.client() as client,
        client.get_queue_receiver("q") as one,
        client.get_queue_receiver("q") as two,
    ):
        got: list[ServiceBusReceivedMessage] = []
        deadline = time.monotonic() + 15
        while len(got) < 20 and time.monotonic() < deadline:
            for receiver in (one, two):
                batch = receiver.receive_messages(max_message_count=3, max_wait_time=0.5)
                for m in batch:
                    receiver.complete_message(m)
                got += batch
        assert sorted(str(m) for m in got) == sorted(f"c{i}" for i in range(20))
        assert nothing_more(one) and nothing_more(two)


# ---------------------------------------------------------------------------- defer


def test_defer_then_receive_by_sequence_number_and_complete(broker: BrokerHandle) -> None:
    send(broker, "q", ServiceBusMessage("deferred", message_id="d1"))
    send(broker, "q", ServiceBusMessage("normal", message_id="n1"))
    with broker.client() as client, client.get_queue_receiver("q") as receiver:
        (message,) = receive_n(receiver, 1)
        assert message.message_id == "d1"
        seq = message.sequence_number
        receiver.defer_message(message)
        (normal,) = receive_n(receiver, 1)
        assert normal.message_id == "n1"  # the deferred one is not delivered normally
        receiver.complete_message(normal)
        assert nothing_more(receiver)

        (deferred,) = receiver.receive_deferred_messages([seq])
        received_at = now()
        assert deferred.message_id == "d1"
        assert deferred.sequence_number == seq
        assert deferred.state == ServiceBusMessageState.DEFERRED
        assert deferred.lock_token is not None
        assert deferred.locked_until_utc is not None
        assert abs((deferred.locked_until_utc - received_at).total_seconds() - 60) <= 2
        receiver.complete_message(deferred)
        assert nothing_more(receiver)
    assert broker.count("q") == 0


# ---------------------------------------------------------------------------- dead-letter


def test_dead_letter_with_reason_and_description(broker: BrokerHandle) -> None:
    send(
        broker, "q",
        ServiceBusMessage("poison", message_id="p1", application_properties={"k": "v"}),
    )  # fmt: skip
    with broker.client() as client, client.get_queue_receiver("q") as receiver:
        (message,) = receive_n(receiver, 1)
        receiver.dead_letter_message(
            message, reason="bad-input", error_description="could not parse it"
        )
        assert nothing_more(receiver)
    (dead,) = dead_letters(broker, "q", 1)
    assert str(dead) == "poison"
    assert dead.message_id == "p1"
    assert dead.dead_letter_reason == "bad-input"
    assert dead.dead_letter_error_description == "could not parse it"
    assert dead.dead_letter_source == "q"
    assert dead.application_properties is not None
    assert dead.application_properties[b"k"] == b"v"
    assert dead.application_properties[b"DeadLetterReason"] == b"bad-input"
    assert broker.count("q") == 0
    assert broker.count("q/$DeadLetterQueue") == 0


def test_dead_letter_without_reason(broker: BrokerHandle) -> None:
    send(broker, "q", ServiceBusMessage("plain dead", message_id="p2"))
    with broker.client() as client, client.get_queue_receiver("q") as receiver:
        (message,) = receive_n(receiver, 1)
        receiver.dead_letter_message(message)
    (dead,) = dead_letters(broker, "q", 1)
    assert dead.message_id == "p2"
    assert dead.dead_letter_source == "q"
    assert not dead.dead_letter_reason
    assert not dead.dead_letter_error_description


def test_max_delivery_count_exceeded_goes_to_dead_letter(broker: BrokerHandle) -> None:
    send(broker, "dlq-test", ServiceBusMessage("twice", message_id="mdc"))
    with broker.client() as client, client.get_queue_receiver("dlq-test") as receiver:
        for expected_count in (0, 1):  # MaxDeliveryCount 2: two deliveries, then the DLQ
            (message,) = receive_n(receiver, 1)
            assert message.delivery_count == expected_count
            receiver.abandon_message(message)
        assert nothing_more(receiver)
    (dead,) = dead_letters(broker, "dlq-test", 1)
    assert dead.message_id == "mdc"
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert dead.dead_letter_error_description
    assert dead.dead_letter_source == "dlq-test"


# ---------------------------------------------------------------------------- locks


def test_lock_expiry_redelivers_and_old_lock_is_lost(broker: BrokerHandle) -> None:
    """Lock expiry's real-time smoke test (kept on the system clock: the SDK judges the
    lock itself, by real time, before the broker does; the exact versions run on a
    ``ManualClock``: test_sdk_management's renew-lock, test_sessions' session lock)."""
    send(broker, "short-lock", ServiceBusMessage("slow", message_id="le"))
    with (
        broker.client(retry_total=0) as client,
        client.get_queue_receiver("short-lock") as receiver,
    ):
        (first,) = receive_n(receiver, 1)
        assert first.delivery_count == 0
        assert nothing_more(receiver)  # locked: nobody else gets it meanwhile
        assert first.locked_until_utc is not None
        time.sleep(max(0.0, (first.locked_until_utc - now()).total_seconds()) + 0.5)
        (second,) = receive_n(receiver, 1, timeout=5)
        assert second.message_id == "le"
        assert second.sequence_number == first.sequence_number
        assert second.delivery_count == 1
        assert second.lock_token != first.lock_token

        with pytest.raises(MessageLockLostError, match="lock has expired"):
            receiver.complete_message(first)  # the SDK itself sees the lock time passed
        with pytest.raises(MessageLockLostError, match="has expired or was released"):
            receiver.renew_message_lock(first)  # the broker refuses ($management renew-lock)
        # Make the SDK believe the old lock still holds, so the broker has to refuse the
        # disposition on the receive link.
        first._expiry = now() + timedelta(minutes=1)
        with pytest.raises(MessageLockLostError, match="has expired or was released"):
            receiver.complete_message(first)
        receiver.complete_message(second)
        assert nothing_more(receiver)
    assert broker.count("short-lock") == 0


def test_a_closed_receivers_locks_hold_until_they_expire(broker_factory: Any) -> None:
    """Service Bus keeps a message a receiver took and left unsettled locked after the
    receiver and its connection close: it comes again once the lock expires (60 s on the
    broker's clock), with the delivery counted."""
    broker: BrokerHandle = broker_factory(clock=ManualClock())
    send(broker, "q", ServiceBusMessage("orphan", message_id="o1"))
    client = broker.client()
    receiver = client.get_queue_receiver("q")
    (held,) = receive_n(receiver, 1)
    assert held.delivery_count == 0
    receiver.close()
    client.close()
    with broker.client() as client, client.get_queue_receiver("q") as receiver:
        assert nothing_more(receiver)  # still locked
        broker.advance(61)
        (again,) = receive_n(receiver, 1, timeout=5)
        assert (again.message_id, again.sequence_number) == ("o1", held.sequence_number)
        assert again.delivery_count == 1
        receiver.complete_message(again)


def test_a_dropped_connections_locks_hold_until_they_expire(broker_factory: Any) -> None:
    """No close, no detach: the socket just goes away (aborted on the broker's side)."""
    broker: BrokerHandle = broker_factory(clock=ManualClock())
    send(broker, "q", ServiceBusMessage("stranded", message_id="s1"))
    client = broker.client(retry_total=0)
    receiver = client.get_queue_receiver("q")
    try:
        (held,) = receive_n(receiver, 1)
        assert broker.drop_receiving_connections() == 1
        with broker.client() as other, other.get_queue_receiver("q") as second:
            assert nothing_more(second)
            broker.advance(61)
            (again,) = receive_n(second, 1, timeout=5)
            assert (again.message_id, again.sequence_number) == ("s1", held.sequence_number)
            assert again.delivery_count == 1
            second.complete_message(again)
    finally:
        with contextlib.suppress(Exception):
            receiver.close()
        with contextlib.suppress(Exception):
            client.close()
    assert broker.count("q") == 0


def test_a_closed_receivers_prefetched_messages_go_to_the_next_one_at_once(
    broker_factory: Any,
) -> None:
    """What the SDK prefetched and never handed out it releases as it closes: the next
    receiver has those at once. The one it handed out and nobody settled stays locked
    until the lock expires."""
    broker: BrokerHandle = broker_factory(clock=ManualClock())
    send(broker, "q", *(ServiceBusMessage(f"u{i}") for i in range(5)))
    with broker.client() as client:
        with client.get_queue_receiver("q", prefetch_count=10) as receiver:
            taken = receive_n(receiver, 2)
            receiver.complete_message(taken[0])
        with client.get_queue_receiver("q") as receiver:
            rest = receive_n(receiver, 3, timeout=5)
            assert [str(m) for m in rest] == ["u2", "u3", "u4"]
            assert all(m.delivery_count == 0 for m in rest)
            for m in rest:
                receiver.complete_message(m)
            assert nothing_more(receiver)
            broker.advance(61)
            (late,) = receive_n(receiver, 1, timeout=5)
            assert (str(late), late.delivery_count) == ("u1", 1)
            receiver.complete_message(late)


# ---------------------------------------------------------------------------- expiry, dedupe


def test_ttl_expiry_dead_letters_when_configured(broker_factory: Any) -> None:
    """On the broker's clock, exactly: the queue's 2 s default time to live holds at
    1.999 s, and at 2 s both messages go to the dead-letter queue."""
    broker = broker_factory(clock=ManualClock())
    with (
        broker.client() as client,
        client.get_queue_sender("ttl") as sender,
        client.get_queue_receiver("ttl", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq,
    ):
        sender.send_messages([
            ServiceBusMessage("short-lived", message_id="t1"),
            # A message's own TTL cannot outlive the entity's default: Service Bus silently
            # lowers it to DefaultMessageTimeToLive.
            ServiceBusMessage("asks for an hour", message_id="t2", time_to_live=timedelta(hours=1)),
        ])  # fmt: skip
        broker.advance(1.999)
        assert broker.count("ttl") == 2
        assert nothing_more(dlq)
        broker.advance(0.001)
        dead = receive_n(dlq, 2)
        assert [m.message_id for m in dead] == ["t1", "t2"]
        for message in dead:
            assert message.dead_letter_reason == "TTLExpiredException"
            assert message.dead_letter_source == "ttl"
            dlq.complete_message(message)
    assert broker.count("ttl") == 0
    assert broker.count("ttl/$DeadLetterQueue") == 0


def test_message_ttl_expiry_without_dead_lettering_drops_it(broker_factory: Any) -> None:
    """On the broker's clock, exactly: a 1 s TTL holds at 0.999 s and is gone at 1 s."""
    broker = broker_factory(clock=ManualClock())
    with (
        broker.client() as client,
        client.get_queue_sender("q") as sender,
        client.get_queue_receiver("q") as receiver,
    ):
        sender.send_messages([
            ServiceBusMessage("gone", time_to_live=timedelta(seconds=1)),
            ServiceBusMessage("kept"),
        ])  # fmt: skip
        peeked = receiver.peek_messages(max_message_count=10)
        assert [str(m) for m in peeked] == ["gone", "kept"]
        assert peeked[0].time_to_live == timedelta(seconds=1)
        broker.advance(0.999)
        assert broker.count("q") == 2
        broker.advance(0.001)
        assert broker.count("q") == 1
        (kept,) = receive_n(receiver, 1)
        assert str(kept) == "kept"
        receiver.complete_message(kept)
        assert nothing_more(receiver)
    assert broker.count("q") == 0
    assert broker.count("q/$DeadLetterQueue") == 0  # q does not dead-letter expired messages


def test_duplicate_detection_drops_repeats_within_the_window(broker: BrokerHandle) -> None:
    with (
        broker.client() as client,
        client.get_queue_sender("dedupe") as sender,
        client.get_queue_receiver("dedupe") as receiver,
    ):
        sender.send_messages(ServiceBusMessage("first", message_id="dup"))
        sender.send_messages(ServiceBusMessage("second", message_id="dup"))  # accepted, dropped
        sender.send_messages([
            ServiceBusMessage("third", message_id="dup"),
            ServiceBusMessage("other", message_id="x"),
        ])  # fmt: skip
        messages = receive_n(receiver, 2)
        assert [(str(m), m.message_id) for m in messages] == [("first", "dup"), ("other", "x")]
        for m in messages:
            receiver.complete_message(m)
        assert nothing_more(receiver)
        # Completing does not end the window: the id is still remembered.
        sender.send_messages(ServiceBusMessage("fourth", message_id="dup"))
        assert nothing_more(receiver)
    assert broker.count("dedupe") == 0


def test_no_duplicate_detection_without_the_setting(broker: BrokerHandle) -> None:
    send(broker, "q", ServiceBusMessage("a", message_id="same"))
    send(broker, "q", ServiceBusMessage("b", message_id="same"))
    with broker.client() as client, client.get_queue_receiver("q") as receiver:
        messages = receive_n(receiver, 2)
        assert [str(m) for m in messages] == ["a", "b"]
        for m in messages:
            receiver.complete_message(m)


# ---------------------------------------------------------------------------- scheduling


def test_scheduled_enqueue_time_on_send(broker_factory: Any) -> None:
    """On the broker's clock, exactly: held back until its time, delivered from then on."""
    broker = broker_factory(clock=ManualClock())
    with (
        broker.client() as client,
        client.get_queue_sender("q") as sender,
        client.get_queue_receiver("q") as receiver,
    ):
        when = whole_ms(now() + timedelta(seconds=2.5))
        message = ServiceBusMessage("on time", message_id="s1")
        message.scheduled_enqueue_time_utc = when
        sender.send_messages(message)
        assert nothing_more(receiver)
        broker.advance_to(when - timedelta(microseconds=500))
        (peeked,) = receiver.peek_messages()
        assert peeked.state == ServiceBusMessageState.SCHEDULED
        assert nothing_more(receiver)
        broker.advance(0.001)  # half a millisecond after its time
        (received,) = receive_n(receiver, 1)
        assert received.message_id == "s1"
        assert received.scheduled_enqueue_time_utc is not None
        assert abs((received.scheduled_enqueue_time_utc - when).total_seconds()) < 0.01
        assert received.state == ServiceBusMessageState.ACTIVE
        receiver.complete_message(received)
