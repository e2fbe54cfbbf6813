"""The opt-in extensions: ``body.`` fields of a JSON body, and value expressions alone."""

from __future__ import annotations

import json
from typing import Any

import pytest

from replication.sqlfilter import (
    MessageFacts,
    SqlEvaluationError,
    SqlSyntaxError,
    parse_action,
    parse_expression,
    parse_filter,
)
from replication.sqlfilter.ast import Property, Scope

DOC = {
    "order": {"id": "o-1", "total": 12.5, "lines": 3, "rush": True, "note": None},
    "items": [{"sku": "a", "qty": 2}, {"sku": "b", "qty": 5}],
    "Region": "eu",
    "region": "EU-exact",
    "with.dot": 1,
    "not": "kw",
    "big": 2**70,
    "tags": ["x", "y"],
}


def body_eval(text: str, document: Any = DOC, **user: Any) -> bool | None:
    return parse_filter(text, body_fields=True).evaluate(MessageFacts({}, dict(user), document))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("body.order.id = 'o-1'", True),
        ("body.order.id = 'o-2'", False),
        ("body.order.total > 12", True),
        ("body.order.lines = 3", True),
        ("body.order.lines = 3.0", True),
        ("body.order.rush = TRUE", True),
        ("body.order.note IS NULL", True),
        ("body.order.missing IS NULL", True),
        ("body.order IS NOT NULL", True),
        ("EXISTS(body.order.note)", True),
        ("EXISTS(body.order.missing)", False),
        ("body.order.missing = 1", None),
        ("body.order = 1", None),
        ("body.order.id LIKE 'o-%'", True),
        ("body.order.id IN ('a', 'o-1')", True),
        ("body.order.lines * 2 = 6", True),
        ("body.items.0.sku = 'a'", True),
        ("body.items.1.qty = 5", True),
        ("body.items.[1].qty = 5", True),
        ("body.items.2.qty = 5", None),
        ("body.items.x = 5", None),
        ("body.order.0 = 1", None),
        ("body.tags.1 = 'y'", True),
        ("body.region = 'EU-exact'", True),
        ("body.REGION = 'eu'", True),
        ("body.[with.dot] = 1", True),
        ("body.[not] = 'kw'", True),
        ("body.big > 1.0", True),
        ("body.order.id = 'o-1' AND sys.Label IS NULL", True),
        ("body.order.id = kind", True),
    ],
)
def test_body_fields(text: str, expected: bool | None) -> None:
    assert body_eval(text, kind="o-1") is expected


def test_big_integers_read_as_doubles() -> None:
    value = parse_expression("body.big", body_fields=True).value(MessageFacts(body=DOC))
    assert type(value) is float and value == float(2**70)


@pytest.mark.parametrize("document", [None, "text", 5, [1, 2], {"other": 1}])
def test_without_a_matching_document_every_field_is_unknown(document: Any) -> None:
    assert body_eval("body.order.id = 'o-1'", document) is None
    assert body_eval("NOT body.order.id = 'o-1'", document) is None
    assert body_eval("body.order.id IS NULL", document) is True
    assert body_eval("EXISTS(body.order)", document) is False


def test_the_body_scope_is_opt_in() -> None:
    with pytest.raises(SqlSyntaxError, match="sys or user before"):
        parse_filter("body.a = 1")
    with pytest.raises(SqlSyntaxError, match="sys, user or body before"):
        parse_filter("other.a = 1", body_fields=True)
    assert parse_filter("body = 1").evaluate(MessageFacts(user={"body": 1})) is True
    assert parse_filter("body = 1", body_fields=True).evaluate(MessageFacts(user={"body": 1}))


def test_actions_cannot_set_body_fields() -> None:
    with pytest.raises(SqlSyntaxError, match=r"expected sys or user before '\.' but found 'body'"):
        parse_action("SET body.a = 1")


def test_property_function_does_not_reach_the_body() -> None:
    facts = MessageFacts(user={"body.a": "user"}, body={"a": "body"})
    assert parse_filter("property('body.a') = 'user'", body_fields=True).matches(facts)


@pytest.mark.parametrize(
    "text",
    ["body. = 1", "body.a. = 1", "body.1e3 = 1", "body.a.(b) = 1", "body.and = 1"],
)
def test_bad_paths_are_syntax_errors(text: str) -> None:
    with pytest.raises(SqlSyntaxError, match="expected a body field name or array index after"):
        parse_filter(text, body_fields=True)


@pytest.mark.parametrize(
    ("text", "path", "canonical"),
    [
        ("body.a", ("a",), "body.a"),
        ("BODY.a.b", ("a", "b"), "body.a.b"),
        ("body.items.0.sku", ("items", "0", "sku"), "body.items.0.sku"),
        ("body.m.0.5", ("m", "0", "5"), "body.m.0.5"),
        ("body.m.0 . x", ("m", "0", "x"), "body.m.0.x"),
        ("body.items.[0]", ("items", "0"), "body.items.0"),
        ("body.[a.b].c", ("a.b", "c"), "body.[a.b].c"),
        ('body."x y"', ("x y",), "body.[x y]"),
        ("body.[and]", ("and",), "body.[and]"),
        ("body.007", ("007",), "body.007"),
    ],
)
def test_paths_and_canonical_text(text: str, path: tuple[str, ...], canonical: str) -> None:
    rule = parse_filter(f"{text} IS NULL", body_fields=True)
    prop = rule.ast.operand  # type: ignore[union-attr]
    assert prop == Property(Scope.BODY, ".".join(path), path)
    assert rule.expression == f"{canonical} IS NULL"
    assert parse_filter(rule.expression, body_fields=True).ast == rule.ast


def test_index_segments_with_leading_zeros_are_kept_as_written() -> None:
    assert body_eval("body.tags.01 = 'y'") is True  # "01" indexes 1
    assert body_eval("body.[007] = 1", {"007": 1}) is True


def test_uses_body() -> None:
    assert parse_filter("a = 1 OR (b = 2 AND body.x = 1)", body_fields=True).uses_body
    assert not parse_filter("a = 1 OR sys.Label = 'x'", body_fields=True).uses_body
    assert not parse_filter("a = 1").uses_body


def test_copy_keeps_the_body() -> None:
    facts = MessageFacts({"Label": "l"}, {"a": 1}, {"b": 2})
    assert facts.copy().body == {"b": 2}


def test_actions_keep_the_body() -> None:
    facts = MessageFacts({}, {"a": 1}, {"b": 2})
    parse_action("SET a = 2").apply(facts)
    assert facts.user == {"a": 2} and facts.body == {"b": 2}


def test_value_expressions() -> None:
    facts = MessageFacts({"MessageId": "m1"}, {"tenant": "t"}, json.loads('{"id": 7}'))
    assert parse_expression("sys.MessageId").value(facts) == "m1"
    assert parse_expression("tenant + ':' + sys.MessageId").value(facts) == "t:m1"
    key = parse_expression("body.id * @k", {"k": 2}, body_fields=True)
    assert key.value(facts) == 14
    assert key.uses_body and key.expression == "body.id * @k"
    assert parse_expression("missing").value(facts) is None
    assert parse_expression("sys.MessageId") == parse_expression("sys.messageid")
    with pytest.raises(SqlSyntaxError, match="expected an arithmetic operator or end of input"):
        parse_expression("a = 1")
    with pytest.raises(SqlSyntaxError, match=r"expected sys or user before '\.' but found 'body'"):
        parse_expression("body.id")
    with pytest.raises(SqlEvaluationError, match="1 / 0: division by zero"):
        parse_expression("1 / 0").value(facts)
