"""Three-valued evaluation of the syntax tree, compiled once into nested closures.

A broker runs every subscription's filter on every message, so the tree is walked once, when
the rule is made, into closures that only look up properties and compute; constants and
parameters are folded into them, ``LIKE 'ord%'`` becomes ``startswith``.

Values are Python's: None is NULL and unknown, ``int`` a C# long, ``float`` a double, ``str``,
``bool``, ``datetime`` (naive ones are taken as UTC), ``timedelta`` (a TimeSpan) and ``UUID``
(a Guid). Predicates give True, False or None (unknown). Operators follow C# as the docs ask:
long op long stays a long (wrapping on overflow, truncating division), long op double is a
double, ``/`` and ``%`` by zero are an error for longs and IEEE results for doubles. Where C#
has no operator for the two types (``'a' = 1``, ``TRUE < FALSE``, ``'a' * 2``), the result is
unknown rather than an error, as for a missing property.
"""

from __future__ import annotations

import math
import operator
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from .ast import (
    LONG_MAX,
    LONG_MIN,
    And,
    Binary,
    Comparison,
    Exists,
    In,
    IsNull,
    Like,
    Literal,
    NewId,
    Node,
    Not,
    Or,
    Parameter,
    Property,
    PropertyFunction,
    Remove,
    Scope,
    Statement,
    Unary,
)
from .errors import SqlEvaluationError
from .facts import MessageFacts, SystemProperty, system_property
from .like import like_matcher

Getter = Callable[[MessageFacts], Any]
Test = Callable[[MessageFacts], bool | None]
Step = Callable[[MessageFacts], None]

_LONG_MASK = 2**64 - 1

# kinds of values, named after their C# types (error messages show them)
NULL, BOOLEAN, LONG, DOUBLE, STRING = "null", "boolean", "long", "double", "string"
DATETIME, TIMESPAN, GUID, OTHER = "datetime", "timespan", "guid", "other"

_KIND_OF_TYPE: dict[type, str] = {
    type(None): NULL,
    bool: BOOLEAN,
    int: LONG,
    float: DOUBLE,
    str: STRING,
    datetime: DATETIME,
    timedelta: TIMESPAN,
    uuid.UUID: GUID,
}
_NUMERIC = frozenset({LONG, DOUBLE})
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_MISSING = object()


def kind_of(value: Any) -> str:
    """The C# type a Python value stands for (AMQP's int and str subclasses included)."""
    kind = _KIND_OF_TYPE.get(type(value))
    if kind is not None:
        return kind
    if isinstance(value, int):  # bool cannot be subclassed, so this is a number
        return LONG
    if isinstance(value, float):
        return DOUBLE
    if isinstance(value, str):
        return STRING
    if isinstance(value, datetime):
        return DATETIME
    if isinstance(value, timedelta):
        return TIMESPAN
    if isinstance(value, uuid.UUID):
        return GUID
    return OTHER


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def compare(op: str, left: Any, right: Any) -> bool | None:
    """``left op right`` for one of ``= <> < <= > >=``; None when unknown or not comparable.

    Strings compare ordinally (case-sensitive); booleans and GUIDs only with ``=`` / ``<>``.
    """
    lk = kind_of(left)
    rk = kind_of(right)
    if lk is NULL or rk is NULL:
        return None
    if lk is rk:
        if lk is LONG or lk is DOUBLE or lk is STRING or lk is TIMESPAN:
            return _OPS[op](left, right)
        if lk is DATETIME:
            return _OPS[op](_utc(left), _utc(right))
        if lk is BOOLEAN or lk is GUID:
            return _OPS[op](left, right) if op == "=" or op == "<>" else None
        return None
    if lk in _NUMERIC and rk in _NUMERIC:
        return _OPS[op](float(left), float(right))  # C#: the long becomes a double
    return None


def equals(left: Any, right: Any) -> bool | None:
    return compare("=", left, right)


def wrap_long(value: int) -> int:
    """C#'s unchecked long arithmetic: two's complement wrap-around."""
    if LONG_MIN <= value <= LONG_MAX:
        return value
    return ((value - LONG_MIN) & _LONG_MASK) + LONG_MIN


def _long_arithmetic(op: str, a: int, b: int) -> int:
    if op == "+":
        return wrap_long(a + b)
    if op == "-":
        return wrap_long(a - b)
    if op == "*":
        return wrap_long(a * b)
    if b == 0:
        raise SqlEvaluationError(f"{a} {op} 0: division by zero (both operands are longs)")
    if a == LONG_MIN and b == -1:
        raise SqlEvaluationError(f"{a} {op} -1 overflows a long")
    quotient = abs(a) // abs(b)
    if (a < 0) != (b < 0):
        quotient = -quotient  # C# truncates toward zero
    return wrap_long(quotient if op == "/" else a - b * quotient)


def _double_arithmetic(op: str, a: float, b: float) -> float:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0.0:
            if a == 0.0 or math.isnan(a):
                return math.nan
            return math.copysign(math.inf, a) * math.copysign(1.0, b)
        return a / b
    if b == 0.0 or math.isinf(a) or math.isnan(a) or math.isnan(b):
        return math.nan
    return math.fmod(a, b)  # C#: the remainder has the sign of the dividend


def arithmetic(op: str, left: Any, right: Any) -> Any:
    """``left op right`` for one of ``+ - * / %``; None when unknown or not defined."""
    lk = kind_of(left)
    rk = kind_of(right)
    if lk is NULL or rk is NULL:
        return None
    if lk is LONG and rk is LONG:
        return _long_arithmetic(op, int(left), int(right))
    if lk in _NUMERIC and rk in _NUMERIC:
        return _double_arithmetic(op, float(left), float(right))
    try:
        if op == "+":
            if lk is STRING and rk is STRING:
                return str(left) + str(right)
            if lk is DATETIME and rk is TIMESPAN:
                return left + right
            if lk is TIMESPAN and rk is DATETIME:
                return right + left
            if lk is TIMESPAN and rk is TIMESPAN:
                return left + right
        elif op == "-":
            if lk is DATETIME and rk is TIMESPAN:
                return left - right
            if lk is DATETIME and rk is DATETIME:
                return _utc(left) - _utc(right)
            if lk is TIMESPAN and rk is TIMESPAN:
                return left - right
    except OverflowError as exc:
        raise SqlEvaluationError(f"{left} {op} {right} is out of range ({exc})") from None
    return None


def negate(value: Any) -> Any:
    kind = kind_of(value)
    if kind is LONG:
        return wrap_long(-int(value))
    if kind is DOUBLE or kind is TIMESPAN:
        try:
            return -value
        except OverflowError as exc:  # -timedelta.min
            raise SqlEvaluationError(f"-({value}) is out of range ({exc})") from None
    return None


def positive(value: Any) -> Any:
    return value if kind_of(value) in (LONG, DOUBLE, TIMESPAN) else None


# -- property lookup -------------------------------------------------------------------------


def user_key(user: Mapping[str, Any], name: str, folded: str) -> str | None:
    """The key under which ``user`` holds property ``name`` (names are case-insensitive)."""
    if name in user:
        return name
    for key in user:
        if isinstance(key, str) and key.lower() == folded:
            return key
    return None


def _user_getter(name: str) -> Getter:
    folded = name.lower()

    def get(facts: MessageFacts) -> Any:
        user = facts.user
        value = user.get(name, _MISSING)
        if value is not _MISSING:
            return value
        for key, value in user.items():
            if isinstance(key, str) and key.lower() == folded:
                return value
        return None

    return get


def body_field(document: Any, path: tuple[str, ...]) -> Any:
    """The JSON value at ``path`` in ``document``, or ``_MISSING``.

    Object keys match exactly first, then case-insensitively (like user property names); a
    segment of decimal digits indexes an array. A JSON integer outside the range of a long is
    read as a double.
    """
    value = document
    for segment in path:
        if isinstance(value, dict):
            found = value.get(segment, _MISSING)
            if found is _MISSING:
                key = user_key(value, segment, segment.lower())
                if key is None:
                    return _MISSING
                found = value[key]
            value = found
        elif isinstance(value, list) and segment.isascii() and segment.isdecimal():
            index = int(segment)
            if index >= len(value):
                return _MISSING
            value = value[index]
        else:
            return _MISSING
    if type(value) is int and not LONG_MIN <= value <= LONG_MAX:
        return float(value)
    return value


def _body_getter(path: tuple[str, ...]) -> Getter:
    def get(facts: MessageFacts) -> Any:
        value = body_field(facts.body, path)
        return None if value is _MISSING else value

    return get


def lookup(facts: MessageFacts, name: str) -> Any:
    """``property(name)``: ``sys.X`` and ``user.X`` name a scope, anything else a user property."""
    folded = name.lower()
    if folded.startswith("sys."):
        prop = system_property(name[4:])
        if prop is None:
            raise SqlEvaluationError(f"property({name!r}): there is no such system property")
        return facts.system.get(prop.name)
    if folded.startswith("user."):
        name = name[5:]
    key = user_key(facts.user, name, name.lower())
    return None if key is None else facts.user[key]


# -- compilation -----------------------------------------------------------------------------


def _constant(node: Node, parameters: Mapping[str, Any]) -> tuple[bool, Any]:
    if isinstance(node, Literal):
        return True, node.value
    if isinstance(node, Parameter):
        return True, parameters[node.name.lower()]
    return False, None


def compile_value(node: Node, parameters: Mapping[str, Any]) -> Getter:
    """A function giving the value of ``node`` for a message."""
    is_constant, constant = _constant(node, parameters)
    if is_constant:
        return lambda facts: constant
    match node:
        case Property(scope=Scope.SYS, name=name):
            return lambda facts: facts.system.get(name)
        case Property(scope=Scope.BODY, path=path):
            return _body_getter(path)
        case Property(name=name):
            return _user_getter(name)
        case NewId():
            return lambda facts: uuid.uuid4()
        case PropertyFunction(name=argument):
            get_name = compile_value(argument, parameters)

            def by_name(facts: MessageFacts) -> Any:
                name = get_name(facts)
                return lookup(facts, name) if isinstance(name, str) else None

            return by_name
        case Unary(op=op, operand=operand):
            get = compile_value(operand, parameters)
            sign = negate if op == "-" else positive
            return lambda facts: sign(get(facts))
        case Binary(op=op, left=left, right=right):
            get_left = compile_value(left, parameters)
            get_right = compile_value(right, parameters)
            return lambda facts: arithmetic(op, get_left(facts), get_right(facts))
    raise TypeError(f"not a value: {node!r}")


def compile_predicate(node: Node, parameters: Mapping[str, Any]) -> Test:
    """A function giving True, False or None (unknown) for a message."""
    match node:
        case Comparison(op=op, left=left, right=right):
            return _comparison(op, left, right, parameters)
        case IsNull(operand=operand, negated=negated):
            get = compile_value(operand, parameters)
            if negated:
                return lambda facts: get(facts) is not None
            return lambda facts: get(facts) is None
        case In(operand=operand, items=items, negated=negated):
            return _in(operand, items, negated, parameters)
        case Like(operand=operand, pattern=pattern, escape=escape, negated=negated):
            return _like(operand, pattern, escape, negated, parameters)
        case Exists(property=Property(scope=Scope.SYS, name=name)):
            return lambda facts: facts.system.get(name) is not None
        case Exists(property=Property(scope=Scope.BODY, path=path)):
            return lambda facts: body_field(facts.body, path) is not _MISSING
        case Exists(property=Property(name=name)):
            folded = name.lower()
            return lambda facts: user_key(facts.user, name, folded) is not None
        case Not(operand=operand):
            test = compile_predicate(operand, parameters)

            def negation(facts: MessageFacts) -> bool | None:
                result = test(facts)
                return None if result is None else not result

            return negation
        case And(operands=operands):
            return _and(tuple(compile_predicate(o, parameters) for o in operands))
        case Or(operands=operands):
            return _or(tuple(compile_predicate(o, parameters) for o in operands))
    raise TypeError(f"not a predicate: {node!r}")


def _comparison(op: str, left: Node, right: Node, parameters: Mapping[str, Any]) -> Test:
    get_left = compile_value(left, parameters)
    right_is_constant, constant = _constant(right, parameters)
    if right_is_constant and not _constant(left, parameters)[0]:
        # the usual shape, "prop op constant": skip the generic dispatch when types match
        kind = kind_of(constant)
        native = _OPS[op]
        if kind is STRING or kind is LONG:
            exact = type(constant)

            def against_constant(facts: MessageFacts) -> bool | None:
                value = get_left(facts)
                if type(value) is exact:
                    return native(value, constant)
                return compare(op, value, constant)

            return against_constant
        if kind is DOUBLE:

            def against_double(facts: MessageFacts) -> bool | None:
                value = get_left(facts)
                if type(value) is float or type(value) is int:
                    return native(float(value), constant)
                return compare(op, value, constant)

            return against_double
    get_right = compile_value(right, parameters)
    return lambda facts: compare(op, get_left(facts), get_right(facts))


def _in(
    operand: Node, items: tuple[Node, ...], negated: bool, parameters: Mapping[str, Any]
) -> Test:
    get = compile_value(operand, parameters)
    constants = [_constant(item, parameters) for item in items]
    if all(is_constant for is_constant, _ in constants):
        values = tuple(value for _, value in constants)
        strings = frozenset(v for v in values if type(v) is str)

        def in_constants(facts: MessageFacts) -> bool | None:
            value = get(facts)
            if type(value) is str:
                found = value in strings
            elif value is None:
                return None
            else:
                found = any(equals(value, v) is True for v in values)
            return found is not negated

        return in_constants
    getters = tuple(compile_value(item, parameters) for item in items)

    def in_values(facts: MessageFacts) -> bool | None:
        value = get(facts)
        if value is None:
            return None
        found = any(equals(value, item(facts)) is True for item in getters)
        return found is not negated

    return in_values


def _like(
    operand: Node,
    pattern: Node,
    escape: Node | None,
    negated: bool,
    parameters: Mapping[str, Any],
) -> Test:
    get = compile_value(operand, parameters)
    pattern_is_constant, constant_pattern = _constant(pattern, parameters)
    escape_is_constant, constant_escape = (
        (True, None) if escape is None else _constant(escape, parameters)
    )
    if (
        pattern_is_constant
        and escape_is_constant
        and isinstance(constant_pattern, str)
        and (
            constant_escape is None
            or (isinstance(constant_escape, str) and len(constant_escape) == 1)
        )
    ):
        try:
            matches = like_matcher(constant_pattern, constant_escape)
        except ValueError:
            pass  # a parameter's pattern: reported at run time, as for a property's
        else:

            def like_constant(facts: MessageFacts) -> bool | None:
                value = get(facts)
                if isinstance(value, str):
                    return matches(value) is not negated
                return None

            return like_constant
    get_pattern = compile_value(pattern, parameters)
    get_escape = None if escape is None else compile_value(escape, parameters)

    def like_values(facts: MessageFacts) -> bool | None:
        value = get(facts)
        pattern_value = get_pattern(facts)
        escape_value = None if get_escape is None else get_escape(facts)
        if value is None or pattern_value is None:
            return None
        if get_escape is not None and escape_value is None:
            return None
        if not isinstance(value, str) or not isinstance(pattern_value, str):
            return None
        if escape_value is not None and (
            not isinstance(escape_value, str) or len(escape_value) != 1
        ):
            raise SqlEvaluationError(
                f"LIKE ... ESCAPE {escape_value!r}: the escape must be a one-character string"
            )
        try:
            matches = like_matcher(pattern_value, escape_value)
        except ValueError as exc:
            raise SqlEvaluationError(f"LIKE {pattern_value!r}: {exc}") from None
        return matches(value) is not negated

    return like_values


def _and(tests: tuple[Test, ...]) -> Test:
    return _junction(tests, decisive=False)


def _or(tests: tuple[Test, ...]) -> Test:
    return _junction(tests, decisive=True)


def _junction(tests: tuple[Test, ...], decisive: bool) -> Test:
    """AND (``decisive`` False) or OR (True) in three-valued logic: the first operand equal
    to ``decisive`` decides; otherwise any unknown makes the whole unknown."""
    other = not decisive
    if len(tests) == 2:
        first, second = tests

        def two(facts: MessageFacts) -> bool | None:
            a = first(facts)
            if a is decisive:
                return decisive
            b = second(facts)
            if b is decisive:
                return decisive
            return other if a is other and b is other else None

        return two

    def many(facts: MessageFacts) -> bool | None:
        unknown = False
        for test in tests:
            result = test(facts)
            if result is decisive:
                return decisive
            if result is None:
                unknown = True
        return None if unknown else other

    return many


# -- actions ---------------------------------------------------------------------------------


def _system_value(prop: SystemProperty, value: Any) -> Any:
    kind = kind_of(value)
    if kind != prop.kind:
        raise SqlEvaluationError(
            f"SET sys.{prop.name}: expected a {prop.kind} value but got a {kind} ({value!r})"
        )
    return value


def _converted(value: Any, old: Any) -> Any:
    """SET keeps a property's type where C# converts implicitly: a long into a double one."""
    if isinstance(old, float) and kind_of(value) is LONG:
        return type(old)(value)
    return value


def compile_statement(statement: Statement, parameters: Mapping[str, Any]) -> Step:
    """A function applying one SET or REMOVE to a message's facts."""
    target = statement.target
    name = target.name
    if target.scope is Scope.SYS:
        prop = system_property(name)
        assert prop is not None and prop.settable  # the parser refuses the others
        if isinstance(statement, Remove):

            def remove_system(facts: MessageFacts) -> None:
                facts.system.pop(name, None)

            return remove_system
        get = compile_value(statement.value, parameters)

        def set_system(facts: MessageFacts) -> None:
            value = get(facts)
            if value is None:
                facts.system.pop(name, None)
            else:
                facts.system[name] = _system_value(prop, value)

        return set_system
    folded = name.lower()
    if isinstance(statement, Remove):

        def remove_user(facts: MessageFacts) -> None:
            user = facts.user
            for key in [k for k in user if isinstance(k, str) and k.lower() == folded]:
                del user[key]

        return remove_user
    get = compile_value(statement.value, parameters)

    def set_user(facts: MessageFacts) -> None:
        value = get(facts)
        user = facts.user
        key = user_key(user, name, folded)
        if key is None:
            user[name] = value
        else:
            user[key] = _converted(value, user[key])

    return set_user


def compile_statements(statements: tuple[Statement, ...], parameters: Mapping[str, Any]) -> Step:
    """All statements, in order, each seeing the changes of those before; all or nothing."""
    steps = tuple(compile_statement(s, parameters) for s in statements)

    def apply(facts: MessageFacts) -> None:
        work = MessageFacts(dict(facts.system), dict(facts.user))
        for step in steps:
            step(work)
        facts.system.clear()
        facts.system.update(work.system)
        facts.user.clear()
        facts.user.update(work.user)

    return apply
