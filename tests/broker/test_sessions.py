"""Message sessions with the unmodified ``azure-servicebus`` SDK (sync, and async at the end).

What the sessions guide promises: an exclusive lock per session, named and next-available
receivers, FIFO inside a session, abandon puts the message back at the head, session state
kept on disk, lock renewal, lock expiry counts a delivery and loses the session, closing a
receiver does not count one; and a sessionless send to a session queue fails clearly.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage
from azure.servicebus.exceptions import (
    OperationTimeoutError,
    ServiceBusError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)

from replication.broker.clock import ManualClock

from .conftest import BrokerHandle, concurrently, make_config, nothing_more, receive_n

pytestmark = pytest.mark.timeout(90)

CONFIG = make_config({
    "s": {"RequiresSession": True},
    "short": {"RequiresSession": True, "LockDuration": "PT5S"},
    "plain": {},
})  # fmt: skip


def send_sessions(broker: BrokerHandle, queue: str, plan: list[tuple[str, str]]) -> None:
    """Sends (session, body) pairs in order, message-id = body."""
    with broker.client() as client, client.get_queue_sender(queue) as sender:
        sender.send_messages(
            [ServiceBusMessage(body, session_id=session, message_id=body) for session, body in plan]
        )


@pytest.mark.broker_config(CONFIG)
def test_named_sessions_are_fifo_and_separate(broker: BrokerHandle) -> None:
    plan = [("a" if i % 3 else "b", f"m{i}") for i in range(30)]
    send_sessions(broker, "s", plan)
    with broker.client() as client:
        for session in ("b", "a"):
            with client.get_queue_receiver("s", session_id=session, prefetch_count=5) as receiver:
                assert receiver.session.session_id == session
                expected = [body for s, body in plan if s == session]
                received = receive_n(receiver, len(expected))
                assert [str(m) for m in received] == expected
                assert {m.session_id for m in received} == {session}
                for message in received:
                    receiver.complete_message(message)
                assert nothing_more(receiver)
    assert broker.count("s") == 0


@pytest.mark.broker_config(CONFIG)
def test_next_available_sessions_and_exclusive_lock(broker: BrokerHandle) -> None:
    send_sessions(broker, "s", [("x", "x1"), ("y", "y1"), ("x", "x2")])
    with broker.client(retry_total=0) as client:
        first = client.get_queue_receiver("s", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2)
        second = client.get_queue_receiver("s", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2)
        with first, second:
            # the session whose oldest message is oldest comes first
            assert first.session.session_id == "x"
            assert second.session.session_id == "y"
            with (
                pytest.raises(
                    SessionCannotBeLockedError, match="The requested session 'x' cannot be accepted"
                ),
                client.get_queue_receiver("s", session_id="x") as third,
            ):
                third.receive_messages(max_wait_time=1)
            with (
                pytest.raises(
                    OperationTimeoutError, match="no session of 's' became available in time"
                ),
                client.get_queue_receiver(
                    "s", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
                ) as fourth,
            ):
                fourth.receive_messages(max_wait_time=1)
            assert [str(m) for m in receive_n(first, 2)] == ["x1", "x2"]
        # closing released both sessions: the named one can be locked again at once
        with client.get_queue_receiver("s", session_id="x") as again:
            assert [str(m) for m in receive_n(again, 2)] == ["x1", "x2"]


@pytest.mark.broker_config(CONFIG)
def test_next_available_waits_for_a_session_to_arrive(broker: BrokerHandle) -> None:
    import threading

    def send_later() -> None:
        time.sleep(1.0)
        send_sessions(broker, "s", [("late", "late1")])

    sender = threading.Thread(target=send_later)
    sender.start()
    with (
        broker.client() as client,
        client.get_queue_receiver(
            "s", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=10
        ) as receiver,
    ):
        assert receiver.session.session_id == "late"
        (message,) = receive_n(receiver, 1)
        receiver.complete_message(message)
    sender.join()


@pytest.mark.broker_config(CONFIG)
def test_locking_an_empty_named_session_succeeds(broker: BrokerHandle) -> None:
    with broker.client() as client, client.get_queue_receiver("s", session_id="empty") as r:
        assert r.session.locked_until_utc is not None
        assert nothing_more(r)
        r.session.set_state(b"still mine")
        assert r.session.get_state() == b"still mine"


@pytest.mark.broker_config(CONFIG)
def test_abandon_brings_the_same_message_next(broker: BrokerHandle) -> None:
    send_sessions(broker, "s", [("q", "q1"), ("q", "q2")])
    with broker.client() as client, client.get_queue_receiver("s", session_id="q") as receiver:
        (q1,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        receiver.abandon_message(q1)
        (again,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert (again.message_id, again.delivery_count) == ("q1", 1)
        receiver.complete_message(again)
        (q2,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert q2.message_id == "q2"
        receiver.complete_message(q2)


@pytest.mark.broker_config(CONFIG)
def test_session_state_is_kept_cleared_and_survives_restart(broker: BrokerHandle) -> None:
    with broker.client() as client, client.get_queue_receiver("s", session_id="st") as r:
        assert r.session.get_state() is None
        r.session.set_state(b"step-1")
        r.session.set_state("step-2")  # str is sent as UTF-8
        assert r.session.get_state() == b"step-2"
    broker.restart()
    with broker.client() as client, client.get_queue_receiver("s", session_id="st") as r:
        assert r.session.get_state() == b"step-2"
        r.session.set_state(None)
        assert r.session.get_state() is None


@pytest.mark.broker_config(CONFIG)
def test_session_state_size_limit(broker: BrokerHandle) -> None:
    with (
        broker.client(retry_total=0) as client,
        client.get_queue_receiver("s", session_id="big") as r,
    ):
        with pytest.raises(ServiceBusError, match="exceeds the limit"):
            r.session.set_state(b"x" * (256 * 1024 + 1))
        r.session.set_state(b"x" * 1000)
        assert len(r.session.get_state()) == 1000


def test_renew_session_lock(broker_factory: Any) -> None:
    """On the broker's clock, exactly: renewed 3 s into a 5 s lock, the session is still
    held 6 s in (past the first expiry) and 7.999 s in, and lost at 8 s."""
    broker = broker_factory(CONFIG, clock=ManualClock())
    send_sessions(broker, "short", [("r", "r1"), ("r", "r2")])
    with broker.client() as client, client.get_queue_receiver("short", session_id="r") as r:
        before = r.session.locked_until_utc
        first, _second = receive_n(r, 2)
        broker.advance(3)
        after = r.session.renew_lock()
        assert (after - before).total_seconds() == pytest.approx(3, abs=0.01)
        broker.advance(3)  # past the first expiry: the renewed lock still holds the message
        r.complete_message(first)
        broker.advance(1.999)
        assert broker.call(lambda: len(broker.broker.queues["short"].session_locks)) == 1
        broker.advance(0.001)
        assert broker.call(lambda: len(broker.broker.queues["short"].session_locks)) == 0
    assert broker.count("short") == 1  # the second came back with the session


def test_lock_expiry_loses_the_session_and_counts_a_delivery(broker_factory: Any) -> None:
    """On the broker's ``ManualClock``: the 5 s session lock runs out when advanced (the
    broker refuses the settlement; the SDK's own expiry check reads real time and has not
    fired), and the message comes back with one delivery counted. Real-time lock expiry
    (the same sweep, ``Queue.expire_locks``): test_sdk_settlement."""
    broker = broker_factory(CONFIG, clock=ManualClock())
    send_sessions(broker, "short", [("e", "e1")])
    with broker.client(retry_total=0) as client:
        with client.get_queue_receiver("short", session_id="e") as r:
            (message,) = receive_n(r, 1)
            broker.advance(5)
            with pytest.raises(SessionLockLostError, match="session 'e' of short is not locked"):
                r.complete_message(message)
        with client.get_queue_receiver("short", session_id="e") as r:
            (again,) = receive_n(r, 1)
            assert (again.message_id, again.delivery_count) == ("e1", 1)
            r.complete_message(again)


@pytest.mark.broker_config(CONFIG)
def test_closing_without_settling_does_not_count(broker: BrokerHandle) -> None:
    send_sessions(broker, "s", [("c", "c1")])
    with broker.client() as client:
        with client.get_queue_receiver("s", session_id="c") as r:
            receive_n(r, 1)
        with client.get_queue_receiver("s", session_id="c") as r:
            (again,) = receive_n(r, 1)
            assert again.delivery_count == 0
            r.complete_message(again)


@pytest.mark.broker_config(CONFIG)
def test_peek_and_defer_inside_a_session(broker: BrokerHandle) -> None:
    send_sessions(broker, "s", [("p", "p1"), ("o", "o1"), ("p", "p2")])
    with broker.client() as client, client.get_queue_receiver("s", session_id="p") as r:
        assert [m.message_id for m in r.peek_messages(max_message_count=10)] == ["p1", "p2"]
        p1, p2 = receive_n(r, 2)
        r.defer_message(p1)
        r.complete_message(p2)
        (deferred,) = r.receive_deferred_messages([p1.sequence_number])
        assert deferred.message_id == "p1"
        r.complete_message(deferred)


@pytest.mark.broker_config(CONFIG)
def test_wrong_receiver_kind_and_sessionless_send_are_refused(broker: BrokerHandle) -> None:
    with broker.client(retry_total=0) as client:
        with client.get_queue_sender("s") as sender:
            with pytest.raises(ServiceBusError, match="SessionId"):
                sender.send_messages(ServiceBusMessage("no session"))
            with pytest.raises(ServiceBusError, match="SessionId"):  # a batch: all or nothing
                sender.send_messages(
                    [ServiceBusMessage("ok", session_id="z"), ServiceBusMessage("no session")]
                )
        with (
            pytest.raises(ServiceBusError, match="requires sessions"),
            client.get_queue_receiver("s") as receiver,
        ):
            receiver.receive_messages(max_wait_time=1)
        with (
            pytest.raises(ServiceBusError, match="does not require sessions"),
            client.get_queue_receiver("plain", session_id="z") as receiver,
        ):
            receiver.receive_messages(max_wait_time=1)
    assert broker.count("s") == 0


@pytest.mark.broker_config(CONFIG)
async def test_async_session_receiver(broker: BrokerHandle) -> None:
    send_sessions(broker, "s", [("aio", f"a{i}") for i in range(5)])
    async with (
        broker.aio_client() as client,
        client.get_queue_receiver(
            "s", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
        ) as receiver,
    ):
        assert receiver.session.session_id == "aio"
        await receiver.session.set_state(b"async state")
        received = []
        while len(received) < 5:
            received += await receiver.receive_messages(max_message_count=5, max_wait_time=2)
        assert [str(m) for m in received] == [f"a{i}" for i in range(5)]
        for message in received:
            await receiver.complete_message(message)
        assert await receiver.session.get_state() == b"async state"


LIST_CONFIG = make_config(
    {"s": {"RequiresSession": True}},
    topics={"t": {"Subscriptions": {"ss": {"Properties": {"RequiresSession": True}}}}},
)


@pytest.mark.broker_config(LIST_CONFIG)
def test_list_sessions_without_and_with_a_cutoff(broker: BrokerHandle) -> None:
    """``list_queue_sessions`` / ``list_subscription_sessions`` (SDK 7.15): without
    ``state_updated_after`` (the SDK sends DateTime.MaxValue) the sessions with active messages
    or stored state; a session whose messages are all settled, or only scheduled, is not
    listed. With a cutoff: the sessions whose state was set after it."""
    with broker.client() as client:
        with client.get_queue_sender("s") as sender:
            sender.send_messages(
                [ServiceBusMessage(b, session_id=s) for s, b in [("b", "1"), ("a", "2")]]
            )
            sender.send_messages([ServiceBusMessage("done", session_id="done")])
            sender.schedule_messages(
                ServiceBusMessage("later", session_id="later"),
                datetime.now(UTC) + timedelta(hours=1),
            )

        def settle_done() -> None:  # each side by side with a client of its own
            with broker.client() as own, own.get_queue_receiver("s", session_id="done") as r:
                for message in receive_n(r, 1):
                    r.complete_message(message)

        def state_only() -> None:
            with broker.client() as own, own.get_queue_receiver("s", session_id="z") as r:
                r.session.set_state(b"state only")

        concurrently(settle_done, state_only)
        assert sorted(client.list_queue_sessions("s")) == ["a", "b", "z"]
        cutoff = datetime.now(UTC)
        time.sleep(0.05)
        assert list(client.list_queue_sessions("s", state_updated_after=cutoff)) == []
        with client.get_queue_receiver("s", session_id="a") as receiver:
            receiver.session.set_state(b"a's state")
        assert list(client.list_queue_sessions("s", state_updated_after=cutoff)) == ["a"]
        assert sorted(
            client.list_queue_sessions("s", state_updated_after=cutoff - timedelta(hours=1))
        ) == ["a", "z"]

        with client.get_topic_sender("t") as sender:
            sender.send_messages([ServiceBusMessage("x", session_id="sub-1")])
        assert list(client.list_subscription_sessions("t", "ss")) == ["sub-1"]
        assert list(client.list_subscription_sessions("t", "ss", state_updated_after=cutoff)) == []
