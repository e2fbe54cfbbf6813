"""SQL filters and the two boolean filters Service Bus derives from them.

A filter is parsed and compiled once, when the rule is made; ``matches`` then only runs the
compiled closures, so one filter object serves every message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from .ast import Predicate, to_text, uses_body
from .evaluate import compile_predicate
from .facts import MessageFacts
from .params import normalize_parameters
from .parser import parse_predicate


@runtime_checkable
class Filter(Protocol):
    """What a subscription rule (or a pipeline condition) needs from any kind of filter."""

    @property
    def expression(self) -> str:
        """Canonical SQL text of the condition."""
        ...

    def matches(self, facts: MessageFacts) -> bool:
        """True only when the condition is TRUE (FALSE and unknown both reject)."""
        ...


class SqlFilter:
    """A parsed, compiled SQL filter expression (``SqlRuleFilter``).

    ``source`` is the text as given (Service Bus hands it back unchanged); ``expression`` the
    canonical text; ``ast`` the syntax tree. Raises ``SqlSyntaxError`` for text Service Bus
    refuses, ``TypeError`` / ``ValueError`` for unusable parameters.

    ``body_fields=True`` admits ``body.a.b`` names (JSON body fields, an extension Service Bus
    does not have: see ``SEMANTICS.md``); ``uses_body`` says whether the filter reads any, so
    a caller parses a message body only for filters that need it.
    """

    __slots__ = ("_expression", "_parameters", "_test", "ast", "parameters", "source", "uses_body")

    def __init__(
        self, text: str, parameters: Mapping[str, Any] | None = None, *, body_fields: bool = False
    ) -> None:
        if not isinstance(text, str):
            raise TypeError(f"a SQL filter is text, got {type(text).__name__}")
        self._parameters = normalize_parameters(parameters)
        self.source = text
        self.parameters: dict[str, Any] = dict(parameters or {})
        self.ast: Predicate = parse_predicate(text, self._parameters, body_fields=body_fields)
        self._test = compile_predicate(self.ast, self._parameters)
        self._expression = to_text(self.ast)
        self.uses_body: bool = uses_body(self.ast)

    @property
    def expression(self) -> str:
        return self._expression

    def matches(self, facts: MessageFacts) -> bool:
        return self._test(facts) is True

    def evaluate(self, facts: MessageFacts) -> bool | None:
        """The three-valued result: True, False or None for unknown."""
        return self._test(facts)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, SqlFilter)
        return self.ast == other.ast and self._parameters == other._parameters

    def __hash__(self) -> int:
        return hash((type(self), self.ast))

    def __repr__(self) -> str:
        if self.parameters:
            return f"{type(self).__name__}({self.expression!r}, {self.parameters!r})"
        return f"{type(self).__name__}({self.expression!r})"


class TrueFilter(SqlFilter):
    """Selects every message; Service Bus defines it as the SQL filter ``1=1``."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__("1=1")

    @property
    def expression(self) -> str:
        return "1=1"

    def matches(self, facts: MessageFacts) -> bool:
        return True

    def __repr__(self) -> str:
        return "TrueFilter()"


class FalseFilter(SqlFilter):
    """Selects no message; Service Bus defines it as the SQL filter ``1=0``."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__("1=0")

    @property
    def expression(self) -> str:
        return "1=0"

    def matches(self, facts: MessageFacts) -> bool:
        return False

    def __repr__(self) -> str:
        return "FalseFilter()"


def parse_filter(
    text: str, parameters: Mapping[str, Any] | None = None, *, body_fields: bool = False
) -> SqlFilter:
    """Parses and compiles a SQL filter; ``parameters`` give ``@name`` values (``@`` optional);
    ``body_fields`` admits ``body.`` names (JSON body fields, an extension)."""
    return SqlFilter(text, parameters, body_fields=body_fields)
