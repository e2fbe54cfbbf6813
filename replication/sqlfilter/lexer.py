"""Splits filter and action text into tokens, each with its offset for error messages.

The lexer never raises: a character it cannot start a token with, or a string or name left
open, becomes an ``ERROR`` token, so the parser reports the first problem in reading order
together with what it expected there.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any


class Kind(enum.Enum):
    IDENT = "identifier"
    """A regular identifier; keywords are IDENTs too (the parser decides, case-insensitively)."""
    QUOTED = "quoted identifier"
    """``"name"`` or ``[name]``: always a name, never a keyword."""
    STRING = "string"
    INTEGER = "integer"
    DECIMAL = "number"
    PARAM = "parameter"
    OP = "operator"
    ERROR = "error"
    EOF = "end of input"


@dataclass(frozen=True, slots=True)
class Token:
    kind: Kind
    text: str
    """The source text of the token."""
    value: Any
    """Decoded: the name, the string, the number, the operator; for ERROR, None or a
    ``(expected, position)`` pair saying what was missing and where."""
    position: int


_TWO_CHAR_OPS = frozenset({"<>", "!=", "<=", ">="})
_ONE_CHAR_OPS = frozenset("=<>+-*/%(),.;")
_DIGITS = frozenset("0123456789")


def is_identifier_start(ch: str) -> bool:
    """``[[:IsLetter:]]``: a Unicode letter (C# ``Char.IsLetter`` is categories Lu Ll Lt Lm Lo)."""
    return ch.isalpha()


def is_identifier_part(ch: str) -> bool:
    """``[_[:IsLetter:][:IsDigit:]]`` (``IsDigit`` is category Nd, Python's ``isdecimal``)."""
    return ch == "_" or ch.isalpha() or ch.isdecimal()


def is_regular_identifier(name: str) -> bool:
    return bool(name) and is_identifier_start(name[0]) and all(map(is_identifier_part, name[1:]))


def tokenize(text: str) -> list[Token]:
    """All tokens of ``text``, ending with one EOF token."""
    tokens: list[Token] = []
    append = tokens.append
    n = len(text)
    i = 0
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            append(Token(Kind.EOF, "", None, n))
            return tokens
        ch = text[i]
        start = i
        if is_identifier_start(ch):
            i += 1
            while i < n and is_identifier_part(text[i]):
                i += 1
            append(Token(Kind.IDENT, text[start:i], text[start:i], start))
        elif ch in _DIGITS:
            i = _number(text, i, tokens)
        elif ch == "'":
            i = _delimited(text, i, "'", Kind.STRING, "' to close the string", tokens)
        elif ch == '"':
            i = _delimited(text, i, '"', Kind.QUOTED, '" to close the quoted name', tokens)
        elif ch == "[":
            i = _delimited(text, i, "]", Kind.QUOTED, "] to close the bracketed name", tokens)
        elif ch == "@":
            i += 1
            while i < n and (text[i] == "_" or text[i].isalnum()):
                i += 1
            if i == start + 1:
                append(Token(Kind.ERROR, "@", None, start))
            else:
                append(Token(Kind.PARAM, text[start:i], text[start + 1 : i], start))
        elif text[i : i + 2] in _TWO_CHAR_OPS:
            i += 2
            append(Token(Kind.OP, text[start:i], text[start:i], start))
        elif ch in _ONE_CHAR_OPS:
            i += 1
            append(Token(Kind.OP, ch, ch, start))
        else:
            i += 1
            append(Token(Kind.ERROR, ch, None, start))


def _number(text: str, i: int, tokens: list[Token]) -> int:
    """``1894`` is a long; ``2.0``, ``2.`` and ``101.5E5`` / ``1e3`` are doubles."""
    n = len(text)
    start = i
    while i < n and text[i] in _DIGITS:
        i += 1
    is_double = False
    if i < n and text[i] == ".":
        is_double = True
        i += 1
        while i < n and text[i] in _DIGITS:
            i += 1
    if i < n and text[i] in "eE":
        j = i + 1
        if j < n and text[j] in "+-":
            j += 1
        if j < n and text[j] in _DIGITS:
            is_double = True
            i = j
            while i < n and text[i] in _DIGITS:
                i += 1
    source = text[start:i]
    if not is_double:
        tokens.append(Token(Kind.INTEGER, source, int(source), start))
        return i
    value = float(source)
    if math.isinf(value):
        expected = "a number within the range of a double"
        tokens.append(Token(Kind.ERROR, source, (expected, start), start))
    else:
        tokens.append(Token(Kind.DECIMAL, source, value, start))
    return i


def _delimited(text: str, i: int, close: str, kind: Kind, missing: str, tokens: list[Token]) -> int:
    """A string or name between delimiters, the closing one doubled inside (``'it''s'``)."""
    n = len(text)
    start = i
    i += 1
    parts: list[str] = []
    while True:
        end = text.find(close, i)
        if end < 0:
            tokens.append(Token(Kind.ERROR, text[start:], (missing, n), start))
            return n
        parts.append(text[i:end])
        if end + 1 < n and text[end + 1] == close:
            parts.append(close)
            i = end + 2
            continue
        i = end + 1
        value = "".join(parts)
        if kind is Kind.QUOTED and not value:
            tokens.append(Token(Kind.ERROR, text[start:i], ("a non-empty name", start), start))
        else:
            tokens.append(Token(kind, text[start:i], value, start))
        return i
