"""What a connection and an entity may take: link credit and counts, message sizes, the
entity's ``MaxSizeInMegabytes``; and the one way messages come in, checked against them."""

from __future__ import annotations

from typing import Final

from . import wire
from .clock import Clock, now_ms
from .errors import QuotaExceededError, SessionRequiredError
from .queue import Queue
from .registry import Entity, queues_of, touch
from .store import MessageStore
from .topic import Topic

LINK_CREDIT: Final = 10_000
"""Credit for a sending peer; the SDK ignores credit and counts from 10,000 itself."""
RECEIVE_LIMIT: Final = 4 * 1024 * 1024
"""Deliveries up to this size are read and refused with a rejected disposition when over the
entity's limit (what the SDK expects: it does not check single messages); larger ones cost the
peer its link."""
MAX_LINKS_PER_CONNECTION = 1000


class Intake:
    """The one way messages enter the broker (sends, scheduling, transactions): all are
    checked first, so a batch is taken whole or refused whole."""

    def __init__(self, store: MessageStore, namespace: str, clock: Clock) -> None:
        self.store = store
        self.namespace = namespace
        """The namespace's name, as quota errors spell it."""
        self.clock = clock

    def send(self, entity: Entity, messages: list[wire.IncomingMessage]) -> list[int]:
        """Checks and enqueues ``messages``; returns the sequence numbers assigned at
        ``entity`` (scheduled messages of a topic, queue messages)."""
        now = now_ms(self.clock)
        for message in messages:
            wire.ensure_message_id(message)  # Service Bus: every message has one
        self.admit(entity, messages, now)
        seqs = []
        for message in messages:
            seq = entity.enqueue(message, now)
            if seq is not None:
                seqs.append(seq)
        return seqs

    def admit(self, entity: Entity, messages: list[wire.IncomingMessage], now: int) -> None:
        """Raises ``SendRefusedError`` when the entity would refuse the messages (it takes
        all of them or none)."""
        touch(entity, now)
        self._check_quota(entity)
        if isinstance(entity, Topic):  # a session subscription dead-letters a sessionless copy
            return
        for message in messages:
            if entity.sessions_enabled and message.session_id is None:
                raise SessionRequiredError(
                    "The SessionId was not set on a message, and it cannot be sent to the "
                    f"entity '{entity.name}'. Entities that have session support enabled can "
                    "only receive messages that have the SessionId set to a valid value."
                )

    def _check_quota(self, entity: Entity) -> None:
        limit = entity.settings.max_size_mb * 1024 * 1024
        size = self.entity_size(entity)
        if size >= limit:
            kind = "Topic" if isinstance(entity, Topic) else "Queue"
            raise QuotaExceededError(
                f"The maximum entity size has been reached or exceeded for {kind}: "
                f"'{self.namespace.upper()}:{kind.upper()}:{entity.name.upper()}'. Size of "
                f"entity in bytes:{size}, Max entity size in bytes: {limit}. For more "
                "information please see https://aka.ms/ServiceBusExceptions ."
            )

    def entity_size(self, entity: Entity) -> int:
        """Bytes counted against an entity's quota (``MaxSizeInMegabytes``): a queue's with
        its dead-letter queue's, a topic's with all its subscriptions'. Auto-forwarding
        into an entity is not held back by it."""
        if isinstance(entity, Queue):  # the common case, without building a list
            dead = entity.dead_letter
            return self.store.size(entity.entity) + (
                self.store.size(dead.entity) if dead is not None else 0
            )
        size = self.store.size(entity.entity)
        return size + sum(self.store.size(queue.entity) for queue in queues_of(entity))
