"""Event hubs in the broker's config file: the official Event Hubs emulator's schema.

``UserConfig.NamespaceConfig[]`` with ``"Type": "EventHub"`` (``EventHub-Emulator/Schema/
Config-schema.json`` in ``Azure/azure-event-hubs-emulator-installer``), next to the Service
Bus emulator's ``UserConfig.Namespaces[]`` in the same file, so either emulator's file works
unchanged. Followed property for property, with these differences:

* ``PartitionCount`` may be a number as well as the emulator's numeric string, 1 to 1024
  (Azure's limit per event hub) instead of the emulator's 32;
* the namespace's ``Name`` is any valid namespace name, not only ``emulatorNs1``, and it
  may list up to any number of event hubs, not 10;
* ``RetentionTimeInHours`` (Azure's ``retentionDescription.retentionTimeInHours``) is our
  addition: how long events are kept, 1 hour to 90 days, default 24 (Azure's default of one
  day; the emulator keeps events for an hour).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_pascal

from .hub import DEFAULT_CONSUMER_GROUP, DEFAULT_RETENTION, EventHubSpec

MAX_PARTITION_COUNT = 1024
MAX_RETENTION_HOURS = 90 * 24
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")


def _name(kind: str, limit: int) -> AfterValidator:
    def check(name: str) -> str:
        if not 1 <= len(name) <= limit or not _NAME.fullmatch(name):
            raise ValueError(
                f"{name!r} is not a valid {kind} name: 1 to {limit} letters, digits, periods, "
                "hyphens and underscores, starting and ending with a letter or digit"
            )
        return name

    return AfterValidator(check)


def _not_default(name: str) -> str:
    if name.lower() == DEFAULT_CONSUMER_GROUP.lower():
        raise ValueError(f"{DEFAULT_CONSUMER_GROUP} always exists: leave it out of the list")
    return name


def _partition_count(value: object) -> object:
    """The emulator writes the count as a string ("2"); a number is taken too."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return value


class _Model(BaseModel):
    """The emulator's spelling (PascalCase), no coercion, unknown properties refused (as in
    the Service Bus part of the file)."""

    model_config = ConfigDict(alias_generator=to_pascal, extra="forbid", strict=True, frozen=True)


class ConsumerGroup(_Model):
    name: Annotated[str, AfterValidator(_not_default), _name("consumer group", 50)]


class EventHub(_Model):
    name: Annotated[str, _name("event hub", 256)]
    partition_count: Annotated[
        int, BeforeValidator(_partition_count), Field(ge=1, le=MAX_PARTITION_COUNT)
    ]
    consumer_groups: list[ConsumerGroup] = Field(default_factory=list)
    retention_time_in_hours: Annotated[int, Field(ge=1, le=MAX_RETENTION_HOURS)] = int(
        DEFAULT_RETENTION.total_seconds() // 3600
    )

    def spec(self) -> EventHubSpec:
        return EventHubSpec(
            self.name,
            self.partition_count,
            tuple(group.name for group in self.consumer_groups),
            timedelta(hours=self.retention_time_in_hours),
        )


class EventHubNamespace(_Model):
    """One entry of ``UserConfig.NamespaceConfig``."""

    type: Literal["EventHub"]
    name: Annotated[str, _name("namespace", 50)]
    entities: list[EventHub] = Field(default_factory=list)


def duplicate_names(namespaces: list[EventHubNamespace]) -> list[tuple[tuple[str | int, ...], str]]:
    """Event hubs named twice, and consumer groups named twice in one hub (names compare
    without case, as Event Hubs resolves them): ``(location under NamespaceConfig, why)``."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    seen: dict[str, str] = {}
    for n, namespace in enumerate(namespaces):
        for e, hub in enumerate(namespace.entities):
            if hub.name.lower() in seen:
                problems.append(
                    ((n, "Entities", e, "Name"), f"event hub {hub.name!r} is defined twice")
                )
            seen[hub.name.lower()] = hub.name
            groups: set[str] = set()
            for g, group in enumerate(hub.consumer_groups):
                if group.name.lower() in groups:
                    problems.append(
                        (
                            (n, "Entities", e, "ConsumerGroups", g, "Name"),
                            f"consumer group {group.name!r} is listed twice",
                        )
                    )
                groups.add(group.name.lower())
    return problems
