"""Correlation filters, the boolean filters, and the Filter protocol."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from replication.sqlfilter import (
    CorrelationFilter,
    FalseFilter,
    Filter,
    SqlFilter,
    TrueFilter,
    parse_filter,
)

from .helpers import facts

FIELDS = [
    ("correlation_id", "CorrelationId"),
    ("message_id", "MessageId"),
    ("to", "To"),
    ("reply_to", "ReplyTo"),
    ("subject", "Label"),
    ("session_id", "SessionId"),
    ("reply_to_session_id", "ReplyToSessionId"),
    ("content_type", "ContentType"),
]


@pytest.mark.parametrize(("field", "name"), FIELDS)
def test_each_system_field(field: str, name: str) -> None:
    rule = CorrelationFilter(**{field: "Value"})
    assert rule.matches(facts(**{name: "Value"}))
    assert not rule.matches(facts(**{name: "value"}))  # case-sensitive
    assert not rule.matches(facts(**{name: "Value "}))
    assert not rule.matches(facts())
    assert not rule.matches(facts({name: "Value"}))  # a user property is not the system one
    assert rule.expression == f"sys.{name} = 'Value'"


def test_subject_matches_the_label_whatever_the_broker_calls_it() -> None:
    assert CorrelationFilter(subject="red").matches(facts(Subject="red"))


def test_all_fields_must_match() -> None:
    rule = CorrelationFilter(
        subject="Important", reply_to="johndoe@contoso.com", properties={"color": "Red"}
    )
    assert rule.expression == (
        "sys.ReplyTo = 'johndoe@contoso.com' AND sys.Label = 'Important' AND color = 'Red'"
    )
    message = facts({"color": "Red"}, Label="Important", ReplyTo="johndoe@contoso.com")
    assert rule.matches(message)
    assert not rule.matches(
        facts({"color": "red"}, Label="Important", ReplyTo="johndoe@contoso.com")
    )
    assert not rule.matches(facts({"color": "Red"}, Label="Important"))
    assert not rule.matches(facts({}, Label="Important", ReplyTo="johndoe@contoso.com"))


@pytest.mark.parametrize(
    ("expected", "actual", "result"),
    [
        ("abc", "abc", True), ("abc", "ABC", False), (2, 2, True), (2, 2.0, True),
        (2, "2", False), ("2", 2, False), (True, True, True), (True, 1, False), (1, True, False),
        (1.5, 1.5, True), (datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 1, 1), True),
        (uuid.UUID(int=1), uuid.UUID(int=1), True), ("x", None, False),
    ],
)  # fmt: skip
def test_user_property_values(expected: Any, actual: Any, result: bool) -> None:
    rule = CorrelationFilter(properties={"prop": expected})
    assert rule.matches(facts({"prop": actual})) is result
    assert rule.matches(facts({"PROP": actual})) is result  # names are case-insensitive
    sql = parse_filter(rule.expression, rule.parameters)
    assert sql.matches(facts({"prop": actual})) is result


def test_values_sql_cannot_write_become_parameters() -> None:
    when = datetime(2024, 1, 1, tzinfo=UTC)
    rule = CorrelationFilter(properties={"when": when, "n": 1})
    assert rule.expression == "when = @p0 AND n = 1"
    assert rule.parameters == {"@p0": when}


def test_an_empty_correlation_filter_matches_everything() -> None:
    assert CorrelationFilter().matches(facts())
    assert CorrelationFilter().expression == "1=1"


def test_invalid_correlation_filters() -> None:
    with pytest.raises(TypeError, match="correlation_id must be a string, got int"):
        CorrelationFilter(correlation_id=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="NULL"):
        CorrelationFilter(properties={"a": None})
    with pytest.raises(TypeError, match="property 'a': list is not a string, long, double"):
        CorrelationFilter(properties={"a": [1]})


def test_correlation_filter_equality_and_repr() -> None:
    assert CorrelationFilter("x") == CorrelationFilter(correlation_id="x")
    assert CorrelationFilter("x") != CorrelationFilter(message_id="x")
    assert repr(CorrelationFilter("x", properties={"a": 1})) == (
        "CorrelationFilter(correlation_id='x', properties={'a': 1})"
    )


def test_true_and_false_filters() -> None:
    assert TrueFilter().expression == "1=1"
    assert FalseFilter().expression == "1=0"
    for message in (facts(), facts({"a": 1}, To="x")):
        assert TrueFilter().matches(message)
        assert not FalseFilter().matches(message)
    # they are SQL filters, equal to the SQL they are defined as
    assert isinstance(TrueFilter(), SqlFilter)
    assert TrueFilter().ast == parse_filter("1=1").ast
    assert FalseFilter().ast == parse_filter("1 = 0").ast
    assert parse_filter("1=1").matches(facts()) and not parse_filter("1=0").matches(facts())


def test_every_filter_is_a_filter() -> None:
    for rule in (parse_filter("a = 1"), CorrelationFilter("x"), TrueFilter(), FalseFilter()):
        assert isinstance(rule, Filter)
        assert isinstance(rule.expression, str)
