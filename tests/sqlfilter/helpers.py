"""Shorthands shared by the SQL filter tests."""

from __future__ import annotations

from typing import Any

from replication.sqlfilter import MessageFacts, parse_filter
from replication.sqlfilter.evaluate import compile_value
from replication.sqlfilter.params import normalize_parameters
from replication.sqlfilter.parser import parse_value

T, F, U = "1 = 1", "1 = 0", "missing = 1"
"""Predicates that are TRUE, FALSE and unknown on any message without a ``missing`` property."""


def facts(user: dict[str, Any] | None = None, **system: Any) -> MessageFacts:
    return MessageFacts(system=dict(system), user=dict(user or {}))


def evaluate(
    text: str,
    user: dict[str, Any] | None = None,
    parameters: dict[str, Any] | None = None,
    **system: Any,
) -> bool | None:
    """The three-valued result of filter ``text`` on a message with these properties."""
    return parse_filter(text, parameters).evaluate(facts(user, **system))


def value(
    text: str,
    user: dict[str, Any] | None = None,
    parameters: dict[str, Any] | None = None,
    **system: Any,
) -> Any:
    """The value of expression ``text`` on a message with these properties."""
    params = normalize_parameters(parameters)
    return compile_value(parse_value(text, params), params)(facts(user, **system))


def same(a: Any, b: Any) -> bool:
    """Equal and of the same type (``1 == 1.0 == True`` in Python, not in SQL); NaN is NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and a != a:
        return b != b
    if isinstance(a, float) and a == 0.0:
        return str(a) == str(b)  # -0.0 and 0.0 are different doubles
    return bool(a == b)
