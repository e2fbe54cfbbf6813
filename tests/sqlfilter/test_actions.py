"""SQL rule actions: SET and REMOVE on user and system properties."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from replication.amqp.types import float32, int32
from replication.sqlfilter import (
    MessageFacts,
    RuleAction,
    SqlEvaluationError,
    SqlRuleAction,
    SqlSyntaxError,
    parse_action,
)

from .helpers import facts, same


def _apply(text: str, user: dict[str, Any] | None = None, **system: Any) -> MessageFacts:
    message = facts(user, **system)
    parse_action(text).apply(message)
    return message


def test_the_docs_example() -> None:
    message = _apply(
        "SET quantity = quantity / 2; REMOVE priority;SET sys.CorrelationId = 'low';",
        {"color": "red", "quantity": 10, "priority": "high"},
        CorrelationId="high",
    )
    assert message.user == {"color": "red", "quantity": 5}
    assert message.system == {"CorrelationId": "low"}


def test_set_creates_and_overwrites_user_properties() -> None:
    assert _apply("SET source = 'routedOrders'", {"source": "orders"}).user == {
        "source": "routedOrders"
    }
    assert _apply("SET [new prop] = 1 + 1").user == {"new prop": 2}
    assert _apply("SET user.a = 'x'").user == {"a": "x"}


def test_set_keeps_the_existing_spelling_of_a_name() -> None:
    assert _apply("SET COLOR = 'blue'", {"Color": "red"}).user == {"Color": "blue"}


def test_set_to_an_unknown_value_stores_null() -> None:
    message = _apply("SET a = missing + 1")
    assert message.user == {"a": None}


def test_set_converts_implicitly_where_csharp_does() -> None:
    # the existing type wins where C# converts implicitly (long -> double)...
    assert same(_apply("SET d = 2", {"d": 1.5}).user["d"], 2.0)
    assert type(_apply("SET d = 2", {"d": float32(1.5)}).user["d"]) is float32
    # ...and not where it does not (double -> long, long -> string)
    assert same(_apply("SET n = 2.5", {"n": 1}).user["n"], 2.5)
    assert same(_apply("SET s = 2", {"s": "x"}).user["s"], 2)
    assert same(_apply("SET n = n + 1", {"n": int32(1)}).user["n"], 2)


def test_remove() -> None:
    assert _apply("REMOVE a", {"a": 1, "b": 2}).user == {"b": 2}
    assert _apply("REMOVE A", {"a": 1, "b": 2}).user == {"b": 2}
    assert _apply("REMOVE missing", {"a": 1}).user == {"a": 1}
    assert _apply("REMOVE a", {"a": 1, "A": 2}).user == {}
    assert _apply("REMOVE sys.To", To="q").system == {}


def test_statements_see_earlier_changes() -> None:
    assert _apply("SET a = 1; SET b = a + 1; REMOVE a").user == {"b": 2}


@pytest.mark.parametrize(
    ("text", "system"),
    [
        ("SET sys.Label = 'x'", {"Label": "x"}),
        ("SET sys.Subject = 'x'", {"Label": "x"}),
        ("SET sys.To = sys.ReplyTo", {"To": "r", "ReplyTo": "r"}),
        ("SET sys.MessageId = 'm' + '1'", {"MessageId": "m1", "ReplyTo": "r"}),
        ("SET sys.SessionId = NULL", {"ReplyTo": "r"}),
        ("SET sys.TimeToLive = @ttl", {"TimeToLive": timedelta(minutes=1), "ReplyTo": "r"}),
        ("SET sys.ScheduledEnqueueTimeUtc = @at",
         {"ScheduledEnqueueTimeUtc": datetime(2030, 1, 1, tzinfo=UTC), "ReplyTo": "r"}),
        ("SET sys.ForcePersistence = TRUE", {"ForcePersistence": True, "ReplyTo": "r"}),
    ],
)  # fmt: skip
def test_set_system_properties(text: str, system: dict[str, Any]) -> None:
    message = facts({}, ReplyTo="r", SessionId="s")
    parameters = {"ttl": timedelta(minutes=1), "at": datetime(2030, 1, 1, tzinfo=UTC)}
    parse_action(text, parameters).apply(message)
    expected = {"ReplyTo": "r", "SessionId": "s", **system}
    if "SessionId = NULL" in text:
        del expected["SessionId"]
    if text == "SET sys.To = sys.ReplyTo":
        expected = {"ReplyTo": "r", "SessionId": "s", "To": "r"}
    assert message.system == expected


@pytest.mark.parametrize(
    "name",
    ["SequenceNumber", "EnqueuedTimeUtc", "DeliveryCount", "Size", "LockToken", "State",
     "ExpiresAtUtc", "LockedUntilUtc", "EnqueuedSequenceNumber", "DeadLetterSource"],
)  # fmt: skip
def test_read_only_system_properties_are_refused_when_parsing(name: str) -> None:
    for text in (f"SET sys.{name} = 1", f"REMOVE sys.{name}"):
        with pytest.raises(
            SqlSyntaxError, match=rf"a settable system property \(.*\) but found '{name}'"
        ) as info:
            parse_action(text)
        assert info.value.position == text.index(name)


@pytest.mark.parametrize(
    "text",
    ["SET sys.Label = 1", "SET sys.TimeToLive = 60", "SET sys.ForcePersistence = 'yes'",
     "SET sys.ScheduledEnqueueTimeUtc = '2030-01-01'"],
)  # fmt: skip
def test_setting_a_system_property_to_the_wrong_type_fails_at_run_time(text: str) -> None:
    message = facts({"a": 1}, Label="before")
    with pytest.raises(SqlEvaluationError, match="expected a"):
        parse_action(f"SET a = 2; {text}").apply(message)
    assert message == facts({"a": 1}, Label="before")  # all or nothing


def test_errors_leave_the_message_unchanged() -> None:
    message = facts({"a": 1})
    with pytest.raises(SqlEvaluationError, match="1 / 0: division by zero"):
        parse_action("SET b = 2; SET c = 1 / 0").apply(message)
    assert message.user == {"a": 1}


def test_apply_changes_the_dicts_in_place() -> None:
    user: dict[str, Any] = {"a": 1}
    system: dict[str, Any] = {}
    parse_action("SET a = 2; SET sys.To = 'q'").apply(MessageFacts(system, user))
    assert user == {"a": 2}
    assert system == {"To": "q"}


def test_a_copy_is_independent() -> None:
    original = facts({"a": 1}, To="q")
    copy = original.copy()
    parse_action("SET a = 2; REMOVE sys.To").apply(copy)
    assert original == facts({"a": 1}, To="q")
    assert copy == facts({"a": 2})


def test_the_action_protocol() -> None:
    action = parse_action("set a = 1")
    assert isinstance(action, SqlRuleAction)
    assert isinstance(action, RuleAction)
    assert action.expression == "SET a = 1"
    assert action.source == "set a = 1"
    assert repr(action) == "SqlRuleAction('SET a = 1')"


def test_action_parameters() -> None:
    assert _apply_with("SET a = @v", {"@v": "x"}).user == {"a": "x"}
    with pytest.raises(SqlSyntaxError, match="expected a parameter that is given a value"):
        parse_action("SET a = @v")


def _apply_with(text: str, parameters: dict[str, Any]) -> MessageFacts:
    message = facts()
    parse_action(text, parameters).apply(message)
    return message
