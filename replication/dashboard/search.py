"""Search over a peek: which of the messages a peek returned match what the page asks.

Service Bus has no server-side search; an explorer peeks and looks. So a search covers at
most ``MAX_SCAN`` messages from a sequence number on, and says how far it looked
(``scanned``, ``last_sequence``) so the page can state the limit and offer the next range.
Each criterion is a case-insensitive substring of the field (a property: ``name`` or
``name=value``); all given criteria must match.
"""

from __future__ import annotations

from typing import Any

MAX_SCAN = 5000
"""Messages one search peeks through at most."""
FIELDS = (
    "message_id",
    "correlation_id",
    "session_id",
    "subject",
    "dead_letter_reason",
)


def criteria(query: dict[str, str]) -> dict[str, str]:
    """The search fields the query gives (empty ones dropped)."""
    return {name: query[name] for name in (*FIELDS, "property") if query.get(name)}


def _property(message: dict[str, Any], wanted: str) -> bool:
    name, equals, value = wanted.partition("=")
    properties = message["application_properties"]
    key = next((k for k in properties if k.lower() == name.strip().lower()), None)
    if key is None:
        return False
    return not equals or value.strip().lower() in str(properties[key]).lower()


def matches(message: dict[str, Any], wanted: dict[str, str]) -> bool:
    """Whether a described message (``namespace.describe``) meets every criterion."""
    for name, text in wanted.items():
        if name == "property":
            if not _property(message, text):
                return False
        elif text.lower() not in str(message.get(name) or "").lower():
            return False
    return True
