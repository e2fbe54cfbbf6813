"""The management REST API (``AdminApi``) as ``ServiceBusAdministrationClient`` uses it.

Requests come from the SDK itself (``admin_harness``: its paths, SAS tokens and XML bodies),
or are hand-made ``Request`` values for what the SDK never sends (broken XML, stale ETags).
Entities made here must be usable over AMQP at once and survive a broker restart.
"""

from __future__ import annotations

import html
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import MessagingEntityNotFoundError, ServiceBusError
from azure.servicebus.management import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)

from replication.broker.admin.api import MAX_BODY, AdminApi
from replication.broker.httpapi import Request, Response
from replication.broker.rules import RuleSpec, dump_rules, load_rules

from .admin_harness import admin_client, token
from .conftest import BrokerHandle, make_config, receive_n, send, wait_for

QUEUE_BODY = (
    b"<?xml version='1.0' encoding='utf-8'?>\n<ns0:entry xmlns:ns0=\"http://www.w3.org/2005/Atom\""
    b' xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect">'
    b'<ns0:content type="application/xml"><QueueDescription>%s</QueueDescription>'
    b"</ns0:content></ns0:entry>"
)
"""What the SDK sends for create_queue (captured), with the properties left to fill in."""


@pytest.fixture
def api(broker: BrokerHandle) -> AdminApi:
    return AdminApi(broker.broker)  # type: ignore[arg-type]


@pytest.fixture
def client(broker: BrokerHandle, api: AdminApi) -> Any:
    client, _ = admin_client(broker, api)
    return client


def call(
    broker: BrokerHandle, api: AdminApi, method: str, target: str, body: bytes = b"",
    headers: dict[str, str] | None = None, auth: str | None = "default",
) -> Response:  # fmt: skip
    sent = {"host": f"localhost:{broker.port}", **(headers or {})}
    if auth == "default":
        sent["authorization"] = token(broker)
    elif auth is not None:
        sent["authorization"] = auth
    return broker.run(api.handle(Request(method, target, sent, body)))


def detail(response: Response) -> str:
    return html.unescape(response.body.decode())


# ---------------------------------------------------------------------- queues


def test_queue_create_get_update_list_delete(client: Any, broker: BrokerHandle) -> None:
    created = client.create_queue(
        "orders", lock_duration=timedelta(seconds=30), max_delivery_count=3,
        default_message_time_to_live=timedelta(hours=1), requires_session=True,
        dead_lettering_on_message_expiration=True, user_metadata="team=a",
        requires_duplicate_detection=True,
        duplicate_detection_history_time_window=timedelta(minutes=2),
    )  # fmt: skip
    assert created.name == "orders"
    got = client.get_queue("orders")
    assert got.lock_duration == timedelta(seconds=30)
    assert got.max_delivery_count == 3
    assert got.default_message_time_to_live == timedelta(hours=1)
    assert got.requires_session and got.requires_duplicate_detection
    assert got.duplicate_detection_history_time_window == timedelta(minutes=2)
    assert got.user_metadata == "team=a"
    assert got.max_size_in_megabytes == 1024 and got.status == "Active"

    got.max_delivery_count = 5
    got.user_metadata = "team=b"
    client.update_queue(got)
    again = client.get_queue("orders")
    assert (again.max_delivery_count, again.user_metadata) == (5, "team=b")
    queue = broker.call(lambda: broker.broker.queues["orders"])  # type: ignore[union-attr]
    assert queue.settings.max_delivery_count == 5 and queue.sessions_enabled

    assert "orders" in [q.name for q in client.list_queues()]
    client.delete_queue("orders")
    with pytest.raises(ResourceNotFoundError, match="Queue 'orders' does not exist"):
        client.get_queue("orders")
    assert "orders" not in [q.name for q in client.list_queues()]


def test_defaults_are_the_services(client: Any) -> None:
    queue = client.create_queue("plain")
    assert queue.lock_duration == timedelta(minutes=1)
    assert queue.max_delivery_count == 10
    assert queue.max_size_in_megabytes == 1024
    assert queue.duplicate_detection_history_time_window == timedelta(minutes=10)
    assert queue.default_message_time_to_live > timedelta(days=10675198)
    assert queue.auto_delete_on_idle > timedelta(days=10675198)
    assert queue.enable_batched_operations and not queue.enable_partitioning
    topic = client.create_topic("plain-topic")
    assert topic.max_size_in_megabytes == 1024 and not topic.requires_duplicate_detection
    sub = client.create_subscription("plain-topic", "s")
    assert sub.lock_duration == timedelta(minutes=1) and sub.max_delivery_count == 10
    assert sub.dead_lettering_on_filter_evaluation_exceptions


def test_config_queues_are_listed_with_their_properties(client: Any) -> None:
    names = [q.name for q in client.list_queues()]
    assert names == ["dedupe", "dlq-test", "q", "short-lock", "ttl"]
    dlq_test = client.get_queue("dlq-test")
    assert dlq_test.max_delivery_count == 2 and dlq_test.lock_duration == timedelta(seconds=5)
    assert client.get_queue("ttl").default_message_time_to_live == timedelta(seconds=2)


def test_list_pages_with_skip_and_top(client: Any, broker: BrokerHandle, api: AdminApi) -> None:
    for index in range(7):
        client.create_queue(f"page-{index}")
    names = [q.name for q in client.list_queues(max_page_size=3)]
    assert names == sorted(names, key=str.lower) and len(names) == 12
    page = call(broker, api, "GET", "/$Resources/Queues?$skip=2&$top=3&api-version=2021-05")
    assert page.status == 200
    assert detail(page).count("<entry") == 3 and 'rel="next"' in detail(page)
    assert "$skip=5" in detail(page)


def test_new_queue_takes_amqp_links_at_once_and_counts_show(
    client: Any, broker: BrokerHandle
) -> None:
    client.create_queue("fresh", max_delivery_count=1)
    send(broker, "fresh", *(ServiceBusMessage(f"m{i}") for i in range(3)))
    runtime = client.get_queue_runtime_properties("fresh")
    assert runtime.active_message_count == 3 and runtime.total_message_count == 3
    assert runtime.size_in_bytes > 0 and runtime.dead_letter_message_count == 0
    with broker.client() as sb, sb.get_queue_receiver("fresh") as receiver:
        first, *_ = receive_n(receiver, 3)
        receiver.dead_letter_message(first, reason="bad")
        for message in _:
            receiver.complete_message(message)
    runtime = client.get_queue_runtime_properties("fresh")
    assert (runtime.active_message_count, runtime.dead_letter_message_count) == (0, 1)
    assert runtime.created_at_utc <= runtime.updated_at_utc


def test_scheduled_messages_are_counted(client: Any, broker: BrokerHandle) -> None:
    from datetime import UTC, datetime

    client.create_queue("later")
    with broker.client() as sb, sb.get_queue_sender("later") as sender:
        sender.schedule_messages(ServiceBusMessage("x"), datetime.now(UTC) + timedelta(hours=1))
    runtime = client.get_queue_runtime_properties("later")
    assert (runtime.scheduled_message_count, runtime.active_message_count) == (1, 0)


def test_deleting_a_queue_detaches_its_receivers(client: Any, broker: BrokerHandle) -> None:
    client.create_queue("doomed")
    send(broker, "doomed", ServiceBusMessage("x"))
    errors: list[BaseException] = []
    ready = threading.Event()

    def receive() -> None:
        try:
            with broker.client() as sb, sb.get_queue_receiver("doomed") as receiver:
                receive_n(receiver, 1)
                ready.set()
                receiver.receive_messages(max_wait_time=10)
        except BaseException as exc:
            errors.append(exc)
        finally:
            ready.set()

    thread = threading.Thread(target=receive)
    thread.start()
    assert ready.wait(10)
    client.delete_queue("doomed")
    thread.join(20)
    assert errors and isinstance(errors[0], ServiceBusError), errors
    assert broker.call(lambda: "doomed" not in broker.broker.entities)  # type: ignore[union-attr]
    with (
        pytest.raises(
            MessagingEntityNotFoundError, match="The messaging entity 'doomed' could not be found"
        ),
        broker.client() as sb,
        sb.get_queue_sender("doomed") as sender,
    ):
        sender.send_messages(ServiceBusMessage("y"))


def test_forwarding_to_an_api_made_queue(client: Any, broker: BrokerHandle) -> None:
    client.create_queue("sink")
    client.create_queue("source", forward_to="sink")
    assert client.get_queue("source").forward_to.endswith("/sink")
    send(broker, "source", ServiceBusMessage("hop"))
    assert wait_for(lambda: broker.count("sink") == 1)
    assert broker.count("source") == 0


# ---------------------------------------------------------------------- topics and rules


def test_topic_subscription_rules_lifecycle(client: Any, broker: BrokerHandle) -> None:
    client.create_topic("events", requires_duplicate_detection=True)
    client.create_subscription("events", "all")
    client.create_subscription("events", "red", max_delivery_count=4)
    client.delete_rule("events", "red", "$Default")
    client.create_rule(
        "events", "red", "by-color",
        filter=CorrelationRuleFilter(label="paint", properties={"color": "red", "size": 3,
                                                                "big": True, "ratio": 0.5}),
        action=SqlRuleAction("SET sys.Label = 'painted'"),
    )  # fmt: skip
    client.create_rule("events", "red", "sql", filter=SqlRuleFilter("color = 'blue'"))
    client.create_rule("events", "red", "never", filter=FalseRuleFilter())
    rules = {r.name: r for r in client.list_rules("events", "red")}
    assert set(rules) == {"by-color", "sql", "never"}
    correlation = rules["by-color"].filter
    assert correlation.label == "paint"
    assert correlation.properties == {"color": "red", "size": 3, "big": True, "ratio": 0.5}
    assert rules["by-color"].action.sql_expression == "SET sys.Label = 'painted'"
    assert rules["sql"].filter.sql_expression == "color = 'blue'"
    assert isinstance(rules["never"].filter, FalseRuleFilter)

    rule = client.get_rule("events", "red", "sql")
    rule.filter = TrueRuleFilter()
    client.update_rule("events", "red", rule)
    assert isinstance(client.get_rule("events", "red", "sql").filter, TrueRuleFilter)
    client.delete_rule("events", "red", "sql")
    client.delete_rule("events", "red", "never")

    with broker.client() as sb, sb.get_topic_sender("events") as sender:
        sender.send_messages([
            ServiceBusMessage("a", subject="paint", application_properties={
                "color": "red", "size": 3, "big": True, "ratio": 0.5}),
            ServiceBusMessage("b", subject="paint", application_properties={"color": "blue"}),
        ])  # fmt: skip
    with broker.client() as sb, sb.get_subscription_receiver("events", "red") as receiver:
        (got,) = receive_n(receiver, 1)
        assert got.subject == "painted"
        receiver.complete_message(got)
    runtime = client.get_subscription_runtime_properties("events", "all")
    assert runtime.active_message_count == 2
    topic = client.get_topic_runtime_properties("events")
    assert topic.subscription_count == 2 and topic.size_in_bytes > 0

    sub = client.get_subscription("events", "red")
    assert sub.max_delivery_count == 4
    sub.max_delivery_count = 6
    client.update_subscription("events", sub)
    assert client.get_subscription("events", "red").max_delivery_count == 6
    assert [s.name for s in client.list_subscriptions("events")] == ["all", "red"]
    client.delete_subscription("events", "red")
    assert [s.name for s in client.list_subscriptions("events")] == ["all"]
    client.delete_topic("events")
    assert [t.name for t in client.list_topics()] == []
    with pytest.raises(
        ResourceNotFoundError, match="The messaging entity 'events' could not be found"
    ):
        client.get_subscription("events", "all")


def test_namespace_properties(client: Any) -> None:
    info = client.get_namespace_properties()
    assert (info.name, info.messaging_sku, info.namespace_type) == (
        "sbemulatorns", "Standard", "Messaging")  # fmt: skip


# ---------------------------------------------------------------------- errors


def test_conflicts_and_missing_entities(client: Any) -> None:
    client.create_queue("dup")
    with pytest.raises(ResourceExistsError, match="The messaging entity 'dup' already exists"):
        client.create_queue("dup")
    with pytest.raises(ResourceExistsError, match="The messaging entity 'DUP' already exists"):
        client.create_topic("DUP")  # queues and topics share names, case-insensitively
    with pytest.raises(
        ResourceNotFoundError, match="The messaging entity 'nope' could not be found"
    ):
        client.delete_queue("nope")
    with pytest.raises(
        ResourceNotFoundError, match="The messaging entity 'nope' could not be found"
    ):
        client.get_subscription("nope", "s")
    client.create_topic("t")
    client.create_subscription("t", "s")
    with pytest.raises(
        ResourceExistsError, match="The messaging entity 't/Subscriptions/s' already exists"
    ):
        client.create_subscription("t", "s")
    with pytest.raises(
        ResourceExistsError,
        match=r"The messaging entity 't/Subscriptions/s/Rules/\$Default' already exists",
    ):
        client.create_rule("t", "s", "$Default")
    with pytest.raises(
        ResourceNotFoundError,
        match="The messaging entity 't/Subscriptions/s/Rules/nope' could not be found",
    ):
        client.get_rule("t", "s", "nope")
    with pytest.raises(
        ResourceNotFoundError,
        match="The messaging entity 't/Subscriptions/s/Rules/nope' could not be found",
    ):
        client.delete_rule("t", "s", "nope")


@pytest.mark.parametrize(("properties", "reason"), [
    (b"<LockDuration>PT1S</LockDuration>", "LockDuration: must be between"),
    (b"<LockDuration>soon</LockDuration>", "not an ISO 8601 duration"),
    (b"<MaxDeliveryCount>0</MaxDeliveryCount>", "MaxDeliveryCount: must be between 1"),
    (b"<MaxDeliveryCount>ten</MaxDeliveryCount>", "not an integer"),
    (b"<RequiresSession>yes</RequiresSession>", "not a boolean"),
    (b"<MaxSizeInMegabytes>100</MaxSizeInMegabytes>", "must be one of 1024"),
    (b"<MaxMessageSizeInKilobytes>1024</MaxMessageSizeInKilobytes>", "Premium"),
    (b"<Colour>red</Colour>", "Colour is not a property of a queue"),
    (b"<ForwardTo>sb://localhost/missing</ForwardTo>", "'missing' does not exist"),
    (b"<LockDuration>PT1M</LockDuration><LockDuration>PT1M</LockDuration>", "more than once"),
    (b"<DuplicateDetectionHistoryTimeWindow>PT1S</DuplicateDetectionHistoryTimeWindow>",
     "between PT20S"),
])  # fmt: skip
def test_bad_properties_are_400_with_a_reason(
    broker: BrokerHandle, api: AdminApi, properties: bytes, reason: str
) -> None:
    response = call(broker, api, "PUT", "/bad?api-version=2021-05", QUEUE_BODY % properties)
    assert response.status == 400, detail(response)
    assert reason in detail(response)
    assert "<Code>400</Code>" in detail(response)


@pytest.mark.parametrize(("body", "reason"), [
    (b"", "empty"),
    (b"<entry", "not well-formed"),
    (b"<feed xmlns='http://www.w3.org/2005/Atom'/>", "expected an Atom <entry>"),
    (b"<entry xmlns='http://www.w3.org/2005/Atom'/>", "no <content>"),
    (b"<entry xmlns='http://www.w3.org/2005/Atom'><content><Queue/></content></entry>",
     "expected QueueDescription or TopicDescription"),
    (b'<!DOCTYPE x [<!ENTITY a "aaaa">]><entry xmlns="http://www.w3.org/2005/Atom">&a;</entry>',
     "forbidden"),
])  # fmt: skip
def test_malformed_xml_is_400(
    broker: BrokerHandle, api: AdminApi, body: bytes, reason: str
) -> None:
    response = call(broker, api, "PUT", "/bad", body)
    assert response.status == 400 and reason in detail(response), detail(response)


def test_bad_names_and_rules_are_400(client: Any) -> None:
    with pytest.raises(HttpResponseError, match="Invalid entity name") as info:
        client.create_queue("bad name!")
    assert info.value.status_code == 400
    client.create_topic("t")
    with pytest.raises(HttpResponseError, match="Invalid subscription name"):
        client.create_subscription("t", "x" * 51)
    client.create_subscription("t", "s")
    with pytest.raises(
        HttpResponseError, match="rule 'broken': line 1, column 9: expected an expression"
    ) as info:
        client.create_rule("t", "s", "broken", filter=SqlRuleFilter("color = = 1"))
    assert info.value.status_code == 400 and "broken" in str(info.value)
    with pytest.raises(HttpResponseError, match="parameter") as info:  # @a has no value
        client.create_rule("t", "s", "p", filter=SqlRuleFilter("a = @a", parameters={"@b": 1}))
    assert info.value.status_code == 400


def test_immutable_properties_cannot_change(client: Any) -> None:
    queue = client.create_queue("fixed")
    queue.requires_session = True
    with pytest.raises(HttpResponseError, match="RequiresSession") as info:
        client.update_queue(queue)
    assert info.value.status_code == 400


def test_authorization(broker_factory: Any) -> None:
    rules = [
        {"Name": "RootManageSharedAccessKey", "Key": "admin-key", "Rights": ["Manage"]},
        {"Name": "sender", "Key": "send-key", "Rights": ["Send"]},
    ]
    broker = broker_factory(make_config(rules=rules))
    api = AdminApi(broker.broker)
    missing = call(broker, api, "GET", "/$Resources/Queues", auth=None)
    assert missing.status == 401 and "MissingToken" in detail(missing)
    garbage = call(broker, api, "GET", "/$Resources/Queues", auth="Bearer abc")
    assert garbage.status == 401 and "Malformed" in detail(garbage)
    forged = call(broker, api, "GET", "/q", auth=token(broker, "RootManageSharedAccessKey", "x"))
    assert forged.status == 401 and "signature" in detail(forged)
    no_manage = call(broker, api, "GET", "/q", auth=token(broker, "sender", "send-key"))
    assert no_manage.status == 401 and "Manage claim required" in detail(no_manage)
    scoped = token(broker, "RootManageSharedAccessKey", "admin-key", path="q")
    assert call(broker, api, "GET", "/q", auth=scoped).status == 200
    assert call(broker, api, "GET", "/$Resources/Queues", auth=scoped).status == 401

    client, _ = admin_client(broker, api, broker.connection_string_for("sender", "send-key"))
    with pytest.raises(ClientAuthenticationError, match="Manage claim required for 'nope'"):
        client.create_queue("nope")
    admin, _ = admin_client(
        broker, api, broker.connection_string_for("RootManageSharedAccessKey", "admin-key")
    )
    assert admin.create_queue("yes").name == "yes"


def test_forwarding_needs_send_on_the_target(broker: BrokerHandle, api: AdminApi) -> None:
    body = QUEUE_BODY % b"<ForwardTo>sb://localhost/q</ForwardTo>"
    scoped = token(broker, path="src")
    refused = call(broker, api, "PUT", "/src", body, auth=scoped)
    assert refused.status == 401 and "ServiceBusSupplementaryAuthorization" in detail(refused)
    supplementary = {"servicebussupplementaryauthorization": token(broker, path="q")}
    made = call(broker, api, "PUT", "/src", body, supplementary, auth=scoped)
    assert made.status == 201, detail(made)


def test_etags_guard_updates(broker: BrokerHandle, api: AdminApi) -> None:
    created = call(broker, api, "PUT", "/tagged", QUEUE_BODY % b"")
    assert created.status == 201
    etag = created.headers["etag"]
    body = QUEUE_BODY % b"<MaxDeliveryCount>4</MaxDeliveryCount>"
    stale = call(broker, api, "PUT", "/tagged", body, {"if-match": '"1"'})
    assert stale.status == 412
    fresh = call(broker, api, "PUT", "/tagged", body, {"if-match": etag})
    assert fresh.status == 200 and "<MaxDeliveryCount>4</MaxDeliveryCount>" in detail(fresh)
    assert call(broker, api, "PUT", "/untagged", body, {"if-match": "*"}).status == 404


def test_oversized_bodies_and_unknown_methods(broker: BrokerHandle, api: AdminApi) -> None:
    huge = call(broker, api, "PUT", "/big", b" " * (MAX_BODY + 1))
    assert huge.status == 413
    assert call(broker, api, "POST", "/q").status == 405
    assert call(broker, api, "GET", "/$Resources/Things").status == 404


def test_a_missing_queue_reads_as_an_empty_feed(broker: BrokerHandle, api: AdminApi) -> None:
    response = call(broker, api, "GET", "/ghost?enrich=false&api-version=2021-05")
    assert response.status == 200 and "<entry" not in detail(response)
    assert detail(response).startswith("<feed")


# ---------------------------------------------------------------------- SQL parameters

EVERY_TYPE = {
    "@s": "text", "@i": 7, "@l": 2**40, "@f": 2.5, "@b": True,
    "@dt": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC), "@ts": timedelta(hours=1, minutes=30),
}  # fmt: skip
"""Every value type the SDK serializes (it writes datetimes without their microseconds)."""


def same(got: Any, expected: Any) -> None:
    """SDK filters and actions compare by identity: compare type, text and typed parameters."""
    assert type(got) is type(expected)
    assert got.sql_expression == expected.sql_expression
    assert dict(got.parameters or {}) == dict(expected.parameters or {})
    for key, value in (expected.parameters or {}).items():
        assert type(got.parameters[key]) is type(value), key


def shop(sb: Any, *messages: ServiceBusMessage) -> list[Any]:
    """Sends to topic ``shop``; returns what subscription ``big-red`` got (completed)."""
    with sb.get_topic_sender("shop") as sender:
        sender.send_messages(list(messages))
    got: list[Any] = []
    with sb.get_subscription_receiver("shop", "big-red") as receiver:
        while batch := receiver.receive_messages(max_message_count=10, max_wait_time=1):
            for message in batch:
                receiver.complete_message(message)
            got += batch
    return sorted(got, key=str)


SHOP_MESSAGES = (
    ("match", {"color": "red", "size": 5}), ("small", {"color": "red", "size": 2}),
    ("blue", {"color": "blue", "size": 9}), ("no-size", {"color": "red"}),
)  # fmt: skip


def test_sql_parameters_round_trip_route_and_survive_a_restart(
    client: Any, broker: BrokerHandle
) -> None:
    rule_filter = SqlRuleFilter("color = @c AND size > @n", {"@c": "red", "@n": 3})
    action = SqlRuleAction("SET tag = @tag; SET sys.Label = @label", {
        "@tag": "big", "@label": "sorted"})  # fmt: skip
    typed_filter = SqlRuleFilter(
        "s = @s OR i = @i OR l = @l OR f = @f OR b = @b OR dt = @dt OR ts = @ts", EVERY_TYPE
    )
    typed_action = SqlRuleAction("SET s = @s; SET i = @i; SET f = @f; SET b = @b", {
        "@s": "x", "@i": -5, "@f": -0.25, "@b": False})  # fmt: skip
    client.create_topic("shop")
    client.create_subscription("shop", "big-red")
    client.create_subscription("shop", "typed")
    client.delete_rule("shop", "big-red", "$Default")
    created = client.create_rule("shop", "big-red", "big-red", filter=rule_filter, action=action)
    same(created.filter, rule_filter)
    same(created.action, action)
    client.create_rule("shop", "typed", "typed", filter=typed_filter, action=typed_action)

    def check(client: Any) -> None:
        rule = client.get_rule("shop", "big-red", "big-red")
        same(rule.filter, rule_filter)
        same(rule.action, action)
        listed = {r.name: r for r in client.list_rules("shop", "typed")}
        same(listed["typed"].filter, typed_filter)
        same(listed["typed"].action, typed_action)
        with broker.client() as sb:
            got = shop(sb, *(ServiceBusMessage(body, application_properties=props)
                             for body, props in SHOP_MESSAGES))  # fmt: skip
        assert [str(m) for m in got] == ["match"]
        (match,) = got
        assert match.subject == "sorted"
        assert match.application_properties[b"tag"] == b"big"
        assert match.application_properties[b"RuleName"] == b"big-red"

    check(client)
    # an update keeps (and can change) the parameters
    rule = client.get_rule("shop", "typed", "typed")
    rule.action = SqlRuleAction("SET i = @i", {"@i": 2**35})
    client.update_rule("shop", "typed", rule)
    typed_action = rule.action
    same(client.get_rule("shop", "typed", "typed").action, typed_action)

    broker.restart()
    check(admin_client(broker, AdminApi(broker.broker))[0])  # type: ignore[arg-type]


def test_parameters_are_checked_and_sent_as_service_bus_writes_them(
    client: Any, broker: BrokerHandle, api: AdminApi
) -> None:
    client.create_topic("t")
    client.create_subscription("t", "s")
    # a parameter name Service Bus refuses is 400 when the rule is made
    with pytest.raises(HttpResponseError, match="'@a b' is not a parameter name") as info:
        client.create_rule("t", "s", "bad", filter=SqlRuleFilter("a = 1", {"@a b": 1}))
    assert info.value.status_code == 400
    client.create_rule("t", "s", "p", filter=SqlRuleFilter("a = @a", {"@a": 1}),
                       action=SqlRuleAction("SET b = @b", {"@b": "x<&>"}))  # fmt: skip
    response = call(broker, api, "GET", "/t/Subscriptions/s/Rules/p")
    xml = response.body.decode()
    assert (
        "<Parameters><KeyValueOfstringanyType><Key>@a</Key>"
        '<Value xmlns:d6p1="http://www.w3.org/2001/XMLSchema" i:type="d6p1:int">1</Value>'
        "</KeyValueOfstringanyType></Parameters></Filter>"
    ) in xml
    assert "<Key>@b</Key>" in xml and ">x&lt;&amp;&gt;</Value>" in xml
    # parameters without a type are strings; unknown types and repeated keys are 400
    body = (
        b'<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml">'
        b'<RuleDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/'
        b'connect" xmlns:i="http://www.w3.org/2001/XMLSchema-instance">'
        b'<Filter i:type="SqlFilter"><SqlExpression>a = @a</SqlExpression><Parameters>%s'
        b"</Parameters></Filter></RuleDescription></content></entry>"
    )
    item = b"<KeyValueOfstringanyType><Key>@a</Key><Value%s>%s</Value></KeyValueOfstringanyType>"
    response = call(broker, api, "PUT", "/t/Subscriptions/s/Rules/plain",
                    body % (item % (b"", b"7")))  # fmt: skip
    assert response.status == 201, detail(response)
    assert client.get_rule("t", "s", "plain").filter.parameters == {"@a": "7"}
    response = call(broker, api, "PUT", "/t/Subscriptions/s/Rules/odd",
                    body % (item % (b' i:type="x:hexBinary"', b"00")))  # fmt: skip
    assert response.status == 400 and "hexBinary" in detail(response)
    response = call(broker, api, "PUT", "/t/Subscriptions/s/Rules/twice",
                    body % (item % (b"", b"1") + item % (b"", b"2")))  # fmt: skip
    assert response.status == 400 and "more than once" in detail(response)


def test_rules_stored_before_parameters_existed_still_load(broker_factory: Any) -> None:
    """Rule records written before ``sql_parameters`` / ``action_parameters`` existed."""
    old = ('[{"action": "SET sys.Label = \'old\'", "correlation": {}, "kind": "sql", '
           '"name": "legacy", "sql": "color = \'red\'"}, {"action": null, "correlation": '
           '{"properties": {"n": 1}, "subject": "vip"}, "kind": "correlation", "name": "vip", '
           '"sql": null}]')  # fmt: skip
    specs = load_rules(old)
    assert (specs[0].sql_parameters, specs[0].action_parameters) == ({}, {})
    # rules without parameters are written exactly as before (the configured rules stored
    # with a subscription are compared as text: a new format would reset API changes)
    assert dump_rules(specs) == old
    params = RuleSpec(
        "p", "sql", sql="a = @a", sql_parameters={"@a": datetime(2024, 1, 2), "@f": 1.0},
        action="SET b = @b", action_parameters={"@b": timedelta(seconds=-3), "@n": None},
    )  # fmt: skip
    assert load_rules(dump_rules([params])) == [params]

    config = make_config(topics={"t": {"Subscriptions": {"s": {}}}})
    broker = broker_factory(config)

    def store_old_rules() -> None:
        b = broker.broker
        entity = b.registry.subscriptions["t/subscriptions/s"].queue.entity
        configured, _ = b.store.rule_set(entity)
        b.store.save_rule_set(entity, configured, old)
        b.store.commit()

    broker.call(store_old_rules)
    broker.restart()
    client, _ = admin_client(broker, AdminApi(broker.broker))  # type: ignore[arg-type]
    rules = {r.name: r for r in client.list_rules("t", "s")}
    assert rules["legacy"].filter.sql_expression == "color = 'red'"
    assert not rules["legacy"].filter.parameters
    assert rules["vip"].filter.properties == {"n": 1}
    with broker.client() as sb:
        with sb.get_topic_sender("t") as sender:
            sender.send_messages([
                ServiceBusMessage("red", application_properties={"color": "red"}),
                ServiceBusMessage("blue", application_properties={"color": "blue"}),
            ])  # fmt: skip
        with sb.get_subscription_receiver("t", "s") as receiver:
            (got,) = receive_n(receiver, 1)
            assert (str(got), got.subject) == ("red", "old")
            receiver.complete_message(got)


# ---------------------------------------------------------------------- durability


def test_api_changes_survive_a_restart(client: Any, broker: BrokerHandle) -> None:
    client.create_queue("kept", max_delivery_count=7, user_metadata="m")
    client.create_topic("news")
    client.create_subscription("news", "s", lock_duration=timedelta(seconds=20))
    client.create_rule("news", "s", "only-a", filter=SqlRuleFilter("kind = 'a'"))
    q = client.get_queue("q")  # a Config.json queue changed through the API
    q.max_delivery_count = 9
    client.update_queue(q)
    client.delete_queue("short-lock")  # a Config.json queue deleted through the API
    send(broker, "kept", ServiceBusMessage("durable"))
    created = client.get_queue_runtime_properties("kept").created_at_utc

    broker.restart()
    client, _ = admin_client(broker, AdminApi(broker.broker))  # type: ignore[arg-type]
    kept = client.get_queue("kept")
    assert (kept.max_delivery_count, kept.user_metadata) == (7, "m")
    assert client.get_queue_runtime_properties("kept").active_message_count == 1
    assert client.get_subscription("news", "s").lock_duration == timedelta(seconds=20)
    assert {r.name for r in client.list_rules("news", "s")} == {"$Default", "only-a"}
    assert client.get_queue("q").max_delivery_count == 9
    with pytest.raises(ResourceNotFoundError, match="Queue 'short-lock' does not exist"):
        client.get_queue("short-lock")
    assert client.get_queue_runtime_properties("kept").created_at_utc == created
    with broker.client() as sb, sb.get_queue_receiver("kept") as receiver:
        (message,) = receive_n(receiver, 1)
        receiver.complete_message(message)


def test_config_changes_win_over_older_api_changes(client: Any, broker: BrokerHandle) -> None:
    q = client.get_queue("q")
    q.max_delivery_count = 9
    client.update_queue(q)
    client.delete_queue("short-lock")
    config = make_config({"q": {"MaxDeliveryCount": 4}, "short-lock": {"LockDuration": "PT6S"}})
    broker.restart(config)
    client, _ = admin_client(broker, AdminApi(broker.broker))  # type: ignore[arg-type]
    assert client.get_queue("q").max_delivery_count == 4  # the file changed q: file wins
    assert client.get_queue("short-lock").lock_duration == timedelta(seconds=6)  # back again
    client.delete_queue("short-lock")
    broker.restart(config)  # unchanged file: the deletion stands
    client, _ = admin_client(broker, AdminApi(broker.broker))  # type: ignore[arg-type]
    with pytest.raises(ResourceNotFoundError, match="Queue 'short-lock' does not exist"):
        client.get_queue("short-lock")
