"""Runtime changes to the namespace's entities as store records, and how they meet
Config.json at start (``Registry.load`` replays what ``reconcile`` keeps).

Each change through the management API is one ``managed_entity`` row, committed before the
API answers. Config.json stays the starting point: at start its entities are built first,
then the rows are replayed over them. A row remembers the Config.json definition it started
from (``configured``); when the file has changed that entity since, the file wins and the
row is dropped (as for subscription rules). API-made entities whose name the file now
defines give way to the file's definition too. A Config.json entity deleted through the API
stays deleted while the file's definition of it is unchanged.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .queue import DEFAULT_MAX_SIZE_MB, QueueSettings
from .store import ManagedEntity, MessageStore
from .topic import SUBSCRIPTIONS, TopicSettings

if TYPE_CHECKING:
    from .registry import TopicSpec

QUEUE, TOPIC, SUBSCRIPTION = "queue", "topic", "subscription"
"""Kinds of entity the management API creates (``ManagedEntity.kind``)."""

Definitions = dict[str, tuple[str, str, str]]
"""What Config.json defines: lower-case path -> (kind, path as spelled, ``dump_settings``)."""


def dump_settings(settings: QueueSettings | TopicSettings) -> str:
    """Entity settings as JSON (durations in seconds), to store and to compare definitions."""
    values = {
        name: {"seconds": value.total_seconds()} if isinstance(value, timedelta) else value
        for name, value in dataclasses.asdict(settings).items()
        if name not in _LATER_SETTINGS or value != _LATER_SETTINGS[name]
    }
    return json.dumps(values, sort_keys=True)


_LATER_SETTINGS: dict[str, Any] = {"max_size_mb": DEFAULT_MAX_SIZE_MB, "auto_delete_on_idle": None}
"""Settings added after records were first stored: left out at their defaults, so an
unchanged Config.json entity still matches its record (and keeps its API-made changes)."""


def load_settings(kind: str, text: str) -> QueueSettings | TopicSettings:
    """``dump_settings`` reversed; ``kind`` is queue, topic or subscription."""
    values: dict[str, Any] = {
        name: timedelta(seconds=value["seconds"]) if isinstance(value, dict) else value
        for name, value in json.loads(text).items()
    }
    return TopicSettings(**values) if kind == TOPIC else QueueSettings(**values)


def definitions(
    queues: Mapping[str, QueueSettings], topics: Mapping[str, TopicSpec]
) -> Definitions:
    """Every entity Config.json defines, as its records compare it."""
    found: Definitions = {}
    for name, settings in queues.items():
        found[name.lower()] = (QUEUE, name, dump_settings(settings))
    for name, spec in topics.items():
        found[name.lower()] = (TOPIC, name, dump_settings(spec.settings))
        for sub, (settings, _) in spec.subscriptions.items():
            path = f"{name}{SUBSCRIPTIONS}{sub}"
            found[path.lower()] = (SUBSCRIPTION, path, dump_settings(settings))
    return found


def reconcile(store: MessageStore, defined: Definitions, now: int) -> list[ManagedEntity]:
    """The stored records to replay over the file's entities, topics first (a subscription
    needs its topic). A record the file has changed the entity of since (or whose name it
    now defines) is replaced by the file's, one of an entity gone from the file is
    forgotten; both in ``store``."""
    order = {TOPIC: 0, QUEUE: 1, SUBSCRIPTION: 2}
    kept = []
    for record in sorted(store.managed_entities(), key=lambda r: order[r.kind]):
        file = defined.get(record.name.lower())
        if file is not None and (record.configured != file[2] or record.kind != file[0]):
            record = ManagedEntity(
                file[1], file[0], file[2], None, None, False, record.created_ms, now
            )
            store.save_managed_entity(record)
        elif file is None and record.configured is not None:
            store.forget_managed_entity(record.name)
            continue
        kept.append(record)
    return kept


def unrecorded(
    store: MessageStore, defined: Definitions, recorded: Mapping[str, ManagedEntity], now: int
) -> dict[str, ManagedEntity]:
    """New records (saved in ``store``) for the file's entities that have none."""
    new = {}
    for key, (kind, name, text) in defined.items():
        if key not in recorded:
            new[key] = ManagedEntity(name, kind, text, None, None, False, now, now)
            store.save_managed_entity(new[key])
    return new
