"""The two ways a filter or action can fail: rejected text, or a message it cannot be run on.

Service Bus rejects a bad rule when it is created (HTTP 400) and raises a ``FilterException``
when a valid rule fails on one message; the broker needs to tell the two apart, so they are
separate classes.
"""

from __future__ import annotations


class SqlSyntaxError(ValueError):
    """Filter or action text that Service Bus would refuse when the rule is created.

    ``position`` is a 0-based offset into ``text``; ``line`` and ``column`` count from 1.
    """

    def __init__(self, text: str, position: int, expected: str, found: str) -> None:
        self.text = text
        self.position = position
        self.line = text.count("\n", 0, position) + 1
        self.column = position - (text.rfind("\n", 0, position) + 1) + 1
        self.expected = expected
        self.found = found
        super().__init__(
            f"line {self.line}, column {self.column}: expected {expected} but found {found}"
        )


class SqlEvaluationError(RuntimeError):
    """A valid filter or action that fails on one message (Service Bus's ``FilterException``).

    Raised for what C# raises at run time (integer division by zero, ``long.MinValue / -1``,
    date overflow), for ``property('sys.Nope')`` naming no system property, and for a ``SET`` of
    a system property to a value of the wrong type. Service Bus dead-letters such a message when
    the subscription has ``DeadLetteringOnFilterEvaluationExceptions`` (the default).
    """
