"""The real ``ServiceBusAdministrationClient`` (sync and asyncio) over HTTPS to the broker.

The broker's listener serves HTTPS on the AMQP port (TLS with a local CA under the data dir);
the management API is its ``http_app`` by default. Every operation the client offers is
called once, and entities made here are used over AMQP straight away.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio.management import (
    ServiceBusAdministrationClient as AsyncAdministrationClient,
)
from azure.servicebus.management import (
    CorrelationRuleFilter,
    ServiceBusAdministrationClient,
    SqlRuleAction,
    SqlRuleFilter,
)

from .conftest import BrokerHandle, receive_n, send


@pytest.fixture
def admin_broker(broker: BrokerHandle) -> BrokerHandle:
    """The default broker: its management API answers HTTPS on the AMQP port."""
    return broker


def options(broker: BrokerHandle) -> dict[str, Any]:
    return {"connection_verify": str(broker.data_dir / "tls" / "ca.pem"), "retry_total": 0}


def test_sync_client_every_operation(admin_broker: BrokerHandle) -> None:
    broker = admin_broker
    with ServiceBusAdministrationClient.from_connection_string(
        broker.connection_string, **options(broker)
    ) as client:
        assert client.get_namespace_properties().name == "sbemulatorns"
        queue = client.create_queue("https-q", max_delivery_count=4)
        with pytest.raises(
            ResourceExistsError, match="The messaging entity 'https-q' already exists"
        ):
            client.create_queue("https-q")
        queue.lock_duration = timedelta(seconds=45)
        client.update_queue(queue)
        assert client.get_queue("https-q").lock_duration == timedelta(seconds=45)
        send(broker, "https-q", ServiceBusMessage("over amqp"))
        assert client.get_queue_runtime_properties("https-q").active_message_count == 1
        assert "https-q" in [q.name for q in client.list_queues()]
        runtime = {q.name: q for q in client.list_queues_runtime_properties()}
        assert runtime["https-q"].total_message_count == 1

        topic = client.create_topic("https-t")
        client.update_topic(topic, default_message_time_to_live=timedelta(hours=2))
        assert client.get_topic("https-t").default_message_time_to_live == timedelta(hours=2)
        assert [t.name for t in client.list_topics()] == ["https-t"]
        assert client.get_topic_runtime_properties("https-t").subscription_count == 0
        assert [t.name for t in client.list_topics_runtime_properties()] == ["https-t"]

        sub = client.create_subscription("https-t", "s", forward_to="https-q")
        client.update_subscription("https-t", sub, max_delivery_count=3)
        assert client.get_subscription("https-t", "s").max_delivery_count == 3
        assert [s.name for s in client.list_subscriptions("https-t")] == ["s"]
        assert client.get_subscription_runtime_properties("https-t", "s").total_message_count == 0
        assert [s.name for s in client.list_subscriptions_runtime_properties("https-t")] == ["s"]

        rule = client.create_rule(
            "https-t", "s", "vip", filter=CorrelationRuleFilter(properties={"tier": "gold"}),
            action=SqlRuleAction("SET seen = 1"),
        )  # fmt: skip
        client.update_rule("https-t", "s", rule, filter=SqlRuleFilter("tier = 'gold'"))
        assert client.get_rule("https-t", "s", "vip").filter.sql_expression == "tier = 'gold'"
        assert {r.name for r in client.list_rules("https-t", "s")} == {"$Default", "vip"}
        client.delete_rule("https-t", "s", "vip")

        client.delete_subscription("https-t", "s")
        client.delete_topic("https-t")
        with broker.client() as sb, sb.get_queue_receiver("https-q") as receiver:
            receiver.complete_message(receive_n(receiver, 1)[0])
        client.delete_queue("https-q")
        with pytest.raises(ResourceNotFoundError, match="Queue 'https-q' does not exist"):
            client.get_queue("https-q")


async def test_async_client_every_operation(admin_broker: BrokerHandle) -> None:
    broker = admin_broker
    async with AsyncAdministrationClient.from_connection_string(
        broker.connection_string, **options(broker)
    ) as client:
        assert (await client.get_namespace_properties()).messaging_sku == "Standard"
        queue = await client.create_queue("aio-q", requires_session=True)
        queue.max_delivery_count = 2
        await client.update_queue(queue)
        assert (await client.get_queue("aio-q")).max_delivery_count == 2
        assert (await client.get_queue_runtime_properties("aio-q")).active_message_count == 0
        assert "aio-q" in [q.name async for q in client.list_queues()]
        assert "aio-q" in [q.name async for q in client.list_queues_runtime_properties()]

        topic = await client.create_topic("aio-t")
        await client.update_topic(topic, max_size_in_megabytes=2048)
        assert (await client.get_topic("aio-t")).max_size_in_megabytes == 2048
        assert [t.name async for t in client.list_topics()] == ["aio-t"]
        assert (await client.get_topic_runtime_properties("aio-t")).size_in_bytes == 0
        assert [t.name async for t in client.list_topics_runtime_properties()] == ["aio-t"]

        sub = await client.create_subscription("aio-t", "s")
        await client.update_subscription("aio-t", sub, lock_duration=timedelta(seconds=10))
        got = await client.get_subscription("aio-t", "s")
        assert got.lock_duration == timedelta(seconds=10)
        runtime = await client.get_subscription_runtime_properties("aio-t", "s")
        assert runtime.total_message_count == 0
        assert [s.name async for s in client.list_subscriptions("aio-t")] == ["s"]
        assert [s.name async for s in client.list_subscriptions_runtime_properties("aio-t")] == [
            "s"
        ]
        rule = await client.create_rule("aio-t", "s", "r", filter=SqlRuleFilter("a = 1"))
        await client.update_rule("aio-t", "s", rule, action=SqlRuleAction("SET b = 2"))
        assert (await client.get_rule("aio-t", "s", "r")).action.sql_expression == "SET b = 2"
        assert {r.name async for r in client.list_rules("aio-t", "s")} == {"$Default", "r"}
        await client.delete_rule("aio-t", "s", "r")
        await client.delete_subscription("aio-t", "s")
        await client.delete_topic("aio-t")
        await client.delete_queue("aio-q")
        with pytest.raises(ResourceNotFoundError, match="Topic 'aio-t' does not exist"):
            await client.get_topic("aio-t")


def test_sql_parameters_over_https(admin_broker: BrokerHandle) -> None:
    """Filter and action parameters through the real HTTP stack, then used over AMQP."""
    broker = admin_broker
    rule_filter = SqlRuleFilter("color = @c AND size > @n", {"@c": "red", "@n": 3})
    action = SqlRuleAction("SET tag = @tag", {"@tag": "big"})
    with ServiceBusAdministrationClient.from_connection_string(
        broker.connection_string, **options(broker)
    ) as client:
        client.create_topic("p-t")
        client.create_subscription("p-t", "s")
        client.delete_rule("p-t", "s", "$Default")
        client.create_rule("p-t", "s", "big-red", filter=rule_filter, action=action)
        (rule,) = client.list_rules("p-t", "s")
        assert (rule.filter.sql_expression, rule.filter.parameters) == (
            rule_filter.sql_expression, rule_filter.parameters)  # fmt: skip
        assert (rule.action.sql_expression, rule.action.parameters) == (
            action.sql_expression, action.parameters)  # fmt: skip
        assert isinstance(rule.filter.parameters["@n"], int)
    with broker.client() as sb:
        with sb.get_topic_sender("p-t") as sender:
            sender.send_messages([
                ServiceBusMessage("yes", application_properties={"color": "red", "size": 4}),
                ServiceBusMessage("no", application_properties={"color": "red", "size": 3}),
            ])  # fmt: skip
        with sb.get_subscription_receiver("p-t", "s") as receiver:
            got = receiver.receive_messages(max_message_count=5, max_wait_time=2)
            for message in got:
                receiver.complete_message(message)
    assert [str(m) for m in got] == ["yes"]
    assert got[0].application_properties[b"tag"] == b"big"
