"""Filter and action parameters (``@name``), checked once when the rule is made."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from .ast import LONG_MAX, LONG_MIN

_ALLOWED = (str, bool, int, float, datetime, timedelta, uuid.UUID)


def normalize_parameters(parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    """Parameters keyed by lower-case name without ``@`` (``@Color`` and ``color`` are one).

    Values may be what Service Bus accepts (string, long, double, boolean; DateTime, TimeSpan
    and Guid as .NET clients send them) or None for NULL.
    """
    if not parameters:
        return {}
    normalized: dict[str, Any] = {}
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TypeError(f"parameter names must be strings, got {key!r}")
        name = key[1:] if key.startswith("@") else key
        if not name or not all(ch == "_" or ch.isalnum() for ch in name):
            raise ValueError(f"{key!r} is not a parameter name (letters, digits and '_')")
        check_value(f"parameter {key!r}", value)
        folded = name.lower()
        if folded in normalized:
            raise ValueError(f"parameter {key!r} is given twice (names are case-insensitive)")
        normalized[folded] = value
    return normalized


def check_value(where: str, value: Any) -> None:
    """A ``TypeError`` or ``ValueError`` starting with ``where`` unless ``value`` is one a
    parameter may hold (or a correlation filter's property may match)."""
    if value is not None and not isinstance(value, _ALLOWED):
        raise TypeError(
            f"{where}: {type(value).__name__} is not a string, long, double, boolean, "
            "datetime, timedelta or UUID"
        )
    if type(value) is not bool and isinstance(value, int) and not LONG_MIN <= value <= LONG_MAX:
        raise ValueError(f"{where}: {value} is out of the range of a long")
