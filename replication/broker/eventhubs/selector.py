"""Where a consumer starts reading: the ``apache.org:selector-filter:string`` on its attach.

The SDKs send one comparison, e.g. ``amqp.annotation.x-opt-offset > '-1'`` (from the
start), ``amqp.annotation.x-opt-offset > '@latest'`` (only new events),
``amqp.annotation.x-opt-sequence-number >= '42'`` or
``amqp.annotation.x-opt-enqueued-time > '1700000000000'`` (milliseconds since the epoch).
A consumer without the filter starts at the end, as the service does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

SELECTOR_FILTER = "apache.org:selector-filter:string"
OFFSET: Final = "x-opt-offset"
SEQUENCE_NUMBER: Final = "x-opt-sequence-number"
ENQUEUED_TIME: Final = "x-opt-enqueued-time"
START_OFFSET = "-1"
LATEST_OFFSET = "@latest"

_EXPRESSION = re.compile(
    r"\s*amqp\.annotation\.(x-opt-offset|x-opt-sequence-number|x-opt-enqueued-time)"
    r"\s*(>=|>)\s*'([^']*)'\s*",
    re.IGNORECASE,
)

Field = Literal["x-opt-offset", "x-opt-sequence-number", "x-opt-enqueued-time"]
_FIELDS: dict[str, Field] = {
    OFFSET: OFFSET,
    SEQUENCE_NUMBER: SEQUENCE_NUMBER,
    ENQUEUED_TIME: ENQUEUED_TIME,
}


class SelectorError(ValueError):
    """A filter the broker cannot read; the message says what form it takes."""


@dataclass(frozen=True, slots=True)
class Position:
    """A start position: events whose ``field`` is after ``value`` (or at it, ``inclusive``).
    ``value`` None with field offset: the end of the partition (``@latest``)."""

    field: Field
    value: int | None
    inclusive: bool

    @property
    def is_latest(self) -> bool:
        return self.field == OFFSET and self.value is None


LATEST = Position(OFFSET, None, False)
EARLIEST = Position(OFFSET, -1, False)


def parse_selector(text: str | None) -> Position:
    """The position a selector-filter names; None (no filter) is ``@latest``."""
    if text is None:
        return LATEST
    match = _EXPRESSION.fullmatch(text)
    if match is None:
        raise SelectorError(
            f"cannot read the selector filter {text!r}: expected "
            '"amqp.annotation.<x-opt-offset | x-opt-sequence-number | x-opt-enqueued-time> '
            "<'>' or '>='> '<value>'\""
        )
    name, operator, raw = match.group(1).lower(), match.group(2), match.group(3)
    inclusive = operator == ">="
    if name == OFFSET and raw.lower() == LATEST_OFFSET:
        return LATEST
    try:
        value = int(raw)
    except ValueError:
        raise SelectorError(
            f"{name} in the selector filter must be a whole number, got {raw!r}"
        ) from None
    field: Field = (
        OFFSET if name == OFFSET else SEQUENCE_NUMBER if name == SEQUENCE_NUMBER else ENQUEUED_TIME
    )
    return Position(field, value, inclusive)
