"""Correlation filters: equality on a few system properties and on user properties.

Service Bus recommends them over SQL filters because they are cheap; here too ``matches`` is a
handful of dictionary lookups. Each one is equivalent to the SQL filter ``expression`` (with
``parameters`` for values SQL has no constants for), and a test holds them to that.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .ast import (
    LONG_MAX,
    LONG_MIN,
    And,
    Comparison,
    Literal,
    Parameter,
    Predicate,
    Property,
    Scope,
    to_text,
)
from .evaluate import STRING, equals, kind_of, user_key
from .facts import MessageFacts
from .params import check_value

_SYSTEM_FIELDS = (
    ("correlation_id", "CorrelationId"),
    ("message_id", "MessageId"),
    ("to", "To"),
    ("reply_to", "ReplyTo"),
    ("subject", "Label"),
    ("session_id", "SessionId"),
    ("reply_to_session_id", "ReplyToSessionId"),
    ("content_type", "ContentType"),
)


def _literal(value: Any) -> bool:
    """Whether SQL can write ``value`` as a constant (else it goes in as a parameter)."""
    if isinstance(value, bool | str):
        return True
    if isinstance(value, int):
        return LONG_MIN <= value <= LONG_MAX
    return isinstance(value, float) and value == value and abs(value) != float("inf")


class CorrelationFilter:
    """Matches when every given system field and user property equals the message's.

    String comparison is case-sensitive (as the docs say); user property names are
    case-insensitive and values compare like SQL ``=`` (``2 = 2.0``, but ``2 <> '2'``). Fields
    left None are not checked; with none at all, every message matches.
    """

    __slots__ = (
        "_expression",
        "_properties",
        "_system",
        "content_type",
        "correlation_id",
        "message_id",
        "parameters",
        "properties",
        "reply_to",
        "reply_to_session_id",
        "session_id",
        "subject",
        "to",
    )

    def __init__(
        self,
        correlation_id: str | None = None,
        message_id: str | None = None,
        to: str | None = None,
        reply_to: str | None = None,
        subject: str | None = None,
        session_id: str | None = None,
        reply_to_session_id: str | None = None,
        content_type: str | None = None,
        properties: Mapping[str, Any] | None = None,
    ) -> None:
        self.correlation_id = correlation_id
        self.message_id = message_id
        self.to = to
        self.reply_to = reply_to
        self.subject = subject
        self.session_id = session_id
        self.reply_to_session_id = reply_to_session_id
        self.content_type = content_type
        self.properties: dict[str, Any] = dict(properties or {})
        system = []
        for field, name in _SYSTEM_FIELDS:
            value = getattr(self, field)
            if value is None:
                continue
            if not isinstance(value, str):
                raise TypeError(f"{field} must be a string, got {type(value).__name__}")
            system.append((name, value))
        self._system: tuple[tuple[str, str], ...] = tuple(system)
        for key, value in self.properties.items():
            if not isinstance(key, str) or not key:
                raise TypeError(f"property names must be non-empty strings, got {key!r}")
            if value is None:
                raise ValueError(f"property {key!r}: a correlation filter cannot match NULL")
            check_value(f"property {key!r}", value)  # the same value types as parameters
        self._properties = tuple(
            (key, key.lower(), value) for key, value in self.properties.items()
        )
        conditions: list[Predicate] = [
            Comparison("=", Property(Scope.SYS, name), Literal(value)) for name, value in system
        ]
        self.parameters: dict[str, Any] = {}
        for key, value in self.properties.items():
            if _literal(value):
                operand: Literal | Parameter = Literal(value)
            else:
                operand = Parameter(f"p{len(self.parameters)}")
                self.parameters["@" + operand.name] = value
            conditions.append(Comparison("=", Property(Scope.USER, key), operand))
        if not conditions:
            self._expression = "1=1"
        elif len(conditions) == 1:
            self._expression = to_text(conditions[0])
        else:
            self._expression = to_text(And(tuple(conditions)))

    @property
    def expression(self) -> str:
        """The equivalent SQL filter; give it ``parameters`` when parsing it back."""
        return self._expression

    def matches(self, facts: MessageFacts) -> bool:
        system = facts.system
        for name, expected in self._system:
            value = system.get(name)
            if value != expected or kind_of(value) is not STRING:
                return False
        user = facts.user
        for name, folded, expected in self._properties:
            value = user.get(name)
            if value is None:
                key = user_key(user, name, folded)
                if key is None:
                    return False
                value = user[key]
            exact = type(value)
            if exact is type(expected) and (exact is str or exact is int):
                if value != expected:
                    return False
            elif equals(value, expected) is not True:
                return False
        return True

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CorrelationFilter):
            return NotImplemented
        return self._system == other._system and self.properties == other.properties

    def __hash__(self) -> int:
        return hash(self._system)

    def __repr__(self) -> str:
        fields = [
            f"{f}={getattr(self, f)!r}" for f, _ in _SYSTEM_FIELDS if getattr(self, f) is not None
        ]
        if self.properties:
            fields.append(f"properties={self.properties!r}")
        return f"CorrelationFilter({', '.join(fields)})"
