"""SQL value expressions on their own (``sys.MessageId``, ``tenant + '/' + body.order.id``).

Not a Service Bus concept: the grammar's value expressions (what may stand on either side of
a comparison, or after ``SET p =``), parsed and compiled once, for pipeline steps that need a
value computed from a message (a de-duplication key, a partition key) in the same language as
their conditions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .ast import Value, to_text, uses_body
from .evaluate import compile_value
from .facts import MessageFacts
from .params import normalize_parameters
from .parser import parse_value


class SqlExpression:
    """A parsed, compiled value expression: ``value(facts)`` gives its value (None: unknown).

    Raises ``SqlSyntaxError`` for text that is not a value expression (a condition such as
    ``a = 1`` is refused too); ``value`` raises ``SqlEvaluationError`` as filters do.
    """

    __slots__ = ("_get", "_parameters", "ast", "expression", "parameters", "source", "uses_body")

    def __init__(
        self, text: str, parameters: Mapping[str, Any] | None = None, *, body_fields: bool = False
    ) -> None:
        if not isinstance(text, str):
            raise TypeError(f"a SQL expression is text, got {type(text).__name__}")
        self._parameters = normalize_parameters(parameters)
        self.source = text
        self.parameters: dict[str, Any] = dict(parameters or {})
        self.ast: Value = parse_value(text, self._parameters, body_fields=body_fields)
        self._get = compile_value(self.ast, self._parameters)
        self.expression = to_text(self.ast)
        self.uses_body: bool = uses_body(self.ast)

    def value(self, facts: MessageFacts) -> Any:
        return self._get(facts)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SqlExpression):
            return NotImplemented
        return self.ast == other.ast and self._parameters == other._parameters

    def __hash__(self) -> int:
        return hash(self.ast)

    def __repr__(self) -> str:
        return f"SqlExpression({self.expression!r})"


def parse_expression(
    text: str, parameters: Mapping[str, Any] | None = None, *, body_fields: bool = False
) -> SqlExpression:
    """Parses and compiles a value expression; ``body_fields`` admits ``body.`` names."""
    return SqlExpression(text, parameters, body_fields=body_fields)
