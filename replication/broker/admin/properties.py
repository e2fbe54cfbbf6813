"""Entity properties as the management API names them: types, defaults, limits, immutability.

A description is a plain dict keyed by the XML element name (``LockDuration``), holding typed
values (``timedelta``, ``int``, ``bool``, ``str``, ``None``). Keeping the Service Bus names
end to end means the XML layer, the validation messages and the stored JSON all speak the
same words as the REST API documentation. The broker's own ``QueueSettings`` /
``TopicSettings`` are derived from a description; everything else (UserMetadata,
MaxSizeInMegabytes, ...) is kept and echoed back, as Service Bus does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..config import (
    MAX_DELIVERY_COUNT_LIMIT,
    MAX_DUPLICATE_DETECTION_WINDOW,
    MAX_LOCK_DURATION,
    MIN_LOCK_DURATION,
    MIN_MESSAGE_TIME_TO_LIVE,
    UNLIMITED_TIME_TO_LIVE,
    format_duration,
    parse_duration,
)
from ..entity_records import QUEUE, SUBSCRIPTION, TOPIC
from ..queue import DEFAULT_MAX_SIZE_MB, QueueSettings
from ..registry import entity_path
from ..topic import TopicSettings

Description = dict[str, Any]

MIN_DUPLICATE_DETECTION_WINDOW = timedelta(seconds=20)
MIN_AUTO_DELETE_ON_IDLE = timedelta(minutes=5)
MAX_SIZE_IN_MEGABYTES = (1024, 2048, 3072, 4096, 5120)
"""What a Standard namespace offers (1 to 5 GB)."""
STANDARD_MESSAGE_SIZE_KB = 256
MAX_USER_METADATA = 1024
STATUSES = ("Active", "Disabled", "SendDisabled", "ReceiveDisabled")
STATUSES_OF = {
    QUEUE: STATUSES,
    TOPIC: ("Active", "Disabled", "SendDisabled"),
    SUBSCRIPTION: ("Active", "Disabled", "ReceiveDisabled"),
}
"""The statuses Service Bus offers per kind (a topic is not received from, a subscription
not sent to)."""


class PropertyError(ValueError):
    """A property value the service would refuse (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class Prop:
    """One writable property: its XML name, how its text is read, its default."""

    name: str
    parse: Callable[[str], Any]
    default: Any = None
    check: Callable[[Any], None] | None = None
    immutable: bool = False
    """Service Bus refuses to change it once the entity exists."""


def _bool(text: str) -> bool:
    folded = text.strip().lower()
    if folded not in ("true", "false"):
        raise PropertyError(f"{text!r} is not a boolean (true or false)")
    return folded == "true"


def _int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise PropertyError(f"{text!r} is not an integer") from None


def _duration(text: str) -> timedelta:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise PropertyError(str(exc)) from None


def _unlimited(text: str) -> timedelta | None:
    """TimeSpan.MaxValue (and anything that long) means "never" and is kept as None."""
    value = _duration(text)
    return None if value >= UNLIMITED_TIME_TO_LIVE else value


def _text(text: str) -> str | None:
    return text or None


def _status(text: str) -> str:
    for status in STATUSES:
        if status.lower() == text.strip().lower():
            return status
    raise PropertyError(f"{text!r} is not an entity status ({', '.join(STATUSES)})")


def _forward(text: str) -> str | None:
    """``sb://host/queue`` (what the SDKs send) or a bare name -> the entity path."""
    path = entity_path(text.strip())
    return path or None


def _between(low: timedelta, high: timedelta | None = None) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value is None:
            return
        if value < low or (high is not None and value > high):
            bounds = (
                f"between {format_duration(low)} and {format_duration(high)}"
                if high
                else (f"at least {format_duration(low)}")
            )
            raise PropertyError(f"must be {bounds}, got {format_duration(value)}")

    return check


def _delivery_count(value: int) -> None:
    if not 1 <= value <= MAX_DELIVERY_COUNT_LIMIT:
        raise PropertyError(f"must be between 1 and {MAX_DELIVERY_COUNT_LIMIT}, got {value}")


def _size(value: int) -> None:
    if value not in MAX_SIZE_IN_MEGABYTES:
        sizes = ", ".join(map(str, MAX_SIZE_IN_MEGABYTES))
        raise PropertyError(f"must be one of {sizes}, got {value}")


def _message_size(value: int) -> None:
    if value != STANDARD_MESSAGE_SIZE_KB:
        raise PropertyError(
            f"this namespace is Standard tier: messages are up to {STANDARD_MESSAGE_SIZE_KB} KB "
            "(other sizes need a Premium namespace)"
        )


def _metadata(value: str | None) -> None:
    if value is not None and len(value) > MAX_USER_METADATA:
        raise PropertyError(f"is {len(value)} characters; at most {MAX_USER_METADATA} are allowed")


LOCK_DURATION = Prop(
    "LockDuration", _duration, timedelta(minutes=1), _between(MIN_LOCK_DURATION, MAX_LOCK_DURATION)
)
TTL = Prop("DefaultMessageTimeToLive", _unlimited, None, _between(MIN_MESSAGE_TIME_TO_LIVE))
MAX_SIZE = Prop("MaxSizeInMegabytes", _int, DEFAULT_MAX_SIZE_MB, _size)
DUPLICATE_DETECTION = Prop("RequiresDuplicateDetection", _bool, False, immutable=True)
DUPLICATE_WINDOW = Prop(
    "DuplicateDetectionHistoryTimeWindow",
    _duration,
    timedelta(minutes=10),
    _between(MIN_DUPLICATE_DETECTION_WINDOW, MAX_DUPLICATE_DETECTION_WINDOW),
)
SESSION = Prop("RequiresSession", _bool, False, immutable=True)
DEAD_LETTER_ON_EXPIRY = Prop("DeadLetteringOnMessageExpiration", _bool, False)
MAX_DELIVERY = Prop("MaxDeliveryCount", _int, 10, _delivery_count)
BATCHED = Prop("EnableBatchedOperations", _bool, True)
STATUS = Prop("Status", _status, "Active")
AUTO_DELETE = Prop("AutoDeleteOnIdle", _unlimited, None, _between(MIN_AUTO_DELETE_ON_IDLE))
PARTITIONING = Prop("EnablePartitioning", _bool, False, immutable=True)
EXPRESS = Prop("EnableExpress", _bool, False)
FORWARD_TO = Prop("ForwardTo", _forward)
FORWARD_DLQ_TO = Prop("ForwardDeadLetteredMessagesTo", _forward)
USER_METADATA = Prop("UserMetadata", _text, None, _metadata)
MESSAGE_SIZE = Prop("MaxMessageSizeInKilobytes", _int, STANDARD_MESSAGE_SIZE_KB, _message_size)
ANONYMOUS = Prop("IsAnonymousAccessible", _bool, False)
ORDERING = Prop("SupportOrdering", _bool, True)

WRITABLE: dict[str, tuple[Prop, ...]] = {
    QUEUE: (
        LOCK_DURATION,
        MAX_SIZE,
        DUPLICATE_DETECTION,
        SESSION,
        TTL,
        DEAD_LETTER_ON_EXPIRY,
        DUPLICATE_WINDOW,
        MAX_DELIVERY,
        BATCHED,
        ANONYMOUS,
        STATUS,
        ORDERING,
        AUTO_DELETE,
        PARTITIONING,
        EXPRESS,
        FORWARD_TO,
        USER_METADATA,
        FORWARD_DLQ_TO,
        MESSAGE_SIZE,
    ),
    TOPIC: (
        TTL,
        MAX_SIZE,
        DUPLICATE_DETECTION,
        DUPLICATE_WINDOW,
        BATCHED,
        Prop("FilteringMessagesBeforePublishing", _bool, False),
        ANONYMOUS,
        STATUS,
        ORDERING,
        AUTO_DELETE,
        PARTITIONING,
        Prop("EnableSubscriptionPartitioning", _bool, False),
        EXPRESS,
        USER_METADATA,
        MESSAGE_SIZE,
    ),
    SUBSCRIPTION: (
        LOCK_DURATION,
        SESSION,
        TTL,
        DEAD_LETTER_ON_EXPIRY,
        Prop("DeadLetteringOnFilterEvaluationExceptions", _bool, True),
        MAX_DELIVERY,
        BATCHED,
        STATUS,
        FORWARD_TO,
        FORWARD_DLQ_TO,
        AUTO_DELETE,
        USER_METADATA,
    ),
}
"""Per kind, in the order Service Bus writes them."""

READ_ONLY: dict[str, frozenset[str]] = {
    QUEUE: frozenset(
        {
            "SizeInBytes",
            "MessageCount",
            "AuthorizationRules",
            "CreatedAt",
            "UpdatedAt",
            "AccessedAt",
            "CountDetails",
            "EntityAvailabilityStatus",
        }
    ),
    TOPIC: frozenset(
        {
            "SizeInBytes",
            "AuthorizationRules",
            "CreatedAt",
            "UpdatedAt",
            "AccessedAt",
            "CountDetails",
            "SubscriptionCount",
            "SqlFilterCount",
            "CorrelationFilterCount",
            "EntityAvailabilityStatus",
        }
    ),
    SUBSCRIPTION: frozenset(
        {
            "MessageCount",
            "CreatedAt",
            "UpdatedAt",
            "AccessedAt",
            "CountDetails",
            "EntityAvailabilityStatus",
            "DefaultRuleDescription",
        }
    ),
}
"""Elements a client may send back (an update echoes a GET) that are silently ignored;
``DefaultRuleDescription`` is read by the API itself on create."""


LAYOUT: dict[str, tuple[str, ...]] = {
    QUEUE: (
        "LockDuration",
        "MaxSizeInMegabytes",
        "RequiresDuplicateDetection",
        "RequiresSession",
        "DefaultMessageTimeToLive",
        "DeadLetteringOnMessageExpiration",
        "DuplicateDetectionHistoryTimeWindow",
        "MaxDeliveryCount",
        "EnableBatchedOperations",
        "SizeInBytes",
        "MessageCount",
        "IsAnonymousAccessible",
        "AuthorizationRules",
        "Status",
        "CreatedAt",
        "UpdatedAt",
        "AccessedAt",
        "SupportOrdering",
        "CountDetails",
        "AutoDeleteOnIdle",
        "EnablePartitioning",
        "EntityAvailabilityStatus",
        "EnableExpress",
        "ForwardTo",
        "UserMetadata",
        "ForwardDeadLetteredMessagesTo",
        "MaxMessageSizeInKilobytes",
    ),
    TOPIC: (
        "DefaultMessageTimeToLive",
        "MaxSizeInMegabytes",
        "RequiresDuplicateDetection",
        "DuplicateDetectionHistoryTimeWindow",
        "EnableBatchedOperations",
        "SizeInBytes",
        "FilteringMessagesBeforePublishing",
        "IsAnonymousAccessible",
        "AuthorizationRules",
        "Status",
        "CreatedAt",
        "UpdatedAt",
        "AccessedAt",
        "SupportOrdering",
        "CountDetails",
        "SubscriptionCount",
        "SqlFilterCount",
        "CorrelationFilterCount",
        "AutoDeleteOnIdle",
        "EnablePartitioning",
        "EntityAvailabilityStatus",
        "EnableSubscriptionPartitioning",
        "EnableExpress",
        "UserMetadata",
        "MaxMessageSizeInKilobytes",
    ),
    SUBSCRIPTION: (
        "LockDuration",
        "RequiresSession",
        "DefaultMessageTimeToLive",
        "DeadLetteringOnMessageExpiration",
        "DeadLetteringOnFilterEvaluationExceptions",
        "MessageCount",
        "MaxDeliveryCount",
        "EnableBatchedOperations",
        "Status",
        "ForwardTo",
        "CreatedAt",
        "UpdatedAt",
        "AccessedAt",
        "CountDetails",
        "ForwardDeadLetteredMessagesTo",
        "AutoDeleteOnIdle",
        "EntityAvailabilityStatus",
        "UserMetadata",
    ),
}
"""The elements of each description in the order Service Bus writes them (writable and
read-only together)."""


def defaults(kind: str) -> Description:
    return {prop.name: prop.default for prop in WRITABLE[kind]}


def parse_value(kind: str, name: str, text: str, current: Any = None) -> Any:
    """One element's text as a checked value; ``PropertyError`` names what is wrong. The
    ``current`` value is taken back unchecked: an update echoes what a GET gave, and
    Config.json allows values the API does not (``MaxSizeInMegabytes`` from 1)."""
    prop = next((p for p in WRITABLE[kind] if p.name == name), None)
    if prop is None:
        raise PropertyError(f"{name} is not a property of a {kind}")
    try:
        value = prop.parse(text)
        if prop.check is not None and (current is None or value != current):
            prop.check(value)
    except PropertyError as exc:
        raise PropertyError(f"{name}: {exc}") from None
    return value


def check_update(kind: str, old: Description, new: Description) -> None:
    for prop in WRITABLE[kind]:
        if prop.immutable and old.get(prop.name) != new.get(prop.name):
            raise PropertyError(
                f"The value for the {prop.name} property of an existing {kind.capitalize()} "
                "cannot be changed."
            )


# ---------------------------------------------------------------------- settings <-> description


def settings_of(kind: str, description: Description) -> QueueSettings | TopicSettings:
    """What the broker's entity logic needs of a description."""
    d = description
    if kind == TOPIC:
        return TopicSettings(
            default_ttl=d["DefaultMessageTimeToLive"],
            requires_duplicate_detection=d["RequiresDuplicateDetection"],
            duplicate_detection_window=d["DuplicateDetectionHistoryTimeWindow"],
            max_message_size=d["MaxMessageSizeInKilobytes"] * 1024,
            status=d.get("Status", "Active"),
            max_size_mb=d["MaxSizeInMegabytes"],
            auto_delete_on_idle=d["AutoDeleteOnIdle"],
        )
    return QueueSettings(
        lock_duration=d["LockDuration"],
        max_delivery_count=d["MaxDeliveryCount"],
        default_ttl=d["DefaultMessageTimeToLive"],
        dead_letter_on_expiration=d["DeadLetteringOnMessageExpiration"],
        requires_duplicate_detection=d.get("RequiresDuplicateDetection", False),
        duplicate_detection_window=d.get(
            "DuplicateDetectionHistoryTimeWindow", timedelta(minutes=10)
        ),
        requires_session=d["RequiresSession"],
        max_message_size=d.get("MaxMessageSizeInKilobytes", STANDARD_MESSAGE_SIZE_KB) * 1024,
        forward_to=d["ForwardTo"],
        forward_dead_lettered_messages_to=d["ForwardDeadLetteredMessagesTo"],
        status=d.get("Status", "Active"),
        max_size_mb=d.get("MaxSizeInMegabytes", MAX_SIZE.default),
        auto_delete_on_idle=d["AutoDeleteOnIdle"],
    )


def description_of(
    kind: str, settings: QueueSettings | TopicSettings, extra: Description | None = None
) -> Description:
    """A description from the broker's settings (Config.json entities), plus the
    management-only properties stored with it (``extra``)."""
    d = defaults(kind)
    d.update(extra or {})
    d["DefaultMessageTimeToLive"] = settings.default_ttl
    d["Status"] = settings.status
    d["AutoDeleteOnIdle"] = settings.auto_delete_on_idle
    d["RequiresDuplicateDetection"] = settings.requires_duplicate_detection
    d["DuplicateDetectionHistoryTimeWindow"] = settings.duplicate_detection_window
    if isinstance(settings, QueueSettings):
        d["LockDuration"] = settings.lock_duration
        d["MaxDeliveryCount"] = settings.max_delivery_count
        d["DeadLetteringOnMessageExpiration"] = settings.dead_letter_on_expiration
        d["RequiresSession"] = settings.requires_session
        d["ForwardTo"] = settings.forward_to
        d["ForwardDeadLetteredMessagesTo"] = settings.forward_dead_lettered_messages_to
    if kind != SUBSCRIPTION:
        d["MaxMessageSizeInKilobytes"] = settings.max_message_size // 1024
        d["MaxSizeInMegabytes"] = settings.max_size_mb
    return {name: d[name] for name in (p.name for p in WRITABLE[kind])}


def dump_extra(description: Description) -> str:
    """The description as JSON (durations in seconds), stored beside the settings."""
    return json.dumps(
        {
            name: {"seconds": value.total_seconds()} if isinstance(value, timedelta) else value
            for name, value in description.items()
        },
        sort_keys=True,
    )


def load_extra(text: str | None) -> Description:
    if not text:
        return {}
    return {
        name: timedelta(seconds=value["seconds"]) if isinstance(value, dict) else value
        for name, value in json.loads(text).items()
    }
