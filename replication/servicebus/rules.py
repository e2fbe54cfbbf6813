"""A subscription's rules as ``$management`` add-rule / enumerate-rules carry them.

add-rule sends a ``rule-description`` map, as the .NET SDK (``AmqpMessageConverter.
GetRuleDescriptionMap``) and the JavaScript SDK (``ManagementClient.addRule``) build it:
``sql-filter`` = ``{expression, parameters}`` or ``correlation-filter`` = ``{correlation-id,
message-id, to, reply-to, label, session-id, reply-to-session-id, content-type,
properties}``, ``sql-rule-action`` = ``{expression, parameters}`` (null without an action),
and ``rule-name``. enumerate-rules answers with described lists (``symbols.*_CODE``): a rule
description ``[filter, action, name, created-at]`` whose filter is a SQL filter
``[expression, compatibility-level]`` (true and false filters are the SQL ``1=1`` and
``1=0``), or a correlation filter (the fields above, in that order); its action an empty
action ``[]`` or a SQL action ``[expression, compatibility-level]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .. import symbols
from ..adapters.amqp import property_value
from ..amqp.types import Described


@dataclass(frozen=True, slots=True)
class SqlFilter:
    """Messages for which the SQL condition holds (``1=1``: all, ``1=0``: none);
    ``parameters`` are the ``@name`` values it uses."""

    expression: str
    parameters: dict[str, Any] | None = None


TRUE_FILTER = SqlFilter("1=1")
FALSE_FILTER = SqlFilter("1=0")


@dataclass(frozen=True, slots=True)
class CorrelationFilter:
    """Messages whose system properties equal every one given here, and whose
    application properties hold every ``properties`` item."""

    correlation_id: str | None = None
    message_id: str | None = None
    to: str | None = None
    reply_to: str | None = None
    subject: str | None = None
    session_id: str | None = None
    reply_to_session_id: str | None = None
    content_type: str | None = None
    properties: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SqlAction:
    """A SQL rule action (``SET``, ``REMOVE``) applied to the copy a rule passes on."""

    expression: str
    parameters: dict[str, Any] | None = None


RuleFilter = SqlFilter | CorrelationFilter


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    filter: RuleFilter = TRUE_FILTER
    action: SqlAction | None = None
    created_at: datetime | None = None
    """When the service created it (enumerate-rules only)."""


_CORRELATION_FIELDS = (
    ("correlation-id", "correlation_id"),
    ("message-id", "message_id"),
    ("to", "to"),
    ("reply-to", "reply_to"),
    ("label", "subject"),
    ("session-id", "session_id"),
    ("reply-to-session-id", "reply_to_session_id"),
    ("content-type", "content_type"),
)


def rule_description(rule: Rule) -> dict[str, Any]:
    """The ``rule-description`` map of an add-rule request."""
    description: dict[str, Any] = {}
    if isinstance(rule.filter, SqlFilter):
        description["sql-filter"] = _sql(rule.filter.expression, rule.filter.parameters)
    else:
        correlation: dict[str, Any] = {
            key: getattr(rule.filter, attribute) for key, attribute in _CORRELATION_FIELDS
        }
        correlation["properties"] = _values(rule.filter.properties)
        description["correlation-filter"] = correlation
    action = rule.action
    description["sql-rule-action"] = (
        None if action is None else _sql(action.expression, action.parameters)
    )
    description["rule-name"] = rule.name
    return description


def _sql(expression: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"expression": expression}
    if parameters:
        out["parameters"] = _values(parameters)
    return out


def _values(values: dict[str, Any]) -> dict[str, Any]:
    """Parameter and property values typed as the SDKs send application properties."""
    return {str(key): property_value(value) for key, value in values.items()}


class RuleDecodeError(ValueError):
    """An enumerate-rules entry that is not a rule description this module knows."""


def rule_from_description(value: Any) -> Rule:
    """A ``Rule`` from one ``rule-description`` of an enumerate-rules answer."""
    fields = _described(value, symbols.RULE_DESCRIPTION_CODE, "rule description")
    if len(fields) < 3:
        raise RuleDecodeError(f"a rule description has filter, action and name: {fields!r}")
    rule_filter, action, name = fields[0], fields[1], fields[2]
    created = fields[3] if len(fields) > 3 else None
    return Rule(
        name=str(name),
        filter=_filter(rule_filter),
        action=_action(action),
        created_at=None if created is None else datetime.fromtimestamp(int(created) / 1000, UTC),
    )


def _filter(value: Any) -> RuleFilter:
    code = _code(value)
    fields = list(value.value or []) if isinstance(value, Described) else []
    if code in (symbols.SQL_FILTER_CODE, symbols.TRUE_FILTER_CODE, symbols.FALSE_FILTER_CODE):
        default = {symbols.TRUE_FILTER_CODE: "1=1", symbols.FALSE_FILTER_CODE: "1=0"}
        expression = fields[0] if fields and fields[0] is not None else default.get(code, "")
        return SqlFilter(str(expression))
    if code == symbols.CORRELATION_FILTER_CODE:
        fields += [None] * (len(_CORRELATION_FIELDS) + 1 - len(fields))
        texts = {
            attribute: None if fields[i] is None else str(fields[i])
            for i, (_, attribute) in enumerate(_CORRELATION_FIELDS)
        }
        properties = fields[len(_CORRELATION_FIELDS)] or {}
        return CorrelationFilter(**texts, properties={str(k): v for k, v in properties.items()})
    raise RuleDecodeError(f"unknown rule filter {value!r}")


def _action(value: Any) -> SqlAction | None:
    code = _code(value)
    if code == symbols.EMPTY_RULE_ACTION_CODE or value is None:
        return None
    if code == symbols.SQL_RULE_ACTION_CODE:
        fields = list(value.value or [])
        return SqlAction(str(fields[0])) if fields and fields[0] is not None else None
    raise RuleDecodeError(f"unknown rule action {value!r}")


def _code(value: Any) -> int | None:
    if not isinstance(value, Described):
        return None
    try:
        return int(value.descriptor)
    except (TypeError, ValueError):  # a symbolic descriptor: none is defined for these
        return None


def _described(value: Any, code: int, what: str) -> list[Any]:
    if _code(value) != code or not isinstance(value.value, list):
        raise RuleDecodeError(f"expected a {what} (descriptor {code:#x}), got {value!r}")
    return list(value.value)
