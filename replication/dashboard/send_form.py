"""Messages the page's send form asks for, checked before anything goes out.

Every system property a Service Bus SDK lets a sender set can be given, and application
properties carry their type explicitly (``{"name", "type", "value"}``): guessing from the
text would turn an id like "007" into the number 7. A send is one message, ``copies`` of
it, or a batch (a JSON array of such objects); a scheduled enqueue time makes the entity
hold them until then. Errors name the field and what would be right.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from ..messages import Message, PropertyValue

MAX_BATCH = 1000
"""Messages one send request makes at most (copies, or the array's length)."""
TEXT_FIELDS = (
    "message_id",
    "session_id",
    "correlation_id",
    "subject",
    "content_type",
    "to",
    "reply_to",
    "reply_to_session_id",
    "partition_key",
)
TYPES = ("string", "int", "double", "bool", "timestamp")


class ComposeError(ValueError):
    """The form asked for something a message cannot be (the text says which field)."""


def timestamp(text: str, what: str) -> datetime:
    """An ISO 8601 time; one without a zone is taken as UTC (what the page sends)."""
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ComposeError(f"{what}: an ISO 8601 time, like 2026-01-31T12:00:00Z") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def typed(name: str, kind: str, value: Any) -> PropertyValue:
    """An application property's value as ``kind`` says, from the page's text (or JSON)."""
    what = f"property {name!r} ({kind})"
    if kind == "string":
        return str(value)
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if str(value).strip().lower() in ("true", "false"):
            return str(value).strip().lower() == "true"
        raise ComposeError(f"{what}: true or false")
    if kind == "timestamp":
        return timestamp(str(value), what)
    try:
        if kind == "int":
            if isinstance(value, float | bool):
                raise ValueError
            return int(str(value).strip())
        if kind == "double":
            return float(str(value).strip())
    except ValueError:
        raise ComposeError(f"{what}: not a valid {kind}: {value!r}") from None
    raise ComposeError(f"property {name!r}: type {kind!r} is not one of {', '.join(TYPES)}")


def properties(spec: Any) -> dict[str, PropertyValue]:
    """``[{"name", "type", "value"}]`` (typed), or an object of JSON strings, numbers and
    booleans (their JSON types kept: ``"007"`` stays a string)."""
    if spec is None:
        return {}
    if isinstance(spec, dict):
        if not all(isinstance(v, str | int | float | bool) for v in spec.values()):
            raise ComposeError("application_properties: an object of strings, numbers, booleans")
        return dict(spec)
    if not isinstance(spec, list):
        raise ComposeError("application_properties: a list of {name, type, value}")
    found: dict[str, PropertyValue] = {}
    for item in spec:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise ComposeError("application_properties: each one needs a name")
        found[item["name"]] = typed(
            item["name"], str(item.get("type", "string")), item.get("value")
        )
    return found


def message(spec: Any) -> Message:
    """One message from the form's (or the batch item's) fields."""
    if not isinstance(spec, dict):
        raise ComposeError("the message must be a JSON object")
    body = spec.get("body", "")
    if not isinstance(body, str):
        raise ComposeError("body: a string")
    fields: dict[str, str | None] = {}
    for name in TEXT_FIELDS:
        value = spec.get(name)
        if value is not None and not isinstance(value, str):
            raise ComposeError(f"{name}: a string")
        fields[name] = value or None
    ttl = spec.get("time_to_live")
    if ttl not in (None, ""):
        try:
            seconds = float(ttl)
        except (TypeError, ValueError):
            raise ComposeError("time_to_live: seconds, a number above 0") from None
        if seconds <= 0:
            raise ComposeError("time_to_live: seconds, a number above 0")
    scheduled = spec.get("scheduled_enqueue_time")
    made = Message(
        body=body.encode("utf-8"),
        application_properties=properties(spec.get("application_properties")),
        message_id=fields.pop("message_id") or str(uuid.uuid4()),
        time_to_live=None if ttl in (None, "") else timedelta(seconds=float(ttl)),
        scheduled_enqueue_time=(
            timestamp(scheduled, "scheduled_enqueue_time") if scheduled else None
        ),
    )
    for name, value in fields.items():
        setattr(made, name, value)
    return made


def messages(spec: Any) -> list[Message]:
    """What one send request sends: ``{"messages": [...]}`` (a batch), or one message
    ``{..., "copies": N}`` times (each copy its own message id unless one was given)."""
    if not isinstance(spec, dict):
        raise ComposeError("the body must be a JSON object")
    batch = spec.get("messages")
    if batch is not None:
        if not isinstance(batch, list) or not batch:
            raise ComposeError("messages: a non-empty JSON array of message objects")
        if len(batch) > MAX_BATCH:
            raise ComposeError(f"messages: at most {MAX_BATCH} per send")
        return [message(item) for item in batch]
    copies = spec.get("copies", 1)
    if not isinstance(copies, int) or isinstance(copies, bool) or not 1 <= copies <= MAX_BATCH:
        raise ComposeError(f"copies: a whole number from 1 to {MAX_BATCH}")
    return [message(spec) for _ in range(copies)]
