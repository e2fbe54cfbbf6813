"""SQL rule actions: ``SET`` and ``REMOVE`` statements run on a message a rule selected."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from .ast import Statement, statements_text
from .evaluate import compile_statements
from .facts import MessageFacts
from .params import normalize_parameters
from .parser import parse_statements


@runtime_checkable
class RuleAction(Protocol):
    @property
    def expression(self) -> str:
        """Canonical SQL text of the action."""
        ...

    def apply(self, facts: MessageFacts) -> None:
        """Changes ``facts.system`` / ``facts.user`` in place."""
        ...


class SqlRuleAction:
    """A parsed, compiled rule action (``SqlRuleAction``).

    Statements run in order, each seeing what the earlier ones set; if one fails
    (``SqlEvaluationError``), the message's facts are left as they were. ``SET`` and ``REMOVE``
    of a read-only system property (``sys.SequenceNumber``...) are refused when parsing.
    """

    __slots__ = ("_apply", "_expression", "_parameters", "parameters", "source", "statements")

    def __init__(self, text: str, parameters: Mapping[str, Any] | None = None) -> None:
        if not isinstance(text, str):
            raise TypeError(f"a SQL rule action is text, got {type(text).__name__}")
        self._parameters = normalize_parameters(parameters)
        self.source = text
        self.parameters: dict[str, Any] = dict(parameters or {})
        self.statements: tuple[Statement, ...] = parse_statements(text, self._parameters)
        self._apply = compile_statements(self.statements, self._parameters)
        self._expression = statements_text(self.statements)

    @property
    def expression(self) -> str:
        return self._expression

    def apply(self, facts: MessageFacts) -> None:
        self._apply(facts)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SqlRuleAction):
            return NotImplemented
        return self.statements == other.statements and self._parameters == other._parameters

    def __hash__(self) -> int:
        return hash(self.statements)

    def __repr__(self) -> str:
        if self.parameters:
            return f"SqlRuleAction({self.expression!r}, {self.parameters!r})"
        return f"SqlRuleAction({self.expression!r})"


def parse_action(text: str, parameters: Mapping[str, Any] | None = None) -> SqlRuleAction:
    """Parses and compiles a SQL rule action; ``parameters`` give ``@name`` values."""
    return SqlRuleAction(text, parameters)
