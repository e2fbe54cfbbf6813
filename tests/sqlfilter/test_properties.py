"""Property tests: canonical text round-trips, the parser's only failure is SqlSyntaxError,
numbers behave as C# says, compiled filters agree with a plain tree-walking interpreter, and
correlation filters agree with the SQL they claim to be."""

from __future__ import annotations

import math
import operator
import re
from fractions import Fraction
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from replication.sqlfilter import (
    CorrelationFilter,
    MessageFacts,
    SqlEvaluationError,
    SqlSyntaxError,
    parse_action,
    parse_filter,
)
from replication.sqlfilter.ast import (
    And,
    Binary,
    Comparison,
    Exists,
    In,
    IsNull,
    Like,
    Literal,
    Not,
    Or,
    Parameter,
    Property,
    PropertyFunction,
    Scope,
    Unary,
    format_literal,
    statements_text,
    to_text,
)
from replication.sqlfilter.evaluate import arithmetic, compare, lookup, negate, positive
from replication.sqlfilter.params import normalize_parameters

from . import strategies as s
from .helpers import same, value

# -- canonical text ---------------------------------------------------------------------------


@given(s.predicates())
def test_filter_text_round_trips(tree: Any) -> None:
    text = to_text(tree)
    parsed = parse_filter(text, s.PARAMETERS)
    assert parsed.ast == tree, text
    assert parsed.expression == text


@given(s.statements)
def test_action_text_round_trips(statements: Any) -> None:
    text = statements_text(statements)
    parsed = parse_action(text, s.PARAMETERS)
    assert parsed.statements == statements, text
    assert parsed.expression == text


# -- the parser never fails otherwise ---------------------------------------------------------

TOKENS = ["a", "b", "sys", "user", ".", "Label", "Nope", "(", ")", ",", ";", "AND", "OR", "NOT",
          "=", "<>", "!=", "<", ">=", "+", "-", "*", "/", "%", "1", "0", "2.5", "1e999",
          "9223372036854775808", "'s'", "'", "'%!'", "[x]", "[", '"q"', "IN", "LIKE", "ESCAPE",
          "'!'", "IS", "NULL", "EXISTS", "TRUE", "newid", "p", "property", "@p", "@nope", "@",
          "SET", "REMOVE", "#", "\n"]  # fmt: skip


def _parses_or_refuses(text: str) -> None:
    for parse in (parse_filter, parse_action):
        try:
            parsed = parse(text, s.PARAMETERS)
        except SqlSyntaxError as error:
            assert 0 <= error.position <= len(text)
            assert error.expected and error.found
            continue
        # what parses, prints as text that parses to the same thing
        again = parse(parsed.expression, s.PARAMETERS)
        assert again == parsed


@given(st.text())
def test_arbitrary_text_parses_or_raises_a_syntax_error(text: str) -> None:
    _parses_or_refuses(text)


@given(st.lists(st.sampled_from(TOKENS), max_size=12).map(" ".join))
@example("a IN (1, 2 AND b = 1")
@example("((((a = 1))))")
def test_token_soup_parses_or_raises_a_syntax_error(text: str) -> None:
    _parses_or_refuses(text)


# -- numbers: C# semantics, against a direct transcription of the C# spec ----------------------

LONG_MIN = -(2**63)
ERROR = object()


def _wrap(n: int) -> int:
    return (n + 2**63) % 2**64 - 2**63


def reference_arithmetic(op: str, a: Any, b: Any) -> Any:
    if a is None or b is None:
        return None
    if type(a) is int and type(b) is int:
        if op in "/%":
            if b == 0 or (a == LONG_MIN and b == -1):
                return ERROR
            quotient = int(Fraction(a, b))  # int() truncates toward zero, as C# does
            return _wrap(quotient if op == "/" else a - b * quotient)
        return _wrap({"+": a + b, "-": a - b, "*": a * b}[op])
    x, y = float(a), float(b)
    if op == "/" and y == 0:
        if x == 0 or math.isnan(x):
            return math.nan
        return math.inf if (x > 0) == (math.copysign(1, y) > 0) else -math.inf
    if op == "%":
        # C# spec, floating-point remainder: NaN for y = 0, x infinite or either NaN; x for
        # infinite y; else x - n * y with n = x / y truncated, exactly
        if math.isnan(x) or math.isnan(y) or math.isinf(x) or y == 0:
            return math.nan
        if math.isinf(y):
            return x
        exact = Fraction(x) - Fraction(y) * int(Fraction(x) / Fraction(y))
        return math.copysign(float(exact), x) if exact == 0 else float(exact)
    return {"+": x + y, "-": x - y, "*": x * y, "/": x / y if y else math.nan}[op]


def reference_compare(op: str, a: Any, b: Any) -> bool | None:
    if a is None or b is None:
        return None
    numeric = (int, float)
    if type(a) in numeric and type(b) in numeric:
        if type(a) is not type(b):
            a, b = float(a), float(b)
    elif type(a) is not type(b) or (type(a) is bool and op not in ("=", "<>")):
        return None
    table = {"=": operator.eq, "<>": operator.ne, "<": operator.lt, "<=": operator.le,
             ">": operator.gt, ">=": operator.ge}  # fmt: skip
    return table[op](a, b)


numbers = st.one_of(s.longs, st.floats(), st.integers(-5, 5), st.none())
operands = st.one_of(numbers, st.booleans(), st.sampled_from(["a", "b", ""]))


@given(numbers, numbers, st.sampled_from(["+", "-", "*", "/", "%"]))
@example(LONG_MIN, -1, "/")
@example(2**63 - 1, 1, "+")
@example(-7, 2, "%")
@example(-7.5, 2, "%")
@example(5.0, 0.0, "/")
@example(-0.0, 1.0, "%")
def test_arithmetic_agrees_with_the_reference(a: Any, b: Any, op: str) -> None:
    expected = reference_arithmetic(op, a, b)
    forms = [("@a {} @b", {}), ("x {} @b", {"x": a}), ("x {} y", {"x": a, "y": b})]
    if all(v is None or isinstance(v, int) or math.isfinite(v) for v in (a, b)):
        forms.append((f"{format_literal(a)} {{}} {format_literal(b)}", {}))
    for template, user in forms:
        text = template.format(op)
        try:
            got = value(text, user, {"a": a, "b": b})
        except SqlEvaluationError:
            got = ERROR
        assert got is ERROR if expected is ERROR else same(got, expected), (text, a, b, got)


@given(operands, operands, st.sampled_from(["=", "<>", "<", "<=", ">", ">="]))
@example(2**53 + 1, float(2**53), "=")
@example(math.nan, math.nan, "<>")
@example(True, 1, "=")
def test_comparison_agrees_with_the_reference(a: Any, b: Any, op: str) -> None:
    expected = reference_compare(op, a, b)
    parameters = {"a": a, "b": b}
    for text, user in [("@a {} @b", {}), ("x {} @b", {"x": a}), ("@a {} y", {"y": b}),
                       ("x {} y", {"x": a, "y": b})]:  # fmt: skip
        got = parse_filter(text.format(op), parameters).evaluate(MessageFacts({}, user))
        assert got is expected, (text, a, b)
    assert compare(op, a, b) is expected


# -- compiled closures against a plain interpreter of the tree ---------------------------------


def _like(text: str, pattern: str, escape: str | None) -> bool:
    regex = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if escape is not None and ch == escape:
            if i + 1 == len(pattern):
                raise SqlEvaluationError("dangling escape")
            regex.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        regex.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return re.fullmatch("".join(regex), text, re.DOTALL) is not None


def interpret(node: Any, message: MessageFacts, parameters: dict[str, Any]) -> Any:
    """The tree's meaning, spelled out node by node, with none of the compiler's shortcuts."""

    def run(n: Any) -> Any:
        return interpret(n, message, parameters)

    match node:
        case Literal(value=v):
            return v
        case Parameter(name=name):
            return parameters[name.lower()]
        case Property(scope=Scope.SYS, name=name):
            return message.system.get(name)
        case Property(name=name):
            for key, v in message.user.items():
                if key == name:
                    return v
            return next((v for k, v in message.user.items() if k.lower() == name.lower()), None)
        case PropertyFunction(name=n):
            name = run(n)
            return lookup(message, name) if isinstance(name, str) else None
        case Unary(op=op, operand=operand):
            return (negate if op == "-" else positive)(run(operand))
        case Binary(op=op, left=left, right=right):
            return arithmetic(op, run(left), run(right))
        case Comparison(op=op, left=left, right=right):
            return compare(op, run(left), run(right))
        case IsNull(operand=operand, negated=negated):
            return (run(operand) is None) is not negated
        case Exists(property=Property(scope=Scope.SYS, name=name)):
            return message.system.get(name) is not None
        case Exists(property=Property(name=name)):
            return any(k.lower() == name.lower() for k in message.user)
        case In(operand=operand, items=items, negated=negated):
            v = run(operand)
            if v is None:
                return None
            found = any(compare("=", v, run(item)) is True for item in items)
            return found is not negated
        case Like(operand=operand, pattern=pattern, escape=escape, negated=negated):
            v, p = run(operand), run(pattern)
            e = None if escape is None else run(escape)
            if v is None or p is None or (escape is not None and e is None):
                return None
            if not isinstance(v, str) or not isinstance(p, str):
                return None
            if e is not None and (not isinstance(e, str) or len(e) != 1):
                raise SqlEvaluationError("bad escape")
            return _like(v, p, e) is not negated
        case Not(operand=operand):
            r = run(operand)
            return None if r is None else not r
        case And(operands=operands):
            results = []
            for o in operands:
                r = run(o)
                if r is False:
                    return False
                results.append(r)
            return True if all(r is True for r in results) else None
        case Or(operands=operands):
            results = []
            for o in operands:
                r = run(o)
                if r is True:
                    return True
                results.append(r)
            return False if all(r is False for r in results) else None
    raise AssertionError(node)


@given(s.predicates(deterministic=True), s.messages())
def test_compiled_filters_agree_with_the_interpreter(tree: Any, message: MessageFacts) -> None:
    parameters = normalize_parameters(s.PARAMETERS)
    try:
        expected = interpret(tree, message, parameters)
    except SqlEvaluationError:
        expected = ERROR
    compiled = parse_filter(to_text(tree), s.PARAMETERS)
    try:
        got = compiled.evaluate(message)
    except SqlEvaluationError:
        got = ERROR
    assert got is expected, to_text(tree)
    if got is not ERROR:
        assert compiled.matches(message) is (expected is True)


# -- correlation filters are the SQL they print -------------------------------------------------

pool = st.sampled_from(["a", "A", "b", 1, 2, 1.0, 2.5, True, False, s.NOW])


@given(
    st.fixed_dictionaries(
        {},
        optional={
            "correlation_id": st.sampled_from(["a", "A"]),
            "subject": st.sampled_from(["a", "A"]),
            "to": st.sampled_from(["a", "b"]),
            "properties": st.dictionaries(st.sampled_from(["a", "B", "color"]), pool, max_size=2),
        },
    ),
    st.dictionaries(st.sampled_from(["a", "b", "color", "COLOR"]), st.one_of(st.none(), pool)),
    st.dictionaries(
        st.sampled_from(["CorrelationId", "Label", "To"]), st.sampled_from(["a", "A", "b", 1])
    ),
)
def test_correlation_filters_match_as_their_sql_does(
    fields: dict[str, Any], user: dict[str, Any], system: dict[str, Any]
) -> None:
    rule = CorrelationFilter(**fields)
    message = MessageFacts(dict(system), dict(user))
    sql = parse_filter(rule.expression, rule.parameters)
    assert rule.matches(message) is sql.matches(message)
