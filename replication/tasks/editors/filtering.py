"""Filtering editors: ``filter`` keeps messages matching a condition, ``dedupe`` drops repeats.

``filter``: the condition is the broker's SQL filter grammar (``sys.Label = 'order' AND
priority > 2``; see ``replication.sqlfilter``) plus ``body.`` names for fields of a JSON body
(``body.order.total >= 100``, ``body.items.0.sku LIKE 'A%'``). A message is kept only when
the condition is TRUE; FALSE or unknown (a missing property or body field) filters it out,
which is not an error. A body that is not JSON has no fields, so any ``body.`` comparison is
unknown. Only an evaluation error (``1 / 0`` on longs...) fails the message
(``StepFailed("ConditionFailed")``, then the step's ``on_error``).

``dedupe``: drops a message whose key was already seen within ``window`` (measured from the
first message with that key; repeats do not extend it). The key is a SQL value expression,
``sys.MessageId`` by default (``tenant + '/' + body.order.id`` works too). State is in memory,
per built step instance, hence per process: several instances of a function each dedupe on
their own, and a restart forgets everything. It is bounded by ``max_entries`` (oldest keys
forgotten first: set it above the number of distinct keys a window holds), and entries hold a
16-byte digest of the key, not the key. For duplicates at the target across processes use
the target entity's duplicate detection (by message-id), which this complements.

Redelivery is not a duplicate: the source message that first claimed a key keeps passing
(same ``sequence_number``) when it is delivered again after a failed send, so at-least-once
delivery never turns into a loss. Messages without a sequence number (not from a broker)
can't be told apart from their redeliveries and are dropped as duplicates.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import Field, model_validator

from ...messages import Message
from ...sqlfilter import SqlEvaluationError
from ..facts import compile_condition, compile_expression
from ..steps import StepContext, StepFailed, StepOptions, step


def _parsed(make: Callable[[str, dict[str, Any]], Any], text: str, parameters: dict) -> None:
    try:
        make(text, parameters)
    except TypeError as exc:  # unusable parameter values: pydantic reports ValueErrors
        raise ValueError(str(exc)) from None


class FilterOptions(StepOptions):
    condition: str = Field(min_length=1)
    """SQL filter condition; ``body.`` names read JSON body fields."""
    parameters: dict[str, Any] = Field(default_factory=dict)
    """Values of ``@name`` parameters in the condition."""

    @model_validator(mode="after")
    def _compiles(self) -> FilterOptions:
        _parsed(compile_condition, self.condition, self.parameters)
        return self


class DedupeOptions(StepOptions):
    key: str = Field(default="sys.MessageId", min_length=1)
    """SQL value expression giving the key (``body.`` names allowed)."""
    parameters: dict[str, Any] = Field(default_factory=dict)
    window: timedelta = timedelta(minutes=10)
    """How long a key is remembered (ISO 8601 ``PT10M``, or seconds)."""
    max_entries: int = Field(default=100_000, gt=0)
    """At most this many keys are remembered; the oldest go first."""
    missing_key: Literal["keep", "fail"] = "keep"
    """A message whose key is NULL/unknown: keep it (not deduplicated), or fail it."""

    @model_validator(mode="after")
    def _compiles(self) -> DedupeOptions:
        if self.window <= timedelta(0):
            raise ValueError("window must be positive")
        _parsed(compile_expression, self.key, self.parameters)
        return self


@step("filter", FilterOptions)
def build_filter(
    options: FilterOptions, context: StepContext
) -> Callable[[Message], list[Message]]:
    """Keeps the messages for which the SQL condition is TRUE; drops the others."""
    condition = compile_condition(options.condition, options.parameters)

    def keep(message: Message) -> list[Message]:
        try:
            matched = condition(message)
        except SqlEvaluationError as exc:
            raise StepFailed("ConditionFailed", f"{condition.expression}: {exc}") from None
        return [message] if matched else []

    return keep


def key_digest(value: Any) -> bytes:
    """16 bytes standing for a key value: equal for equal values of the same type."""
    if isinstance(value, dict | list):
        text = "json:" + json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)
    else:
        text = f"{type(value).__name__}:{value!r}"
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class Deduplicator:
    """Keys seen within a window, bounded; thread-safe. ``first(key, now, source)`` is True
    for a key not seen within the window (and remembers it), or for the same ``source``
    (a redelivery of the message that claimed the key)."""

    def __init__(self, window: timedelta, max_entries: int) -> None:
        self.window = window
        self.max_entries = max_entries
        self._seen: OrderedDict[bytes, tuple[datetime, int | None]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._seen)

    def _expire(self, now: datetime) -> None:
        horizon = now - self.window
        seen = self._seen
        while seen:
            key, (when, _) = next(iter(seen.items()))
            if when > horizon:
                return
            del seen[key]

    def first(self, key: bytes, now: datetime, source: int | None = None) -> bool:
        with self._lock:
            self._expire(now)
            entry = self._seen.get(key)
            if entry is not None:
                when, claimed_by = entry
                if now - when < self.window:  # (the clock may have gone back)
                    return source is not None and source == claimed_by
                del self._seen[key]
            self._seen[key] = (now, source)
            while len(self._seen) > self.max_entries:
                self._seen.popitem(last=False)
            return True

    def forget(self, key: bytes) -> None:
        with self._lock:
            self._seen.pop(key, None)


class DedupeStep:
    """The built ``dedupe`` step: a callable with its ``Deduplicator`` as ``seen``."""

    def __init__(self, options: DedupeOptions, context: StepContext) -> None:
        self.key = compile_expression(options.key, options.parameters)
        self.seen = Deduplicator(options.window, options.max_entries)
        self.missing_key = options.missing_key
        self.now = context.now

    def __call__(self, message: Message) -> list[Message]:
        try:
            value = self.key(message)
        except SqlEvaluationError as exc:
            raise StepFailed("KeyFailed", f"{self.key.expression}: {exc}") from None
        if value is None:
            if self.missing_key == "fail":
                raise StepFailed("MissingKey", f"{self.key.expression} is NULL or unknown")
            return [message]
        if self.seen.first(key_digest(value), self.now(), message.sequence_number):
            return [message]
        return []


@step("dedupe", DedupeOptions)
def build_dedupe(options: DedupeOptions, context: StepContext) -> DedupeStep:
    """Drops messages whose key (message-id by default) was seen within the window."""
    return DedupeStep(options, context)
