"""Syntax tree of filters and actions, and its canonical text.

Nodes are frozen and compare by value, so a parsed filter can be compared with another, used
as a dict key, and printed back (``to_text``) as text that parses to the same tree. The tree
keeps what the text meant, not how it was written: ``!=`` is ``<>``, ``sys.subject`` is
``sys.Label``, ``user.x`` is ``x``, and ``a AND b AND c`` is one ``And`` of three.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .lexer import is_regular_identifier

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # typing.TypeIs is 3.13

KEYWORDS = frozenset(
    {"AND", "OR", "NOT", "IS", "NULL", "IN", "LIKE", "ESCAPE", "EXISTS", "TRUE", "FALSE"}
)
"""Reserved words: a regular identifier cannot be one of these (``[and]`` can)."""

LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
"""The range of a C# long: integer constants, and every integer result, stay within it."""

COMPARISON_OPERATORS = ("=", "<>", "<", "<=", ">", ">=")
ARITHMETIC_OPERATORS = ("+", "-", "*", "/", "%")


class Scope(enum.Enum):
    SYS = "sys"
    USER = "user"
    BODY = "body"
    """JSON body fields: an extension, only parsed when asked for (``body_fields=True``)."""


# -- values ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class Literal:
    """A constant: None (NULL), bool, int (a C# long), float (a double) or str."""

    value: bool | int | float | str | None

    def __eq__(self, other: object) -> bool:
        # 1 == 1.0 == True in Python, but they are three different SQL constants
        return (
            type(other) is Literal
            and type(self.value) is type(other.value)
            and self.value == other.value
        )

    def __hash__(self) -> int:
        return hash((type(self.value), self.value))


@dataclass(frozen=True, slots=True)
class Parameter:
    """``@name``: a value given with the filter (``SqlRuleFilter.Parameters``)."""

    name: str
    """Without the ``@``, as written."""


@dataclass(frozen=True, slots=True)
class Property:
    scope: Scope
    name: str
    """The canonical name for ``sys``; as written for ``user`` (looked up case-insensitively);
    for ``body``, the path segments joined with ``.`` (for messages only: ``path`` counts)."""
    path: tuple[str, ...] = ()
    """``body`` only: the field names (and array indexes, as decimal text) from the root."""


@dataclass(frozen=True, slots=True)
class NewId:
    """``newid()``: a fresh GUID at each evaluation."""


@dataclass(frozen=True, slots=True)
class PropertyFunction:
    """``property(name)`` / ``p(name)``: the property whose name ``name`` evaluates to."""

    name: Value


@dataclass(frozen=True, slots=True)
class Unary:
    op: str
    """``+`` or ``-``."""
    operand: Value


@dataclass(frozen=True, slots=True)
class Binary:
    op: str
    """One of ``ARITHMETIC_OPERATORS``."""
    left: Value
    right: Value


# -- predicates ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Comparison:
    op: str
    """One of ``COMPARISON_OPERATORS``."""
    left: Value
    right: Value


@dataclass(frozen=True, slots=True)
class IsNull:
    operand: Property | PropertyFunction
    negated: bool = False


@dataclass(frozen=True, slots=True)
class In:
    operand: Value
    items: tuple[Value, ...]
    negated: bool = False


@dataclass(frozen=True, slots=True)
class Like:
    operand: Value
    pattern: Value
    escape: Value | None = None
    negated: bool = False


@dataclass(frozen=True, slots=True)
class Exists:
    property: Property


@dataclass(frozen=True, slots=True)
class Not:
    operand: Predicate


@dataclass(frozen=True, slots=True)
class And:
    operands: tuple[Predicate, ...]
    """Two or more."""


@dataclass(frozen=True, slots=True)
class Or:
    operands: tuple[Predicate, ...]
    """Two or more."""


# -- action statements -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Set:
    target: Property
    value: Value


@dataclass(frozen=True, slots=True)
class Remove:
    target: Property


Value = Literal | Parameter | Property | NewId | PropertyFunction | Unary | Binary
Predicate = Comparison | IsNull | In | Like | Exists | Not | And | Or
Node = Value | Predicate
Statement = Set | Remove

PREDICATE_TYPES: tuple[type, ...] = (Comparison, IsNull, In, Like, Exists, Not, And, Or)


def is_predicate(node: Node) -> TypeIs[Predicate]:
    return isinstance(node, PREDICATE_TYPES)


def children(node: Node | Statement) -> Iterator[Node]:
    """The direct sub-nodes of ``node``, left to right."""
    match node:
        case PropertyFunction(name=name):
            yield name
        case Unary(operand=operand) | Not(operand=operand) | IsNull(operand=operand):
            yield operand
        case Binary(left=left, right=right) | Comparison(left=left, right=right):
            yield left
            yield right
        case In(operand=operand, items=items):
            yield operand
            yield from items
        case Like(operand=operand, pattern=pattern, escape=escape):
            yield operand
            yield pattern
            if escape is not None:
                yield escape
        case Exists(property=prop):
            yield prop
        case And(operands=operands) | Or(operands=operands):
            yield from operands
        case Set(target=target, value=value):
            yield target
            yield value
        case Remove(target=target):
            yield target
        case _:
            return


# -- canonical text --------------------------------------------------------------------------

_OR, _AND, _NOT, _PREDICATE, _ADDITIVE, _MULTIPLICATIVE, _UNARY, _PRIMARY = range(1, 9)


def _precedence(node: Node) -> int:
    match node:
        case Or():
            return _OR
        case And():
            return _AND
        case Not():
            return _NOT
        case Comparison() | IsNull() | In() | Like():
            return _PREDICATE
        case Binary(op=op):
            return _ADDITIVE if op in "+-" else _MULTIPLICATIVE
        case Unary():
            return _UNARY
        case _:
            return _PRIMARY


def _wrapped(node: Node, parenthesize: bool) -> str:
    text = to_text(node)
    return f"({text})" if parenthesize else text


def format_literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if value is True:
        return "TRUE"
    if value is False:
        return "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, float):
        return repr(float(value))  # "2.0", "1e+16": both read back as doubles
    return str(int(value))


def format_name(name: str) -> str:
    """A user property or parameter-free name as a regular identifier if it can be one."""
    if is_regular_identifier(name) and name.upper() not in KEYWORDS:
        return name
    return "[" + name.replace("]", "]]") + "]"


def format_segment(segment: str) -> str:
    """A ``body.`` path segment: an array index (decimal digits) stays as it is."""
    return segment if segment.isascii() and segment.isdecimal() else format_name(segment)


def uses_body(node: Node | Statement) -> bool:
    """Whether ``node`` reads a ``body.`` field anywhere (so the body must be parsed)."""
    if isinstance(node, Property):
        return node.scope is Scope.BODY
    return any(uses_body(child) for child in children(node))


def to_text(node: Node | Statement) -> str:
    """Canonical text: keywords upper case, minimal parentheses, single spaces."""
    match node:
        case Literal(value=value):
            return format_literal(value)
        case Parameter(name=name):
            return "@" + name
        case Property(scope=Scope.SYS, name=name):
            return "sys." + name
        case Property(scope=Scope.BODY, path=path):
            return "body." + ".".join(format_segment(segment) for segment in path)
        case Property(name=name):
            return format_name(name)
        case NewId():
            return "newid()"
        case PropertyFunction(name=name):
            return f"property({to_text(name)})"
        case Unary(op=op, operand=operand):
            # "-(5)" stays a negation of 5; "-5" would read back as the constant -5
            tight = isinstance(operand, Unary) or (
                isinstance(operand, Literal)
                and isinstance(operand.value, int | float)
                and not isinstance(operand.value, bool)
            )
            return op + _wrapped(operand, tight or _precedence(operand) < _UNARY)
        case Binary(op=op, left=left, right=right):
            level = _precedence(node)
            return (
                f"{_wrapped(left, _precedence(left) < level)} {op} "
                f"{_wrapped(right, _precedence(right) <= level)}"
            )
        case Comparison(op=op, left=left, right=right):
            return f"{to_text(left)} {op} {to_text(right)}"
        case IsNull(operand=operand, negated=negated):
            return f"{to_text(operand)} IS {'NOT ' if negated else ''}NULL"
        case In(operand=operand, items=items, negated=negated):
            listed = ", ".join(to_text(item) for item in items)
            return f"{to_text(operand)} {'NOT ' if negated else ''}IN ({listed})"
        case Like(operand=operand, pattern=pattern, escape=escape, negated=negated):
            text = f"{to_text(operand)} {'NOT ' if negated else ''}LIKE {to_text(pattern)}"
            return text if escape is None else f"{text} ESCAPE {to_text(escape)}"
        case Exists(property=prop):
            return f"EXISTS({to_text(prop)})"
        case Not(operand=operand):
            return "NOT " + _wrapped(operand, _precedence(operand) < _NOT)
        case And(operands=operands):
            return " AND ".join(_wrapped(o, _precedence(o) <= _AND) for o in operands)
        case Or(operands=operands):
            return " OR ".join(_wrapped(o, _precedence(o) <= _OR) for o in operands)
        case Set(target=target, value=value):
            return f"SET {to_text(target)} = {to_text(value)}"
        case Remove(target=target):
            return f"REMOVE {to_text(target)}"
    raise TypeError(f"not a filter or action node: {node!r}")


def statements_text(statements: tuple[Statement, ...]) -> str:
    return "; ".join(to_text(s) for s in statements)
