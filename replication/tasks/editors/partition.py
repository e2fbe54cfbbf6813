"""Setting the partition key and session id from the content, the editor pattern's
"partitioning".

A target may need messages grouped differently from the source: per customer sessions so a
session-enabled consumer sees one customer's messages in order, or a partition key so a
partitioned entity keeps related messages on one partition. ``partition`` takes the value
from a JSON body field (dotted path; a numeric part indexes an array) or an application
property (its exact name), with a ``default`` for messages that lack it; without a default a
missing value fails the message (reason ``missing session id`` / ``missing partition key``).

Values become strings: strings as they are, numbers and booleans as JSON writes them
(``42``, ``true``); objects, arrays and empty strings count as unusable. Service Bus limits
both to 128 characters. For a message with a session id Service Bus requires the partition
key to equal it: when only ``session_id`` is configured, a partition key the message already
has is set to the new session id; when both are configured they must resolve to the same
value. With ``overwrite: false`` a message that already has the value keeps it.

Shorthand: ``partition_key: "body:customer.id"`` or ``"property:tenant"`` means
``{"body": "customer.id"}`` / ``{"property": "tenant"}``.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from ...messages import Message
from ..steps import Step, StepContext, StepFailed, StepOptions, step
from .transcode import parse_json
from .transform import MISSING, get_path, split_path

MAX_LENGTH = 128


class KeySource(BaseModel):
    """Where a key comes from: exactly one of ``body`` (dotted path) or ``property``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    body: str | None = None
    property: str | None = None
    default: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):
            kind, sep, where = value.partition(":")
            if not sep or kind not in ("body", "property") or not where:
                raise ValueError("use 'body:<path>' or 'property:<name>'")
            return {kind: where}
        return value

    @model_validator(mode="after")
    def _one(self) -> KeySource:
        if (self.body is None) == (self.property is None):
            raise ValueError("give exactly one of 'body' or 'property'")
        if self.body is not None:
            split_path(self.body)
        if self.default is not None and not 0 < len(self.default) <= MAX_LENGTH:
            raise ValueError(f"default must have 1 to {MAX_LENGTH} characters")
        return self

    def describe(self) -> str:
        return f"body field {self.body!r}" if self.body else f"property {self.property!r}"


class PartitionOptions(StepOptions):
    """Where the partition key and/or the session id come from."""

    partition_key: KeySource | None = None
    session_id: KeySource | None = None
    overwrite: bool = True

    @model_validator(mode="after")
    def _something(self) -> PartitionOptions:
        if self.partition_key is None and self.session_id is None:
            raise ValueError("give partition_key and/or session_id")
        return self


def _as_key(value: Any) -> str | None:
    if value is None or value is MISSING or isinstance(value, dict | list):
        return None
    if isinstance(value, str):
        text = value
    elif isinstance(value, bool | int | float):
        text = json.dumps(value)
    elif isinstance(value, bytes):
        return None
    elif isinstance(value, datetime):
        text = value.isoformat()
    else:
        text = str(value)
    return text or None


@step("partition", PartitionOptions)
def build_partition(options: PartitionOptions, context: StepContext) -> Step:
    """Sets the partition key and/or session id from a body field or a property, so the
    target groups (and orders) messages by what they are about."""
    needs_body = any(s is not None and s.body for s in (options.partition_key, options.session_id))

    def resolve(source: KeySource, body: Any, message: Message, what: str) -> str:
        if source.body is not None:
            raw = get_path(body, source.body)
        else:
            raw = message.application_properties.get(source.property or "", MISSING)
        value = _as_key(raw)
        if value is None:
            if source.default is not None:
                return source.default
            found = "is missing" if raw is MISSING else f"is unusable ({raw!r:.60})"
            raise StepFailed(f"missing {what}", f"{source.describe()} {found}")
        if len(value) > MAX_LENGTH:
            raise StepFailed(f"{what} too long", f"{source.describe()} has {len(value)} characters")
        return value

    def run(message: Message) -> list[Message]:
        body = parse_json(message.body) if needs_body else None
        changes: dict[str, Any] = {}
        session = message.session_id
        if options.session_id is not None and (options.overwrite or not session):
            session = resolve(options.session_id, body, message, "session id")
            changes["session_id"] = session
        if options.partition_key is not None:
            if options.overwrite or not message.partition_key:
                key = resolve(options.partition_key, body, message, "partition key")
                if options.session_id is not None and session and key != session:
                    raise StepFailed(
                        "partition key differs from session id",
                        f"partition key {key!r}, session id {session!r}",
                    )
                changes["partition_key"] = key
        elif "session_id" in changes and message.partition_key:
            changes["partition_key"] = session
        return [message.copy(**changes)] if changes else [message]

    return run
