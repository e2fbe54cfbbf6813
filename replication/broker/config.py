"""The broker's configuration: the official Service Bus emulator's Config.json, validated.

Why the emulator's file: a project that already runs the emulator can point the embedded
broker at the same file. The schema (``ServiceBus-Emulator/Schema/Config-schema.json`` in
``Azure/azure-service-bus-emulator-installer``) is followed property for property, with
three deliberate differences:

* limits and defaults are Azure Service Bus's, not the emulator's narrower ones (a lock of
  5 s .. 5 min, default 1 min; MaxDeliveryCount >= 1, default 10; TTL unlimited by default
  and not capped at 1 hour; duplicate detection window 20 s .. 7 days, default 10 min);
* ``Topics`` may be omitted and a topic may have no subscriptions (the emulator's own
  sample configs omit ``Topics`` although its schema requires it);
* a namespace may list ``AuthorizationRules``; without them the emulator's well-known
  ``RootManageSharedAccessKey`` / ``SAS_KEY_VALUE`` rule applies.

Event hubs come in the same file in the Event Hubs emulator's schema
(``UserConfig.NamespaceConfig``, ``LoggingConfig``: ``eventhubs/config.py``), so either
emulator's file, or one with both parts, works; ``Namespaces`` may then be left out.

Every mistake is reported as a ``ConfigError`` (``replication.configproblems``, shared with
the pipeline files) naming the file, the line and column, the property path and what is
wrong, with a "did you mean" for misspelt names.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal, TypeVar

import isodate
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_pascal

from .. import sqlfilter
from ..configproblems import (
    JSON,
    Loc,
    Positions,
    did_you_mean,
    format_loc,
    located_problems,
    parse_json,
    read_text,
    validation_problems,
)
from ..configproblems import ConfigError as ConfigError  # what a bad Config.json raises
from .auth import EMULATOR_RULE, SharedAccessRule
from .eventhubs.config import EventHubNamespace, duplicate_names
from .eventhubs.hub import EventHubSpec
from .queue import DEFAULT_MAX_SIZE_MB

# Azure Service Bus limits and defaults (the emulator's are narrower; we accept Azure's).
MIN_LOCK_DURATION = timedelta(seconds=5)
MAX_LOCK_DURATION = timedelta(minutes=5)
DEFAULT_LOCK_DURATION = timedelta(minutes=1)
DEFAULT_MAX_DELIVERY_COUNT = 10
MAX_DELIVERY_COUNT_LIMIT = 2**31 - 1
MAX_SIZE_IN_MEGABYTES_LIMIT = 81920
"""The largest quota Service Bus has (Premium)."""
MIN_DUPLICATE_DETECTION_WINDOW = timedelta(seconds=5)  # the emulator allows PT5S; Azure 20 s
MAX_DUPLICATE_DETECTION_WINDOW = timedelta(days=7)
DEFAULT_DUPLICATE_DETECTION_WINDOW = timedelta(minutes=10)
MIN_MESSAGE_TIME_TO_LIVE = timedelta(seconds=1)
UNLIMITED_TIME_TO_LIVE = timedelta(days=10675199)
"""TimeSpan.MaxValue (Azure's "never expires", ``P10675199DT2H48M5.4775807S``) in whole
days: a DefaultMessageTimeToLive at least this long means unlimited (``None``)."""
MAX_ENTITY_NAME_LENGTH = 260
MAX_SUBSCRIPTION_NAME_LENGTH = 50
MAX_RULE_NAME_LENGTH = 50
MAX_AUTHORIZATION_RULE_NAME_LENGTH = 256
DEFAULT_RULE_NAME = "$Default"


# ---------------------------------------------------------------------- value parsing


def parse_duration(value: object) -> timedelta:
    """An ISO 8601 duration (``PT30S``, ``PT1M``, ``P14D``) as a ``timedelta``.

    Years and months count as 365 and 30 days, as .NET's XmlConvert (which Service Bus
    uses) counts them, so ``P1Y`` means the same here as in Azure.
    """
    if isinstance(value, timedelta):
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected an ISO 8601 duration string such as 'PT1M', got {value!r}")
    try:
        parsed = isodate.parse_duration(value.strip())
        if isinstance(parsed, isodate.Duration):
            days = 365 * float(parsed.years) + 30 * float(parsed.months)
            result = timedelta(days=days) + parsed.tdelta
        else:
            result = parsed
    except (isodate.ISO8601Error, ValueError, ArithmeticError):
        raise ValueError(
            f"{value!r} is not an ISO 8601 duration (examples: 'PT30S', 'PT1M', 'PT1H', 'P14D')"
        ) from None
    if result < timedelta(0):
        raise ValueError(f"{value!r} is a negative duration")
    return result


def format_duration(value: timedelta) -> str:
    """A ``timedelta`` back in ISO 8601, for messages that quote limits."""
    return str(isodate.duration_isoformat(value))


def _between(low: timedelta, high: timedelta) -> Callable[[timedelta], timedelta]:
    def check(value: timedelta) -> timedelta:
        if not low <= value <= high:
            raise ValueError(
                f"must be between {format_duration(low)} and {format_duration(high)}, "
                f"got {format_duration(value)}"
            )
        return value

    return check


def _time_to_live(value: object) -> timedelta | None:
    duration = parse_duration(value)
    if duration >= UNLIMITED_TIME_TO_LIVE:
        return None
    if duration < MIN_MESSAGE_TIME_TO_LIVE:
        raise ValueError(
            f"must be at least {format_duration(MIN_MESSAGE_TIME_TO_LIVE)}, "
            f"got {format_duration(duration)}"
        )
    return duration


_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
_NAMESPACE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{4,48}[A-Za-z0-9]")


def _bad_characters(text: str) -> str:
    bad = sorted({c for c in text if not (c.isascii() and (c.isalnum() or c in "._-"))})
    return " ".join(repr(c) for c in bad)


def validate_entity_name(name: str) -> str:
    """Queue and topic names: up to 260 characters, '/'-separated segments of letters,
    digits, '.', '-' and '_', not starting or ending with '/' (Service Bus's rules)."""
    if not name:
        raise ValueError("must not be empty")
    if len(name) > MAX_ENTITY_NAME_LENGTH:
        raise ValueError(f"{name[:40]!r}... is {len(name)} characters; at most 260 are allowed")
    if name.startswith("/") or name.endswith("/"):
        raise ValueError(f"{name!r} must not start or end with '/'")
    for segment in name.split("/"):
        if not segment:
            raise ValueError(f"{name!r} contains an empty path segment ('//')")
        if not _SEGMENT.fullmatch(segment):
            raise ValueError(
                f"{name!r} contains {_bad_characters(segment)}; only letters, digits, '.', '-', "
                "'_' and '/' are allowed"
            )
    return name


def _simple_name(kind: str, limit: int, reserved: str | None = None) -> Callable[[str], str]:
    def check(name: str) -> str:
        if reserved is not None and name == reserved:
            return name
        if not name:
            raise ValueError("must not be empty")
        if len(name) > limit:
            raise ValueError(f"{kind} name {name!r} is {len(name)} characters; at most {limit}")
        if not _SEGMENT.fullmatch(name):
            raise ValueError(
                f"{kind} name {name!r} contains {_bad_characters(name)}; only letters, digits, "
                "'.', '-' and '_' are allowed"
            )
        return name

    return check


def _namespace_name(name: str) -> str:
    if not _NAMESPACE_NAME.fullmatch(name):
        raise ValueError(
            f"namespace name {name!r} must be 6-50 letters, digits and '-', starting with a "
            "letter and ending with a letter or digit"
        )
    return name


def _forward_target(value: object) -> str | None:
    # The emulator's samples write "" for "not forwarded".
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"expected a queue or topic name, got {value!r}")
    return validate_entity_name(value)


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


def _user_properties(value: object) -> dict[str, str | int | float | bool] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"expected an object of property names to values, got {value!r}")
    if not value:
        raise ValueError("must name at least one property (or be left out)")
    result: dict[str, str | int | float | bool] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"property names must be non-empty strings, got {key!r}")
        if not isinstance(item, str | int | float | bool):
            raise ValueError(
                f"property {key!r} must be a string, number or boolean, got {json.dumps(item)}"
            )
        result[key] = item
    return result


def _exactly_one_namespace(namespaces: list[Namespace]) -> list[Namespace]:
    if len(namespaces) != 1:
        raise ValueError(
            f"exactly one namespace is supported (as in the emulator), got {len(namespaces)}"
        )
    return namespaces


LockDuration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    AfterValidator(_between(MIN_LOCK_DURATION, MAX_LOCK_DURATION)),
]
TimeToLive = Annotated[timedelta | None, BeforeValidator(_time_to_live)]
DuplicateDetectionWindow = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    AfterValidator(_between(MIN_DUPLICATE_DETECTION_WINDOW, MAX_DUPLICATE_DETECTION_WINDOW)),
]
MaxDeliveryCount = Annotated[int, Field(ge=1, le=MAX_DELIVERY_COUNT_LIMIT)]
MaxSizeInMegabytes = Annotated[int, Field(ge=1, le=MAX_SIZE_IN_MEGABYTES_LIMIT)]
"""Our addition to the emulator's schema: any size from 1 MB, so a full entity can be tried
without filling a gigabyte (the management API takes Service Bus's sizes only)."""
ForwardTarget = Annotated[str | None, BeforeValidator(_forward_target)]
EntityName = Annotated[str, AfterValidator(validate_entity_name)]
validate_subscription_name = _simple_name("subscription", MAX_SUBSCRIPTION_NAME_LENGTH)
validate_rule_name = _simple_name("rule", MAX_RULE_NAME_LENGTH, reserved=DEFAULT_RULE_NAME)
SubscriptionName = Annotated[str, AfterValidator(validate_subscription_name)]
RuleName = Annotated[str, AfterValidator(validate_rule_name)]
AuthorizationRuleName = Annotated[
    str, AfterValidator(_simple_name("authorization rule", MAX_AUTHORIZATION_RULE_NAME_LENGTH))
]
NamespaceName = Annotated[str, AfterValidator(_namespace_name)]
Right = Literal["Send", "Listen", "Manage"]


# ---------------------------------------------------------------------- models


class _Model(BaseModel):
    """Config.json's spelling (PascalCase aliases), no coercion, unknown properties refused."""

    model_config = ConfigDict(alias_generator=to_pascal, extra="forbid", strict=True, frozen=True)


class QueueProperties(_Model):
    dead_lettering_on_message_expiration: bool = False
    default_message_time_to_live: TimeToLive = None
    """``None``: messages never expire (Azure's default)."""
    duplicate_detection_history_time_window: DuplicateDetectionWindow = (
        DEFAULT_DUPLICATE_DETECTION_WINDOW
    )
    forward_dead_lettered_messages_to: ForwardTarget = None
    forward_to: ForwardTarget = None
    lock_duration: LockDuration = DEFAULT_LOCK_DURATION
    max_delivery_count: MaxDeliveryCount = DEFAULT_MAX_DELIVERY_COUNT
    max_size_in_megabytes: MaxSizeInMegabytes = DEFAULT_MAX_SIZE_MB
    requires_duplicate_detection: bool = False
    requires_session: bool = False


class Queue(_Model):
    name: EntityName
    properties: QueueProperties = Field(default_factory=QueueProperties)


class TopicProperties(_Model):
    default_message_time_to_live: TimeToLive = None
    duplicate_detection_history_time_window: DuplicateDetectionWindow = (
        DEFAULT_DUPLICATE_DETECTION_WINDOW
    )
    max_size_in_megabytes: MaxSizeInMegabytes = DEFAULT_MAX_SIZE_MB
    requires_duplicate_detection: bool = False


class SubscriptionProperties(_Model):
    dead_lettering_on_message_expiration: bool = False
    default_message_time_to_live: TimeToLive = None
    lock_duration: LockDuration = DEFAULT_LOCK_DURATION
    max_delivery_count: MaxDeliveryCount = DEFAULT_MAX_DELIVERY_COUNT
    forward_dead_lettered_messages_to: ForwardTarget = None
    forward_to: ForwardTarget = None
    requires_session: bool = False


class CorrelationFilter(_Model):
    """Matches when every given system property and user property equals the message's."""

    content_type: str | None = None
    correlation_id: str | None = None
    label: str | None = None
    """The message's subject (AMQP ``subject``; "Label" in the older SDKs)."""
    message_id: str | None = None
    reply_to: str | None = None
    reply_to_session_id: str | None = None
    session_id: str | None = None
    to: str | None = None
    properties: Annotated[
        dict[str, str | int | float | bool] | None, BeforeValidator(_user_properties)
    ] = None
    """User (application) properties that must all match."""

    @model_validator(mode="after")
    def _not_empty(self) -> CorrelationFilter:
        if not any(getattr(self, name) is not None for name in type(self).model_fields):
            raise ValueError("a correlation filter must set at least one property")
        return self


def _valid_filter(text: str) -> str:
    """Parsed now, so a typo stops start-up naming the position, not the first message."""
    sqlfilter.parse_filter(text)
    return text


def _valid_action(text: str) -> str:
    sqlfilter.parse_action(text)
    return text


class SqlFilter(_Model):
    sql_expression: Annotated[str, AfterValidator(_not_blank), AfterValidator(_valid_filter)]


class SqlRuleAction(_Model):
    sql_expression: Annotated[str, AfterValidator(_not_blank), AfterValidator(_valid_action)]


class RuleProperties(_Model):
    filter_type: Literal["Correlation", "Sql"]
    correlation_filter: CorrelationFilter | None = None
    sql_filter: SqlFilter | None = None
    action: SqlRuleAction | None = None

    @model_validator(mode="after")
    def _filter_matches_type(self) -> RuleProperties:
        if self.filter_type == "Correlation":
            if self.correlation_filter is None:
                raise ValueError("FilterType is 'Correlation' but CorrelationFilter is missing")
            if self.sql_filter is not None:
                raise ValueError("FilterType is 'Correlation' but a SqlFilter is given too")
        else:
            if self.sql_filter is None:
                raise ValueError("FilterType is 'Sql' but SqlFilter is missing")
            if self.correlation_filter is not None:
                raise ValueError("FilterType is 'Sql' but a CorrelationFilter is given too")
        return self


class Rule(_Model):
    name: RuleName
    properties: RuleProperties


DEFAULT_RULE = Rule.model_validate(
    {
        "Name": DEFAULT_RULE_NAME,
        "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "1=1"}},
    }
)
"""What Service Bus gives a subscription created without rules: accept everything."""


class Subscription(_Model):
    name: SubscriptionName
    properties: SubscriptionProperties = Field(default_factory=SubscriptionProperties)
    rules: list[Rule] = Field(default_factory=list)

    def effective_rules(self) -> list[Rule]:
        """The configured rules, or Service Bus's ``$Default`` (``1=1``) when there are none."""
        return list(self.rules) or [DEFAULT_RULE]


class Topic(_Model):
    name: EntityName
    properties: TopicProperties = Field(default_factory=TopicProperties)
    subscriptions: list[Subscription] = Field(default_factory=list)

    def subscription(self, name: str) -> Subscription | None:
        """Case-insensitive lookup, as Service Bus resolves subscription names."""
        return _find(self.subscriptions, name)


def _environ(info: ValidationInfo) -> Mapping[str, str]:
    context = info.context if isinstance(info.context, Mapping) else {}
    environ = context.get("environ")
    return environ if environ is not None else os.environ


class AuthorizationRule(_Model):
    """A shared access rule: not in the emulator's schema, which only knows its built-in one.

    The key comes either inline (``Key``) or from an environment variable read at load
    time (``KeyEnvironmentVariable``), so real keys need not sit in the file.
    """

    name: AuthorizationRuleName
    key: str | None = None
    key_environment_variable: str | None = None
    rights: Annotated[list[Right], Field(min_length=1)]
    _resolved_key: str = PrivateAttr(default="")

    @field_validator("key_environment_variable")
    @classmethod
    def _variable_is_set(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if not value:
            raise ValueError("must name an environment variable")
        if not _environ(info).get(value):
            raise ValueError(f"environment variable {value!r} is not set (or is empty)")
        return value

    @field_validator("key")
    @classmethod
    def _key_not_empty(cls, value: str | None) -> str | None:
        if value is not None and not value:
            raise ValueError("must not be empty")
        return value

    @model_validator(mode="after")
    def _resolve_key(self, info: ValidationInfo) -> AuthorizationRule:
        if (self.key is None) == (self.key_environment_variable is None):
            raise ValueError("set exactly one of Key and KeyEnvironmentVariable")
        if self.key is not None:
            self._resolved_key = self.key
        else:
            self._resolved_key = _environ(info)[str(self.key_environment_variable)]
        return self

    def to_rule(self) -> SharedAccessRule:
        """The rule with its key resolved and ``Manage`` expanded to Send and Listen."""
        return SharedAccessRule(self.name, self._resolved_key, frozenset(self.rights))


class Namespace(_Model):
    name: NamespaceName
    queues: list[Queue] = Field(default_factory=list)
    topics: list[Topic] = Field(default_factory=list)
    authorization_rules: Annotated[list[AuthorizationRule], Field(min_length=1)] | None = None
    """``None`` (left out): the emulator's ``RootManageSharedAccessKey`` rule applies."""

    def queue(self, name: str) -> Queue | None:
        """Case-insensitive lookup; the result keeps the configured spelling."""
        return _find(self.queues, name)

    def topic(self, name: str) -> Topic | None:
        return _find(self.topics, name)

    def rules(self) -> tuple[SharedAccessRule, ...]:
        """The effective authorization rules (the emulator's well-known one by default)."""
        if self.authorization_rules is None:
            return (EMULATOR_RULE,)
        return tuple(rule.to_rule() for rule in self.authorization_rules)

    @model_validator(mode="after")
    def _check_references(self) -> Namespace:
        problems = _namespace_problems(self)
        if problems:
            raise located_problems(problems)
        return self


class Logging(_Model):
    type: Literal["File", "Console", "File,Console", "Console,File"]

    @property
    def to_file(self) -> bool:
        return "File" in self.type.split(",")

    @property
    def to_console(self) -> bool:
        return "Console" in self.type.split(",")


class UserConfig(_Model):
    namespaces: Annotated[list[Namespace], AfterValidator(_exactly_one_namespace)] | None = None
    """Service Bus (the Service Bus emulator's part); may be left out for event hubs only."""
    namespace_config: (
        Annotated[list[EventHubNamespace], AfterValidator(_exactly_one_namespace)] | None
    ) = None
    """Event hubs (the Event Hubs emulator's part)."""
    logging: Logging | None = None
    logging_config: Logging | None = None
    """The Event Hubs emulator's name for ``Logging``."""

    @model_validator(mode="after")
    def _check_parts(self) -> UserConfig:
        problems: list[tuple[Loc, str]] = []
        if self.namespaces is None and self.namespace_config is None:
            problems.append(
                (
                    ("Namespaces",),
                    (
                        "required property 'Namespaces' is missing (Service Bus), or "
                        "NamespaceConfig "
                        "(Event Hubs)"
                    ),
                )
            )
        if self.logging is None and self.logging_config is None:
            problems.append(
                (
                    ("Logging",),
                    (
                        "required property 'Logging' is missing (or LoggingConfig, the Event Hubs "
                        "emulator's name for it)"
                    ),
                )
            )
        if self.logging is not None and self.logging_config is not None:
            problems.append((("LoggingConfig",), "set Logging or LoggingConfig, not both"))
        hubs = self.namespace_config or []
        problems += [(("NamespaceConfig", *loc), why) for loc, why in duplicate_names(hubs)]
        taken = {queue.name.lower() for ns in self.namespaces or [] for queue in ns.queues}
        taken |= {topic.name.lower() for ns in self.namespaces or [] for topic in ns.topics}
        for n, namespace in enumerate(hubs):
            for e, hub in enumerate(namespace.entities):
                if hub.name.lower() in taken:
                    problems.append(
                        (
                            ("NamespaceConfig", n, "Entities", e, "Name"),
                            f"event hub {hub.name!r} is also the name of a queue or topic: the "
                            "broker serves both on one listener, so names must differ",
                        )
                    )
        if problems:
            raise located_problems(problems)
        return self


class BrokerConfig(_Model):
    """The whole Config.json: ``{"UserConfig": {"Namespaces": [...], "Logging": {...}}}``."""

    user_config: UserConfig

    @property
    def namespace(self) -> Namespace:
        """The namespace (the emulator, and so this broker, serves exactly one); a file with
        event hubs only gets an empty one of the Event Hubs namespace's name."""
        config = self.user_config
        if config.namespaces is not None:
            return config.namespaces[0]
        assert config.namespace_config is not None
        return Namespace.model_validate({"Name": config.namespace_config[0].name})

    @property
    def logging(self) -> Logging:
        logging = self.user_config.logging or self.user_config.logging_config
        assert logging is not None
        return logging

    @property
    def event_hubs(self) -> list[EventHubSpec]:
        """The event hubs the file defines (``NamespaceConfig``), in order."""
        namespaces = self.user_config.namespace_config or []
        return [hub.spec() for namespace in namespaces for hub in namespace.entities]

    def queue(self, name: str) -> Queue | None:
        """Case-insensitive queue lookup; the result keeps the configured spelling."""
        return self.namespace.queue(name)

    def topic(self, name: str) -> Topic | None:
        """Case-insensitive topic lookup; the result keeps the configured spelling."""
        return self.namespace.topic(name)

    def rules(self) -> tuple[SharedAccessRule, ...]:
        """The effective authorization rules, keys resolved."""
        return self.namespace.rules()


_Named = TypeVar("_Named", Queue, Topic, Subscription)


def _find(items: Iterable[_Named], name: str) -> _Named | None:
    folded = name.lower()
    return next((item for item in items if item.name.lower() == folded), None)


# ---------------------------------------------------------------------- cross-entity checks


def _namespace_problems(namespace: Namespace) -> list[tuple[Loc, str]]:
    """Checks that need the whole namespace: unique names and forwarding targets."""
    problems: list[tuple[Loc, str]] = []

    def unique(kind: str, key: str, names: Sequence[tuple[Loc, str]]) -> None:
        first: dict[str, tuple[Loc, str]] = {}
        for loc, name in names:
            earlier = first.setdefault(name.lower(), (loc, name))
            if earlier[0] != loc:
                problems.append(
                    (
                        (*loc, "Name"),
                        f"duplicate {kind} name {name!r}: {format_loc(earlier[0])} is already "
                        "named "
                        f"{earlier[1]!r} (names are case-insensitive{key})",
                    )
                )

    entities = [(("Queues", i), q.name) for i, q in enumerate(namespace.queues)]
    entities += [(("Topics", i), t.name) for i, t in enumerate(namespace.topics)]
    unique("entity", "; queues and topics share one namespace", entities)
    for t, topic in enumerate(namespace.topics):
        unique(
            "subscription",
            "",
            [
                (("Topics", t, "Subscriptions", s), sub.name)
                for s, sub in enumerate(topic.subscriptions)
            ],
        )
        for s, sub in enumerate(topic.subscriptions):
            unique(
                "rule",
                "",
                [
                    (("Topics", t, "Subscriptions", s, "Rules", r), rule.name)
                    for r, rule in enumerate(sub.rules)
                ],
            )
    unique(
        "authorization rule",
        "",
        [
            (("AuthorizationRules", i), rule.name)
            for i, rule in enumerate(namespace.authorization_rules or ())
        ],
    )

    names = {name.lower() for _, name in entities}
    spelled = [name for _, name in entities]

    def forwarding(
        loc: Loc, owner: str | None, props: QueueProperties | SubscriptionProperties
    ) -> None:
        for attribute, alias in (
            ("forward_to", "ForwardTo"),
            ("forward_dead_lettered_messages_to", "ForwardDeadLetteredMessagesTo"),
        ):
            target: str | None = getattr(props, attribute)
            if target is None:
                continue
            where = (*loc, "Properties", alias)
            if target.lower() not in names:
                problems.append(
                    (
                        where,
                        (
                            f"{target!r} is not a queue or topic in namespace {namespace.name!r}"
                            + did_you_mean(target, spelled)
                        ),
                    )
                )
            elif owner is not None and target.lower() == owner.lower():
                problems.append((where, f"queue {owner!r} cannot forward to itself"))

    for i, queue in enumerate(namespace.queues):
        forwarding(("Queues", i), queue.name, queue.properties)
    for t, topic in enumerate(namespace.topics):
        for s, sub in enumerate(topic.subscriptions):
            forwarding(("Topics", t, "Subscriptions", s), None, sub.properties)
    if not problems:
        problems += _forwarding_loops(namespace)
    return problems


def _forwarding_loops(namespace: Namespace) -> list[tuple[Loc, str]]:
    """ForwardTo chains that come back to where they started (a topic reaches each of its
    subscriptions): Service Bus refuses to create them."""
    edges: dict[str, list[tuple[str, Loc | None]]] = {}
    spelled: dict[str, str] = {}
    for i, queue in enumerate(namespace.queues):
        spelled[queue.name.lower()] = queue.name
        if queue.properties.forward_to:
            edges[queue.name.lower()] = [
                (queue.properties.forward_to.lower(), ("Queues", i, "Properties", "ForwardTo"))
            ]
    for t, topic in enumerate(namespace.topics):
        spelled[topic.name.lower()] = topic.name
        for s, sub in enumerate(topic.subscriptions):
            path = f"{topic.name}/Subscriptions/{sub.name}"
            spelled[path.lower()] = path
            edges.setdefault(topic.name.lower(), []).append((path.lower(), None))
            if sub.properties.forward_to:
                edges[path.lower()] = [
                    (
                        sub.properties.forward_to.lower(),
                        ("Topics", t, "Subscriptions", s, "Properties", "ForwardTo"),
                    )
                ]
    problems: list[tuple[Loc, str]] = []
    reported: set[frozenset[str]] = set()

    def walk(node: str, trail: list[str], locs: list[Loc | None]) -> None:
        for target, loc in edges.get(node, []):
            if target in trail:
                cycle = trail[trail.index(target) :]
                if frozenset(cycle) not in reported:
                    reported.add(frozenset(cycle))
                    where = next(
                        (lc for lc in [*locs[trail.index(target) :], loc] if lc is not None),
                        ("Queues",),
                    )
                    shown = " -> ".join(spelled.get(n, n) for n in [*cycle, target])
                    problems.append((where, f"forwarding loop: {shown}"))
                continue
            walk(target, [*trail, target], [*locs, loc])

    for start in list(edges):
        walk(start, [start], [])
    return problems


# ---------------------------------------------------------------------- loading


def load_config(path: str | Path, *, environ: Mapping[str, str] | None = None) -> BrokerConfig:
    """Read and validate a Config.json; raises ``ConfigError`` on any problem.

    ``environ`` replaces ``os.environ`` for ``KeyEnvironmentVariable`` look-ups.
    """
    return load_config_text(read_text(path), str(path), environ=environ)


def load_config_text(
    text: str, source: str = "<string>", *, environ: Mapping[str, str] | None = None
) -> BrokerConfig:
    """Validate Config.json given as text; ``source`` names it in error messages."""
    data, positions, duplicates = parse_json(source, text)
    if duplicates:
        raise positions.error(
            [(loc, f"property {loc[-1]!r} appears more than once") for loc in duplicates],
            lambda loc: _context(loc, data),
        )
    return _validate(data, positions, environ)


def parse_config(
    data: object, source: str = "<config>", *, environ: Mapping[str, str] | None = None
) -> BrokerConfig:
    """Validate an already-parsed Config.json (a dict), e.g. one built in a test."""
    return _validate(data, Positions(source), environ)


def _validate(
    data: object, positions: Positions, environ: Mapping[str, str] | None
) -> BrokerConfig:
    context = {"environ": os.environ if environ is None else environ}
    try:
        return BrokerConfig.model_validate(data, context=context)
    except ValidationError as exc:
        problems = validation_problems(exc, (), data, BrokerConfig, JSON)
        raise positions.error(problems, lambda loc: _context(loc, data)) from None


_KINDS = {
    "Queues": "queue",
    "Topics": "topic",
    "Subscriptions": "subscription",
    "Rules": "rule",
    "AuthorizationRules": "authorization rule",
}


def _context(loc: Loc, data: object) -> str:
    """Name the entities along ``loc`` (indices alone are hard to map back to the file)."""
    names: list[str] = []
    node = data
    previous: str | int | None = None
    for part in loc:
        try:
            node = node[part]  # type: ignore[index]  # any JSON: errors caught
        except (KeyError, IndexError, TypeError):
            break
        if isinstance(part, int) and isinstance(previous, str) and previous in _KINDS:
            name = node.get("Name") if isinstance(node, dict) else None
            if isinstance(name, str):
                names.append(f"{_KINDS[previous]} {name!r}")
        previous = part
    return " / ".join(names)
