"""Syntax errors: where (offset, line, column), what was expected, what was found."""

from __future__ import annotations

import re

import pytest

from replication.sqlfilter import SqlSyntaxError, parse_action, parse_filter
from replication.sqlfilter.parser import MAX_DEPTH, MAX_NESTING

PREDICATE_OPERATOR = "a comparison operator (=, <>, !=, <, <=, >, >=), IS, IN, LIKE or NOT"


@pytest.mark.parametrize(
    ("text", "position", "expected", "found"),
    [
        ("", 0, "an expression", "end of input"),
        ("color", 5, PREDICATE_OPERATOR, "end of input"),
        ("color =", 7, "an expression", "end of input"),
        ("color = 'red", 12, "' to close the string", "end of input"),
        ("[my prop = 1", 12, "] to close the bracketed name", "end of input"),
        ("(a = 1", 6, "')'", "end of input"),
        ("a = 1)", 5, "AND, OR or end of input", "')'"),
        ("a IN (1, 2 AND b = 1", 11, "')'", "'AND'"),
        ("a IN ()", 6, "an expression", "')'"),
        ("a IN 1", 5, "'('", "'1'"),
        ("a NOT b", 6, "IN or LIKE after NOT", "'b'"),
        ("EXISTS(1)", 7, "a property name", "'1'"),
        ("a LIKE 5", 7, "a string pattern", "'5'"),
        ("a LIKE 'x' ESCAPE 'ab'", 18, "a one-character escape string", "\"'ab'\""),
        ("a LIKE 'x!' ESCAPE '!'", 7, "a pattern that does not end with its escape character",
         "\"'x!'\""),
        ("a = 1 b = 2", 6, "AND, OR or end of input", "'b'"),
        ("a AND b = 1", 2, PREDICATE_OPERATOR, "'AND'"),
        ("a = 1 AND", 9, "an expression", "end of input"),
        ("a = TRUE AND OR", 13, "an expression", "'OR'"),
        ("NOT 5", 5, PREDICATE_OPERATOR, "end of input"),
        ("a == 1", 3, "an expression", "'='"),
        ("a = 1 = 2", 6, "AND, OR or end of input", "'='"),
        ("a # 1", 2, PREDICATE_OPERATOR, "'#'"),
        ("a = @", 4, "an expression", "'@'"),
        ("foo.bar = 1", 0, "sys or user before '.'", "'foo'"),
        ("a = foo(1)", 4, "a function name (newid, property or p)", "'foo'"),
        ("1 IS NULL", 0, "a property before IS [NOT] NULL", "'1'"),
        ("a IS 5", 5, "NULL", "'5'"),
        ("a = (b = 1)", 4, "a value (not a condition)", "'('"),
        ("(a = 1) + 2 = 3", 8, "AND, OR or end of input", "'+'"),
        ("a = 9223372036854775808", 4, "an integer within the range of a long",
         "'9223372036854775808'"),
        ("a = -9223372036854775809", 5, "an integer within the range of a long",
         "'9223372036854775809'"),
        ("a = 1e999", 4, "a number within the range of a double", "'1e999'"),
        ("[] = 1", 0, "a non-empty name", "'[]'"),
        ("AND = 1", 0, "an expression", "'AND'"),
        ("user.and = 1", 5, "a property name after 'user.'", "'and'"),
    ],
)  # fmt: skip
def test_filter_syntax_errors(text: str, position: int, expected: str, found: str) -> None:
    message = f"line 1, column {position + 1}: expected {expected} but found {found}"
    with pytest.raises(SqlSyntaxError, match="^" + re.escape(message) + "$") as info:
        parse_filter(text)
    error = info.value
    assert (error.position, error.expected, error.found) == (position, expected, found)
    assert isinstance(error, ValueError)


def test_unknown_system_property_names_the_known_ones() -> None:
    with pytest.raises(
        SqlSyntaxError, match=r"expected a system property name \(ContentType, CorrelationId, "
    ) as info:
        parse_filter("sys.Nope = 1")
    assert info.value.position == 4
    assert "ViaPartitionKey" in info.value.expected


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [
        ("a\n AND b = 1", 2, 2),
        ("a = 1\nOR (b = 2\nAND c)", 3, 6),
        ("a = 1\r\nOR", 2, 3),
        ("\n\n\n", 4, 1),
    ],
)
def test_line_and_column(text: str, line: int, column: int) -> None:
    with pytest.raises(SqlSyntaxError, match=f"^line {line}, column {column}: ") as info:
        parse_filter(text)
    assert (info.value.line, info.value.column) == (line, column)


@pytest.mark.parametrize(
    ("text", "position", "expected", "found"),
    [
        ("", 0, "SET or REMOVE", "end of input"),
        ("SET", 3, "a property name", "end of input"),
        ("SET a", 5, "'='", "end of input"),
        ("SET a = ", 8, "an expression", "end of input"),
        ("SET a = 1 b", 10, "SET, REMOVE, ';' or end of input", "'b'"),
        ("SET a = 1;;", 10, "SET, REMOVE or end of input", "';'"),
        ("UPDATE a = 1", 0, "SET or REMOVE", "'UPDATE'"),
        ("REMOVE 1", 7, "a property name", "'1'"),
        ("SET a = b = 1", 10, "SET, REMOVE, ';' or end of input", "'='"),
        ("SET a = (b = 1)", 8, "a value (not a condition)", "'('"),
        ("SET sys.Nope = 1", 8, "a system property name", "'Nope'"),
    ],
)
def test_action_syntax_errors(text: str, position: int, expected: str, found: str) -> None:
    with pytest.raises(SqlSyntaxError, match=": expected " + re.escape(expected)) as info:
        parse_action(text)
    error = info.value
    assert (error.position, error.found) == (position, found)


def test_deep_nesting_is_a_syntax_error_not_a_crash() -> None:
    depth = MAX_NESTING + 1
    for text in (
        "(" * depth + "a = 1" + ")" * depth,
        "NOT " * depth + "a = 1",
        "a = " + "-" * depth + "x",
    ):
        with pytest.raises(SqlSyntaxError, match="at most"):
            parse_filter(text)
    long_chain = "a = " + " + ".join(["1"] * (MAX_DEPTH + 1))
    with pytest.raises(SqlSyntaxError, match="levels deep"):
        parse_filter(long_chain)
    # but long AND / OR chains are flat, and fine
    assert parse_filter(" AND ".join(["a = 1"] * 1000)).matches
    within = MAX_NESTING - 1
    assert parse_filter("(" * within + "a = 1" + ")" * within)
