"""What the page's entity and rule forms ask for, checked before anything is sent.

The checks are the management API's own, called here first: names by the broker's name
rules (``broker.config``), each setting by ``broker.admin.properties`` (its parser, limits
and messages: lock duration 5 s to 5 min, a delivery count of at least 1, TTL, duplicate
detection window, auto-delete on idle of at least 5 min, sizes, immutable settings), SQL
filters and actions by the broker's rule compiler (``replication.sqlfilter``: the parser
that will run them). So what the page refuses is exactly what the service would, and an
error names the field it is about. Values arrive as the page's inputs hold them: a duration
as ISO 8601 (``PT30S``) or seconds, empty for "never" where Service Bus allows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..broker.admin.api import CORRELATION_XML
from ..broker.admin.atom import format_duration
from ..broker.admin.properties import (
    MAX_SIZE_IN_MEGABYTES,
    STATUSES_OF,
    WRITABLE,
    Description,
    PropertyError,
    check_update,
    defaults,
    parse_value,
)
from ..broker.config import validate_entity_name, validate_rule_name, validate_subscription_name
from ..broker.entity_records import QUEUE, SUBSCRIPTION, TOPIC
from ..broker.rules import RuleError, RuleSpec, compile_rule
from ..broker.topic import SUBSCRIPTIONS
from . import send_form
from .namespace import DashboardError

KINDS = (QUEUE, TOPIC, SUBSCRIPTION)
NEVER = ("DefaultMessageTimeToLive", "AutoDeleteOnIdle")
"""Durations that may be left empty: "never" (TimeSpan.MaxValue on the wire)."""
FORWARDS = ("ForwardTo", "ForwardDeadLetteredMessagesTo")


class FormError(DashboardError):
    """A value the service would refuse; ``field`` names the input it came from."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class Field:
    """One input of the entity form: the management API's name, a label, how it is typed."""

    name: str
    label: str
    type: str
    """duration, int, bool, status, size, entity (a queue or topic of the namespace), text."""


FIELDS = (
    Field("Status", "status", "status"),
    Field("LockDuration", "lock duration", "duration"),
    Field("MaxDeliveryCount", "max delivery count", "int"),
    Field("DefaultMessageTimeToLive", "default message time to live", "duration"),
    Field("MaxSizeInMegabytes", "max size (MB)", "size"),
    Field("RequiresSession", "requires session", "bool"),
    Field("RequiresDuplicateDetection", "requires duplicate detection", "bool"),
    Field("DuplicateDetectionHistoryTimeWindow", "duplicate detection window", "duration"),
    Field("DeadLetteringOnMessageExpiration", "dead-letter on expiration", "bool"),
    Field(
        "DeadLetteringOnFilterEvaluationExceptions",
        "dead-letter on filter evaluation errors",
        "bool",
    ),
    Field("ForwardTo", "forward to", "entity"),
    Field("ForwardDeadLetteredMessagesTo", "forward dead-lettered messages to", "entity"),
    Field("AutoDeleteOnIdle", "auto-delete on idle", "duration"),
    Field("EnableBatchedOperations", "batched operations", "bool"),
    Field("EnablePartitioning", "partitioning", "bool"),
    Field("UserMetadata", "user metadata", "text"),
)


def check_kind(kind: Any) -> str:
    if kind not in KINDS:
        raise FormError("kind", f"kind: one of {', '.join(KINDS)}")
    return str(kind)


def fields(kind: str) -> list[Field]:
    """The form's inputs for ``kind``: those of ``FIELDS`` the kind has."""
    names = {prop.name for prop in WRITABLE[kind]}
    return [f for f in FIELDS if f.name in names]


def immutable(kind: str) -> set[str]:
    return {prop.name for prop in WRITABLE[kind] if prop.immutable}


def show(value: Any) -> str:
    """A setting as the page shows it and as its inputs hold it."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, timedelta):
        return format_duration(value)
    return str(value)


def schema(kind: str, description: Description, existing: bool) -> list[dict[str, Any]]:
    """The form for ``kind`` filled with ``description``'s values; on an existing entity the
    settings Service Bus will not change are marked so."""
    fixed = immutable(kind) if existing else set()
    out = []
    for item in fields(kind):
        value = description.get(item.name)
        entry: dict[str, Any] = {
            "name": item.name,
            "label": item.label,
            "type": item.type,
            "value": value if isinstance(value, bool) else show(value),
            "immutable": item.name in fixed,
        }
        if item.type == "status":
            entry["choices"] = list(STATUSES_OF[kind])
        elif item.type == "size":
            entry["choices"] = [str(size) for size in MAX_SIZE_IN_MEGABYTES]
            if entry["value"] not in entry["choices"]:  # Config.json allows any size
                entry["choices"].insert(0, entry["value"])
        elif item.type == "duration":
            entry["hint"] = "ISO 8601 (PT30S, PT5M, P14D) or seconds" + (
                "; empty: never" if item.name in NEVER else ""
            )
        out.append(entry)
    return out


# ---------------------------------------------------------------------- names


def entity_path(kind: str, name: Any, topic: Any = None) -> str:
    """The path a new entity gets: its name (a queue or topic), ``topic/Subscriptions/name``
    (a subscription), checked by the rules Service Bus applies."""
    if not isinstance(name, str):
        raise FormError("name", "name: the entity's name")
    try:
        if kind != SUBSCRIPTION:
            return validate_entity_name(name)
        if not isinstance(topic, str) or not topic:
            raise FormError("topic", "topic: the topic the subscription belongs to")
        validate_subscription_name(name)
    except ValueError as exc:
        raise FormError("name", f"name: {exc}") from None
    return f"{topic}{SUBSCRIPTIONS}{name}"


def rule_name(name: Any) -> str:
    if not isinstance(name, str):
        raise FormError("name", "name: the rule's name")
    try:
        return validate_rule_name(name)
    except ValueError as exc:
        raise FormError("name", f"name: {exc}") from None


# ---------------------------------------------------------------------- settings


def _text(item: Field, value: Any) -> str:
    """An input's value as the XML text the management API parses."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        value = ""
    if isinstance(value, int | float):
        value = str(value)
    if not isinstance(value, str):
        raise FormError(item.name, f"{item.label}: a value, not {type(value).__name__}")
    text = value.strip()
    if item.type != "duration":
        return text
    if not text:
        if item.name not in NEVER:
            raise FormError(item.name, f"{item.label}: a duration, like PT30S or 30")
        return format_duration(None)
    try:
        seconds = float(text)
    except ValueError:
        return text
    if seconds < 0:
        raise FormError(item.name, f"{item.label}: {text} is a negative duration")
    return format_duration(timedelta(seconds=seconds))


def settings(kind: str, values: Any, base: Description) -> Description:
    """``base`` with the form's ``values`` (``{name: input value}``) read and checked."""
    if not isinstance(values, dict):
        raise FormError("settings", "settings: an object of the form's values")
    by_name = {item.name: item for item in fields(kind)}
    found = dict(base)
    for name, value in values.items():
        item = by_name.get(name)
        if item is None:
            raise FormError(name, f"{name} is not a setting of a {kind} here")
        try:
            found[name] = parse_value(kind, name, _text(item, value), base.get(name))
        except PropertyError as exc:
            raise FormError(name, str(exc)) from None
        if name == "Status" and found[name] not in STATUSES_OF[kind]:
            allowed = ", ".join(STATUSES_OF[kind])
            raise FormError(name, f"status: {found[name]} is not a {kind}'s ({allowed})")
    return found


def check_forwarding(path: str, description: Description, sendable: set[str]) -> None:
    """Forward targets must be queues or topics of the namespace (``sendable``, lowercase),
    and not the entity itself."""
    for name in FORWARDS:
        target = description.get(name)
        if target is None:
            continue
        if target.lower() == path.lower():
            raise FormError(name, f"{name}: an entity cannot forward to itself")
        if target.lower() not in sendable:
            raise FormError(name, f"{name}: the queue or topic {target!r} does not exist")


def check_changes(kind: str, old: Description, new: Description) -> None:
    """Refuses a change of a setting Service Bus keeps from creation on (one at a time, so
    the error names its field)."""
    for prop in WRITABLE[kind]:
        try:
            check_update(kind, {prop.name: old.get(prop.name)}, {prop.name: new.get(prop.name)})
        except PropertyError as exc:
            raise FormError(prop.name, str(exc)) from None


def changes(old: Description, new: Description) -> list[str]:
    """What an update changes, as ``name: old → new``."""
    return [
        f"{name}: {show(old.get(name)) or 'none'} → {show(value) or 'none'}"
        for name, value in new.items()
        if old.get(name) != value
    ]


def differences(kind: str, description: Description) -> list[str]:
    """The settings a new entity gets that are not the default, as ``name = value``."""
    default = defaults(kind)
    return [
        f"{name} = {show(value) or 'none'}"
        for name, value in description.items()
        if default.get(name) != value
    ]


# ---------------------------------------------------------------------- rules


def rule(name: str, spec: Any) -> RuleSpec:
    """A rule from the form: ``{"filter": {"sql": text} | {"correlation": {XmlName: value,
    "properties": [{name, type, value}]}}, "action": text}``, compiled as the broker will."""
    if not isinstance(spec, dict):
        raise FormError("filter", "the rule: an object with a filter and an action")
    wanted = spec.get("filter") or {}
    action = spec.get("action") or None
    if action is not None and not isinstance(action, str):
        raise FormError("action", "action: SQL text, like SET priority = 'high'")
    if not isinstance(wanted, dict) or len(wanted) != 1:
        raise FormError("filter", 'filter: {"sql": "..."} or {"correlation": {...}}')
    if "sql" in wanted:
        sql = wanted["sql"]
        if not isinstance(sql, str) or not sql.strip():
            raise FormError("filter", "filter: a SQL expression, like region = 'eu'")
        made = RuleSpec(name, "sql", sql=sql.strip(), action=action)
    elif "correlation" in wanted:
        made = RuleSpec(name, "correlation", correlation=_correlation(wanted["correlation"]))
        made.action = action
    else:
        raise FormError("filter", 'filter: {"sql": "..."} or {"correlation": {...}}')
    try:
        compile_rule(made)
    except RuleError as exc:
        text = str(exc).removeprefix(f"rule {name!r}: ")
        raise FormError("action" if _in_action(made) else "filter", text) from None
    return made


def _correlation(values: Any) -> dict[str, Any]:
    if not isinstance(values, dict):
        raise FormError("filter", "correlation: an object of the filter's fields")
    found: dict[str, Any] = {}
    for xml_name, value in values.items():
        if xml_name == "properties":
            try:
                typed = send_form.properties(value)
            except send_form.ComposeError as exc:
                raise FormError("filter", f"correlation {exc}") from None
            if typed:
                found["properties"] = typed
        elif xml_name in CORRELATION_XML:
            if not isinstance(value, str):
                raise FormError("filter", f"correlation {xml_name}: text")
            if value:
                found[CORRELATION_XML[xml_name]] = value
        else:
            known = ", ".join(CORRELATION_XML)
            raise FormError("filter", f"correlation: {xml_name} is not one of {known}")
    if not found:
        raise FormError("filter", "correlation: set at least one field or property")
    return found


def _in_action(spec: RuleSpec) -> bool:
    """Whether the filter compiles alone: then the error was the action's."""
    try:
        compile_rule(RuleSpec(spec.name, spec.kind, spec.sql, spec.correlation))
    except RuleError:
        return False
    return spec.action is not None
