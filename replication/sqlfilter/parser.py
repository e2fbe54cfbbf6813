"""Recursive-descent parser for SQL filter predicates and rule-action statements.

Precedence, loosest first: ``OR``, ``AND``, ``NOT``, the predicates (``= <> != < <= > >=``,
``IS [NOT] NULL``, ``[NOT] IN``, ``[NOT] LIKE``), ``+ -``, ``* / %``, unary ``+ -``. The
Service Bus grammar keeps predicates and values apart (``a AND b`` is not a filter unless ``a``
and ``b`` are predicates, ``(a = 1) + 1`` is not a value); since both may sit in parentheses,
the parser reads either and checks the kind where it is used.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from . import ast
from .ast import (
    COMPARISON_OPERATORS,
    KEYWORDS,
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
    Predicate,
    Property,
    PropertyFunction,
    Remove,
    Scope,
    Set,
    Statement,
    Unary,
    Value,
    is_predicate,
)
from .errors import SqlSyntaxError
from .facts import SETTABLE_NAMES, SYSTEM_PROPERTIES, system_property
from .lexer import Kind, Token, tokenize
from .like import check_pattern

MAX_NESTING = 64
"""Parentheses, NOT and unary signs nested deeper than this are refused (Python's stack)."""
MAX_DEPTH = 128
"""Syntax trees deeper than this are refused (each level costs a frame when evaluated)."""

_PREDICATE_OPERATOR = "a comparison operator (=, <>, !=, <, <=, >, >=), IS, IN, LIKE or NOT"
_SYSTEM_NAMES = ", ".join(p.name for p in SYSTEM_PROPERTIES)
_COMPARISONS = frozenset((*COMPARISON_OPERATORS, "!="))
_INDEXES = re.compile(r"[0-9]+(?:\.[0-9]+)*\.?")
"""Number tokens that are array indexes in a body path: ``0.``, ``1.5`` (not ``1e3``)."""


def parse_predicate(
    text: str, parameters: Mapping[str, Any] | None = None, *, body_fields: bool = False
) -> Predicate:
    """The predicate of a SQL filter; ``parameters`` are keyed by folded name without ``@``.
    ``body_fields`` admits the ``body.`` scope (JSON body fields, an extension)."""
    parser = _Parser(text, parameters, body_fields=body_fields)
    node = parser.disjunction()
    if not is_predicate(node):
        parser.fail(_PREDICATE_OPERATOR)
    if parser.tok.kind is not Kind.EOF:
        parser.fail("AND, OR or end of input")
    return node


def parse_value(
    text: str, parameters: Mapping[str, Any] | None = None, *, body_fields: bool = False
) -> Value:
    """A value expression alone (``quantity / 2``): for tests and computed pipeline fields."""
    parser = _Parser(text, parameters, body_fields=body_fields)
    node = parser.value(parser.additive)
    if parser.tok.kind is not Kind.EOF:
        parser.fail("an arithmetic operator or end of input")
    return node


def parse_statements(
    text: str, parameters: Mapping[str, Any] | None = None
) -> tuple[Statement, ...]:
    """The statements of a SQL rule action: ``SET p = e`` / ``REMOVE p``, each optionally
    followed by one ``;``."""
    parser = _Parser(text, parameters)
    statements: list[Statement] = []
    after_semicolon = False
    while True:
        tok = parser.tok
        if parser.is_keyword(tok, "SET"):
            parser.advance()
            target = parser.settable_property()
            parser.expect_op("=")
            statements.append(Set(target, parser.value(parser.additive)))
        elif parser.is_keyword(tok, "REMOVE"):
            parser.advance()
            statements.append(Remove(parser.settable_property()))
        elif after_semicolon:
            parser.fail("SET, REMOVE or end of input")
        elif statements:
            parser.fail("SET, REMOVE, ';' or end of input")
        else:
            parser.fail("SET or REMOVE")
        after_semicolon = parser.is_op(parser.tok, ";")
        if after_semicolon:
            parser.advance()
        if parser.tok.kind is Kind.EOF:
            return tuple(statements)


def _found(tok: Token) -> str:
    if tok.kind is Kind.EOF:
        return "end of input"
    text = tok.text if len(tok.text) <= 30 else tok.text[:27] + "..."
    return f'"{text}"' if "'" in text else f"'{text}'"


def _constant_text(node: Value | None) -> str | None:
    """The text of a string constant (``like_operand`` lets no other constant through)."""
    return node.value if isinstance(node, Literal) and isinstance(node.value, str) else None


class _Parser:
    def __init__(
        self, text: str, parameters: Mapping[str, Any] | None, *, body_fields: bool = False
    ) -> None:
        self.text = text
        self.body_fields = body_fields
        self.tokens = tokenize(text)
        self.index = 0
        self.tok = self.tokens[0]
        self.parameters = parameters or {}
        self.nesting = 0
        self.depths: dict[int, tuple[int, Node]] = {}

    # -- token helpers -----------------------------------------------------------------------

    def advance(self) -> Token:
        tok = self.tok
        if tok.kind is not Kind.EOF:
            self.index += 1
            self.tok = self.tokens[self.index]
        return tok

    def peek(self) -> Token:
        return self.tokens[min(self.index + 1, len(self.tokens) - 1)]

    def fail(self, expected: str, tok: Token | None = None) -> NoReturn:
        tok = tok or self.tok
        if tok.kind is Kind.ERROR and tok.value is not None:
            expected, position = tok.value  # the lexer knows better: an unclosed string...
            found = "end of input" if position == len(self.text) else _found(tok)
            raise SqlSyntaxError(self.text, position, expected, found)
        raise SqlSyntaxError(self.text, tok.position, expected, _found(tok))

    @staticmethod
    def is_keyword(tok: Token, word: str) -> bool:
        return tok.kind is Kind.IDENT and tok.value.upper() == word

    @staticmethod
    def is_op(tok: Token, op: str) -> bool:
        return tok.kind is Kind.OP and tok.value == op

    def expect_op(self, op: str) -> Token:
        if not self.is_op(self.tok, op):
            self.fail(f"'{op}'")
        return self.advance()

    def expect_keyword(self, word: str) -> Token:
        if not self.is_keyword(self.tok, word):
            self.fail(word)
        return self.advance()

    def enter(self, tok: Token) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            self.fail(f"at most {MAX_NESTING} nested parentheses, NOTs or signs", tok)

    def made(self, node: Node, tok: Token) -> Node:
        """Registers ``node``'s depth; refuses trees too deep to evaluate safely."""
        depth = 1 + max(
            (self.depths.get(id(child), (1,))[0] for child in ast.children(node)), default=0
        )
        if depth > MAX_DEPTH:
            self.fail(f"an expression at most {MAX_DEPTH} levels deep", tok)
        self.depths[id(node)] = (depth, node)  # holding the node keeps its id unique
        return node

    def value(self, parse: Callable[[], Node]) -> Value:
        """A value (not a predicate) read by ``parse``."""
        start = self.tok
        node = parse()
        if is_predicate(node):
            self.fail("a value (not a condition)", start)
        return node

    def predicate(self, parse: Callable[[], Node]) -> Predicate:
        node = parse()
        if not is_predicate(node):
            self.fail(_PREDICATE_OPERATOR)
        return node

    # -- predicates --------------------------------------------------------------------------

    def disjunction(self) -> Node:
        start = self.tok
        first = self.conjunction()
        if not self.is_keyword(self.tok, "OR"):
            return first
        if not is_predicate(first):
            self.fail(_PREDICATE_OPERATOR)
        operands: list[Predicate] = [first]
        while self.is_keyword(self.tok, "OR"):
            self.advance()
            operands.append(self.predicate(self.conjunction))
        return self.made(Or(tuple(operands)), start)

    def conjunction(self) -> Node:
        start = self.tok
        first = self.negation()
        if not self.is_keyword(self.tok, "AND"):
            return first
        if not is_predicate(first):
            self.fail(_PREDICATE_OPERATOR)
        operands: list[Predicate] = [first]
        while self.is_keyword(self.tok, "AND"):
            self.advance()
            operands.append(self.predicate(self.negation))
        return self.made(And(tuple(operands)), start)

    def negation(self) -> Node:
        tok = self.tok
        if not self.is_keyword(tok, "NOT"):
            return self.comparison()
        self.advance()
        self.enter(tok)
        operand = self.predicate(self.negation)
        self.nesting -= 1
        return self.made(Not(operand), tok)

    def comparison(self) -> Node:
        start = self.tok
        left = self.additive()
        if is_predicate(left):
            return left
        tok = self.tok
        if tok.kind is Kind.OP and tok.value in _COMPARISONS:
            self.advance()
            op = "<>" if tok.value == "!=" else tok.value
            return self.made(Comparison(op, left, self.value(self.additive)), tok)
        if self.is_keyword(tok, "IS"):
            if not isinstance(left, Property | PropertyFunction):
                self.fail("a property before IS [NOT] NULL", start)
            self.advance()
            negated = self.is_keyword(self.tok, "NOT")
            if negated:
                self.advance()
            self.expect_keyword("NULL")
            return self.made(IsNull(left, negated), tok)
        negated = self.is_keyword(tok, "NOT")
        if negated:
            self.advance()
            if not (self.is_keyword(self.tok, "IN") or self.is_keyword(self.tok, "LIKE")):
                self.fail("IN or LIKE after NOT")
        if self.is_keyword(self.tok, "IN"):
            self.advance()
            self.expect_op("(")
            items = [self.value(self.additive)]
            while self.is_op(self.tok, ","):
                self.advance()
                items.append(self.value(self.additive))
            self.expect_op(")")
            return self.made(In(left, tuple(items), negated), tok)
        if self.is_keyword(self.tok, "LIKE"):
            self.advance()
            pattern_tok = self.tok
            pattern = self.like_operand("a string pattern")
            escape = None
            escape_text: str | None = None
            if self.is_keyword(self.tok, "ESCAPE"):
                self.advance()
                escape_tok = self.tok
                escape = self.like_operand("a one-character escape string")
                escape_text = _constant_text(escape)
                if escape_text is not None and len(escape_text) != 1:
                    self.fail("a one-character escape string", escape_tok)
            pattern_text = _constant_text(pattern)
            if (
                pattern_text is not None
                and (escape is None or escape_text is not None)
                and check_pattern(pattern_text, escape_text) is not None
            ):
                self.fail("a pattern that does not end with its escape character", pattern_tok)
            return self.made(Like(left, pattern, escape, negated), tok)
        return left

    def like_operand(self, expected: str) -> Value:
        """A LIKE pattern or escape: any value, but a constant one must be a string."""
        start = self.tok
        node = self.value(self.additive)
        if isinstance(node, Literal) and not isinstance(node.value, str):
            self.fail(expected, start)
        return node

    # -- values ------------------------------------------------------------------------------

    def additive(self) -> Node:
        left = self.multiplicative()
        while self.tok.kind is Kind.OP and self.tok.value in ("+", "-"):
            if is_predicate(left):
                return left  # "(a = 1) + 2": the caller reports the '+'
            tok = self.advance()
            right = self.value(self.multiplicative)
            left = self.made(Binary(tok.value, left, right), tok)
        return left

    def multiplicative(self) -> Node:
        left = self.unary()
        while self.tok.kind is Kind.OP and self.tok.value in ("*", "/", "%"):
            if is_predicate(left):
                return left
            tok = self.advance()
            right = self.value(self.unary)
            left = self.made(Binary(tok.value, left, right), tok)
        return left

    def unary(self) -> Node:
        tok = self.tok
        if not (tok.kind is Kind.OP and tok.value in ("+", "-")):
            return self.primary()
        self.advance()
        number = self.tok
        if tok.value == "-" and number.kind in (Kind.INTEGER, Kind.DECIMAL):
            # "-5" is the constant -5, so that -9223372036854775808 is a long
            self.advance()
            if number.kind is Kind.INTEGER and number.value > -LONG_MIN:
                self.fail("an integer within the range of a long", number)
            return Literal(-number.value)
        self.enter(tok)
        operand = self.value(self.unary)
        self.nesting -= 1
        return self.made(Unary(tok.value, operand), tok)

    def primary(self) -> Node:
        tok = self.tok
        kind = tok.kind
        if kind is Kind.INTEGER:
            if tok.value > LONG_MAX:
                self.fail("an integer within the range of a long", tok)
            self.advance()
            return Literal(tok.value)
        if kind is Kind.DECIMAL or kind is Kind.STRING:
            self.advance()
            return Literal(tok.value)
        if kind is Kind.PARAM:
            if tok.value.lower() not in self.parameters:
                self.fail("a parameter that is given a value", tok)
            self.advance()
            return Parameter(tok.value)
        if self.is_op(tok, "("):
            self.advance()
            self.enter(tok)
            inner = self.disjunction()
            self.nesting -= 1
            self.expect_op(")")
            return inner
        if kind is Kind.IDENT:
            word = tok.value.upper()
            if word in ("TRUE", "FALSE", "NULL"):
                self.advance()
                return Literal(None if word == "NULL" else word == "TRUE")
            if word == "EXISTS":
                self.advance()
                self.expect_op("(")
                prop = self.property()
                self.expect_op(")")
                return self.made(Exists(prop), tok)
            if word in KEYWORDS:
                self.fail("an expression")
            if self.is_op(self.peek(), "("):
                return self.function()
            return self.property()
        if kind is Kind.QUOTED:
            return self.property()
        self.fail("an expression")
        return None

    def function(self) -> Node:
        tok = self.advance()
        name = tok.value.lower()
        self.advance()  # the '('
        if name == "newid":
            self.expect_op(")")
            return NewId()
        if name in ("property", "p"):
            self.enter(tok)
            argument = self.value(self.additive)
            self.nesting -= 1
            self.expect_op(")")
            return self.made(PropertyFunction(argument), tok)
        self.fail("a function name (newid, property or p)", tok)
        return None

    def is_name(self, tok: Token) -> bool:
        if tok.kind is Kind.QUOTED:
            return True
        return tok.kind is Kind.IDENT and tok.value.upper() not in KEYWORDS

    def property(self) -> Property:
        """``[scope.]name``; a ``sys`` name must be one Service Bus has."""
        tok = self.tok
        if not self.is_name(tok):
            self.fail("a property name")
        self.advance()
        if not self.is_op(self.tok, "."):
            return Property(Scope.USER, tok.value)
        scope = tok.value.lower()
        if scope == "body" and self.body_fields:
            self.advance()
            return self.body_path()
        if scope not in ("sys", "user"):
            scopes = "sys, user or body" if self.body_fields else "sys or user"
            self.fail(f"{scopes} before '.'", tok)
        self.advance()
        name = self.tok
        if not self.is_name(name):
            self.fail(f"a property name after '{tok.value}.'")
        self.advance()
        if scope == "user":
            return Property(Scope.USER, name.value)
        prop = system_property(name.value)
        if prop is None:
            self.fail(f"a system property name ({_SYSTEM_NAMES})", name)
        return Property(Scope.SYS, prop.name)

    def body_path(self) -> Property:
        """The segments after ``body.``: names, or array indexes written as digits
        (``body.items.0.sku``; the lexer reads ``0.`` and ``1.5`` as numbers, split here)."""
        path: list[str] = []
        while True:
            tok = self.tok
            if self.is_name(tok):
                self.advance()
                path.append(tok.value)
            elif tok.kind is Kind.INTEGER:
                self.advance()
                path.append(tok.text)
            elif tok.kind is Kind.DECIMAL and _INDEXES.fullmatch(tok.text):
                self.advance()
                path += tok.text.rstrip(".").split(".")
                if tok.text.endswith("."):
                    continue  # "0." took the dot before the next segment
            else:
                self.fail("a body field name or array index after '.'")
            if len(path) > MAX_DEPTH:
                self.fail(f"a body path of at most {MAX_DEPTH} segments", tok)
            if not self.is_op(self.tok, "."):
                return Property(Scope.BODY, ".".join(path), tuple(path))
            self.advance()

    def settable_property(self) -> Property:
        target = self.property()
        if target.scope is Scope.SYS and target.name not in SETTABLE_NAMES:
            name_tok = self.tokens[self.index - 1]
            self.fail(
                f"a user property or a settable system property ({', '.join(SETTABLE_NAMES)})",
                name_tok,
            )
        return target
