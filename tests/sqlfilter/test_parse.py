"""Parsing: every literal and operator form, names, scopes, parameters, canonical text."""

from __future__ import annotations

import pytest

from replication.sqlfilter import SqlSyntaxError, parse_action, parse_filter
from replication.sqlfilter.ast import (
    And,
    Binary,
    Comparison,
    Exists,
    In,
    IsNull,
    Like,
    Literal,
    NewId,
    Not,
    Or,
    Parameter,
    Property,
    PropertyFunction,
    Remove,
    Scope,
    Set,
    Unary,
)
from replication.sqlfilter.parser import parse_value

from .helpers import same

x = Property(Scope.USER, "x")


def _cmp(right: object) -> Comparison:
    return Comparison("=", x, right)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1894", 1894),
        ("2", 2),
        ("0", 0),
        ("9223372036854775807", 2**63 - 1),
        ("-9223372036854775808", -(2**63)),
        ("-5", -5),
        ("1894.1204", 1894.1204),
        ("2.0", 2.0),
        ("2.", 2.0),
        ("101.5E5", 101.5e5),
        ("0.5E-2", 0.5e-2),
        ("1e3", 1000.0),
        ("1E+3", 1000.0),
        ("-2.5", -2.5),
        ("'abc'", "abc"),
        ("''", ""),
        ("'it''s'", "it's"),
        ("''''", "'"),
        ("'multi\nline'", "multi\nline"),
        ("'ünïcødé ✓'", "ünïcødé ✓"),
        ("TRUE", True),
        ("true", True),
        ("False", False),
        ("NULL", None),
        ("null", None),
    ],
)
def test_constants(text: str, expected: object) -> None:
    node = parse_value(text)
    assert isinstance(node, Literal)
    assert same(node.value, expected), (node.value, expected)


def test_integer_constants_are_longs_and_decimals_doubles() -> None:
    assert type(parse_value("2").value) is int  # type: ignore[union-attr]
    assert type(parse_value("2.0").value) is float  # type: ignore[union-attr]
    assert type(parse_value("2e0").value) is float  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "op"),
    [("x = 1", "="), ("x <> 1", "<>"), ("x != 1", "<>"), ("x < 1", "<"), ("x <= 1", "<="),
     ("x > 1", ">"), ("x >= 1", ">=")],
)  # fmt: skip
def test_comparison_operators(text: str, op: str) -> None:
    assert parse_filter(text).ast == Comparison(op, x, Literal(1))


@pytest.mark.parametrize(
    ("text", "tree"),
    [
        ("1 + 2 * 3", Binary("+", Literal(1), Binary("*", Literal(2), Literal(3)))),
        ("(1 + 2) * 3", Binary("*", Binary("+", Literal(1), Literal(2)), Literal(3))),
        ("1 - 2 - 3", Binary("-", Binary("-", Literal(1), Literal(2)), Literal(3))),
        ("1 - (2 - 3)", Binary("-", Literal(1), Binary("-", Literal(2), Literal(3)))),
        ("8 / 4 % 3", Binary("%", Binary("/", Literal(8), Literal(4)), Literal(3))),
        ("-x", Unary("-", x)),
        ("+x", Unary("+", x)),
        ("- -x", Unary("-", Unary("-", x))),
        ("-(5)", Unary("-", Literal(5))),
        ("+5", Unary("+", Literal(5))),
        ("-2 * x", Binary("*", Literal(-2), x)),
        ("x - -2", Binary("-", x, Literal(-2))),
        ("newid()", NewId()),
        ("NEWID ( )", NewId()),
        ("property('a')", PropertyFunction(Literal("a"))),
        ("P('a' + 'b')", PropertyFunction(Binary("+", Literal("a"), Literal("b")))),
    ],
)
def test_arithmetic_precedence_and_functions(text: str, tree: object) -> None:
    assert parse_value(text) == tree


@pytest.mark.parametrize(
    ("text", "tree"),
    [
        ("x IS NULL", IsNull(x)),
        ("x is not null", IsNull(x, negated=True)),
        ("p('x') IS NULL", IsNull(PropertyFunction(Literal("x")))),
        ("x IN (1, 'a', NULL)", In(x, (Literal(1), Literal("a"), Literal(None)))),
        ("x NOT IN (1)", In(x, (Literal(1),), negated=True)),
        ("x LIKE 'a%'", Like(x, Literal("a%"))),
        ("x NOT LIKE 'a%'", Like(x, Literal("a%"), negated=True)),
        ("x LIKE 'a!%' ESCAPE '!'", Like(x, Literal("a!%"), Literal("!"))),
        ("x LIKE y ESCAPE z", Like(x, Property(Scope.USER, "y"), Property(Scope.USER, "z"))),
        ("EXISTS(x)", Exists(x)),
        ("exists ( sys.To )", Exists(Property(Scope.SYS, "To"))),
        ("NOT x = 1", Not(_cmp(Literal(1)))),
        ("NOT NOT x = 1", Not(Not(_cmp(Literal(1))))),
        ("x = 1 AND x = 2 AND x = 3", And(tuple(_cmp(Literal(i)) for i in (1, 2, 3)))),
        ("x = 1 OR x = 2 OR x = 3", Or(tuple(_cmp(Literal(i)) for i in (1, 2, 3)))),
        (
            "x = 1 OR x = 2 AND x = 3",
            Or((_cmp(Literal(1)), And((_cmp(Literal(2)), _cmp(Literal(3)))))),
        ),
        (
            "(x = 1 OR x = 2) AND x = 3",
            And((Or((_cmp(Literal(1)), _cmp(Literal(2)))), _cmp(Literal(3)))),
        ),
        (
            "NOT x = 1 AND x = 2",
            And((Not(_cmp(Literal(1))), _cmp(Literal(2)))),
        ),
        ("x = 1 AND (x = 2 AND x = 3)",
         And((_cmp(Literal(1)), And((_cmp(Literal(2)), _cmp(Literal(3))))))),
        ("((x = 1))", _cmp(Literal(1))),
        ("(x + 1) * 2 > 3",
         Comparison(">", Binary("*", Binary("+", x, Literal(1)), Literal(2)), Literal(3))),
    ],
)  # fmt: skip
def test_predicates(text: str, tree: object) -> None:
    assert parse_filter(text).ast == tree


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("x = 1 and x = 2", "x = 1 AND x = 2"),
        ("x = 1 AnD x = 2 oR x = 3", "x = 1 AND x = 2 OR x = 3"),
        ("not x = 1", "NOT x = 1"),
        ("x Is Not Null", "x IS NOT NULL"),
        ("x nOt In (1)", "x NOT IN (1)"),
        ("x LiKe 'a' EsCaPe '!'", "x LIKE 'a' ESCAPE '!'"),
        ("ExIsTs(x)", "EXISTS(x)"),
        ("x = tRuE", "x = TRUE"),
        ("x = fAlSe", "x = FALSE"),
        ("x = nULL", "x = NULL"),
        ("x = NewId()", "x = newid()"),
        ("x = PROPERTY('a')", "x = property('a')"),
    ],
)
def test_keywords_and_functions_are_case_insensitive(text: str, canonical: str) -> None:
    assert parse_filter(text).expression == canonical


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("sys.Label = 'a'", "Label"),
        ("sys.label = 'a'", "Label"),
        ("SYS.LABEL = 'a'", "Label"),
        ("sys.Subject = 'a'", "Label"),
        ("sys.subject = 'a'", "Label"),
        ("sys.messageid = 'a'", "MessageId"),
        ("sys.CORRELATIONID = 'a'", "CorrelationId"),
        ("sys.[To] = 'a'", "To"),
        ("sys.ScheduledEnqueueTime = 'a'", "ScheduledEnqueueTimeUtc"),
        ("sys.TransactionPartitionKey = 'a'", "ViaPartitionKey"),
        ("sys . Label = 'a'", "Label"),
    ],
)
def test_system_property_names_are_case_insensitive_and_canonical(text: str, name: str) -> None:
    ast = parse_filter(text).ast
    assert isinstance(ast, Comparison)
    assert ast.left == Property(Scope.SYS, name)


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("color = 1", "color"),
        ("user.color = 1", "color"),
        ("USER.color = 1", "color"),
        ("[my prop] = 1", "my prop"),
        ("user.[my prop] = 1", "my prop"),
        ("[HR-EmployeeID] = 1", "HR-EmployeeID"),
        ("[a]]b] = 1", "a]b"),
        ("[and] = 1", "and"),
        ('"Contoso & Northwind" = 1', "Contoso & Northwind"),
        ('"say ""hi""" = 1', 'say "hi"'),
        ('"http://schemas.microsoft.com/xrm/2011/Claims/EntityLogicalName" = 1',
         "http://schemas.microsoft.com/xrm/2011/Claims/EntityLogicalName"),
        ("Größe = 1", "Größe"),
        ("a_1 = 1", "a_1"),
        ("p = 1", "p"),
        ("newid = 1", "newid"),
        ("sys = 1", "sys"),
        ("user.sys = 1", "sys"),
        ("set = 1", "set"),
    ],
)  # fmt: skip
def test_user_property_names(text: str, name: str) -> None:
    ast = parse_filter(text).ast
    assert isinstance(ast, Comparison)
    assert ast.left == Property(Scope.USER, name)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("color='red' and quantity>10 or sys.label like 'ord%'",
         "color = 'red' AND quantity > 10 OR sys.Label LIKE 'ord%'"),
        ("user.x != 1", "x <> 1"),
        ("[my prop] = 'it''s'", "[my prop] = 'it''s'"),
        ('"plain" = 1', "plain = 1"),
        ("[and] = 1", "[and] = 1"),
        ("(a = 1 OR b = 2) AND c = 3", "(a = 1 OR b = 2) AND c = 3"),
        ("a = 1 AND (b = 2 AND c = 3)", "a = 1 AND (b = 2 AND c = 3)"),
        ("NOT (a = 1 OR b = 2)", "NOT (a = 1 OR b = 2)"),
        ("a - (b - c) = 1", "a - (b - c) = 1"),
        ("(a - b) - c = 1", "a - b - c = 1"),
        ("-(5) = x", "-(5) = x"),
        ("- - 5 = x", "-(-5) = x"),
        ("2.50 = x", "2.5 = x"),
        ("1E20 = x", "1e+20 = x"),
        ("x = @Param", "x = @Param"),
        ("p('a') IS NOT NULL", "property('a') IS NOT NULL"),
        ("x LIKE 'a' ESCAPE '!'", "x LIKE 'a' ESCAPE '!'"),
        ("x NOT IN (1,2)", "x NOT IN (1, 2)"),
        ("exists(user.x)", "EXISTS(x)"),
    ],
)  # fmt: skip
def test_canonical_text(text: str, canonical: str) -> None:
    parsed = parse_filter(text, {"param": 1})
    assert parsed.expression == canonical
    assert parse_filter(canonical, {"param": 1}).ast == parsed.ast
    assert parsed.source == text


def test_parameters_with_or_without_at_sign_any_case() -> None:
    assert parse_filter("x = @a", {"@a": 1}).ast == _cmp(Parameter("a"))
    assert parse_filter("x = @A", {"a": 1}).ast == _cmp(Parameter("A"))
    with pytest.raises(ValueError, match="twice"):
        parse_filter("x = @a", {"@a": 1, "A": 2})
    with pytest.raises(TypeError, match="not a string"):
        parse_filter("x = @a", {"a": [1]})
    with pytest.raises(ValueError, match="range of a long"):
        parse_filter("x = @a", {"a": 2**63})


def test_missing_parameter_is_a_syntax_error() -> None:
    with pytest.raises(
        SqlSyntaxError, match="expected a parameter that is given a value but found '@nope'"
    ) as info:
        parse_filter("x = @nope", {"other": 1})
    assert info.value.position == 4


@pytest.mark.parametrize(
    ("text", "statements"),
    [
        ("SET x = 1", (Set(x, Literal(1)),)),
        ("set x = 1;", (Set(x, Literal(1)),)),
        ("REMOVE x", (Remove(x),)),
        ("SET x = 1; REMOVE y", (Set(x, Literal(1)), Remove(Property(Scope.USER, "y")))),
        ("SET x = 1 REMOVE y", (Set(x, Literal(1)), Remove(Property(Scope.USER, "y")))),
        ("SET quantity = quantity / 2; REMOVE priority;SET sys.CorrelationId = 'low';",
         (Set(Property(Scope.USER, "quantity"),
              Binary("/", Property(Scope.USER, "quantity"), Literal(2))),
          Remove(Property(Scope.USER, "priority")),
          Set(Property(Scope.SYS, "CorrelationId"), Literal("low")))),
        ("SET sys.subject = 'a'", (Set(Property(Scope.SYS, "Label"), Literal("a")),)),
        ("REMOVE sys.To", (Remove(Property(Scope.SYS, "To")),)),
        ("SET set = remove", (Set(Property(Scope.USER, "set"), Property(Scope.USER, "remove")),)),
    ],
)  # fmt: skip
def test_action_statements(text: str, statements: tuple[object, ...]) -> None:
    action = parse_action(text)
    assert action.statements == statements
    assert parse_action(action.expression).statements == statements


def test_action_canonical_text() -> None:
    action = parse_action("set quantity=quantity/2;remove priority;set sys.correlationid='low';")
    assert action.expression == (
        "SET quantity = quantity / 2; REMOVE priority; SET sys.CorrelationId = 'low'"
    )


def test_filters_compare_by_meaning_and_are_hashable() -> None:
    assert parse_filter("user.x != 1") == parse_filter("x <> 1")
    assert hash(parse_filter("user.x != 1")) == hash(parse_filter("x <> 1"))
    assert parse_filter("x = @a", {"a": 1}) != parse_filter("x = @a", {"a": 2})
    assert parse_filter("x = 1") != parse_filter("x = 1.0")
    assert parse_action("SET a = 1;") == parse_action("set a=1")
