"""The dashboard's entity endpoints: every setting and rule shown; queues, topics,
subscriptions and rules created, changed and deleted through the management API; forms the
service would refuse refused first, naming the field, with nothing sent. Every effect is
read back with the unmodified SDK's ``ServiceBusAdministrationClient``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.servicebus.management import (
    CorrelationRuleFilter,
    EntityStatus,
    ServiceBusAdministrationClient,
    SqlRuleFilter,
)

from replication.clock import ManualClock
from replication.servicebus.sas import mint
from tests.broker.conftest import BrokerHandle
from tests.dashboard.test_api import CONFIG, Api, _dashboard
from tests.dashboard.test_api import api as api  # the fixture, found by name

SUBSCRIPTION = "events/Subscriptions/eu"


@contextmanager
def _admin(api: Api) -> Iterator[ServiceBusAdministrationClient]:
    client = ServiceBusAdministrationClient.from_connection_string(
        api.handle.connection_string,
        retry_total=0,
        connection_verify=str(api.handle.data_dir / "tls" / "ca.pem"),
    )
    with client:
        yield client


def _refused(api: Api, route: str, body: dict[str, Any], **params: Any) -> tuple[str, str]:
    """The check's answer (what is wrong, and where) and the change's refusal agree."""
    checked = api.ok(route, {**body, "check": True}, **params)
    status, answer = api(route, body, **params)
    assert status == 400, answer
    assert (checked["field"], checked["refused"]) == (answer["field"], answer["error"])
    return answer["field"], answer["error"]


def test_every_setting_of_a_queue_topic_and_subscription_is_shown(api: Api) -> None:
    queue = api.ok("entity", entity="dedupe")
    assert (queue["kind"], queue["etag"]) == ("queue", queue["etag"] or "missing")
    settings = queue["settings"]
    assert settings["LockDuration"] == "PT1M" and settings["MaxDeliveryCount"] == "10"
    assert settings["RequiresDuplicateDetection"] == "true"
    assert settings["DuplicateDetectionHistoryTimeWindow"] == "PT1M"
    for name in (
        "DefaultMessageTimeToLive",
        "Status",
        "MaxSizeInMegabytes",
        "RequiresSession",
        "DeadLetteringOnMessageExpiration",
        "ForwardTo",
        "ForwardDeadLetteredMessagesTo",
        "AutoDeleteOnIdle",
        "EnableBatchedOperations",
        "EnablePartitioning",
        "UserMetadata",
    ):
        assert name in settings, name
    form = {f["name"]: f for f in queue["fields"]}
    assert form["RequiresSession"]["immutable"] and not form["LockDuration"]["immutable"]
    assert form["Status"]["choices"] == ["Active", "Disabled", "SendDisabled", "ReceiveDisabled"]
    topic = api.ok("entity", entity="events")
    assert topic["settings"]["SubscriptionCount"] == "2"
    assert {f["name"]: f for f in topic["fields"]}["Status"]["choices"] == [
        "Active",
        "Disabled",
        "SendDisabled",
    ]
    subscription = api.ok("entity", entity=SUBSCRIPTION)
    assert subscription["settings"]["DeadLetteringOnFilterEvaluationExceptions"] == "true"
    (rule,) = subscription["rules"]
    assert (rule["name"], rule["filter"], rule["form"]) == (
        "eu",
        "region = 'eu'",
        {"sql": "region = 'eu'"},
    )
    for path in ("nothing", f"{SUBSCRIPTION}/Rules/eu", "events/Subscriptions/none"):
        status, answer = api("entity", entity=path)
        assert status == 404 and f"no entity '{path}'" in answer["error"], answer


def test_a_queue_is_created_only_once_confirmed(api: Api) -> None:
    body = {
        "kind": "queue",
        "name": "orders",
        "check": True,
        "settings": {
            "LockDuration": "30",
            "MaxDeliveryCount": 3,
            "ForwardTo": "",
            "DeadLetteringOnMessageExpiration": True,
            "UserMetadata": "team a",
        },
    }
    plan = api.ok("entity/create", body, entity="")["plan"]
    assert plan == (
        "Create queue 'orders' in ns with LockDuration = PT30S; "
        "DeadLetteringOnMessageExpiration = true; MaxDeliveryCount = 3; UserMetadata = team a."
    )
    with _admin(api) as admin:
        with pytest.raises(ResourceNotFoundError):
            admin.get_queue("orders")  # a check sends nothing
        done = api.ok("entity/create", {**body, "check": False}, entity="")
        assert done["done"] == plan and done["path"] == "orders"
        queue = admin.get_queue("orders")
        assert queue.lock_duration == timedelta(seconds=30) and queue.max_delivery_count == 3
        assert queue.dead_lettering_on_message_expiration and queue.user_metadata == "team a"
        assert queue.status == EntityStatus.ACTIVE and queue.forward_to is None


def test_topics_and_subscriptions_are_created_with_their_settings(api: Api) -> None:
    api.ok(
        "entity/create",
        {
            "kind": "topic",
            "name": "audit",
            "settings": {
                "DefaultMessageTimeToLive": "P1D",
                "RequiresDuplicateDetection": True,
                "DuplicateDetectionHistoryTimeWindow": "PT5M",
            },
        },
        entity="",
    )
    api.ok(
        "entity/create",
        {
            "kind": "subscription",
            "topic": "audit",
            "name": "all",
            "settings": {"ForwardTo": "work", "AutoDeleteOnIdle": "PT1H", "RequiresSession": True},
        },
        entity="",
    )
    with _admin(api) as admin:
        topic = admin.get_topic("audit")
        assert topic.default_message_time_to_live == timedelta(days=1)
        assert topic.requires_duplicate_detection
        assert topic.duplicate_detection_history_time_window == timedelta(minutes=5)
        subscription = admin.get_subscription("audit", "all")
        assert subscription.forward_to and subscription.forward_to.endswith("/work")
        assert subscription.auto_delete_on_idle == timedelta(hours=1)
        assert subscription.requires_session
        (rule,) = admin.list_rules("audit", "all")
        assert rule.name == "$Default"


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"kind": "queue", "name": "bad name!"}, "name", "contains ' ' '!'"),
        ({"kind": "queue", "name": "q" * 261}, "name", "at most 260 are allowed"),
        ({"kind": "queue", "name": "/lead"}, "name", "must not start or end with '/'"),
        ({"kind": "subscription", "topic": "events", "name": "s" * 51}, "name", "at most 50"),
        ({"kind": "subscription", "topic": "events", "name": "a/b"}, "name", "contains '/'"),
        ({"kind": "subscription", "topic": "nope", "name": "s"}, "topic", "no topic 'nope'"),
        ({"kind": "queue", "name": "work"}, "name", "queue 'work' in ns exists"),
        ({"kind": "topic", "name": "work"}, "name", "queue 'work' in ns exists"),
        ({"kind": "table", "name": "t"}, "kind", "kind: one of queue, topic, subscription"),
        (
            {"settings": {"LockDuration": "PT2S"}},
            "LockDuration",
            "LockDuration: must be between PT5S and PT5M, got PT2S",
        ),
        (
            {"settings": {"LockDuration": "301"}},
            "LockDuration",
            "LockDuration: must be between PT5S and PT5M, got PT5M1S",
        ),
        ({"settings": {"LockDuration": "soon"}}, "LockDuration", "is not an ISO 8601 duration"),
        ({"settings": {"LockDuration": ""}}, "LockDuration", "lock duration: a duration"),
        (
            {"settings": {"MaxDeliveryCount": 0}},
            "MaxDeliveryCount",
            "MaxDeliveryCount: must be between 1 and 2147483647, got 0",
        ),
        ({"settings": {"MaxDeliveryCount": "ten"}}, "MaxDeliveryCount", "'ten' is not an integer"),
        (
            {"settings": {"DefaultMessageTimeToLive": "PT0.5S"}},
            "DefaultMessageTimeToLive",
            "must be at least PT1S",
        ),
        (
            {"settings": {"DuplicateDetectionHistoryTimeWindow": "PT10S"}},
            "DuplicateDetectionHistoryTimeWindow",
            "must be between PT20S and P7D, got PT10S",
        ),
        (
            {"settings": {"DuplicateDetectionHistoryTimeWindow": "P8D"}},
            "DuplicateDetectionHistoryTimeWindow",
            "must be between PT20S and P7D, got P8D",
        ),
        (
            {"settings": {"AutoDeleteOnIdle": "PT4M"}},
            "AutoDeleteOnIdle",
            "AutoDeleteOnIdle: must be at least PT5M, got PT4M",
        ),
        (
            {"settings": {"MaxSizeInMegabytes": 100}},
            "MaxSizeInMegabytes",
            "must be one of 1024, 2048, 3072, 4096, 5120, got 100",
        ),
        (
            {"settings": {"ForwardTo": "nowhere"}},
            "ForwardTo",
            "ForwardTo: the queue or topic 'nowhere' does not exist",
        ),
        (
            {"settings": {"ForwardDeadLetteredMessagesTo": SUBSCRIPTION}},
            "ForwardDeadLetteredMessagesTo",
            "does not exist",
        ),
        ({"settings": {"ForwardTo": "fresh"}}, "ForwardTo", "cannot forward to itself"),
        ({"settings": {"UserMetadata": "x" * 1025}}, "UserMetadata", "at most 1024"),
        ({"settings": {"Status": "Paused"}}, "Status", "'Paused' is not an entity status"),
        (
            {"kind": "topic", "settings": {"Status": "ReceiveDisabled"}},
            "Status",
            "ReceiveDisabled is not a topic's (Active, Disabled, SendDisabled)",
        ),
        (
            {"kind": "topic", "settings": {"LockDuration": "PT1M"}},
            "LockDuration",
            "LockDuration is not a setting of a topic",
        ),
    ],
)
def test_a_form_the_service_would_refuse_is_refused_first(
    api: Api, body: dict[str, Any], field: str, message: str
) -> None:
    sent = {"kind": "queue", "name": "fresh", **body}
    found, error = _refused(api, "entity/create", sent, entity="")
    assert found == field and message in error, error
    with _admin(api) as admin:  # nothing was sent
        names = {q.name for q in admin.list_queues()} | {t.name for t in admin.list_topics()}
        assert names == {"work", "dedupe", "sessions", "events"}
        assert {s.name for s in admin.list_subscriptions("events")} == {"eu", "all"}


def test_settings_change_and_the_status_switches(api: Api) -> None:
    etag = api.ok("entity", entity="work")["etag"]
    plan = api.ok(
        "entity/update",
        {"settings": {"LockDuration": "PT45S", "MaxDeliveryCount": 4}, "check": True},
        entity="work",
    )["plan"]
    assert (
        plan == "Change queue 'work' in ns: LockDuration: PT1M → PT45S; MaxDeliveryCount: 10 → 4."
    )
    assert api.handle.broker is not None
    clock = api.handle.broker.clock
    assert isinstance(clock, ManualClock)
    clock.advance(1)  # the ETag is the time of the last change
    api.ok(
        "entity/update",
        {"settings": {"LockDuration": "PT45S", "MaxDeliveryCount": 4}, "etag": etag},
        entity="work",
    )
    status = api.ok(
        "entity/update", {"settings": {"Status": "SendDisabled"}, "check": True}, entity="work"
    )["plan"]
    assert status == "Change queue 'work' in ns: Status: Active → SendDisabled (receives only)."
    api.ok("entity/update", {"settings": {"Status": "SendDisabled"}}, entity="work")
    api.ok("entity/update", {"settings": {"Status": "ReceiveDisabled"}}, entity=SUBSCRIPTION)
    with _admin(api) as admin:
        queue = admin.get_queue("work")
        assert queue.lock_duration == timedelta(seconds=45) and queue.max_delivery_count == 4
        assert queue.status == EntityStatus.SEND_DISABLED
        assert admin.get_subscription("events", "eu").status == EntityStatus.RECEIVE_DISABLED
    # the ETag the page saw is now stale: the service refuses, in its own words
    status, answer = api(
        "entity/update", {"settings": {"MaxDeliveryCount": 5}, "etag": etag}, entity="work"
    )
    assert status == 412 and answer["error"].startswith("the service refused (412): The entity")
    field, error = _refused(
        api, "entity/update", {"settings": {"RequiresSession": True}}, entity="work"
    )
    assert field == "RequiresSession" and "cannot be changed" in error
    field, error = _refused(
        api, "entity/update", {"settings": {"MaxDeliveryCount": 4}}, entity="work"
    )
    assert field == "settings" and error == "nothing to change on queue 'work' in ns"
    field, error = _refused(
        api, "entity/update", {"settings": {"Status": "SendDisabled"}}, entity=SUBSCRIPTION
    )
    assert "not a subscription's (Active, Disabled, ReceiveDisabled)" in error


def test_deletes_need_the_name_typed(api: Api) -> None:
    plan = api.ok("entity/delete", {"check": True}, entity="events")["plan"]
    assert plan.startswith("Delete topic 'events' in ns, its 2 subscription(s) and every ")
    status, answer = api("entity/delete", {"confirm": "event"}, entity="events")
    assert status == 400 and 'type the entity\'s name ("events")' in answer["error"]
    with _admin(api) as admin:
        assert admin.get_topic("events").name == "events"
        api.ok("entity/delete", {"confirm": SUBSCRIPTION}, entity=SUBSCRIPTION)
        assert {s.name for s in admin.list_subscriptions("events")} == {"all"}
        api.ok("entity/delete", {"confirm": "work"}, entity="work")
        with pytest.raises(ResourceNotFoundError):
            admin.get_queue("work")


def test_rules_are_added_changed_and_deleted(api: Api) -> None:
    sql = {"name": "big", "filter": {"sql": "amount > 100"}, "action": "SET tier = 'gold'"}
    plan = api.ok("rule/create", {**sql, "check": True}, entity=SUBSCRIPTION)["plan"]
    assert plan == (
        "Add rule 'big' of subscription 'eu' of topic 'events' in ns: filter "
        "amount > 100; action SET tier = 'gold'."
    )
    api.ok("rule/create", sql, entity=SUBSCRIPTION)
    correlation = {
        "name": "vip",
        "filter": {
            "correlation": {
                "CorrelationId": "c-1",
                "properties": [{"name": "priority", "type": "int", "value": "5"}],
            }
        },
    }
    api.ok("rule/create", correlation, entity=SUBSCRIPTION)
    with _admin(api) as admin:
        rules = {r.name: r for r in admin.list_rules("events", "eu")}
        assert isinstance(rules["big"].filter, SqlRuleFilter)
        assert rules["big"].filter.sql_expression == "amount > 100"
        assert rules["big"].action is not None
        assert rules["big"].action.sql_expression == "SET tier = 'gold'"
        assert isinstance(rules["vip"].filter, CorrelationRuleFilter)
        assert rules["vip"].filter.correlation_id == "c-1"
        assert rules["vip"].filter.properties == {"priority": 5}
        shown = {r["name"]: r for r in api.ok("entity", entity=SUBSCRIPTION)["rules"]}
        assert shown["vip"]["form"] == {
            "correlation": {
                "CorrelationId": "c-1",
                "properties": [{"name": "priority", "type": "int", "value": "5"}],
            }
        }
        api.ok(
            "rule/update", {"name": "big", "filter": {"sql": "amount > 500"}}, entity=SUBSCRIPTION
        )
        rule = admin.get_rule("events", "eu", "big")
        assert isinstance(rule.filter, SqlRuleFilter)
        assert rule.filter.sql_expression == "amount > 500"
        status, answer = api("rule/delete", {"name": "big", "confirm": "bi"}, entity=SUBSCRIPTION)
        assert status == 400 and '("big")' in answer["error"]
        api.ok("rule/delete", {"name": "big", "confirm": "big"}, entity=SUBSCRIPTION)
        assert {r.name for r in admin.list_rules("events", "eu")} == {"eu", "vip"}


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        (
            {"filter": {"sql": "region = "}},
            "filter",
            "line 1, column 9: expected an expression but found end of input",
        ),
        (
            {"filter": {"sql": "region == 'eu'"}},
            "filter",
            "line 1, column 9: expected an expression but found '='",
        ),
        (
            {"filter": {"sql": "region = 'eu'"}, "action": "SET"},
            "action",
            "line 1, column 4: expected a property name but found end of input",
        ),
        ({"filter": {"sql": "  "}}, "filter", "a SQL expression"),
        ({"filter": {"correlation": {}}}, "filter", "set at least one field or property"),
        ({"filter": {"correlation": {"Colour": "red"}}}, "filter", "Colour is not one of"),
        (
            {
                "filter": {
                    "correlation": {"properties": [{"name": "n", "type": "int", "value": "x"}]}
                }
            },
            "filter",
            "not a valid int",
        ),
        ({"name": "bad name", "filter": {"sql": "1=1"}}, "name", "contains ' '"),
        ({"name": "r" * 51, "filter": {"sql": "1=1"}}, "name", "at most 50"),
        ({"name": "eu", "filter": {"sql": "1=1"}}, "name", "already has a rule 'eu'"),
    ],
)
def test_a_rule_the_service_would_refuse_is_refused_first(
    api: Api, body: dict[str, Any], field: str, message: str
) -> None:
    found, error = _refused(api, "rule/create", {"name": "new", **body}, entity=SUBSCRIPTION)
    assert found == field and message in error, error
    with _admin(api) as admin:
        assert [r.name for r in admin.list_rules("events", "eu")] == ["eu"]


def test_rules_belong_to_subscriptions(api: Api) -> None:
    status, answer = api("rule/create", {"name": "r", "filter": {"sql": "1=1"}}, entity="work")
    assert (
        status == 400
        and answer["error"] == "queue 'work' in ns has no rules: only a subscription has"
    )


def test_off_loopback_entities_need_manage(broker_factory: Callable[..., BrokerHandle]) -> None:
    handle = broker_factory(CONFIG)
    dashboard = _dashboard(handle, require_token=True)
    api = Api(handle, dashboard)
    try:
        audience = f"sb://localhost:{handle.port}"
        reader = {"authorization": mint(audience, "reader", "READER_KEY")[0]}
        manager = {"authorization": mint(audience, "RootManageSharedAccessKey", "SAS_KEY_VALUE")[0]}
        for route, body in (
            ("entity", None),
            ("entity/update", {"settings": {"MaxDeliveryCount": 2}}),
            ("entity/delete", {"confirm": "work"}),
        ):
            status, answer = api(route, body, entity="work", headers=reader)
            assert status == 401 and "Manage" in answer["error"], answer
        create = {"kind": "queue", "name": "new"}
        status, answer = api("entity/create", create, entity="", headers=reader)
        assert status == 401 and "Manage" in answer["error"]
        status, answer = api("entity/create", create, entity="")
        assert status == 401 and "SAS token is required" in answer["error"]
        assert api("entity/create", create, entity="", headers=manager)[0] == 200
        assert api("entity", entity="new", headers=manager)[0] == 200
    finally:
        handle.run(dashboard.stop())
