"""The namespace's entities: queues, topics, subscriptions and dead-letter queues by path,
built from Config.json and changed at runtime (the management API), with auto-forwarding.

Runtime changes are kept as store records and replayed over the Config.json entities at
start (``entity_records``: which record wins).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from .clock import Clock, now_ms
from .entity_records import (
    QUEUE,
    SUBSCRIPTION,
    TOPIC,
    definitions,
    dump_settings,
    load_settings,
    reconcile,
    unrecorded,
)
from .queue import DEAD_LETTER_SUFFIX, Queue, QueueSettings
from .rules import DEFAULT_RULE, RuleSet, RuleSpec, dump_rules, load_rules
from .store import ManagedEntity, MessageStore
from .topic import SUBSCRIPTIONS, Subscription, Topic, TopicSettings

log = logging.getLogger("replication.broker")

Entity = Queue | Topic


@dataclass(slots=True)
class TopicSpec:
    """A topic and its subscriptions as the broker is given them (from Config.json)."""

    settings: TopicSettings = field(default_factory=TopicSettings)
    subscriptions: dict[str, tuple[QueueSettings, list[RuleSpec]]] = field(default_factory=dict)


def entity_path(address: str | None) -> str:
    """``amqps://host:port/a/b`` or ``a/b`` -> ``a/b`` (entities match by path, never by host)."""
    text = str(address or "")
    if "://" in text:
        text = urlparse(text).path
    return text.strip("/")


_STOPS = {"Send": ("Disabled", "SendDisabled"), "Listen": ("Disabled", "ReceiveDisabled")}


def disabled(entity: Entity, right: str) -> str | None:
    """Why the entity's ``Status`` refuses sends (``right`` Send) or receives (Listen), if
    it does (the SDKs raise ``MessagingEntityDisabledError`` for ``entity-disabled``)."""
    status = entity.settings.status
    if status not in _STOPS[right]:
        return None
    what = "sending to" if right == "Send" else "receiving from"
    return f"Messaging entity '{entity.name}' is {status}: {what} it is not allowed."


def queues_of(entity: Entity) -> list[Queue]:
    """The queues that belong to an entity: a queue (or subscription) and its dead-letter
    queue; every subscription of a topic with theirs."""
    queues = (
        [sub.queue for sub in entity.subscriptions.values()]
        if isinstance(entity, Topic)
        else [entity]
    )
    return queues + [queue.dead_letter for queue in queues if queue.dead_letter is not None]


def touch(entity: Entity, now: int) -> None:
    """The entity was used (on every send and delivery: one assignment)."""
    entity.accessed_ms = now


def last_use(entity: Entity) -> int:
    """When an entity was last used: a dead-letter queue's use is its queue's, and a topic
    is used while its subscriptions are (Service Bus: "no operations on the topic's
    subscriptions")."""
    return max([entity.accessed_ms, *(queue.accessed_ms for queue in queues_of(entity))])


_FORWARDS = (
    ("forward_to", "forward_to"),
    ("forward_dead_letters_to", "forward_dead_lettered_messages_to"),
)
"""A queue's forwarding attribute and the setting that names its target."""


class Registry:
    """Every entity of the namespace by lower-case path, over ``store``; ``load`` builds
    them (it reads the store), ``create`` / ``update`` / ``remove`` change them."""

    def __init__(self, store: MessageStore, clock: Clock, on_ready: Callable[[Queue], None]):
        self.store = store
        self.clock = clock
        self.on_ready = on_ready
        """Given to every queue: called when messages became deliverable (after a commit)."""
        self.entities: dict[str, Entity] = {}
        """Every addressable entity by lower-case path: queues, topics, subscriptions, DLQs."""
        self.queues: dict[str, Queue] = {}
        """Every entity that holds messages (queues, subscriptions and their DLQs)."""
        self.topics: dict[str, Topic] = {}
        self.sendable: set[str] = set()
        """Paths a client may send to: queues and topics."""
        self.subscriptions: dict[str, Subscription] = {}
        self.managed: dict[str, ManagedEntity] = {}
        """Every entity's record (created and updated times, management-only properties)."""
        self.by_entity_id: dict[int, Entity] = {}
        """Entities by their store id (what the store's due and expired rows name)."""
        self._configured_rules: dict[str, str] = {}

    def resolve(self, address: str | None) -> Entity | None:
        """The entity a link address (or a path) names."""
        return self.entities.get(entity_path(address).lower())

    # ------------------------------------------------------------------ building

    def load(self, queues: dict[str, QueueSettings], topics: dict[str, TopicSpec]) -> None:
        """Builds the Config.json entities, replays the runtime changes over them, resolves
        forwarding and commits."""
        for name, settings in queues.items():
            self._new_queue(name, settings)
        for name, spec in topics.items():
            topic = self._new_topic(name, spec.settings)
            for sub_name, (sub_settings, rules) in spec.subscriptions.items():
                queue = self._add_queue(topic.subscription_path(sub_name), sub_settings)
                subscription = Subscription(queue, RuleSet(self._initial_rules(queue, rules)))
                topic.subscriptions[sub_name.lower()] = subscription
                self.subscriptions[queue.name.lower()] = subscription
        self._restore_managed(queues, topics)  # API-made changes (runtime management)
        for queue in self.queues.values():
            self._resolve_forwarding(queue, strict=True)
        self.by_entity_id = {e.entity: e for e in self.entities.values()}
        self.store.commit()

    def _add_queue(self, name: str, settings: QueueSettings) -> Queue:
        dlq_settings = QueueSettings(
            lock_duration=settings.lock_duration,
            max_delivery_count=2**31 - 1,
            max_message_size=settings.max_message_size,
        )
        dlq = Queue(name + DEAD_LETTER_SUFFIX, self.store, dlq_settings, clock=self.clock)
        queue = Queue(name, self.store, settings, dead_letter=dlq, clock=self.clock)
        for q in (queue, dlq):
            q.on_ready = self.on_ready
            self.queues[q.name.lower()] = q
            self.entities[q.name.lower()] = q
            self.by_entity_id[q.entity] = q
        return queue

    def _initial_rules(self, queue: Queue, configured: list[RuleSpec]) -> list[RuleSpec]:
        """The rules a subscription had when the broker stopped (changed through
        ``$management``), unless Config.json changed them since: then the file wins."""
        configured_json = dump_rules(configured)
        self._configured_rules[queue.name.lower()] = configured_json
        saved = self.store.rule_set(queue.entity)
        if saved is not None and saved[0] == configured_json:
            return load_rules(saved[1])
        self.store.save_rule_set(queue.entity, configured_json, configured_json)
        return configured

    def save_rules(self, subscription: Subscription) -> None:
        name = subscription.queue.name.lower()
        self.store.save_rule_set(
            subscription.queue.entity,
            self._configured_rules[name],
            dump_rules(subscription.rules.specs),
        )

    def _resolve_forwarding(self, queue: Queue, *, strict: bool = False) -> None:
        """Points the queue's forwarding at its targets (``strict``: a missing one is an
        error, as in Config.json; otherwise the caller checked them)."""
        for attribute, setting in _FORWARDS:
            target_name = getattr(queue.settings, setting)
            target = self.entities.get(target_name.lower()) if target_name else None
            if strict and target_name and (target is None or not self._sendable(target)):
                raise ValueError(f"{queue.name}: no queue or topic {target_name!r}")
            setattr(queue, attribute, target)

    def _sendable(self, entity: Entity) -> bool:
        return entity.name.lower() in self.sendable

    def _restore_managed(
        self, queues: dict[str, QueueSettings], topics: dict[str, TopicSpec]
    ) -> None:
        defined = definitions(queues, topics)
        now = now_ms(self.clock)
        for record in reconcile(self.store, defined, now):
            if self._replay(record):
                self.managed[record.name.lower()] = record
            else:
                self.store.forget_managed_entity(record.name)
        self.managed.update(unrecorded(self.store, defined, self.managed, now))
        for queue in self.queues.values():  # targets deleted through the API
            for _, attribute in _FORWARDS:
                target = getattr(queue.settings, attribute)
                if target is not None and target.lower() not in self.sendable:
                    log.warning(
                        "%s: %s %r no longer exists; not forwarding", queue.name, attribute, target
                    )
                    cleared: dict[str, Any] = {attribute: None}
                    queue.settings = dataclasses.replace(queue.settings, **cleared)

    def _replay(self, record: ManagedEntity) -> bool:
        """Applies one stored record at start; False when it no longer applies."""
        key = record.name.lower()
        if record.deleted:
            if key in self.entities:
                self.remove(key)
            return True
        if record.settings is None:
            return key in self.entities
        settings = load_settings(record.kind, record.settings)
        if key in self.entities:
            self._apply_settings(key, settings)
        elif record.kind == SUBSCRIPTION:
            topic_name, _, sub_name = record.name.partition(SUBSCRIPTIONS)
            topic = self.topics.get(topic_name.lower())
            if topic is None:
                return False
            saved = self.store.rule_set(self.store.entity_id(record.name))
            rules = load_rules(saved[1]) if saved else [DEFAULT_RULE]
            assert isinstance(settings, QueueSettings)
            self._new_subscription(topic, sub_name, settings, rules)
        elif isinstance(settings, TopicSettings):
            self._new_topic(record.name, settings)
        else:
            self._new_queue(record.name, settings)
        return True

    def _new_queue(self, name: str, settings: QueueSettings) -> Queue:
        queue = self._add_queue(name, settings)
        self.sendable.add(name.lower())
        return queue

    def _new_topic(self, name: str, settings: TopicSettings) -> Topic:
        topic = Topic(name, self.store, settings, clock=self.clock)
        self.entities[name.lower()] = self.topics[name.lower()] = topic
        self.by_entity_id[topic.entity] = topic
        self.sendable.add(name.lower())
        return topic

    def _new_subscription(
        self, topic: Topic, name: str, settings: QueueSettings, rules: list[RuleSpec]
    ) -> Subscription:
        queue = self._add_queue(topic.subscription_path(name), settings)
        subscription = Subscription(queue, RuleSet(rules))
        topic.subscriptions[name.lower()] = subscription
        self.subscriptions[queue.name.lower()] = subscription
        self._configured_rules.setdefault(queue.name.lower(), "[]")
        return subscription

    def _apply_settings(self, key: str, settings: QueueSettings | TopicSettings) -> None:
        entity = self.entities[key]
        if isinstance(entity, Topic):
            assert isinstance(settings, TopicSettings)
            entity.settings = settings
            return
        assert isinstance(settings, QueueSettings)
        entity.settings = settings
        if entity.dead_letter is not None:
            entity.dead_letter.settings = dataclasses.replace(
                entity.dead_letter.settings,
                lock_duration=settings.lock_duration,
                max_message_size=settings.max_message_size,
            )

    # ------------------------------------------------------------------ runtime changes

    def entity_record(self, path: str) -> ManagedEntity | None:
        """The record of a live entity: when it was made and changed, and how."""
        record = self.managed.get(path.lower())
        return None if record is None or record.deleted else record

    def create(
        self,
        kind: str,
        path: str,
        settings: QueueSettings | TopicSettings,
        description: str,
        rules: list[RuleSpec] | None = None,
    ) -> Entity:
        """A new queue, topic or subscription and its record (the caller commits). The
        caller has checked the name is free and the settings (forward targets) valid."""
        now = now_ms(self.clock)
        if kind == TOPIC:
            assert isinstance(settings, TopicSettings)
            entity: Entity = self._new_topic(path, settings)
        elif kind == QUEUE:
            assert isinstance(settings, QueueSettings)
            entity = self._new_queue(path, settings)
        else:
            assert isinstance(settings, QueueSettings)
            topic_name, _, sub_name = path.partition(SUBSCRIPTIONS)
            subscription = self._new_subscription(
                self.topics[topic_name.lower()], sub_name, settings, rules or [DEFAULT_RULE]
            )
            entity = subscription.queue
            self._configured_rules[path.lower()] = "[]"
            self.save_rules(subscription)
        if isinstance(entity, Queue):
            self._resolve_forwarding(entity)
        previous = self.managed.get(path.lower())
        record = ManagedEntity(
            entity.name,
            kind,
            previous.configured if previous else None,
            dump_settings(settings),
            description,
            False,
            now,
            now,
        )
        self.store.save_managed_entity(record)
        self.managed[path.lower()] = record
        return entity

    def update(
        self, path: str, settings: QueueSettings | TopicSettings, description: str
    ) -> Entity:
        """New settings for a live entity and its record (the caller commits)."""
        key = path.lower()
        self._apply_settings(key, settings)
        entity = self.entities[key]
        if isinstance(entity, Queue):
            self._resolve_forwarding(entity)
        record = dataclasses.replace(
            self.managed[key],
            settings=dump_settings(settings),
            description=description,
            updated_ms=now_ms(self.clock),
        )
        self.store.save_managed_entity(record)
        self.managed[key] = record
        touch(entity, now_ms(self.clock))
        return entity

    def remove(self, key: str) -> list[Entity]:
        """Takes an entity (a topic with its subscriptions, a queue with its dead-letter
        queue) out of every index; returns what was removed (see ``forget``)."""
        entity = self.entities[key]
        removed: list[Entity] = [entity]
        if isinstance(entity, Topic):
            for sub in list(entity.subscriptions.values()):
                removed += self.remove(sub.queue.name.lower())
            self.topics.pop(key, None)
        else:
            if entity.dead_letter is not None:
                removed.append(entity.dead_letter)
            subscription = self.subscriptions.pop(key, None)
            if subscription is not None:
                topic_name, _, sub_name = entity.name.partition(SUBSCRIPTIONS)
                self.topics[topic_name.lower()].subscriptions.pop(sub_name.lower(), None)
                self._configured_rules.pop(key, None)
        for item in removed:
            self.entities.pop(item.name.lower(), None)
            self.queues.pop(item.name.lower(), None)
            self.sendable.discard(item.name.lower())
            self.by_entity_id.pop(item.entity, None)
        return removed

    def forget(self, removed: list[Entity]) -> None:
        """After ``remove``: the entities' messages and records go (the caller commits), and
        forwarding into them stops. A Config.json entity's record says it was deleted, so it
        stays deleted while the file's definition of it is unchanged."""
        for item in removed:
            self.store.purge(item.entity)
        for queue in self.queues.values():
            for attribute, setting in _FORWARDS:
                if getattr(queue, attribute) in removed:
                    setattr(queue, attribute, None)
                    cleared: dict[str, Any] = {setting: None}
                    queue.settings = dataclasses.replace(queue.settings, **cleared)
        for item in removed:
            name = item.name.lower()
            record = self.managed.pop(name, None)
            if record is None:
                continue
            if record.configured is not None:  # stays deleted while Config.json is unchanged
                record = dataclasses.replace(record, deleted=True, updated_ms=now_ms(self.clock))
                self.store.save_managed_entity(record)
                self.managed[name] = record
            else:
                self.store.forget_managed_entity(record.name)

    def delete_idle(self, now: int, delete: Callable[[str], None]) -> list[str]:
        """Calls ``delete`` for each entity unused for its ``AutoDeleteOnIdle``; returns
        their names. Holding scheduled messages, an entity is in use, as in Service Bus."""
        deleted = []
        for key, entity in list(self.entities.items()):
            idle = getattr(entity.settings, "auto_delete_on_idle", None)
            if idle is None or key not in self.entities:
                continue  # no limit, or deleted with its topic meanwhile
            if now - last_use(entity) < idle.total_seconds() * 1000:
                continue
            if self.store.has_scheduled(entity.entity):  # a query: only for the idle ones
                continue
            log.info("%s: deleted after %s idle (AutoDeleteOnIdle)", entity.name, idle)
            delete(entity.name)
            deleted.append(entity.name)
        return deleted
