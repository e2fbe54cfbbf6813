"""Evaluation: operators, C# typing, three-valued logic, LIKE, IN, EXISTS, IS NULL, functions."""

from __future__ import annotations

import math
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from replication.amqp.types import int32, symbol
from replication.sqlfilter import SqlEvaluationError, SqlSyntaxError, parse_filter

from .helpers import F, T, U, evaluate, facts, same, value

LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1

# -- three-valued logic: the tables of the SQL filter syntax page -----------------------------

_TRUTH = {"T": True, "F": False, "U": None}
_PREDICATE = {"T": T, "F": F, "U": U}

AND_TABLE = {"TT": "T", "TF": "F", "TU": "U", "FT": "F", "FF": "F", "FU": "F",
             "UT": "U", "UF": "F", "UU": "U"}  # fmt: skip
OR_TABLE = {"TT": "T", "TF": "T", "TU": "T", "FT": "T", "FF": "F", "FU": "U",
            "UT": "T", "UF": "U", "UU": "U"}  # fmt: skip


def test_the_three_building_blocks() -> None:
    assert evaluate(T) is True
    assert evaluate(F) is False
    assert evaluate(U) is None


@pytest.mark.parametrize(("pair", "result"), AND_TABLE.items())
def test_and_truth_table(pair: str, result: str) -> None:
    a, b = (_PREDICATE[c] for c in pair)
    assert evaluate(f"{a} AND {b}") is _TRUTH[result]
    assert evaluate(f"{a} AND {b} AND {T}") is _TRUTH[result]  # the n-ary form


@pytest.mark.parametrize(("pair", "result"), OR_TABLE.items())
def test_or_truth_table(pair: str, result: str) -> None:
    a, b = (_PREDICATE[c] for c in pair)
    assert evaluate(f"{a} OR {b}") is _TRUTH[result]
    assert evaluate(f"{a} OR {b} OR {F}") is _TRUTH[result]


@pytest.mark.parametrize(("operand", "result"), [("T", "F"), ("F", "T"), ("U", "U")])
def test_not_truth_table(operand: str, result: str) -> None:
    assert evaluate(f"NOT {_PREDICATE[operand]}") is _TRUTH[result]


def test_a_filter_matches_only_on_true() -> None:
    assert parse_filter(T).matches(facts()) is True
    assert parse_filter(F).matches(facts()) is False
    assert parse_filter(U).matches(facts()) is False
    assert parse_filter(f"NOT {U}").matches(facts()) is False


def test_and_or_stop_at_the_deciding_operand() -> None:
    # the right side would fail (long division by zero) if it were evaluated
    assert evaluate(f"{F} AND 1 / 0 = 1") is False
    assert evaluate(f"{T} OR 1 / 0 = 1") is True
    with pytest.raises(SqlEvaluationError, match="1 / 0: division by zero"):
        evaluate(f"{T} AND 1 / 0 = 1")


# -- comparisons ------------------------------------------------------------------------------

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
GUID = uuid.UUID("3f2504e0-4f89-11d3-9a0c-0305e82c3301")


@pytest.mark.parametrize(
    ("left", "op", "right", "result"),
    [
        (1, "=", 1, True), (1, "=", 2, False), (1, "<>", 2, True), (1, "<", 2, True),
        (2, "<=", 2, True), (3, ">", 2, True), (2, ">=", 3, False),
        (1, "=", 1.0, True), (1.5, ">", 1, True), (2, "<", 2.5, True),
        (2**53 + 1, "=", float(2**53), True),  # C#: the long is converted to a double
        (math.nan, "=", math.nan, False), (math.nan, "<>", math.nan, True),
        (math.nan, "<", 1, False), (math.inf, ">", LONG_MAX, True),
        ("a", "=", "a", True), ("a", "=", "A", False), ("a", "<", "b", True),
        ("B", "<", "a", True),  # ordinal
        ("abc", ">=", "abd", False), ("", "<", "a", True),
        (True, "=", True, True), (True, "<>", False, True), (True, "<", False, None),
        (NOW, "=", NOW, True), (NOW, "<", NOW + timedelta(seconds=1), True),
        (NOW.replace(tzinfo=None), "=", NOW, True),  # naive is UTC
        (timedelta(1), ">", timedelta(0), True),
        (GUID, "=", GUID, True), (GUID, "<>", uuid.UUID(int=0), True), (GUID, "<", GUID, None),
        # no C# operator between these types: unknown, not an error
        (1, "=", "1", None), ("1", "<>", 1, None), (True, "=", 1, None), (1, "=", True, None),
        (NOW, "=", "2024-05-01", None), (GUID, "=", str(GUID), None),
        (timedelta(0), "=", 0, None), (b"x", "=", b"x", None),
        (None, "=", None, None), (None, "<>", 1, None), (1, "=", None, None),
        # AMQP's int and str subclasses are longs and strings
        (int32(5), "=", 5, True), (symbol("a"), "=", "a", True), (int32(5), ">", 4.5, True),
    ],
)  # fmt: skip
def test_comparison(left: Any, op: str, right: Any, result: bool | None) -> None:
    user = {"a": left, "b": right}
    assert evaluate(f"a {op} b", user) is result
    if not isinstance(left, bytes):  # bytes are no parameter type
        assert evaluate(f"a {op} @b", user, {"b": right}) is result  # the constant fast path
        assert evaluate(f"@a {op} b", user, {"a": left}) is result


@pytest.mark.parametrize(
    ("text", "result"),
    [
        ("s = 'red'", True), ("s = 'Red'", False), ("n = 10", True), ("n = 10.0", True),
        ("n > 9.5", True), ("n < 10", False), ("d = 2.5", True), ("d > 2", True),
        ("n = '10'", None), ("s = 1", None), ("missing = 1", None), ("missing <> 1", None),
        ("n = NULL", None), ("NULL = NULL", None), ("s <> NULL", None),
        ("b = TRUE", True), ("b = FALSE", False), ("1 = 1", True), ("'a' < 'b'", True),
        ("1 = 1.0", True), ("TRUE = TRUE", True),
    ],
)  # fmt: skip
def test_comparison_with_constants(text: str, result: bool | None) -> None:
    assert evaluate(text, {"s": "red", "n": 10, "d": 2.5, "b": True}) is result


# -- arithmetic -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1 + 2", 3), ("5 - 7", -2), ("6 * 7", 42), ("7 / 2", 3), ("-7 / 2", -3),
        ("7 / -2", -3), ("7 % 3", 1), ("-7 % 3", -1), ("7 % -3", 1), ("0 / 5", 0),
        ("9223372036854775807 + 1", LONG_MIN), ("-9223372036854775808 - 1", LONG_MAX),
        ("9223372036854775807 * 2", -2), ("-(-9223372036854775808)", LONG_MIN),
        ("1 + 2.5", 3.5), ("7 / 2.0", 3.5), ("7.5 % 2", 1.5), ("-7.5 % 2", -1.5),
        ("1.0 / 0", math.inf), ("-1.0 / 0", -math.inf), ("0.0 / 0", math.nan),
        ("1 / 0.0", math.inf), ("5.0 % 0", math.nan), ("1e308 * 10", math.inf),
        ("-5", -5), ("+5", 5), ("-(5)", -5), ("-2.5", -2.5), ("- -2", 2), ("+ -2", -2),
        ("2 + 3 * 4", 14), ("(2 + 3) * 4", 20), ("10 - 4 - 3", 3), ("2 * 3 % 4", 2),
        ("'ab' + 'cd'", "abcd"), ("'a' + 1", None), ("1 + 'a'", None), ("'a' - 'b'", None),
        ("TRUE + 1", None), ("-'a'", None), ("+'a'", None), ("-TRUE", None),
        ("NULL + 1", None), ("1 + NULL", None), ("missing * 2", None), ("-missing", None),
    ],
)  # fmt: skip
def test_arithmetic(text: str, expected: Any) -> None:
    assert same(value(text), expected), (value(text), expected)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1 / 0", "1 / 0: division by zero (both operands are longs)"),
        ("1 % 0", "1 % 0: division by zero (both operands are longs)"),
        ("x / 0", "5 / 0: division by zero (both operands are longs)"),
        ("-9223372036854775808 / -1", "-9223372036854775808 / -1 overflows a long"),
        ("-9223372036854775808 % -1", "-9223372036854775808 % -1 overflows a long"),
    ],
)
def test_long_division_errors_as_in_csharp(text: str, message: str) -> None:
    with pytest.raises(SqlEvaluationError, match="^" + re.escape(message) + "$"):
        value(text, {"x": 5})


def test_date_and_timespan_arithmetic() -> None:
    later = NOW + timedelta(hours=1)
    user = {"t1": NOW, "t2": later, "span": timedelta(hours=1)}
    assert value("t2 - t1", user) == timedelta(hours=1)
    assert value("t1 + span", user) == later
    assert value("span + t1", user) == later
    assert value("t2 - span", user) == NOW
    assert value("span + span", user) == timedelta(hours=2)
    assert value("span - span", user) == timedelta(0)
    assert value("-span", user) == timedelta(hours=-1)
    assert value("+span", user) == timedelta(hours=1)
    assert value("t1 + t2", user) is None
    assert value("span * 2", user) is None
    # the docs' example: (DateTimeMp2-DateTimeMp1) <= @timespan
    assert evaluate("(t2 - t1) <= @ts", user, {"@ts": timedelta(hours=1)}) is True
    assert evaluate("t2 - t1 <= @ts", user, {"@ts": timedelta(minutes=59)}) is False
    with pytest.raises(
        SqlEvaluationError, match=r"^9999-12-31 23:59:59\.999999 \+ 1 day, 0:00:00 is out of range"
    ):
        value("t + span", {"t": datetime.max, "span": timedelta(days=1)})


# -- IS NULL, EXISTS --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("user", "is_null", "exists"),
    [({}, True, False), ({"x": None}, True, True), ({"x": 0}, False, True),
     ({"x": ""}, False, True), ({"X": 1}, False, True)],
)  # fmt: skip
def test_is_null_and_exists(user: dict[str, Any], is_null: bool, exists: bool) -> None:
    assert evaluate("x IS NULL", user) is is_null
    assert evaluate("x IS NOT NULL", user) is (not is_null)
    assert evaluate("EXISTS(x)", user) is exists
    assert evaluate("EXISTS(user.x)", user) is exists
    assert evaluate("NOT EXISTS(x)", user) is (not exists)


def test_system_properties_null_and_exists() -> None:
    assert evaluate("sys.To IS NULL") is True
    assert evaluate("sys.To IS NULL", To=None) is True
    assert evaluate("sys.To IS NOT NULL", To="q") is True
    assert evaluate("EXISTS(sys.To)", To="q") is True
    assert evaluate("EXISTS(sys.To)") is False
    assert evaluate("EXISTS(sys.To)", To=None) is False
    assert evaluate("sys.To = 'q'") is None  # a message without "to": unknown, no error


# -- IN ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "user", "result"),
    [
        ("x IN ('a', 'b')", {"x": "a"}, True),
        ("x IN ('a', 'b')", {"x": "c"}, False),
        ("x IN ('a', 'b')", {"x": "A"}, False),
        ("x NOT IN ('a', 'b')", {"x": "c"}, True),
        ("x NOT IN ('a', 'b')", {"x": "a"}, False),
        ("x IN ('a')", {}, None),
        ("x NOT IN ('a')", {}, None),
        ("x IN (1, 2)", {"x": 2.0}, True),
        ("x IN (1, 'a')", {"x": "a"}, True),
        ("x IN ('1')", {"x": 1}, False),
        # only the left operand makes IN unknown (the docs); a NULL in the list never equals
        ("x IN ('a', NULL)", {"x": "b"}, False),
        ("x NOT IN ('a', NULL)", {"x": "b"}, True),
        ("x IN ('a', NULL)", {"x": "a"}, True),
        ("x IN (y, z)", {"x": 1, "z": 1}, True),
        ("x IN (y, z)", {"x": 1}, False),
        ("x IN (y)", {"y": 1}, None),
        ("x IN (y + 1, 5)", {"x": 3, "y": 2}, True),
        ("x IN (@a, @b)", {"x": 7}, True),
        ("sys.To IN ('Store5', 'Store6')", {}, None),
    ],
)  # fmt: skip
def test_in(text: str, user: dict[str, Any], result: bool | None) -> None:
    assert evaluate(text, user, {"a": 1, "b": 7}) is result


# -- LIKE -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "text", "result"),
    [
        ("abc", "abc", True), ("abc", "abcd", False), ("abc", "ABC", False),
        ("a%", "a", True), ("a%", "abc", True), ("a%", "ba", False),
        ("%c", "abc", True), ("%c", "cb", False), ("%b%", "abc", True), ("%b%", "ac", False),
        ("%", "", True), ("%", "anything", True), ("", "", True), ("", "a", False),
        ("a_c", "abc", True), ("a_c", "ac", False), ("a_c", "abbc", False), ("___", "abc", True),
        ("_", "\n", True), ("a%c", "a\nc", True), ("%bus%", "the bus stop", True),
        ("a%b%c", "axxbyyc", True), ("a%b%c", "axxcyyb", False), ("%%a%%", "bab", True),
        ("a.c", "abc", False), ("a.c", "a.c", True), ("[ab]", "a", False), ("[ab]", "[ab]", True),
        ("(x)*+?", "(x)*+?", True), ("^a$", "^a$", True),
    ],
)  # fmt: skip
def test_like(pattern: str, text: str, result: bool) -> None:
    quoted = "'" + pattern.replace("'", "''") + "'"
    assert evaluate(f"x LIKE {quoted}", {"x": text}) is result
    assert evaluate(f"x NOT LIKE {quoted}", {"x": text}) is (not result)
    assert evaluate("x LIKE p", {"x": text, "p": pattern}) is result  # the dynamic path


@pytest.mark.parametrize(
    ("pattern", "escape", "text", "result"),
    [
        ("ABC\\%", "\\", "ABC%", True), ("ABC\\%", "\\", "ABCD", False),
        ("a!_c", "!", "a_c", True), ("a!_c", "!", "abc", False),
        ("a!!c", "!", "a!c", True), ("!%%", "!", "%abc", True), ("!%%", "!", "abc", False),
        ("a!bc", "!", "abc", True),  # an escaped ordinary character is itself
        ("%%", "%", "%", True), ("%%", "%", "x%y", False),  # the escape may be a wildcard
        ("%%_", "%", "%a", True), ("%%_", "%", "a%", False),
    ],
)  # fmt: skip
def test_like_escape(pattern: str, escape: str, text: str, result: bool) -> None:
    assert evaluate(f"x LIKE '{pattern}' ESCAPE '{escape}'", {"x": text}) is result
    assert evaluate("x LIKE p ESCAPE e", {"x": text, "p": pattern, "e": escape}) is result


@pytest.mark.parametrize(
    ("user", "result"),
    [({}, None), ({"x": 5}, None), ({"x": "a", "p": None}, None), ({"x": "a", "p": 5}, None),
     ({"x": "a", "p": "a", "e": None}, None), ({"x": "a", "p": "a", "e": "!"}, True)],
)  # fmt: skip
def test_like_with_unknown_or_non_string_operands_is_unknown(
    user: dict[str, Any], result: bool | None
) -> None:
    if "e" in user:
        assert evaluate("x LIKE p ESCAPE e", user) is result
    else:
        assert evaluate("x LIKE p", {"p": "a", **user}) is result
        assert evaluate("x NOT LIKE p", {"p": "a", **user}) is (
            None if result is None else not result
        )


@pytest.mark.parametrize(
    ("user", "message"),
    [
        ({"p": "ab!", "e": "!"}, "LIKE 'ab!': the pattern ends with its escape character"),
        ({"p": "ab", "e": "!!"}, "LIKE ... ESCAPE '!!': the escape must be a one-character string"),
        ({"p": "ab", "e": 1}, "LIKE ... ESCAPE 1: the escape must be a one-character string"),
    ],
)
def test_like_with_a_bad_dynamic_escape_fails_at_run_time(
    user: dict[str, Any], message: str
) -> None:
    with pytest.raises(SqlEvaluationError, match="^" + re.escape(message) + "$"):
        evaluate("x LIKE p ESCAPE e", {"x": "ab", **user})


def test_like_with_a_parameter_pattern() -> None:
    assert evaluate("x LIKE @p", {"x": "order-1"}, {"p": "order%"}) is True
    assert evaluate("x LIKE @p ESCAPE @e", {"x": "a%"}, {"p": "a!%", "e": "!"}) is True
    assert evaluate("x LIKE @p", {"x": "1"}, {"p": 1}) is None
    with pytest.raises(SqlEvaluationError, match="LIKE 'a!': the pattern ends with its escape"):
        evaluate("x LIKE @p ESCAPE '!'", {"x": "a"}, {"p": "a!"})


# -- names: scopes, case ----------------------------------------------------------------------


def test_user_property_names_are_case_insensitive() -> None:
    assert evaluate("COLOR = 'red'", {"color": "red"}) is True
    assert evaluate("user.Color = 'red'", {"cOLOR": "red"}) is True
    assert evaluate("[Größe] = 1", {"GRÖSSE": 1}) is None  # lower(), not casefold()
    assert evaluate("[Größe] = 1", {"größe": 1}) is True
    # an exact match wins over one that differs in case
    assert evaluate("Color = 'exact'", {"color": "other", "Color": "exact"}) is True


def test_user_and_system_scopes_are_separate() -> None:
    assert evaluate("To = 'q'", {"To": "q"}) is True
    assert evaluate("sys.To = 'q'", {"To": "q"}) is None
    assert evaluate("sys.To = 'q'", To="q") is True
    assert evaluate("user.To = 'q'", To="q") is None


@pytest.mark.parametrize(
    ("text", "system", "result"),
    [
        ("sys.Label LIKE '%bus%'", {"Label": "a bus"}, True),
        ("sys.Subject = 'a'", {"Label": "a"}, True),
        ("sys.label = 'a'", {"Subject": "a"}, True),  # MessageFacts takes the alias too
        ("sys.messageid = 'xxxx'", {"MessageId": "xxxx"}, True),
        ("sys.correlationid like 'abc-%'", {"CorrelationId": "abc-1"}, True),
        ("sys.SequenceNumber > 10", {"SequenceNumber": 11}, True),
        ("sys.DeliveryCount = 0", {"DeliveryCount": 0}, True),
        ("sys.Size < 1024", {"Size": 10}, True),
        ("sys.EnqueuedTimeUtc > @t", {"EnqueuedTimeUtc": NOW}, True),
        ("sys.TimeToLive >= @span", {"TimeToLive": timedelta(minutes=5)}, True),
        ("sys.ExpiresAtUtc - sys.EnqueuedTimeUtc = sys.TimeToLive",
         {"EnqueuedTimeUtc": NOW, "ExpiresAtUtc": NOW + timedelta(minutes=5),
          "TimeToLive": timedelta(minutes=5)}, True),
        ("sys.LockToken = @g", {"LockToken": GUID}, True),
        ("sys.ForcePersistence = TRUE", {"ForcePersistence": True}, True),
        ("sys.To IN ('Store5','Store6','Store7') OR StoreId = 'Store8'", {"To": "Store6"}, True),
    ],
)  # fmt: skip
def test_system_properties(text: str, system: dict[str, Any], result: bool | None) -> None:
    parameters = {"t": NOW - timedelta(1), "span": timedelta(minutes=5), "g": GUID}
    assert evaluate(text, None, parameters, **system) is result


def test_unknown_system_properties_are_refused() -> None:
    with pytest.raises(SqlSyntaxError, match="system property"):
        parse_filter("sys.Nope = 1")
    with pytest.raises(ValueError, match="unknown system property"):
        facts(Nope=1)
    with pytest.raises(SqlEvaluationError, match="no such system property"):
        evaluate("property('sys.Nope') = 1")


# -- functions --------------------------------------------------------------------------------


def test_property_function() -> None:
    user = {"color": "red", "name": "color", "a.b": 1}
    assert evaluate("property('color') = 'red'", user) is True
    assert evaluate("p('COLOR') = 'red'", user) is True
    assert evaluate("property(name) = 'red'", user) is True
    assert evaluate("property('col' + 'or') = 'red'", user) is True
    assert evaluate("property('user.color') = 'red'", user) is True
    assert evaluate("property('a.b') = 1", user) is True
    assert evaluate("property('sys.Label') = 'x'", user, Label="x") is True
    assert evaluate("property('SYS.subject') = 'x'", user, Label="x") is True
    assert evaluate("property('nope') = 'red'", user) is None
    assert evaluate("property(missing) = 'red'", user) is None
    assert evaluate("property(1) = 'red'", user) is None
    assert evaluate("property('nope') IS NULL", user) is True


def test_newid_is_a_fresh_guid() -> None:
    first, second = value("newid()"), value("newid()")
    assert isinstance(first, uuid.UUID) and first != second
    assert evaluate("newid() = newid()") is False
    with pytest.raises(SqlSyntaxError, match="a property before IS"):
        parse_filter("newid() IS NULL")  # the grammar: <property> IS [NOT] NULL
    assert evaluate("newid() = 'x'") is None


def test_parameters() -> None:
    assert evaluate("source = @stringParam", {"source": "orders"}, {"@stringParam": "orders"})
    assert evaluate("n = @p", {"n": 5}, {"p": 5}) is True
    assert evaluate("n = @p", {"n": 5}, {"p": 5.0}) is True
    assert evaluate("b = @p", {"b": True}, {"p": True}) is True
    assert evaluate("n = @p", {"n": 5}, {"p": None}) is None
    assert evaluate("DateTimeMp < @dtParam", {"DateTimeMp": NOW}, {"dtParam": NOW}) is False
    assert evaluate("@a = @b", None, {"a": "x", "b": "x"}) is True


def test_a_compiled_filter_is_reusable() -> None:
    rule = parse_filter("color = 'red' AND quantity > 10 OR sys.Label LIKE 'ord%'")
    assert rule.matches(facts({"color": "red", "quantity": 11}))
    assert not rule.matches(facts({"color": "red", "quantity": 10}))
    assert rule.matches(facts({}, Label="order-1"))
    assert not rule.matches(facts({"color": "blue"}, Label="x"))
    assert rule.evaluate(facts({"color": "red"})) is None
    assert rule.matches(facts({"color": "red", "quantity": 11}))
