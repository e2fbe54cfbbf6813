"""Subscription rules: which messages of a topic a subscription gets, and how actions change them.

Service Bus semantics (topic filters and actions): every rule without an action that
matches contributes to ONE copy of the message (they are OR-ed); every matching rule with
an action produces its own copy, changed by the action and carrying a ``RuleName``
application property. A subscription without rules gets ``$Default`` (``1=1``).

Rules are kept as plain ``RuleSpec`` records (what Config.json and ``$management`` add-rule
describe, JSON in the store) and compiled once into filters from ``replication.sqlfilter``.
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from .. import symbols
from ..amqp.message import Header, Properties
from ..amqp.types import decimal32, decimal64, decimal128, timestamp
from ..sqlfilter import (
    CorrelationFilter,
    FalseFilter,
    Filter,
    MessageFacts,
    SqlEvaluationError,
    SqlRuleAction,
    TrueFilter,
    parse_action,
    parse_filter,
)
from ..symbols import PARTITION_KEY
from . import wire

DEFAULT_RULE_NAME = "$Default"
RULE_NAME_PROPERTY = "RuleName"

CORRELATION_FIELDS = (
    "correlation_id",
    "message_id",
    "to",
    "reply_to",
    "subject",
    "session_id",
    "reply_to_session_id",
    "content_type",
)


@dataclass(slots=True)
class RuleSpec:
    """One rule as configured: ``kind`` is sql, correlation, true or false.

    ``sql_parameters`` and ``action_parameters`` give the ``@name`` values of the SQL filter
    and of the action (keys as the client wrote them, ``@`` included or not): strings, ints,
    floats, bools, ``datetime``, ``timedelta``, ``UUID`` or None.
    """

    name: str
    kind: str = "true"
    sql: str | None = None
    correlation: dict[str, Any] = field(default_factory=dict)
    """Correlation filter fields (``CORRELATION_FIELDS``) plus ``properties``."""
    action: str | None = None
    sql_parameters: dict[str, Any] = field(default_factory=dict)
    action_parameters: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready; parameters only when there are some, so a rule without any is stored
        (and compared with the configured rules) exactly as before they existed."""
        correlation = dict(self.correlation)
        if correlation.get("properties"):
            correlation["properties"] = encode_values(correlation["properties"])
        data: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "sql": self.sql,
            "correlation": correlation,
            "action": self.action,
        }
        if self.sql_parameters:
            data["sql_parameters"] = encode_values(self.sql_parameters)
        if self.action_parameters:
            data["action_parameters"] = encode_values(self.action_parameters)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RuleSpec:
        """Also reads records stored before parameters existed (no such keys)."""
        correlation = dict(data.get("correlation") or {})
        if correlation.get("properties"):
            correlation["properties"] = decode_values(correlation["properties"])
        return cls(
            name=data["name"],
            kind=data.get("kind", "true"),
            sql=data.get("sql"),
            correlation=correlation,
            action=data.get("action"),
            sql_parameters=decode_values(data.get("sql_parameters") or {}),
            action_parameters=decode_values(data.get("action_parameters") or {}),
        )


def encode_value(value: Any) -> Any:
    """A parameter or property value for JSON: strings, ints, finite floats, bools and None
    as themselves (JSON keeps them apart); the rest as ``{"type": ..., "value": ...}``."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"type": "double", "value": repr(value)}
    if isinstance(value, datetime):
        return {"type": "datetime", "value": value.isoformat()}
    if isinstance(value, timedelta):
        return {"type": "timedelta", "value": value // timedelta(microseconds=1)}
    if isinstance(value, uuid.UUID):
        return {"type": "uuid", "value": str(value)}
    raise TypeError(f"a rule value of type {type(value).__name__} cannot be stored")


def decode_value(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    kind, raw = value.get("type"), value["value"]  # as encode_value wrote them
    if kind == "double":
        return float(raw)
    if kind == "datetime":
        return datetime.fromisoformat(raw)
    if kind == "timedelta":
        return timedelta(microseconds=raw)
    if kind == "uuid":
        return uuid.UUID(raw)
    raise ValueError(f"unknown stored rule value {value!r}")


def encode_values(values: dict[str, Any]) -> dict[str, Any]:
    return {str(key): encode_value(value) for key, value in values.items()}


def decode_values(values: dict[str, Any]) -> dict[str, Any]:
    return {str(key): decode_value(value) for key, value in values.items()}


DEFAULT_RULE = RuleSpec(DEFAULT_RULE_NAME, "true")


def dump_rules(rules: list[RuleSpec]) -> str:
    return json.dumps([rule.to_json() for rule in rules], sort_keys=True)


def load_rules(text: str) -> list[RuleSpec]:
    return [RuleSpec.from_json(item) for item in json.loads(text)]


class RuleError(ValueError):
    """A rule that cannot be compiled (bad SQL, unknown filter kind)."""


@dataclass(slots=True)
class CompiledRule:
    spec: RuleSpec
    filter: Filter
    action: SqlRuleAction | None


def compile_rule(spec: RuleSpec) -> CompiledRule:
    """Parses a rule's filter and action once; a syntax error names the rule."""
    try:
        if spec.kind == "sql":
            rule_filter: Filter = parse_filter(spec.sql or "", spec.sql_parameters)
        elif spec.kind == "correlation":
            values = dict(spec.correlation)
            properties = values.pop("properties", None) or {}
            rule_filter = CorrelationFilter(**values, properties=properties)
        elif spec.kind == "true":
            rule_filter = TrueFilter()
        elif spec.kind == "false":
            rule_filter = FalseFilter()
        else:
            raise RuleError(f"rule {spec.name!r}: unknown filter kind {spec.kind!r}")
        action = parse_action(spec.action, spec.action_parameters) if spec.action else None
    except (ValueError, TypeError) as exc:
        if isinstance(exc, RuleError):
            raise
        raise RuleError(f"rule {spec.name!r}: {exc}") from exc
    return CompiledRule(spec, rule_filter, action)


class RuleSet:
    """A subscription's rules, compiled, in the order they were added."""

    def __init__(self, specs: list[RuleSpec]) -> None:
        self.rules = [compile_rule(spec) for spec in specs]

    @property
    def specs(self) -> list[RuleSpec]:
        return [rule.spec for rule in self.rules]

    def add(self, spec: RuleSpec) -> None:
        if any(r.spec.name.lower() == spec.name.lower() for r in self.rules):
            raise KeyError(spec.name)
        self.rules.append(compile_rule(spec))

    def remove(self, name: str) -> None:
        for index, rule in enumerate(self.rules):
            if rule.spec.name.lower() == name.lower():
                del self.rules[index]
                return
        raise KeyError(name)

    def copies(
        self, message: wire.IncomingMessage, facts: MessageFacts
    ) -> list[wire.IncomingMessage]:
        """The messages this subscription gets for one sent message (often one, maybe none).

        Raises ``FilterEvaluationError`` when a rule fails at run time (division by zero, a
        value of the wrong type for a system property): Service Bus then dead-letters the
        message in the subscription (DeadLetteringOnFilterEvaluationExceptions, default on).
        """
        out: list[wire.IncomingMessage] = []
        plain_match = False
        for rule in self.rules:
            try:
                if not rule.filter.matches(facts):
                    continue
                if rule.action is None:
                    plain_match = True
                    continue
                changed = facts.copy()
                rule.action.apply(changed)
            except SqlEvaluationError as exc:
                raise FilterEvaluationError(f"rule '{rule.spec.name}': {exc}") from exc
            changed.user[RULE_NAME_PROPERTY] = rule.spec.name
            out.append(apply_facts(message, changed))
        if plain_match:
            out.insert(0, message)
        return out


class FilterEvaluationError(Exception):
    """A rule's filter or action failed on a message at run time."""


# ---------------------------------------------------------------------- message <-> facts

_SYSTEM_FROM_PROPERTIES = {
    "MessageId": "message_id",
    "CorrelationId": "correlation_id",
    "Label": "subject",
    "To": "to",
    "ReplyTo": "reply_to",
    "ContentType": "content_type",
    "SessionId": "group_id",
    "ReplyToSessionId": "reply_to_group_id",
}


def message_facts(message: wire.IncomingMessage, now_ms: int) -> MessageFacts:
    """What filters see of a sent message: system properties and application properties."""
    props = message.properties or Properties()
    system: dict[str, Any] = {}
    for name, attribute in _SYSTEM_FROM_PROPERTIES.items():
        value = getattr(props, attribute)
        if value is not None:
            system[name] = _text(value)
    system["EnqueuedTimeUtc"] = datetime.fromtimestamp(now_ms / 1000, UTC)
    system["Size"] = message.size
    system["DeliveryCount"] = 0
    if message.ttl_ms is not None:
        system["TimeToLive"] = timedelta(milliseconds=message.ttl_ms)
    if message.scheduled_ms is not None:
        system["ScheduledEnqueueTimeUtc"] = datetime.fromtimestamp(message.scheduled_ms / 1000, UTC)
    partition_key = message.annotations.get(PARTITION_KEY)
    if partition_key is not None:
        system["PartitionKey"] = str(partition_key)
    user = {
        str(key): _filter_value(value)
        for key, value in (message.application_properties or {}).items()
    }
    return MessageFacts(system, user)


def _filter_value(value: Any) -> Any:
    """AMQP values as filters compare them: timestamps as UTC datetimes."""
    if isinstance(value, timestamp):
        return datetime.fromtimestamp(int(value) / 1000, UTC)
    return value


def apply_facts(message: wire.IncomingMessage, facts: MessageFacts) -> wire.IncomingMessage:
    """A copy of ``message`` whose properties and application properties are ``facts``
    (system properties the action did not touch keep their original AMQP types)."""
    props = message.properties or Properties()
    before = message_facts(message, 0).system
    values = {name: getattr(props, name) for name in Properties.__dataclass_fields__}
    for name, attribute in _SYSTEM_FROM_PROPERTIES.items():
        if facts.system.get(name) != before.get(name):
            values[attribute] = facts.system.get(name)
    new_props = Properties(**values)
    user = {key: _amqp_value(value) for key, value in facts.user.items()}
    bare = wire.rewrite_bare(message.bare, new_props, user)
    header = message.header
    ttl = facts.system.get("TimeToLive")
    if ttl != before.get("TimeToLive") and isinstance(ttl, timedelta):
        old = header or Header()
        header = Header(
            durable=old.durable,
            priority=old.priority,
            ttl=int(ttl.total_seconds() * 1000),
            first_acquirer=old.first_acquirer,
            delivery_count=old.delivery_count,
        )
    annotations = dict(message.annotations)
    if facts.system.get("PartitionKey") != before.get("PartitionKey"):
        annotations[PARTITION_KEY] = facts.system.get("PartitionKey")
    return wire.IncomingMessage(
        header,
        annotations,
        new_props,
        user or None,
        bare,
        message.size - len(message.bare) + len(bare),
    )


def _amqp_value(value: Any) -> Any:
    """A filter value back as an application property (datetimes as AMQP timestamps)."""
    if isinstance(value, datetime):
        return timestamp(int(value.timestamp() * 1000))
    return value


def _text(value: Any) -> Any:
    return value if isinstance(value, str) else str(value)


# ---------------------------------------------------------------------- $management encoding

RULE_DESCRIPTION = symbols.RULE_DESCRIPTION_CODE
EMPTY_RULE_ACTION = symbols.EMPTY_RULE_ACTION_CODE
SQL_RULE_ACTION = symbols.SQL_RULE_ACTION_CODE
SQL_FILTER = symbols.SQL_FILTER_CODE
TRUE_FILTER = symbols.TRUE_FILTER_CODE
FALSE_FILTER = symbols.FALSE_FILTER_CODE
CORRELATION_FILTER = symbols.CORRELATION_FILTER_CODE
COMPATIBILITY_LEVEL = 20
"""What Service Bus reports as a SQL filter's and action's compatibility level."""

_CORRELATION_KEYS = {
    "correlation-id": "correlation_id",
    "message-id": "message_id",
    "to": "to",
    "reply-to": "reply_to",
    "label": "subject",
    "session-id": "session_id",
    "reply-to-session-id": "reply_to_session_id",
    "content-type": "content_type",
}


def spec_from_description(name: str, description: dict[Any, Any]) -> RuleSpec:
    """An add-rule request's ``rule-description`` map (as the .NET and JS SDKs send it)."""
    fields = {str(k): v for k, v in description.items()}
    action = fields.get("sql-rule-action")
    action_sql = str(_field(action, "expression")) if action else None
    action_parameters = _parameters(action) if action else {}
    if fields.get("sql-filter") is not None:
        sql = str(_field(fields["sql-filter"], "expression") or "")
        kind = {"1=1": "true", "1=0": "false"}.get(sql.replace(" ", ""), "sql")
        return RuleSpec(
            name,
            kind,
            sql=sql if kind == "sql" else None,
            action=action_sql,
            sql_parameters=_parameters(fields["sql-filter"]) if kind == "sql" else {},
            action_parameters=action_parameters,
        )
    correlation = fields.get("correlation-filter")
    if correlation is None:
        raise RuleError("the rule description has neither sql-filter nor correlation-filter")
    values = {str(k): v for k, v in dict(correlation).items()}
    spec_fields: dict[str, Any] = {
        attribute: _text(values[key])
        for key, attribute in _CORRELATION_KEYS.items()
        if values.get(key) is not None
    }
    if values.get("properties"):
        spec_fields["properties"] = _amqp_values(dict(values["properties"]))
    if not spec_fields:
        raise RuleError("a correlation filter must set at least one property")
    return RuleSpec(
        name,
        "correlation",
        correlation=spec_fields,
        action=action_sql,
        action_parameters=action_parameters,
    )


def _parameters(value: Any) -> dict[str, Any]:
    """The optional ``parameters`` map of a ``sql-filter`` / ``sql-rule-action``: AMQP values
    as the SQL engine takes them (timestamps as UTC datetimes, AMQP integer and float
    subtypes as plain ``int`` / ``float``)."""
    parameters = _field(value, "parameters")
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise RuleError(f"parameters must be a map, got {type(parameters).__name__}")
    return _amqp_values(parameters)


def _amqp_values(values: dict[Any, Any]) -> dict[str, Any]:
    """Parameter or correlation property values from an AMQP map, as the SQL engine and the
    store take them."""
    out: dict[str, Any] = {}
    for key, item in values.items():
        if isinstance(item, timestamp):
            item = datetime.fromtimestamp(int(item) / 1000, UTC)
        elif isinstance(item, decimal32 | decimal64 | decimal128):
            raise RuleError(f"{str(key)!r}: AMQP decimals are not supported")
        elif isinstance(item, bool) or item is None:
            pass
        elif isinstance(item, int):
            item = int(item)
        elif isinstance(item, float):
            item = float(item)
        elif isinstance(item, str):
            item = str(item)
        elif not isinstance(item, datetime | timedelta | uuid.UUID):
            raise RuleError(
                f"{str(key)!r}: {type(item).__name__} is not a string, "
                "long, double, boolean, timestamp or uuid"
            )
        out[str(key)] = item
    return out


def _field(value: Any, key: str) -> Any:
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}.get(key)
    return None


def describe(spec: RuleSpec, created_ms: int = 0) -> Any:
    """The ``rule-description`` described list enumerate-rules answers with."""
    from ..amqp.types import Described, timestamp, ulong

    if spec.kind == "sql":
        rule_filter = Described(ulong(SQL_FILTER), [spec.sql, COMPATIBILITY_LEVEL])
    elif spec.kind == "true":
        rule_filter = Described(ulong(TRUE_FILTER), ["1=1", COMPATIBILITY_LEVEL])
    elif spec.kind == "false":
        rule_filter = Described(ulong(FALSE_FILTER), ["1=0", COMPATIBILITY_LEVEL])
    else:
        c = spec.correlation
        rule_filter = Described(
            ulong(CORRELATION_FILTER),
            [
                c.get("correlation_id"),
                c.get("message_id"),
                c.get("to"),
                c.get("reply_to"),
                c.get("subject"),
                c.get("session_id"),
                c.get("reply_to_session_id"),
                c.get("content_type"),
                dict(c.get("properties") or {}),
            ],
        )
    if spec.action:
        action = Described(ulong(SQL_RULE_ACTION), [spec.action, COMPATIBILITY_LEVEL])
    else:
        action = Described(ulong(EMPTY_RULE_ACTION), [])
    return Described(
        ulong(RULE_DESCRIPTION), [rule_filter, action, spec.name, timestamp(created_ms)]
    )
