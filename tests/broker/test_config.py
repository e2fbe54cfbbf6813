"""Config.json: the emulator's schema, Azure's limits, and error messages that point home."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from replication.broker.auth import EMULATOR_KEY, EMULATOR_RULE_NAME
from replication.broker.config import (
    DEFAULT_DUPLICATE_DETECTION_WINDOW,
    DEFAULT_LOCK_DURATION,
    DEFAULT_MAX_DELIVERY_COUNT,
    AuthorizationRule,
    BrokerConfig,
    ConfigError,
    CorrelationFilter,
    Namespace,
    QueueProperties,
    RuleProperties,
    SqlFilter,
    SqlRuleAction,
    Subscription,
    SubscriptionProperties,
    Topic,
    TopicProperties,
    UserConfig,
    load_config,
    load_config_text,
    parse_config,
    parse_duration,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

SAMPLE_SQL = "sys.MessageId = '123456' AND userProp1 = 'value1'"

# The official emulator's sample (azure-service-bus-emulator-installer README), trimmed.
EMULATOR_SAMPLE: dict[str, Any] = {
    "UserConfig": {
        "Namespaces": [{
            "Name": "sbemulatorns",
            "Queues": [{
                "Name": "queue.1",
                "Properties": {
                    "DeadLetteringOnMessageExpiration": False,
                    "DefaultMessageTimeToLive": "PT1H",
                    "DuplicateDetectionHistoryTimeWindow": "PT20S",
                    "ForwardDeadLetteredMessagesTo": "",
                    "ForwardTo": "",
                    "LockDuration": "PT1M",
                    "MaxDeliveryCount": 3,
                    "RequiresDuplicateDetection": False,
                    "RequiresSession": False,
                },
            }],
            "Topics": [{
                "Name": "topic.1",
                "Properties": {
                    "DefaultMessageTimeToLive": "PT1H",
                    "DuplicateDetectionHistoryTimeWindow": "PT20S",
                    "RequiresDuplicateDetection": False,
                },
                "Subscriptions": [
                    {
                        "Name": "subscription.1",
                        "Properties": {
                            "DeadLetteringOnMessageExpiration": False,
                            "DefaultMessageTimeToLive": "PT1H",
                            "LockDuration": "PT1M",
                            "MaxDeliveryCount": 3,
                            "ForwardDeadLetteredMessagesTo": "",
                            "ForwardTo": "",
                            "RequiresSession": False,
                        },
                        "Rules": [{
                            "Name": "app-prop-filter-1",
                            "Properties": {
                                "FilterType": "Correlation",
                                "CorrelationFilter": {
                                    "ContentType": "application/text",
                                    "CorrelationId": "id1",
                                    "Label": "subject1",
                                    "MessageId": "msgid1",
                                    "ReplyTo": "someQueue",
                                    "ReplyToSessionId": "sessionId",
                                    "SessionId": "session1",
                                    "To": "xyz",
                                },
                            },
                        }],
                    },
                    {
                        "Name": "subscription.2",
                        "Rules": [{
                            "Name": "user-prop-filter-1",
                            "Properties": {
                                "FilterType": "Correlation",
                                "CorrelationFilter": {"Properties": {"prop3": "value3"}},
                            },
                        }],
                    },
                    {"Name": "subscription.3"},
                    {
                        "Name": "subscription.4",
                        "Rules": [{
                            "Name": "sql-filter-1",
                            "Properties": {
                                "FilterType": "Sql",
                                "SqlFilter": {"SqlExpression": SAMPLE_SQL},
                                "Action": {"SqlExpression": "SET sys.To = 'Entity'"},
                            },
                        }],
                    },
                ],
            }],
        }],
        "Logging": {"Type": "File"},
    }
}  # fmt: skip


def config(**namespace: Any) -> dict[str, Any]:
    """A minimal valid document; keyword arguments go into the namespace object."""
    ns: dict[str, Any] = {"Name": "sbemulatorns", "Queues": [], "Topics": []}
    ns.update(namespace)
    return {"UserConfig": {"Namespaces": [ns], "Logging": {"Type": "Console"}}}


def write(tmp_path: Path, data: Any, name: str = "Config.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data, indent=2))
    return path


def load_error(tmp_path: Path, data: Any, **kwargs: Any) -> tuple[Path, ConfigError]:
    path = write(tmp_path, data)
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}") as info:
        load_config(path, **kwargs)
    return path, info.value


def assert_mentions(error: ConfigError, path: Path, field: str, *reasons: str) -> None:
    message = str(error)
    assert str(path) in message, message
    assert field in message, message
    for reason in reasons:
        assert reason in message, message
    assert any(p.path == field for p in error.problems), error.problems


NS = "UserConfig.Namespaces[0]"


# ---------------------------------------------------------------------- valid files


def test_repo_sample_config_loads() -> None:
    cfg = load_config(REPO_ROOT / "Config.json")
    assert cfg.namespace.name == "sbemulatorns"
    assert [q.name for q in cfg.namespace.queues] == ["queue.1", "orders", "orders-sessions"]

    default = cfg.queue("queue.1")
    assert default is not None
    assert default.properties == QueueProperties()

    orders = cfg.queue("orders")
    assert orders is not None
    assert orders.properties.max_delivery_count == 3
    assert orders.properties.lock_duration == timedelta(seconds=30)
    assert orders.properties.dead_lettering_on_message_expiration is True
    assert orders.properties.requires_duplicate_detection is True
    assert orders.properties.duplicate_detection_history_time_window == timedelta(seconds=20)

    sessions = cfg.queue("orders-sessions")
    assert sessions is not None and sessions.properties.requires_session is True

    topic = cfg.topic("topic.1")
    assert topic is not None
    assert [s.name for s in topic.subscriptions] == [
        "subscription.1", "subscription.2", "subscription.3",
    ]  # fmt: skip
    sub1, sub2, sub3 = topic.subscriptions
    assert sub1.rules == []
    assert sub1.properties.forward_to is None  # "" in the file
    (correlation,) = sub2.rules
    assert correlation.properties.filter_type == "Correlation"
    assert correlation.properties.correlation_filter == CorrelationFilter(
        ContentType="application/json", Properties={"region": "eu"}
    )
    (sql,) = sub3.rules
    assert sql.properties.sql_filter == SqlFilter(
        SqlExpression="priority > 5 AND sys.Label = 'order'"
    )
    assert sql.properties.action == SqlRuleAction(SqlExpression="SET routed = 'high'")
    assert cfg.logging.type == "File"
    assert cfg.logging.to_file and not cfg.logging.to_console


def test_official_emulator_sample_loads(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, EMULATOR_SAMPLE))
    queue = cfg.queue("queue.1")
    assert queue is not None
    assert queue.properties.default_message_time_to_live == timedelta(hours=1)
    assert queue.properties.forward_to is None
    assert queue.properties.forward_dead_lettered_messages_to is None
    topic = cfg.topic("topic.1")
    assert topic is not None
    sub1 = topic.subscription("subscription.1")
    assert sub1 is not None
    flt = sub1.rules[0].properties.correlation_filter
    assert flt is not None
    assert (flt.content_type, flt.correlation_id, flt.label, flt.message_id) == (
        "application/text", "id1", "subject1", "msgid1",
    )  # fmt: skip
    assert (flt.reply_to, flt.reply_to_session_id, flt.session_id, flt.to) == (
        "someQueue", "sessionId", "session1", "xyz",
    )  # fmt: skip
    assert flt.properties is None
    sub4 = topic.subscription("subscription.4")
    assert sub4 is not None
    assert sub4.rules[0].properties.action == SqlRuleAction(SqlExpression="SET sys.To = 'Entity'")


def test_emulator_prover_style_file_without_topics_loads(tmp_path: Path) -> None:
    # The emulator repo's own Config/Prover/Config.json leaves "Topics" out.
    data = config()
    del data["UserConfig"]["Namespaces"][0]["Topics"]
    data["UserConfig"]["Namespaces"][0]["Queues"] = [{"Name": "background-task"}]
    cfg = load_config(write(tmp_path, data))
    assert cfg.namespace.topics == []
    assert cfg.queue("background-task") is not None


def test_azure_defaults_apply_when_properties_are_left_out(tmp_path: Path) -> None:
    data = config(
        Queues=[{"Name": "q"}],
        Topics=[{"Name": "t", "Subscriptions": [{"Name": "s"}]}],
    )
    cfg = load_config(write(tmp_path, data))
    queue = cfg.queue("q")
    assert queue is not None
    props = queue.properties
    assert props.lock_duration == DEFAULT_LOCK_DURATION == timedelta(minutes=1)
    assert props.max_delivery_count == DEFAULT_MAX_DELIVERY_COUNT == 10
    assert props.default_message_time_to_live is None  # never expires
    assert props.duplicate_detection_history_time_window == DEFAULT_DUPLICATE_DETECTION_WINDOW
    assert timedelta(minutes=10) == DEFAULT_DUPLICATE_DETECTION_WINDOW
    assert not props.requires_session and not props.requires_duplicate_detection
    assert not props.dead_lettering_on_message_expiration
    assert props.forward_to is None and props.forward_dead_lettered_messages_to is None
    topic = cfg.topic("t")
    assert topic is not None
    assert topic.properties == TopicProperties()
    subscription = topic.subscription("s")
    assert subscription is not None
    assert subscription.properties == SubscriptionProperties()
    assert subscription.properties.lock_duration == timedelta(minutes=1)
    assert subscription.properties.max_delivery_count == 10


def test_topic_without_subscriptions_is_allowed(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, config(Topics=[{"Name": "lonely"}])))
    topic = cfg.topic("lonely")
    assert topic is not None and topic.subscriptions == []


def test_subscription_without_rules_gets_the_default_rule(tmp_path: Path) -> None:
    data = config(Topics=[{"Name": "t", "Subscriptions": [{"Name": "s"}]}])
    cfg = load_config(write(tmp_path, data))
    topic = cfg.topic("t")
    assert topic is not None
    sub = topic.subscription("s")
    assert sub is not None
    (rule,) = sub.effective_rules()
    assert rule.name == "$Default"
    assert rule.properties.filter_type == "Sql"
    assert rule.properties.sql_filter == SqlFilter(SqlExpression="1=1")


def test_lookups_are_case_insensitive_and_keep_the_configured_spelling(tmp_path: Path) -> None:
    data = config(
        Queues=[{"Name": "Orders.EU"}],
        Topics=[{"Name": "Events", "Subscriptions": [{"Name": "Audit.Log"}]}],
    )
    cfg = load_config(write(tmp_path, data))
    queue = cfg.queue("orders.eu")
    assert queue is not None and queue.name == "Orders.EU"
    assert cfg.queue("ORDERS.EU") is queue
    assert cfg.namespace.queue("oRdErS.eU") is queue
    assert cfg.queue("orders") is None
    assert cfg.queue("events") is None  # a topic, not a queue
    topic = cfg.topic("EVENTS")
    assert topic is not None and topic.name == "Events"
    sub = topic.subscription("audit.log")
    assert sub is not None and sub.name == "Audit.Log"
    assert topic.subscription("nope") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PT30S", timedelta(seconds=30)),
        ("PT1M", timedelta(minutes=1)),
        ("PT1H", timedelta(hours=1)),
        ("P14D", timedelta(days=14)),
        ("P1DT2H3M4S", timedelta(days=1, hours=2, minutes=3, seconds=4)),
        ("PT1.5S", timedelta(seconds=1.5)),
        ("P1W", timedelta(days=7)),
        ("P1M", timedelta(days=30)),  # .NET XmlConvert: a month is 30 days
        ("P1Y", timedelta(days=365)),  # ... and a year 365
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


def test_time_to_live_longer_than_the_emulator_allows_is_accepted(tmp_path: Path) -> None:
    data = config(Queues=[{"Name": "q", "Properties": {"DefaultMessageTimeToLive": "P14D"}}])
    queue = load_config(write(tmp_path, data)).queue("q")
    assert queue is not None
    assert queue.properties.default_message_time_to_live == timedelta(days=14)


def test_azure_max_time_to_live_means_unlimited(tmp_path: Path) -> None:
    timespan_max = "P10675199DT2H48M5.4775807S"
    data = config(Queues=[{"Name": "q", "Properties": {"DefaultMessageTimeToLive": timespan_max}}])
    queue = load_config(write(tmp_path, data)).queue("q")
    assert queue is not None and queue.properties.default_message_time_to_live is None


@pytest.mark.parametrize("value", ["PT5S", "PT5M", "PT2M30S"])
def test_lock_duration_bounds_are_inclusive(tmp_path: Path, value: str) -> None:
    data = config(Queues=[{"Name": "q", "Properties": {"LockDuration": value}}])
    assert load_config(write(tmp_path, data)).queue("q") is not None


@pytest.mark.parametrize("value", ["PT5S", "P7D"])  # PT5S: the emulator's own minimum
def test_duplicate_detection_window_bounds_are_inclusive(tmp_path: Path, value: str) -> None:
    data = config(
        Queues=[{"Name": "q", "Properties": {"DuplicateDetectionHistoryTimeWindow": value}}]
    )
    assert load_config(write(tmp_path, data)).queue("q") is not None


def test_valid_names(tmp_path: Path) -> None:
    long_name = "a" * 260
    data = config(
        Queues=[
            {"Name": "a"}, {"Name": "a.b-c_d"}, {"Name": "path/to/queue"}, {"Name": long_name},
            {"Name": "_leading.underscore."},
        ],
        Topics=[{"Name": "t", "Subscriptions": [{"Name": "s" * 50}]}],
    )  # fmt: skip
    cfg = load_config(write(tmp_path, data))
    assert cfg.queue("PATH/TO/QUEUE") is not None
    assert cfg.queue(long_name.upper()) is not None


def test_forwarding_to_existing_entities_case_insensitively(tmp_path: Path) -> None:
    data = config(
        Queues=[
            {"Name": "in", "Properties": {
                "ForwardTo": "OUT", "ForwardDeadLetteredMessagesTo": "dlq",
            }},
            {"Name": "out"}, {"Name": "dlq"},
        ],
        Topics=[{"Name": "t", "Subscriptions": [{"Name": "s", "Properties": {"ForwardTo": "In"}}]}],
    )  # fmt: skip
    cfg = load_config(write(tmp_path, data))
    queue = cfg.queue("in")
    assert queue is not None
    assert queue.properties.forward_to == "OUT"
    assert queue.properties.forward_dead_lettered_messages_to == "dlq"


def test_correlation_user_property_types_are_kept(tmp_path: Path) -> None:
    flt = {"Properties": {"s": "x", "i": 3, "f": 1.5, "b": True}}
    data = config(Topics=[{"Name": "t", "Subscriptions": [{"Name": "s", "Rules": [
        {"Name": "r", "Properties": {"FilterType": "Correlation", "CorrelationFilter": flt}},
    ]}]}])  # fmt: skip
    topic = load_config(write(tmp_path, data)).topic("t")
    assert topic is not None
    sub = topic.subscription("s")
    assert sub is not None
    cf = sub.rules[0].properties.correlation_filter
    assert cf is not None and cf.properties == {"s": "x", "i": 3, "f": 1.5, "b": True}
    assert cf.properties is not None and cf.properties["b"] is True


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "Config.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(config()).encode())
    assert load_config(path).namespace.name == "sbemulatorns"


def test_parse_config_accepts_a_dict_and_names_the_source() -> None:
    assert parse_config(config()).namespace.name == "sbemulatorns"
    bad = config(Queues=[{"Name": "q", "Properties": {"LockDuration": "PT1H"}}])
    with pytest.raises(ConfigError, match=r"^in-memory: ") as info:
        parse_config(bad, "in-memory")
    assert f"{NS}.Queues[0].Properties.LockDuration" in str(info.value)


def test_models_use_the_emulator_property_names() -> None:
    def aliases(model: Any) -> set[str]:
        return {str(f.alias) for f in model.model_fields.values()}

    assert aliases(BrokerConfig) == {"UserConfig"}
    assert aliases(UserConfig) == {
        "Namespaces", "Logging",
        "NamespaceConfig", "LoggingConfig",  # the Event Hubs emulator's (eventhubs/config.py)
    }  # fmt: skip
    assert aliases(Namespace) == {"Name", "Queues", "Topics", "AuthorizationRules"}
    assert aliases(QueueProperties) == {
        "DeadLetteringOnMessageExpiration", "DefaultMessageTimeToLive",
        "DuplicateDetectionHistoryTimeWindow", "ForwardDeadLetteredMessagesTo", "ForwardTo",
        "LockDuration", "MaxDeliveryCount", "RequiresDuplicateDetection", "RequiresSession",
        "MaxSizeInMegabytes",  # ours: the emulator's schema has no quota
    }  # fmt: skip
    assert aliases(TopicProperties) == {
        "DefaultMessageTimeToLive", "DuplicateDetectionHistoryTimeWindow",
        "RequiresDuplicateDetection", "MaxSizeInMegabytes",
    }  # fmt: skip
    assert aliases(Topic) == {"Name", "Properties", "Subscriptions"}
    assert aliases(Subscription) == {"Name", "Properties", "Rules"}
    assert aliases(SubscriptionProperties) == {
        "DeadLetteringOnMessageExpiration", "DefaultMessageTimeToLive", "LockDuration",
        "MaxDeliveryCount", "ForwardDeadLetteredMessagesTo", "ForwardTo", "RequiresSession",
    }  # fmt: skip
    assert aliases(RuleProperties) == {"FilterType", "CorrelationFilter", "SqlFilter", "Action"}
    assert aliases(CorrelationFilter) == {
        "ContentType", "CorrelationId", "Label", "MessageId", "ReplyTo", "ReplyToSessionId",
        "SessionId", "To", "Properties",
    }  # fmt: skip
    assert aliases(AuthorizationRule) == {"Name", "Key", "KeyEnvironmentVariable", "Rights"}


def test_direct_model_validation_reports_cross_entity_problems() -> None:
    data = config(Queues=[{"Name": "q"}, {"Name": "Q"}])
    with pytest.raises(ValidationError, match=r"Queues\[1\]\.Name: duplicate entity name 'Q'"):
        BrokerConfig.model_validate(data)


# ---------------------------------------------------------------------- error reporting

Mutation = Callable[[dict[str, Any]], None]


def _queue_props(**props: Any) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        data["UserConfig"]["Namespaces"][0]["Queues"] = [
            {"Name": "first"}, {"Name": "second", "Properties": props},
        ]  # fmt: skip

    return mutate


def _namespace(**changes: Any) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        data["UserConfig"]["Namespaces"][0].update(copy.deepcopy(changes))

    return mutate


def _rule(properties: Any, name: str = "r") -> Mutation:
    return _namespace(Topics=[{"Name": "t", "Subscriptions": [
        {"Name": "s", "Rules": [{"Name": name, "Properties": properties}]},
    ]}])  # fmt: skip


Q1 = f"{NS}.Queues[1].Properties"
RULE = f"{NS}.Topics[0].Subscriptions[0].Rules[0]"

ERROR_CASES: list[tuple[str, Mutation, str, tuple[str, ...]]] = [
    ("lock too long", _queue_props(LockDuration="PT10M"), f"{Q1}.LockDuration",
     ("must be between PT5S and PT5M", "got PT10M", "queue 'second'")),
    ("lock too short", _queue_props(LockDuration="PT1S"), f"{Q1}.LockDuration",
     ("must be between PT5S and PT5M", "got PT1S")),
    ("lock not ISO", _queue_props(LockDuration="1 minute"), f"{Q1}.LockDuration",
     ("'1 minute' is not an ISO 8601 duration",)),
    ("lock a number", _queue_props(LockDuration=60), f"{Q1}.LockDuration",
     ("expected an ISO 8601 duration string",)),
    ("negative duration", _queue_props(LockDuration="-PT1M"), f"{Q1}.LockDuration",
     ("negative duration",)),
    ("delivery count zero", _queue_props(MaxDeliveryCount=0), f"{Q1}.MaxDeliveryCount",
     ("must be at least 1, got 0",)),
    ("delivery count string", _queue_props(MaxDeliveryCount="3"), f"{Q1}.MaxDeliveryCount",
     ('expected an integer, got "3"',)),
    ("bool as string", _queue_props(RequiresSession="true"), f"{Q1}.RequiresSession",
     ('expected a boolean, got "true"',)),
    ("dedup window too short", _queue_props(DuplicateDetectionHistoryTimeWindow="PT4S"),
     f"{Q1}.DuplicateDetectionHistoryTimeWindow", ("must be between PT5S and P7D",)),
    ("dedup window too long", _queue_props(DuplicateDetectionHistoryTimeWindow="P8D"),
     f"{Q1}.DuplicateDetectionHistoryTimeWindow", ("must be between PT5S and P7D",)),
    ("ttl zero", _queue_props(DefaultMessageTimeToLive="PT0S"), f"{Q1}.DefaultMessageTimeToLive",
     ("at least PT1S",)),
    ("misspelt property", _queue_props(LockDuraton="PT1M"), f"{Q1}.LockDuraton",
     ("unknown property 'LockDuraton'", "did you mean 'LockDuration'?")),
    ("wrong case property", _queue_props(lockDuration="PT1M"), f"{Q1}.lockDuration",
     ("unknown property 'lockDuration'", "did you mean 'LockDuration'?", "case matters")),
    ("unrelated property", _queue_props(Colour="blue"), f"{Q1}.Colour",
     ("unknown property 'Colour'", "expected one of: DeadLetteringOnMessageExpiration")),
    ("topic-only property on a queue", _queue_props(SupportOrdering=True),
     f"{Q1}.SupportOrdering", ("unknown property 'SupportOrdering'",)),
    ("queue name characters", _namespace(Queues=[{"Name": "bad name!"}]),
     f"{NS}.Queues[0].Name", ("'bad name!' contains ' ' '!'",)),
    ("queue name leading slash", _namespace(Queues=[{"Name": "/lead"}]),
     f"{NS}.Queues[0].Name", ("must not start or end with '/'",)),
    ("queue name trailing slash", _namespace(Queues=[{"Name": "trail/"}]),
     f"{NS}.Queues[0].Name", ("must not start or end with '/'",)),
    ("queue name empty segment", _namespace(Queues=[{"Name": "a//b"}]),
     f"{NS}.Queues[0].Name", ("empty path segment",)),
    ("queue name too long", _namespace(Queues=[{"Name": "q" * 261}]),
     f"{NS}.Queues[0].Name", ("261 characters; at most 260",)),
    ("queue name empty", _namespace(Queues=[{"Name": ""}]),
     f"{NS}.Queues[0].Name", ("must not be empty",)),
    ("queue name missing", _namespace(Queues=[{"Properties": {}}]),
     f"{NS}.Queues[0].Name", ("required property 'Name' is missing",)),
    ("subscription name too long",
     _namespace(Topics=[{"Name": "t", "Subscriptions": [{"Name": "s" * 51}]}]),
     f"{NS}.Topics[0].Subscriptions[0].Name", ("at most 50",)),
    ("subscription name with slash",
     _namespace(Topics=[{"Name": "t", "Subscriptions": [{"Name": "a/b"}]}]),
     f"{NS}.Topics[0].Subscriptions[0].Name", ("contains '/'",)),
    ("namespace name", _namespace(Name="ns"), f"{NS}.Name", ("6-50 letters",)),
    ("duplicate queues", _namespace(Queues=[{"Name": "orders"}, {"Name": "ORDERS"}]),
     f"{NS}.Queues[1].Name",
     ("duplicate entity name 'ORDERS'", "Queues[0] is already named 'orders'", "case-insensitive")),
    ("queue and topic share a name", _namespace(Queues=[{"Name": "x"}], Topics=[{"Name": "X"}]),
     f"{NS}.Topics[0].Name", ("duplicate entity name 'X'", "queues and topics share")),
    ("duplicate subscriptions",
     _namespace(Topics=[{"Name": "t", "Subscriptions": [{"Name": "s"}, {"Name": "S"}]}]),
     f"{NS}.Topics[0].Subscriptions[1].Name", ("duplicate subscription name 'S'",)),
    ("duplicate rules", _namespace(Topics=[{"Name": "t", "Subscriptions": [{"Name": "s", "Rules": [
        {"Name": "r", "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "1=1"}}},
        {"Name": "R", "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "1=1"}}},
    ]}]}]), f"{RULE[:-3]}[1].Name", ("duplicate rule name 'R'",)),
    ("forward to nowhere", _queue_props(ForwardTo="frist"), f"{Q1}.ForwardTo",
     ("'frist' is not a queue or topic in namespace 'sbemulatorns'", "did you mean 'first'?")),
    ("forward to itself", _queue_props(ForwardTo="SECOND"), f"{Q1}.ForwardTo",
     ("queue 'second' cannot forward to itself",)),
    ("dead letters to nowhere", _queue_props(ForwardDeadLetteredMessagesTo="dlq"),
     f"{Q1}.ForwardDeadLetteredMessagesTo", ("'dlq' is not a queue or topic",)),
    ("subscription forwards to nowhere", _namespace(Topics=[{"Name": "t", "Subscriptions": [
        {"Name": "s", "Properties": {"ForwardTo": "gone"}},
    ]}]), f"{NS}.Topics[0].Subscriptions[0].Properties.ForwardTo",
     ("'gone' is not a queue or topic", "subscription 's'")),
    ("forward to a bad name", _queue_props(ForwardTo="no way"), f"{Q1}.ForwardTo",
     ("contains ' '",)),
    ("correlation without filter", _rule({"FilterType": "Correlation"}), f"{RULE}.Properties",
     ("FilterType is 'Correlation' but CorrelationFilter is missing",)),
    ("sql without filter", _rule({"FilterType": "Sql"}), f"{RULE}.Properties",
     ("FilterType is 'Sql' but SqlFilter is missing",)),
    ("both filters", _rule({
        "FilterType": "Sql", "SqlFilter": {"SqlExpression": "1=1"},
        "CorrelationFilter": {"To": "x"},
    }), f"{RULE}.Properties", ("a CorrelationFilter is given too",)),
    ("filter type case", _rule({"FilterType": "correlation", "CorrelationFilter": {"To": "x"}}),
     f"{RULE}.Properties.FilterType",
     ("\"correlation\" is not one of 'Correlation', 'Sql'", "did you mean 'Correlation'?")),
    ("filter type missing", _rule({"SqlFilter": {"SqlExpression": "1=1"}}),
     f"{RULE}.Properties.FilterType", ("required property 'FilterType' is missing",)),
    ("empty correlation filter", _rule({"FilterType": "Correlation", "CorrelationFilter": {}}),
     f"{RULE}.Properties.CorrelationFilter", ("at least one property",)),
    ("empty user properties",
     _rule({"FilterType": "Correlation", "CorrelationFilter": {"Properties": {}}}),
     f"{RULE}.Properties.CorrelationFilter.Properties", ("at least one property",)),
    ("nested user property",
     _rule({"FilterType": "Correlation", "CorrelationFilter": {"Properties": {"a": {"b": 1}}}}),
     f"{RULE}.Properties.CorrelationFilter.Properties",
     ("property 'a' must be a string, number or boolean",)),
    ("misspelt correlation field",
     _rule({"FilterType": "Correlation", "CorrelationFilter": {"CorelationId": "x"}}),
     f"{RULE}.Properties.CorrelationFilter.CorelationId", ("did you mean 'CorrelationId'?",)),
    ("empty sql", _rule({"FilterType": "Sql", "SqlFilter": {"SqlExpression": " "}}),
     f"{RULE}.Properties.SqlFilter.SqlExpression", ("must not be empty",)),
    ("rule properties missing", _namespace(Topics=[{"Name": "t", "Subscriptions": [
        {"Name": "s", "Rules": [{"Name": "r"}]},
    ]}]), f"{RULE}.Properties", ("required property 'Properties' is missing", "rule 'r'")),
    ("rule name", _rule({"FilterType": "Sql", "SqlFilter": {"SqlExpression": "1=1"}}, "r#1"),
     f"{RULE}.Name", ("rule name 'r#1' contains '#'",)),
    ("queues not a list", _namespace(Queues={"Name": "q"}), f"{NS}.Queues",
     ("expected an array, got an object",)),
    ("queue not an object", _namespace(Queues=["q"]), f"{NS}.Queues[0]",
     ("expected an object, got \"q\"",)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("mutate", "field", "reasons"),
    [case[1:] for case in ERROR_CASES],
    ids=[case[0] for case in ERROR_CASES],
)
def test_errors_name_file_field_and_reason(
    tmp_path: Path, mutate: Mutation, field: str, reasons: tuple[str, ...]
) -> None:
    data = config()
    mutate(data)
    path, error = load_error(tmp_path, data)
    assert_mentions(error, path, field, *reasons)
    problem = next(p for p in error.problems if p.path == field)
    assert problem.line is not None  # every one of these can be located in the file


def test_logging_type_is_checked(tmp_path: Path) -> None:
    data = config()
    data["UserConfig"]["Logging"]["Type"] = "Files"
    path, error = load_error(tmp_path, data)
    assert_mentions(
        error, path, "UserConfig.Logging.Type",
        "\"Files\" is not one of 'File', 'Console', 'File,Console', 'Console,File'",
        "did you mean 'File'?",
    )  # fmt: skip


def test_logging_is_required(tmp_path: Path) -> None:
    data = config()
    del data["UserConfig"]["Logging"]
    path, error = load_error(tmp_path, data)
    assert_mentions(error, path, "UserConfig.Logging", "required property 'Logging' is missing")


def test_exactly_one_namespace(tmp_path: Path) -> None:
    data = config()
    data["UserConfig"]["Namespaces"].append(copy.deepcopy(data["UserConfig"]["Namespaces"][0]))
    path, error = load_error(tmp_path, data)
    assert_mentions(error, path, "UserConfig.Namespaces", "exactly one namespace", "got 2")
    data["UserConfig"]["Namespaces"] = []
    path, error = load_error(tmp_path, data)
    assert_mentions(error, path, "UserConfig.Namespaces", "got 0")


def test_the_user_config_wrapper_is_required(tmp_path: Path) -> None:
    path, error = load_error(tmp_path, config()["UserConfig"])
    assert_mentions(error, path, "UserConfig", "required property 'UserConfig' is missing")
    assert_mentions(error, path, "Namespaces", "unknown property 'Namespaces'")


def test_misspelt_top_level_key(tmp_path: Path) -> None:
    path, error = load_error(tmp_path, {"UserConfg": config()["UserConfig"]})
    assert_mentions(error, path, "UserConfg", "did you mean 'UserConfig'?")


def test_document_must_be_an_object(tmp_path: Path) -> None:
    path, error = load_error(tmp_path, [1, 2])
    assert str(error) == f"{path}:1:1: expected an object, got an array"


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    data = config(Queues=[
        {"Name": "a", "Properties": {"LockDuration": "PT1H"}},
        {"Name": "b", "Properties": {"MaxDeliveryCount": -1}},
        {"Name": "c", "Properties": {"Bogus": 1}},
    ])  # fmt: skip
    _, error = load_error(tmp_path, data)
    assert len(error.problems) == 3
    message = str(error)
    assert len(message.splitlines()) == 3  # one line each, in file order
    for field in ("Queues[0].Properties.LockDuration", "Queues[1].Properties.MaxDeliveryCount",
                  "Queues[2].Properties.Bogus"):  # fmt: skip
        assert f"{NS}.{field}" in message


def test_line_and_column_point_at_the_offending_property(tmp_path: Path) -> None:
    text = """{
  "UserConfig": {
    "Namespaces": [
      {
        "Name": "sbemulatorns",
        "Queues": [
          { "Name": "ok" },
          {
            "Name": "slow",
            "Properties": {
              "LockDuration": "PT10M"
            }
          }
        ],
        "Topics": []
      }
    ],
    "Logging": { "Type": "File" }
  }
}
"""
    path, error = load_error(tmp_path, text)
    (problem,) = error.problems
    assert (problem.line, problem.column) == (11, 15)
    assert str(error).startswith(f"{path}:11:15: {NS}.Queues[1].Properties.LockDuration: ")
    assert problem.context == "queue 'slow'"


def test_missing_property_points_at_its_parent_object(tmp_path: Path) -> None:
    text = (
        '{\n  "UserConfig": {\n    "Namespaces": [\n      {"Queues": []}\n    ],\n'
        '    "Logging": {"Type": "File"}\n  }\n}\n'
    )
    path, error = load_error(tmp_path, text)
    (problem,) = error.problems
    assert problem.path == f"{NS}.Name"
    assert problem.line == 4
    assert f"{path}:4:7: {NS}.Name: required property 'Name' is missing" in str(error)


def test_invalid_json_gives_line_and_column(tmp_path: Path) -> None:
    text = '{\n  "UserConfig": {\n    "Namespaces": [,]\n  }\n}\n'
    path, error = load_error(tmp_path, text)
    assert str(error).startswith(f"{path}:3:20: invalid JSON: Expecting value")
    (problem,) = error.problems
    assert (problem.line, problem.column) == (3, 20)


def test_duplicate_json_keys_are_refused(tmp_path: Path) -> None:
    text = '{"UserConfig": {\n  "Namespaces": [],\n  "Namespaces": []\n}}'
    path, error = load_error(tmp_path, text)
    assert str(error) == (
        f"{path}:3:3: UserConfig.Namespaces: property 'Namespaces' appears more than once"
    )


def test_unreadable_and_non_utf8_files(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "Config.json"
    with pytest.raises(
        ConfigError, match="cannot read the file: No such file or directory"
    ) as info:
        load_config(missing)
    assert str(info.value) == f"{missing}: cannot read the file: No such file or directory"
    binary = tmp_path / "Config.json"
    binary.write_bytes(b'{"UserConfig": "\xff"}')
    with pytest.raises(ConfigError, match="not UTF-8") as info:
        load_config(binary)
    assert str(binary) in str(info.value) and "not UTF-8" in str(info.value)


def test_load_config_text_names_its_source() -> None:
    with pytest.raises(ConfigError, match="required property 'UserConfig' is missing") as info:
        load_config_text("{}", "inline.json")
    assert (
        str(info.value) == "inline.json:1:1: UserConfig: required property 'UserConfig' is missing"
    )


# ---------------------------------------------------------------------- authorization rules


def test_without_rules_the_emulator_rule_applies(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, config()))
    (rule,) = cfg.rules()
    assert rule.name == EMULATOR_RULE_NAME == "RootManageSharedAccessKey"
    assert rule.key == EMULATOR_KEY == "SAS_KEY_VALUE"
    assert rule.rights == {"Manage", "Send", "Listen"}


def test_inline_and_environment_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BROKER_LISTEN_KEY", "from-the-environment")
    data = config(AuthorizationRules=[
        {"Name": "sender", "Key": "inline-key", "Rights": ["Send"]},
        {"Name": "reader", "KeyEnvironmentVariable": "BROKER_LISTEN_KEY", "Rights": ["Listen"]},
        {"Name": "admin", "Key": "admin-key", "Rights": ["Manage"]},
    ])  # fmt: skip
    cfg = load_config(write(tmp_path, data))
    sender, reader, admin = cfg.rules()
    assert (sender.name, sender.key, sender.rights) == ("sender", "inline-key", {"Send"})
    assert (reader.name, reader.key, reader.rights) == (
        "reader", "from-the-environment", {"Listen"},
    )  # fmt: skip
    assert admin.rights == {"Manage", "Send", "Listen"}  # Manage implies the others
    assert "inline-key" not in repr(sender)


def test_environment_can_be_passed_explicitly(tmp_path: Path) -> None:
    data = config(AuthorizationRules=[
        {"Name": "r", "KeyEnvironmentVariable": "ONLY_IN_MAPPING", "Rights": ["Send"]},
    ])  # fmt: skip
    cfg = load_config(write(tmp_path, data), environ={"ONLY_IN_MAPPING": "k"})
    assert cfg.rules()[0].key == "k"


def test_unset_environment_variable_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BROKER_MISSING_KEY", raising=False)
    data = config(AuthorizationRules=[
        {"Name": "r", "KeyEnvironmentVariable": "BROKER_MISSING_KEY", "Rights": ["Send"]},
    ])  # fmt: skip
    path, error = load_error(tmp_path, data)
    assert_mentions(
        error, path, f"{NS}.AuthorizationRules[0].KeyEnvironmentVariable",
        "environment variable 'BROKER_MISSING_KEY' is not set", "authorization rule 'r'",
    )  # fmt: skip
    monkeypatch.setenv("BROKER_MISSING_KEY", "")
    path, error = load_error(tmp_path, data)
    assert "is not set (or is empty)" in str(error)


AUTH = f"{NS}.AuthorizationRules"
AUTH_CASES: list[tuple[str, list[Any], str, tuple[str, ...]]] = [
    ("both key sources",
     [{"Name": "r", "Key": "k", "KeyEnvironmentVariable": "HOME", "Rights": ["Send"]}],
     f"{AUTH}[0]", ("set exactly one of Key and KeyEnvironmentVariable",)),
    ("no key source", [{"Name": "r", "Rights": ["Send"]}],
     f"{AUTH}[0]", ("set exactly one of Key and KeyEnvironmentVariable",)),
    ("empty key", [{"Name": "r", "Key": "", "Rights": ["Send"]}],
     f"{AUTH}[0].Key", ("must not be empty",)),
    ("no rights", [{"Name": "r", "Key": "k", "Rights": []}],
     f"{AUTH}[0].Rights", ("Rights: must not be empty",)),
    ("misspelt right", [{"Name": "r", "Key": "k", "Rights": ["Sned"]}],
     f"{AUTH}[0].Rights[0]", ("\"Sned\" is not one of 'Send', 'Listen', 'Manage'",
                              "did you mean 'Send'?")),
    ("lower-case right", [{"Name": "r", "Key": "k", "Rights": ["listen"]}],
     f"{AUTH}[0].Rights[0]", ("did you mean 'Listen'?",)),
    ("duplicate rule names", [
        {"Name": "r", "Key": "k", "Rights": ["Send"]},
        {"Name": "R", "Key": "k2", "Rights": ["Listen"]},
    ], f"{AUTH}[1].Name", ("duplicate authorization rule name 'R'",)),
    ("bad rule name", [{"Name": "a rule", "Key": "k", "Rights": ["Send"]}],
     f"{AUTH}[0].Name", ("contains ' '",)),
    ("empty rule list", [], AUTH, ("AuthorizationRules: must not be empty",)),
    ("misspelt property", [{"Name": "r", "Key": "k", "Right": ["Send"]}],
     f"{AUTH}[0].Right", ("did you mean 'Rights'?",)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("rules", "field", "reasons"),
    [case[1:] for case in AUTH_CASES],
    ids=[case[0] for case in AUTH_CASES],
)
def test_authorization_rule_errors(
    tmp_path: Path, rules: list[Any], field: str, reasons: tuple[str, ...]
) -> None:
    path, error = load_error(tmp_path, config(AuthorizationRules=rules))
    assert_mentions(error, path, field, *reasons)


def test_keys_never_appear_in_error_messages(tmp_path: Path) -> None:
    data = config(AuthorizationRules=[
        {"Name": "r", "Key": "super-secret-value", "Rights": ["Sned"]},
    ])  # fmt: skip
    _, error = load_error(tmp_path, data)
    assert "super-secret-value" not in str(error)


def _rule_config(props: dict[str, Any]) -> dict[str, Any]:
    return {"UserConfig": {"Namespaces": [{
        "Name": "sbemulatorns", "Queues": [],
        "Topics": [{"Name": "t", "Subscriptions": [
            {"Name": "s", "Rules": [{"Name": "r", "Properties": props}]},
        ]}],
    }], "Logging": {"Type": "File"}}}  # fmt: skip


@pytest.mark.parametrize(
    ("props", "where", "reason"),
    [
        (
            {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "color = 'red' AND (n > 1"}},
            "Properties.SqlFilter.SqlExpression",
            "line 1, column 25: expected ')' but found end of input",
        ),
        (
            {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "sys.Nope = 1"}},
            "Properties.SqlFilter.SqlExpression",
            "line 1, column 5",
        ),
        (
            {
                "FilterType": "Sql", "SqlFilter": {"SqlExpression": "1=1"},
                "Action": {"SqlExpression": "SET sys.SequenceNumber = 3"},
            },
            "Properties.Action.SqlExpression",
            "but found 'SequenceNumber'",
        ),
    ],
)  # fmt: skip
def test_sql_rules_are_parsed_at_load(props: dict[str, Any], where: str, reason: str) -> None:
    """A SQL typo stops start-up with the rule's path and the position in the expression."""
    with pytest.raises(ConfigError, match=re.escape(reason)) as info:
        parse_config(_rule_config(props))
    message = str(info.value)
    assert f"Topics[0].Subscriptions[0].Rules[0].{where}" in message
    assert reason in message
