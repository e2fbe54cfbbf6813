"""Authorization end to end: Config.json ``AuthorizationRules`` enforced on real SDK and
proton clients (CBS tokens from connection strings and credentials, SASL PLAIN)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.core.credentials import AzureSasCredential
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus._pyamqp.error import AMQPLinkError, TokenAuthFailure
from azure.servicebus.exceptions import (
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusConnectionError,
)
from proton import ConnectionException, Message, int32
from proton.utils import LinkDetached

from replication.broker.auth import EMULATOR_KEY, EMULATOR_RULE_NAME
from replication.broker.clock import ManualClock
from replication.servicebus.sas import generate_sas_token

from .conftest import (
    BrokerHandle,
    QuickCloseClient,
    make_config,
    nothing_more,
    proton_connection,
    receive_n,
)

RULES_CONFIG = make_config(
    {"q": {}, "other": {}},
    rules=[
        {"Name": "sender", "Key": "send-key", "Rights": ["Send"]},
        {"Name": "listener", "Key": "listen-key", "Rights": ["Listen"]},
        {"Name": "admin", "Key": "admin-key", "Rights": ["Manage"]},
    ],
)
pytestmark = [pytest.mark.timeout(60), pytest.mark.broker_config(RULES_CONFIG)]

KEYS = {"sender": "send-key", "listener": "listen-key", "admin": "admin-key"}
# how the SDK words a put-token the broker refused (assert_token_refused reads the 401 itself)
CBS_REFUSED = "Error condition: amqp:client-error"


def _in_minutes(minutes: int) -> datetime:
    return datetime.now(UTC) + timedelta(minutes=minutes)


def client_as(broker: BrokerHandle, rule: str, key: str | None = None, **kwargs: Any) -> Any:
    """An SDK client authenticating with ``rule``'s key; no retries (errors at once)."""
    key = KEYS[rule] if key is None else key
    return broker.client(conn_str=broker.connection_string_for(rule, key), retry_total=0, **kwargs)


def sas_client(broker: BrokerHandle, token: str) -> QuickCloseClient:
    return QuickCloseClient(
        broker.endpoint, AzureSasCredential(token), use_tls=False, retry_total=0
    )


def assert_token_refused(error: pytest.ExceptionInfo[Any], description: str) -> None:
    """The SDK raised because the broker answered the CBS put-token with 401 ``description``
    (not because the SDK itself judged the token, which it also does for expired ones)."""
    inner = error.value.inner_exception
    assert isinstance(inner, TokenAuthFailure), repr(inner)
    assert inner.status_code == 401
    assert description in inner.status_description.decode()


def assert_link_refused(error: pytest.ExceptionInfo[Any], right: str) -> None:
    """The SDK raised because the broker refused the link for want of ``right``."""
    inner = error.value.inner_exception
    assert isinstance(inner, AMQPLinkError), repr(inner)
    assert inner.condition == b"amqp:unauthorized-access"
    assert f"{right} claim required" in str(error.value)


def admin_send(broker: BrokerHandle, *bodies: str) -> None:
    with client_as(broker, "admin") as client, client.get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage(body) for body in bodies])


# ---------------------------------------------------------------------------- rights


def test_sender_can_send_but_not_receive(broker: BrokerHandle) -> None:
    with client_as(broker, "sender") as client:
        with client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage("from sender"))
            sender.schedule_messages(ServiceBusMessage("scheduled"), _in_minutes(10))
        with (
            pytest.raises(
                ServiceBusAuthorizationError, match="Listen claim required for 'q'"
            ) as error,
            client.get_queue_receiver("q") as receiver,
        ):
            receiver.receive_messages(max_message_count=1, max_wait_time=2)
        assert_link_refused(error, "Listen")
    assert broker.count("q") == 2
    with client_as(broker, "admin") as client, client.get_queue_receiver("q") as receiver:
        (message,) = receive_n(receiver, 1)
        assert str(message) == "from sender"
        receiver.complete_message(message)


def test_listener_can_receive_but_not_send(broker: BrokerHandle) -> None:
    admin_send(broker, "for listener")
    with client_as(broker, "listener") as client:
        with client.get_queue_receiver("q") as receiver:
            assert [str(m) for m in receiver.peek_messages()] == ["for listener"]
            (message,) = receive_n(receiver, 1)
            assert str(message) == "for listener"
            receiver.abandon_message(message)
            (message,) = receive_n(receiver, 1)
            receiver.dead_letter_message(message, reason="listener may settle")
        with client.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            (dead,) = receive_n(dlq, 1)
            assert dead.dead_letter_reason == "listener may settle"
            dlq.complete_message(dead)
        with (
            pytest.raises(
                ServiceBusAuthorizationError, match="Send claim required for 'q'"
            ) as error,
            client.get_queue_sender("q") as sender,
        ):
            sender.send_messages(ServiceBusMessage("not allowed"))
        assert_link_refused(error, "Send")
    assert broker.count("q") == 0


def test_manage_implies_send_and_listen(broker: BrokerHandle) -> None:
    with client_as(broker, "admin") as client:
        with client.get_queue_sender("other") as sender:
            sender.send_messages(ServiceBusMessage("admin"))
        with client.get_queue_receiver("other") as receiver:
            (message,) = receive_n(receiver, 1)
            receiver.complete_message(message)
            assert nothing_more(receiver)


# ---------------------------------------------------------------------------- refused credentials


def test_wrong_key_is_refused(broker: BrokerHandle) -> None:
    with (
        client_as(broker, "admin", "not-the-key") as client,
        pytest.raises(ServiceBusAuthenticationError, match=CBS_REFUSED) as error,
        client.get_queue_sender("q") as sender,
    ):
        sender.send_messages(ServiceBusMessage("x"))
    assert_token_refused(error, "Invalid SAS token signature for rule 'admin'")
    assert broker.count("q") == 0


def test_unknown_rule_is_refused(broker: BrokerHandle) -> None:
    with (
        broker.client(
            conn_str=broker.connection_string_for("nobody", "admin-key"), retry_total=0
        ) as client,
        pytest.raises(ServiceBusAuthenticationError, match=CBS_REFUSED) as error,
        client.get_queue_receiver("q") as receiver,
    ):
        receiver.receive_messages(max_message_count=1, max_wait_time=1)
    assert_token_refused(error, "Unknown shared access rule 'nobody'")


def test_default_emulator_key_is_refused_once_rules_are_configured(broker: BrokerHandle) -> None:
    with (
        broker.client(
            conn_str=broker.connection_string_for(EMULATOR_RULE_NAME, EMULATOR_KEY),
            retry_total=0,
        ) as client,
        pytest.raises(ServiceBusAuthenticationError, match=CBS_REFUSED) as error,
        client.get_queue_sender("q") as sender,
    ):
        sender.send_messages(ServiceBusMessage("x"))
    assert_token_refused(error, "Unknown shared access rule 'RootManageSharedAccessKey'")
    assert broker.count("q") == 0


def test_expired_sas_token_is_refused(broker: BrokerHandle) -> None:
    token = generate_sas_token(broker.audience("q"), "admin", "admin-key", int(time.time()) - 60)
    with (
        sas_client(broker, token) as client,
        pytest.raises(ServiceBusAuthenticationError, match=CBS_REFUSED) as error,
        client.get_queue_sender("q") as sender,
    ):
        sender.send_messages(ServiceBusMessage("x"))
    assert_token_refused(error, "SAS token expired")
    assert broker.count("q") == 0


def test_a_sender_whose_token_expired_sends_no_more(
    broker_factory: Callable[..., BrokerHandle],
) -> None:
    """Once the broker's clock passes a token's expiry, a sender that was allowed before
    sends nothing more (the per-transfer answer kept while the grant lasts: test_auth's
    ``test_a_connection_is_asked_again_once_the_grant_that_allowed_it_expired``)."""
    clock = ManualClock()
    broker = broker_factory(RULES_CONFIG, clock=clock)
    expiry = int(clock.time()) + 60
    token = generate_sas_token(broker.audience("q"), "sender", "send-key", expiry)
    with sas_client(broker, token) as client, client.get_queue_sender("q") as sender:
        sender.send_messages(ServiceBusMessage("while the token lasts"))
        broker.advance(61)  # the broker's time only: the SDK still takes the token as valid
        # the broker's token check detaches the link; the SDK reports a send whose link
        # went away without an outcome as a connection error (amqp:unknown-error)
        with pytest.raises(ServiceBusConnectionError, match="unknown-error"):
            sender.send_messages(ServiceBusMessage("after it expired"))
    assert broker.count("q") == 1


def test_sas_token_for_another_entity_is_refused(broker: BrokerHandle) -> None:
    token = generate_sas_token(
        broker.audience("other"), "admin", "admin-key", int(time.time()) + 3600
    )
    with (
        sas_client(broker, token) as client,
        pytest.raises(ServiceBusAuthenticationError, match=CBS_REFUSED) as error,
        client.get_queue_sender("q") as sender,
    ):
        sender.send_messages(ServiceBusMessage("x"))
    assert_token_refused(error, "does not cover the audience")
    assert broker.count("q") == 0


def test_valid_sas_tokens_work(broker: BrokerHandle) -> None:
    later = int(time.time()) + 3600
    entity_token = generate_sas_token(broker.audience("q"), "sender", "send-key", later)
    with sas_client(broker, entity_token) as client, client.get_queue_sender("q") as sender:
        sender.send_messages(ServiceBusMessage("entity token"))
    namespace_token = generate_sas_token(broker.audience(), "listener", "listen-key", later)
    with sas_client(broker, namespace_token) as client, client.get_queue_receiver("q") as receiver:
        (message,) = receive_n(receiver, 1)
        assert str(message) == "entity token"
        receiver.complete_message(message)


def test_sas_token_signed_with_the_wrong_key_is_refused(broker: BrokerHandle) -> None:
    token = generate_sas_token(broker.audience("q"), "sender", "listen-key", int(time.time()) + 60)
    with (
        sas_client(broker, token) as client,
        pytest.raises(ServiceBusAuthenticationError, match=CBS_REFUSED) as error,
        client.get_queue_sender("q") as sender,
    ):
        sender.send_messages(ServiceBusMessage("x"))
    assert_token_refused(error, "Invalid SAS token signature for rule 'sender'")


# ---------------------------------------------------------------------------- SASL PLAIN (proton)


def test_plain_with_a_rule_name_and_key(broker: BrokerHandle) -> None:
    conn = proton_connection(broker.port, "admin", "admin-key")
    try:
        conn.create_sender("q").send(Message(body="plain", id="pl-1"))
        receiver = conn.create_receiver("q", credit=1)
        message = receiver.receive(timeout=5)
        receiver.accept()
        assert (message.body, message.id) == ("plain", "pl-1")
    finally:
        conn.close()
    assert broker.count("q") == 0


def test_plain_rights_are_enforced(broker: BrokerHandle) -> None:
    conn = proton_connection(broker.port, "listener", "listen-key")
    try:
        with pytest.raises(LinkDetached, match="Send claim required for 'q'") as info:
            conn.create_sender("q")
        assert "unauthorized-access" in str(info.value)
        conn.create_receiver("q", credit=1).close()  # Listen is what it has
    finally:
        conn.close()
    conn = proton_connection(broker.port, "sender", "send-key")
    try:
        conn.create_sender("q").send(Message(body="by plain sender"))
        with pytest.raises(LinkDetached, match="Listen claim required for 'q'") as info:
            conn.create_receiver("q", credit=1)
        assert "unauthorized-access" in str(info.value)
    finally:
        conn.close()
    assert broker.count("q") == 1


@pytest.mark.parametrize(
    ("user", "password"),
    [("admin", "wrong-key"), ("nobody", "admin-key"), (EMULATOR_RULE_NAME, EMULATOR_KEY)],
)
def test_plain_with_bad_credentials_is_refused(
    broker: BrokerHandle, user: str, password: str
) -> None:
    with pytest.raises(ConnectionException, match="amqp:unauthorized-access"):
        conn = proton_connection(broker.port, user, password, timeout=5)
        try:
            conn.create_sender("q").send(Message(body="never"))
        finally:
            conn.close()
    assert broker.count("q") == 0


def management_request(conn: Any, entity: str, operation: str, body: dict[str, Any]) -> Message:
    """One request on ``<entity>/$management`` over a proton connection; returns the reply."""
    node = f"{entity}/$management"
    receiver = conn.create_receiver(node, credit=1)
    sender = conn.create_sender(node)
    sender.send(
        Message(
            id="req-1", reply_to=node, body=body,
            properties={"operation": operation, "com.microsoft:server-timeout": 5000},
        )
    )  # fmt: skip
    reply = receiver.receive(timeout=5)  # replies come pre-settled: nothing to accept
    sender.close()
    receiver.close()
    assert reply.correlation_id == "req-1"
    return reply


def test_management_operations_check_rights(broker: BrokerHandle) -> None:
    """Peek needs Listen, schedule needs Send, checked per request on ``$management``."""
    admin_send(broker, "peek me")
    peek = {"from-sequence-number": 1, "message-count": int32(10)}
    schedule = {"messages": [{"message": Message(body="s").encode()}]}
    conn = proton_connection(broker.port, "sender", "send-key")
    try:
        reply = management_request(conn, "q", "com.microsoft:peek-message", peek)
        assert reply.properties["statusCode"] == 401
        assert reply.properties["errorCondition"] == "amqp:unauthorized-access"
        assert "Listen claim required" in reply.properties["statusDescription"]
        reply = management_request(conn, "q", "com.microsoft:schedule-message", schedule)
        assert reply.properties["statusCode"] == 200
    finally:
        conn.close()
    conn = proton_connection(broker.port, "listener", "listen-key")
    try:
        reply = management_request(conn, "q", "com.microsoft:peek-message", peek)
        assert reply.properties["statusCode"] == 200
        assert len(reply.body["messages"]) == 2
        reply = management_request(conn, "q", "com.microsoft:schedule-message", schedule)
        assert reply.properties["statusCode"] == 401
        assert "Send claim required" in reply.properties["statusDescription"]
    finally:
        conn.close()
    assert broker.count("q") == 2
