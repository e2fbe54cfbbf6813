"""What a filter sees of a message: its system (broker) properties and its user properties.

Keys of ``MessageFacts.system`` are the canonical names below (``Label``, not ``Subject``), so a
broker can read back what a rule action changed without knowing the aliases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class SystemProperty:
    """One ``sys.`` property: canonical name, C# type of its value, whether SET may change it."""

    name: str
    kind: str
    """One of ``string``, ``long``, ``boolean``, ``datetime``, ``timespan``, ``guid``."""
    settable: bool


# "Messages, payloads, and serialization" lists these; the ones it calls read-only are not
# settable. AMQP names, for the broker: see the package docstring.
SYSTEM_PROPERTIES: tuple[SystemProperty, ...] = (
    SystemProperty("ContentType", "string", True),
    SystemProperty("CorrelationId", "string", True),
    SystemProperty("DeadLetterSource", "string", False),
    SystemProperty("DeliveryCount", "long", False),
    SystemProperty("EnqueuedSequenceNumber", "long", False),
    SystemProperty("EnqueuedTimeUtc", "datetime", False),
    SystemProperty("ExpiresAtUtc", "datetime", False),
    SystemProperty("ForcePersistence", "boolean", True),
    SystemProperty("Label", "string", True),
    SystemProperty("LockedUntilUtc", "datetime", False),
    SystemProperty("LockToken", "guid", False),
    SystemProperty("MessageId", "string", True),
    SystemProperty("PartitionKey", "string", True),
    SystemProperty("ReplyTo", "string", True),
    SystemProperty("ReplyToSessionId", "string", True),
    SystemProperty("ScheduledEnqueueTimeUtc", "datetime", True),
    SystemProperty("SequenceNumber", "long", False),
    SystemProperty("SessionId", "string", True),
    SystemProperty("Size", "long", False),
    SystemProperty("State", "string", False),
    SystemProperty("TimeToLive", "timespan", True),
    SystemProperty("To", "string", True),
    SystemProperty("ViaPartitionKey", "string", True),
)

ALIASES: dict[str, str] = {
    # The filter docs: "Subject from ServiceBusMessage maps to Label"; and "use system property
    # names from ServiceBusMessage", whose other renamings are these two.
    "Subject": "Label",
    "ScheduledEnqueueTime": "ScheduledEnqueueTimeUtc",
    "TransactionPartitionKey": "ViaPartitionKey",
}

_BY_FOLDED: dict[str, SystemProperty] = {p.name.lower(): p for p in SYSTEM_PROPERTIES}
_BY_FOLDED.update({alias.lower(): _BY_FOLDED[name.lower()] for alias, name in ALIASES.items()})
_CANONICAL = frozenset(p.name for p in SYSTEM_PROPERTIES)

SETTABLE_NAMES: tuple[str, ...] = tuple(p.name for p in SYSTEM_PROPERTIES if p.settable)


def system_property(name: str) -> SystemProperty | None:
    """The system property ``name`` denotes (any case, aliases too), or None if there is none."""
    return _BY_FOLDED.get(name.lower())


@dataclass(slots=True)
class MessageFacts:
    """A message's properties as filters and actions read (and actions change) them.

    ``system`` maps canonical names to values (leave a property out, or give None, when the
    message has none); ``user`` holds the application properties as sent. Aliases and other
    spellings of system names are rewritten to the canonical ones on construction.

    ``body`` is the message body as a parsed JSON document (``json.loads``: dicts, lists, str,
    int, float, bool, None) for filters that read ``body.`` fields (an extension, see
    ``parse_filter(..., body_fields=True)``); None when there is none, or it is not JSON, so
    every body field is missing. Actions never change it.
    """

    system: dict[str, Any] = field(default_factory=dict)
    user: dict[str, Any] = field(default_factory=dict)
    body: Any = None

    def __post_init__(self) -> None:
        if not self.system.keys() <= _CANONICAL:
            canonical = {}
            for key, value in self.system.items():
                prop = system_property(key) if isinstance(key, str) else None
                if prop is None:
                    raise ValueError(
                        f"unknown system property {key!r}; expected one of "
                        f"{', '.join(sorted(_CANONICAL))}"
                    )
                canonical[prop.name] = value
            self.system.clear()
            self.system.update(canonical)

    def copy(self) -> MessageFacts:
        """An independent copy (a rule with an action works on its own copy of the message)."""
        return MessageFacts(dict(self.system), dict(self.user), self.body)
