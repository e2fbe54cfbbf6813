"""Subscription rules through ``$management`` (add-rule, remove-rule, enumerate-rules, as the
.NET and JavaScript rule managers send them) and get-message-sessions, from python-qpid-proton
(the Python SDK manages rules over HTTP only); plus a rule that fails at run time."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from proton import Described, Message, timestamp, ulong

from replication.broker import rules
from replication.broker.admin.api import AdminApi

from .admin_harness import admin_client
from .conftest import DRAIN_PREFETCH, BrokerHandle, make_config, proton_connection, take_all

pytestmark = pytest.mark.timeout(60)

CONFIG = make_config(
    {"sessions": {"RequiresSession": True}},
    topics={"t": {"Subscriptions": {"s": {}, "math": {"Rules": [{
        "Name": "divide", "Properties": {
            "FilterType": "Sql", "SqlFilter": {"SqlExpression": "10 / n > 1"},
        },
    }]}}}},
)  # fmt: skip


class Management:
    """A request/response link pair on ``<entity>/$management``."""

    def __init__(self, conn: Any, entity: str) -> None:
        self.address = f"{entity}/$management"
        self.requests = conn.create_sender(self.address)
        self.responses = conn.create_receiver(self.address, credit=10)

    def __call__(self, operation: str, body: dict[str, Any]) -> tuple[int, Any, Any]:
        self.requests.send(Message(
            id=uuid.uuid4(), reply_to=self.address, body=body,
            properties={"operation": f"com.microsoft:{operation}"},
        ))  # fmt: skip
        response = self.responses.receive(timeout=5)
        props = response.properties
        return props["statusCode"], props.get("errorCondition"), response.body


def sql(expression: str, action: str | None = None) -> dict[str, Any]:
    description: dict[str, Any] = {"sql-filter": {"expression": expression}}
    if action is not None:
        description["sql-rule-action"] = {"expression": action}
    return description


def rule_names(mgmt: Management) -> list[str]:
    status, _, body = mgmt("enumerate-rules", {"top": 100, "skip": 0})
    if status == 204:
        return []
    return [entry["rule-description"].value[2] for entry in body["rules"]]


def deliver(broker: BrokerHandle, *messages: ServiceBusMessage) -> list[str]:
    """Sends to topic ``t``; returns the bodies subscription ``s`` got (completed)."""
    with broker.client() as client:
        with client.get_topic_sender("t") as sender:
            sender.send_messages(list(messages))
        with client.get_subscription_receiver("t", "s", prefetch_count=DRAIN_PREFETCH) as receiver:
            return sorted(str(m) for m in take_all(receiver, batch=20))


@pytest.mark.broker_config(CONFIG)
def test_add_enumerate_remove_rules(broker: BrokerHandle) -> None:
    conn = proton_connection(broker.port)
    try:
        mgmt = Management(conn, "t/Subscriptions/s")
        assert rule_names(mgmt) == ["$Default"]
        assert mgmt("add-rule", {"rule-name": "red", "rule-description": sql(
            "color = 'red'", "SET tagged = TRUE"
        )})[0] == 200  # fmt: skip
        assert mgmt("add-rule", {"rule-name": "vip", "rule-description": {
            "correlation-filter": {"label": "vip", "properties": {"tier": "gold"}},
        }})[0] == 200  # fmt: skip
        duplicate = {"rule-name": "RED", "rule-description": sql("1=1")}
        status, condition, _ = mgmt("add-rule", duplicate)
        assert (status, condition) == (409, "com.microsoft:entity-already-exists")
        status, condition, body = mgmt(
            "add-rule", {"rule-name": "bad", "rule-description": sql("color = 'red' AND")}
        )
        assert (status, condition) == (400, "com.microsoft:argument-error")
        assert rule_names(mgmt) == ["$Default", "red", "vip"]

        # the descriptions come back as the SDKs decode them
        _, _, body = mgmt("enumerate-rules", {"top": 10, "skip": 1})
        red, vip = (entry["rule-description"] for entry in body["rules"])
        assert isinstance(red, Described) and red.descriptor == ulong(rules.RULE_DESCRIPTION)
        red_filter, red_action, name, _created = red.value
        assert name == "red"
        assert (red_filter.descriptor, red_filter.value[0]) == (rules.SQL_FILTER, "color = 'red'")
        assert (red_action.descriptor, red_action.value[0]) == (
            rules.SQL_RULE_ACTION, "SET tagged = TRUE",
        )  # fmt: skip
        vip_filter = vip.value[0]
        assert vip_filter.descriptor == rules.CORRELATION_FILTER
        assert vip_filter.value[4] == "vip" and vip_filter.value[8] == {"tier": "gold"}

        assert mgmt("remove-rule", {"rule-name": "$Default"})[0] == 200
        status, condition, _ = mgmt("remove-rule", {"rule-name": "$Default"})
        assert (status, condition) == (404, "com.microsoft:entity-not-found")
    finally:
        conn.close()

    # the new rules route: red (a tagged copy), vip by correlation, nothing else
    assert deliver(
        broker,
        ServiceBusMessage("red", application_properties={"color": "red"}),
        ServiceBusMessage("blue", application_properties={"color": "blue"}),
        ServiceBusMessage("vip", subject="vip", application_properties={"tier": "gold"}),
        ServiceBusMessage("silver", subject="vip", application_properties={"tier": "silver"}),
    ) == ["red", "vip"]
    # and they are kept across a restart (the config did not change)
    broker.restart()
    blue = ServiceBusMessage("blue", application_properties={"color": "blue"})
    assert deliver(broker, blue) == []


@pytest.mark.broker_config(CONFIG)
def test_add_rule_with_parameters(broker: BrokerHandle) -> None:
    """``sql-filter`` and ``sql-rule-action`` maps may carry ``parameters`` (@name values):
    they are kept (and stored); enumerate-rules answers with Service Bus's two-field filter
    and action lists, which have no place for them; the management REST API shows them."""
    description = {
        "sql-filter": {"expression": "color = @c AND sys.EnqueuedTimeUtc > @since",
                       "parameters": {"@c": "red", "@since": timestamp(1_000_000)}},
        "sql-rule-action": {"expression": "SET tagged = @t; SET n = @n",
                            "parameters": {"@t": True, "@n": 2.5}},
    }  # fmt: skip
    conn = proton_connection(broker.port)
    try:
        mgmt = Management(conn, "t/Subscriptions/s")
        assert mgmt("remove-rule", {"rule-name": "$Default"})[0] == 200
        assert mgmt("add-rule", {"rule-name": "param", "rule-description": description})[0] == 200
        missing = {"sql-filter": {"expression": "color = @c", "parameters": {"@d": "red"}}}
        status, condition, _ = mgmt("add-rule", {"rule-name": "bad", "rule-description": missing})
        assert (status, condition) == (400, "com.microsoft:argument-error")
        listed = {"sql-filter": {"expression": "a = @a", "parameters": {"@a": ["x"]}}}
        status, condition, _ = mgmt("add-rule", {"rule-name": "bad", "rule-description": listed})
        assert (status, condition) == (400, "com.microsoft:argument-error")
        _, _, body = mgmt("enumerate-rules", {"top": 10, "skip": 0})
        (entry,) = body["rules"]
        rule_filter, action, name, _created = entry["rule-description"].value
        assert name == "param"
        assert rule_filter.value == ["color = @c AND sys.EnqueuedTimeUtc > @since", 20]
        assert action.value == ["SET tagged = @t; SET n = @n", 20]
    finally:
        conn.close()

    def check() -> None:
        admin, _ = admin_client(broker, AdminApi(broker.broker))  # type: ignore[arg-type]
        rule = admin.get_rule("t", "s", "param")
        assert rule.filter.parameters == {
            "@c": "red", "@since": datetime(1970, 1, 1, 0, 16, 40, tzinfo=UTC)}  # fmt: skip
        assert rule.action.parameters == {"@t": True, "@n": 2.5}
        with broker.client() as client:
            with client.get_topic_sender("t") as sender:
                sender.send_messages([
                    ServiceBusMessage("red", application_properties={"color": "red"}),
                    ServiceBusMessage("blue", application_properties={"color": "blue"}),
                ])  # fmt: skip
            with client.get_subscription_receiver("t", "s") as receiver:
                got = receiver.receive_messages(max_message_count=5, max_wait_time=2)
                for message in got:
                    receiver.complete_message(message)
        (red,) = got
        assert str(red) == "red"
        assert red.application_properties[b"tagged"] is True
        assert red.application_properties[b"n"] == 2.5

    check()
    broker.restart()
    check()


@pytest.mark.broker_config(CONFIG)
def test_rules_need_a_subscription(broker: BrokerHandle) -> None:
    conn = proton_connection(broker.port)
    try:
        status, condition, _ = Management(conn, "sessions")("enumerate-rules", {"top": 5})
        assert (status, condition) == (400, "amqp:not-allowed")
        status, condition, _ = Management(conn, "t")("enumerate-rules", {"top": 5})
        assert (status, condition) == (400, "com.microsoft:not-supported")
    finally:
        conn.close()


@pytest.mark.broker_config(CONFIG)
def test_get_message_sessions(broker: BrokerHandle) -> None:
    with broker.client() as client:
        with client.get_queue_sender("sessions") as sender:
            sender.send_messages(
                [ServiceBusMessage("x", session_id=s) for s in ("b", "a", "c", "a")]
            )
        with client.get_queue_receiver("sessions", session_id="z") as receiver:
            receiver.session.set_state(b"state only")
    conn = proton_connection(broker.port)
    try:
        mgmt = Management(conn, "sessions")
        status, _, body = mgmt("get-message-sessions", {"skip": 0, "top": 100})
        assert status == 200 and body["sessions-ids"] == ["a", "b", "c", "z"]
        status, _, body = mgmt("get-message-sessions", {"skip": 1, "top": 2})
        assert body["sessions-ids"] == ["b", "c"]
        status, _, body = mgmt("get-message-sessions", {"skip": 10, "top": 2})
        assert status == 204
    finally:
        conn.close()


@pytest.mark.broker_config(CONFIG)
def test_a_rule_that_fails_dead_letters_the_message_in_that_subscription(
    broker: BrokerHandle,
) -> None:
    """``10 / n`` with n = 0 is a filter evaluation error: Service Bus keeps the message in
    the subscription's dead-letter queue (DeadLetteringOnFilterEvaluationExceptions)."""
    with broker.client() as client:
        with client.get_topic_sender("t") as sender:
            sender.send_messages([
                ServiceBusMessage("zero", application_properties={"n": 0}),
                ServiceBusMessage("two", application_properties={"n": 2}),
            ])  # fmt: skip
        with client.get_subscription_receiver("t", "math") as receiver:
            (good,) = receiver.receive_messages(max_message_count=5, max_wait_time=2)
            receiver.complete_message(good)
        with client.get_subscription_receiver(
            "t", "math", sub_queue=ServiceBusSubQueue.DEAD_LETTER
        ) as dlq:
            (bad,) = dlq.receive_messages(max_message_count=5, max_wait_time=2)
            dlq.complete_message(bad)
    assert str(good) == "two"
    assert str(bad) == "zero"
    assert bad.dead_letter_reason == "FilterEvaluationException"
    assert "divide" in (bad.dead_letter_error_description or "")
