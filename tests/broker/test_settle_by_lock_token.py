"""Settling by lock token through ``$management`` ``com.microsoft:update-disposition`` from
another connection than the one that received the message, with the unmodified SDK.

What the Spark design (``replication/spark/README.md``) relies on, as Service Bus behaves:
a non-session message received on one connection can be completed by lock token from
another (the .NET SDK's Sample16_CrossReceiverMessageSettlement, azure-sdk-for-go PR
24966) while the receiving link is open; once that link or its connection is gone the lock
is gone too (seed 001: "the lock is dropped since Service Bus does not support recovery of
existing AMQP links on a different connection") and the settlement fails with
message-lock-lost; a session's messages settle only through the session's own receiver.

The SDK has no public call for settling a bare lock token, so these tests use the path its
receivers take for deferred messages (``_settle_message_via_mgmt_link``) and its request
helper: the SDK's own wire form of the request.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceiver
from azure.servicebus._common import mgmt_handlers
from azure.servicebus._common.constants import REQUEST_RESPONSE_UPDATE_DISPOSTION_OPERATION
from azure.servicebus.exceptions import MessageLockLostError, SessionLockLostError

from replication.clock import ManualClock

from .conftest import BrokerHandle, make_config, nothing_more, receive_n, send

pytestmark = pytest.mark.timeout(60)

CONFIG = make_config({"q": {}, "s": {"RequiresSession": True}})


def settle_by_token(receiver: ServiceBusReceiver, token: Any, status: str = "completed") -> None:
    """``update-disposition`` for one lock token on ``receiver``'s connection (its
    session-id added when it is a session receiver, as the SDK does)."""
    receiver._settle_message_via_mgmt_link(status, [token])


def request_disposition(receiver: ServiceBusReceiver, token: Any, session_id: str) -> None:
    """The same request naming ``session_id``, whatever session ``receiver`` holds."""
    body = {
        "disposition-status": "completed",
        "lock-tokens": receiver._amqp_transport.AMQP_ARRAY_VALUE([token]),
        "session-id": session_id,
    }
    receiver._mgmt_request_response(
        REQUEST_RESPONSE_UPDATE_DISPOSTION_OPERATION, body, mgmt_handlers.default
    )


@pytest.mark.broker_config(CONFIG)
def test_complete_by_lock_token_from_another_connection(broker: BrokerHandle) -> None:
    send(broker, "q", ServiceBusMessage("elsewhere", message_id="x1"))
    with broker.client() as client1, client1.get_queue_receiver("q") as receiver1:
        (held,) = receive_n(receiver1, 1)
        with broker.client() as client2, client2.get_queue_receiver("q") as receiver2:
            settle_by_token(receiver2, held.lock_token)  # receiver1's link is still open
        assert broker.count("q") == 0
        assert nothing_more(receiver1)
        with pytest.raises(MessageLockLostError, match="has expired or was released"):
            settle_by_token(receiver1, held.lock_token)  # settled once: the lock is gone


@pytest.mark.parametrize("how", ["receiver closed", "connection dropped"])
def test_lock_token_is_lost_with_the_receiving_link(broker_factory: Any, how: str) -> None:
    """The lock is lost to every settlement once its link is gone (the SDKs' troubleshooting
    guide), and the message stays locked until the lock expires, then comes again."""
    broker: BrokerHandle = broker_factory(CONFIG, clock=ManualClock())
    send(broker, "q", ServiceBusMessage("orphan", message_id="o1"))
    client1 = broker.client(retry_total=0)
    receiver1 = client1.get_queue_receiver("q")
    try:
        (held,) = receive_n(receiver1, 1)
        if how == "receiver closed":
            receiver1.close()
        else:
            assert broker.drop_receiving_connections() == 1
        with broker.client() as client2, client2.get_queue_receiver("q") as receiver2:
            with pytest.raises(MessageLockLostError, match="has expired or was released"):
                settle_by_token(receiver2, held.lock_token)
            assert nothing_more(receiver2)  # still locked
            broker.advance(50)
            receiver2._renew_locks(str(held.lock_token))  # any receiver renews it
            broker.advance(50)  # past the first 60 s, not past the renewal
            assert nothing_more(receiver2)
            broker.advance(11)
            (again,) = receive_n(receiver2, 1, timeout=5)
            assert (again.message_id, again.delivery_count) == ("o1", 1)
            receiver2.complete_message(again)
    finally:
        with contextlib.suppress(Exception):
            receiver1.close()
        with contextlib.suppress(Exception):
            client1.close()
    assert broker.count("q") == 0


@pytest.mark.broker_config(CONFIG)
def test_session_messages_settle_only_through_the_sessions_receiver(
    broker: BrokerHandle,
) -> None:
    send(broker, "s", ServiceBusMessage("mine", session_id="a", message_id="s1"))
    with broker.client() as client1, client1.get_queue_receiver("s", session_id="a") as owner:
        (held,) = receive_n(owner, 1)
        with (
            broker.client() as client2,
            client2.get_queue_receiver("s", session_id="other") as stranger,
        ):
            with pytest.raises(SessionLockLostError, match="does not hold the session 'a'"):
                settle_by_token(stranger, held.lock_token)  # names its own session
            with pytest.raises(SessionLockLostError, match="does not hold the session 'a'"):
                request_disposition(stranger, held.lock_token, "a")  # names the owner's
        assert broker.count("s") == 1
        owner.complete_message(held)  # still locked by its receiver, which settles it
    assert broker.count("s") == 0
