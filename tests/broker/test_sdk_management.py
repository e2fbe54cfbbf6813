"""The ``<queue>/$management`` operations, driven through the sync SDK's own methods:
renew-lock, peek-message, receive-by-sequence-number, update-disposition,
schedule-message and cancel-scheduled-message."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import (
    ServiceBusMessage,
    ServiceBusMessageState,
    ServiceBusReceiveMode,
    ServiceBusReceiver,
)
from azure.servicebus.exceptions import MessageNotFoundError

from replication.broker.clock import ManualClock

from .conftest import BrokerHandle, dead_letters, nothing_more, receive_n, send, whole_ms

pytestmark = pytest.mark.timeout(60)

NOT_DEFERRED = "some of the sequence numbers are not deferred messages of this entity"


def now() -> datetime:
    return datetime.now(UTC)


# ---------------------------------------------------------------------------- renew-lock


def test_renew_lock_extends_locked_until(broker_factory: Callable[..., BrokerHandle]) -> None:
    """On the broker's ``ManualClock``: a renew 2.5 s into a 5 s lock moves it to 5 s from
    then, exactly, and past the original expiry the renewed lock holds (real-time lock
    expiry: test_sdk_settlement's ``test_lock_expiry_redelivers_and_old_lock_is_lost``)."""
    clock = ManualClock()
    broker = broker_factory(clock=clock)
    send(broker, "short-lock", ServiceBusMessage("hold on", message_id="r1"))
    with broker.client() as client, client.get_queue_receiver("short-lock") as receiver:
        (message,) = receive_n(receiver, 1)
        original = message.locked_until_utc
        assert original is not None
        assert original.timestamp() == pytest.approx(clock.time() + 5, abs=0.001)
        broker.advance(2.5)
        renewed = receiver.renew_message_lock(message)
        assert renewed.timestamp() == pytest.approx(clock.time() + 5, abs=0.001)
        assert renewed - original == pytest.approx(
            timedelta(seconds=2.5), abs=timedelta(milliseconds=1)
        )
        assert message.locked_until_utc == renewed
        # Past the original expiry the renewed lock still holds: nobody else gets the
        # message, it can be renewed again, and completing it works.
        broker.advance(3)
        assert nothing_more(receiver)
        again = receiver.renew_message_lock(message)
        assert again > renewed
        receiver.complete_message(message)
        assert message.delivery_count == 0
    assert broker.count("short-lock") == 0


# ---------------------------------------------------------------------------- peek


def test_peek_from_sequence_number(broker: BrokerHandle) -> None:
    send(broker, "q", *(ServiceBusMessage(f"k{i}", message_id=f"k{i}") for i in range(5)))
    with broker.client() as client, client.get_queue_receiver("q") as receiver:
        peeked = receiver.peek_messages(max_message_count=10)
        assert [m.message_id for m in peeked] == [f"k{i}" for i in range(5)]
        seqs = [m.sequence_number for m in peeked]
        assert seqs == list(range(seqs[0], seqs[0] + 5))
        assert all(
            m.delivery_count == 0 and m.state == ServiceBusMessageState.ACTIVE for m in peeked
        )
        assert all(m.lock_token is None for m in peeked)
        assert all(m.enqueued_time_utc is not None for m in peeked)

        from_third = receiver.peek_messages(max_message_count=10, sequence_number=seqs[2])
        assert [m.sequence_number for m in from_third] == seqs[2:]
        two = receiver.peek_messages(max_message_count=2, sequence_number=seqs[1])
        assert [m.message_id for m in two] == ["k1", "k2"]
        # Without a sequence number the SDK continues after the last one it peeked.
        assert [m.message_id for m in receiver.peek_messages(max_message_count=10)] == ["k3", "k4"]
        assert receiver.peek_messages(max_message_count=10, sequence_number=seqs[-1] + 1) == []

        # Peeking locks nothing and counts no delivery.
        received = receive_n(receiver, 5)
        assert [m.delivery_count for m in received] == [0] * 5
        for m in received:
            receiver.complete_message(m)
        assert receiver.peek_messages(max_message_count=10, sequence_number=1) == []


def test_peek_shows_locked_deferred_and_scheduled_messages(broker: BrokerHandle) -> None:
    send(broker, "q", ServiceBusMessage("locked"), ServiceBusMessage("deferred"))
    with broker.client() as client:
        with client.get_queue_sender("q") as sender:
            (scheduled_seq,) = sender.schedule_messages(
                ServiceBusMessage("scheduled"), now() + timedelta(minutes=5)
            )
        with client.get_queue_receiver("q") as receiver:
            locked, deferred = receive_n(receiver, 2)
            receiver.defer_message(deferred)
            peeked = receiver.peek_messages(max_message_count=10, sequence_number=1)
            assert [str(m) for m in peeked] == ["locked", "deferred", "scheduled"]
            assert [m.state for m in peeked] == [
                ServiceBusMessageState.ACTIVE,
                ServiceBusMessageState.DEFERRED,
                ServiceBusMessageState.SCHEDULED,
            ]
            assert peeked[2].sequence_number == scheduled_seq
            receiver.complete_message(locked)
        with client.get_queue_sender("q") as sender:
            sender.cancel_scheduled_messages(scheduled_seq)


# ---------------------------------------------------------------------------- deferred messages


def defer_one(broker: BrokerHandle, receiver: ServiceBusReceiver, body: str) -> int:
    """Sends a message, receives it with ``receiver`` and defers it; its sequence number."""
    send(broker, "q", ServiceBusMessage(body, message_id=body))
    (message,) = receive_n(receiver, 1)
    receiver.defer_message(message)
    assert message.sequence_number is not None
    return message.sequence_number


def test_deferred_complete_via_update_disposition(broker: BrokerHandle) -> None:
    with broker.client(retry_total=0) as client, client.get_queue_receiver("q") as receiver:
        seq = defer_one(broker, receiver, "to-complete")
        (message,) = receiver.receive_deferred_messages([seq])
        assert message.message_id == "to-complete"
        assert message.delivery_count == 0
        receiver.complete_message(message)
        with pytest.raises(MessageNotFoundError, match=NOT_DEFERRED):
            receiver.receive_deferred_messages([seq])
    assert broker.count("q") == 0


def test_deferred_abandon_keeps_it_deferred(broker: BrokerHandle) -> None:
    with broker.client() as client, client.get_queue_receiver("q") as receiver:
        seq = defer_one(broker, receiver, "to-abandon")
        (message,) = receiver.receive_deferred_messages([seq])
        assert message.delivery_count == 0
        receiver.abandon_message(message)
        assert nothing_more(receiver)  # still deferred: not delivered normally
        (again,) = receiver.receive_deferred_messages([seq])
        assert again.message_id == "to-abandon"
        assert again.delivery_count == 1
        assert again.state == ServiceBusMessageState.DEFERRED
        receiver.complete_message(again)
    assert broker.count("q") == 0


def test_deferred_dead_letter_via_update_disposition(broker: BrokerHandle) -> None:
    with broker.client(retry_total=0) as client, client.get_queue_receiver("q") as receiver:
        seq = defer_one(broker, receiver, "to-dead-letter")
        (message,) = receiver.receive_deferred_messages([seq])
        receiver.dead_letter_message(message, reason="late", error_description="too late now")
        with pytest.raises(MessageNotFoundError, match=NOT_DEFERRED):
            receiver.receive_deferred_messages([seq])
    (dead,) = dead_letters(broker, "q", 1)
    assert dead.message_id == "to-dead-letter"
    assert dead.dead_letter_reason == "late"
    assert dead.dead_letter_error_description == "too late now"
    assert dead.dead_letter_source == "q"
    assert broker.count("q") == 0


def test_deferred_defer_again_and_receive_and_delete(broker: BrokerHandle) -> None:
    with broker.client() as client:
        with client.get_queue_receiver("q") as receiver:
            seq = defer_one(broker, receiver, "to-defer")
            (message,) = receiver.receive_deferred_messages([seq])
            receiver.defer_message(message)
            assert nothing_more(receiver)
        with client.get_queue_receiver(
            "q", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        ) as receiver:
            (message,) = receiver.receive_deferred_messages([seq])
            assert message.message_id == "to-defer"
            assert message.lock_token is None
    assert broker.count("q") == 0


def test_receive_deferred_several_and_unknown(broker: BrokerHandle) -> None:
    send(broker, "q", *(ServiceBusMessage(f"m{i}") for i in range(3)))
    with broker.client(retry_total=0) as client, client.get_queue_receiver("q") as receiver:
        messages = receive_n(receiver, 3)
        for m in messages:
            receiver.defer_message(m)
        seqs = [m.sequence_number for m in messages]
        deferred = receiver.receive_deferred_messages([seqs[2], seqs[0]])
        assert sorted(m.sequence_number for m in deferred) == [seqs[0], seqs[2]]
        for m in deferred:
            receiver.complete_message(m)
        with pytest.raises(MessageNotFoundError, match=NOT_DEFERRED):
            receiver.receive_deferred_messages([seqs[1] + 1000])
        with pytest.raises(MessageNotFoundError, match=NOT_DEFERRED):  # active, not deferred
            receiver.receive_deferred_messages([seqs[0]])
        (last,) = receiver.receive_deferred_messages([seqs[1]])
        receiver.complete_message(last)
    assert broker.count("q") == 0


# ---------------------------------------------------------------------------- schedule / cancel


def test_schedule_and_cancel(broker_factory: Callable[..., BrokerHandle]) -> None:
    """On the broker's ``ManualClock``: held back until its time, delivered from then on."""
    broker = broker_factory(clock=ManualClock())
    with (
        broker.client() as client,
        client.get_queue_sender("q") as sender,
        client.get_queue_receiver("q") as receiver,
    ):
        when = whole_ms(now() + timedelta(seconds=2.5))
        scheduled = [ServiceBusMessage(i, message_id=i) for i in ("keep", "cancel")]
        seqs = sender.schedule_messages(scheduled, when)
        assert len(seqs) == 2 and seqs[0] < seqs[1]
        sender.cancel_scheduled_messages(seqs[1])
        peeked = receiver.peek_messages(max_message_count=10, sequence_number=1)
        assert [m.message_id for m in peeked] == ["keep"]
        assert peeked[0].state == ServiceBusMessageState.SCHEDULED
        assert peeked[0].scheduled_enqueue_time_utc == when
        broker.advance_to(when - timedelta(microseconds=500))
        assert nothing_more(receiver)
        broker.advance(0.001)  # half a millisecond after its time
        (message,) = receive_n(receiver, 1)
        assert message.message_id == "keep"
        assert message.sequence_number == seqs[0]
        assert message.delivery_count == 0
        receiver.complete_message(message)
        assert nothing_more(receiver)
    assert broker.count("q") == 0


def test_cancel_several_scheduled_messages(broker: BrokerHandle) -> None:
    with broker.client() as client:
        with client.get_queue_sender("q") as sender:
            seqs = sender.schedule_messages(
                [ServiceBusMessage(f"s{i}") for i in range(3)], now() + timedelta(minutes=10)
            )
            assert broker.count("q") == 3
            sender.cancel_scheduled_messages(seqs)
            sender.cancel_scheduled_messages(seqs)  # again: nothing left to cancel, no error
        with client.get_queue_receiver("q") as receiver:
            assert receiver.peek_messages(max_message_count=10, sequence_number=1) == []
    assert broker.count("q") == 0


def test_schedule_in_the_past_is_delivered_at_once(broker: BrokerHandle) -> None:
    with broker.client() as client:
        with client.get_queue_sender("q") as sender:
            (seq,) = sender.schedule_messages(
                ServiceBusMessage("overdue"), now() - timedelta(minutes=1)
            )
        with client.get_queue_receiver("q") as receiver:
            (message,) = receive_n(receiver, 1, timeout=3)
            assert str(message) == "overdue"
            assert message.sequence_number == seq
            receiver.complete_message(message)
