"""A Service Bus topic: duplicate detection and scheduling at the topic, a copy per subscription.

A topic keeps no messages of its own except scheduled ones (under its own entity id, so
schedule and cancel work by the topic's sequence numbers, as in Service Bus); a sent
message is routed at once, in the sender's transaction, into every subscription whose
rules match it. Subscriptions are ordinary ``Queue`` objects (locks, TTL, max delivery,
defer, sessions, dead-lettering, forwarding) named ``<topic>/Subscriptions/<name>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from ..amqp.message import Header
from ..symbols import SCHEDULED_ENQUEUE_TIME
from . import wire
from .clock import SYSTEM, Clock, now_ms
from .queue import DEFAULT_MAX_SIZE_MB, Queue, effective_ttl, is_duplicate
from .rules import FilterEvaluationError, RuleSet, message_facts
from .store import STATE_SCHEDULED, MessageStore, StoredMessage

SUBSCRIPTIONS = "/Subscriptions/"
FILTER_EVALUATION_FAILED = "FilterEvaluationException"
"""Dead-letter reason of a message a subscription rule failed on (Service Bus keeps such
messages in the subscription's dead-letter queue: DeadLetteringOnFilterEvaluationExceptions)."""


@dataclass(slots=True)
class TopicSettings:
    default_ttl: timedelta | None = None
    requires_duplicate_detection: bool = False
    duplicate_detection_window: timedelta = timedelta(minutes=10)
    max_message_size: int = 256 * 1024
    status: str = "Active"
    max_size_mb: int = DEFAULT_MAX_SIZE_MB
    """The quota of the topic with its subscriptions (theirs count here)."""
    auto_delete_on_idle: timedelta | None = None


@dataclass(slots=True, eq=False)
class Subscription:
    queue: Queue
    rules: RuleSet


class Topic:
    def __init__(
        self, name: str, store: MessageStore, settings: TopicSettings, clock: Clock = SYSTEM
    ) -> None:
        self.name = name
        self.clock = clock
        self.store = store
        self.settings = settings
        self.entity = store.entity_id(name)
        self.subscriptions: dict[str, Subscription] = {}
        self.accessed_ms = now_ms(clock)
        """Last send, change or use of a subscription (``AccessedAt``; ``AutoDeleteOnIdle``)."""

    def __repr__(self) -> str:
        return f"Topic({self.name!r}, subscriptions={list(self.subscriptions)})"

    def subscription_path(self, name: str) -> str:
        return f"{self.name}{SUBSCRIPTIONS}{name}"

    # ------------------------------------------------------------------ send

    def is_duplicate(self, message_id: str | None, now: int) -> bool:
        return is_duplicate(self.store, self.entity, self.settings, message_id, now)

    def enqueue(self, message: wire.IncomingMessage, now: int, hops: int = 0) -> int | None:
        """Routes a message to the subscriptions (or holds it while scheduled); returns the
        topic's sequence number for a scheduled message."""
        if self.is_duplicate(message.message_id, now):
            return None
        scheduled = message.scheduled_ms
        if scheduled is not None and scheduled > now:
            seq = self.store.next_sequence(self.entity)
            ttl = self._ttl(message)
            self.store.insert(
                self.entity,
                StoredMessage(
                    seq=seq,
                    state=STATE_SCHEDULED,
                    delivery_count=0,
                    enqueued_ms=now,
                    expires_ms=scheduled + ttl if ttl else None,
                    scheduled_ms=scheduled,
                    message_id=message.message_id,
                    session_id=message.session_id,
                    dead_letter_source=None,
                    annotations=wire.encode_annotations(message.annotations) or None,
                    bare=message.bare,
                ),
            )
            return seq
        self._fan_out(message, now, hops)
        return None

    def _ttl(self, message: wire.IncomingMessage) -> int | None:
        return effective_ttl(message.ttl_ms, self.settings.default_ttl)

    def _fan_out(self, message: wire.IncomingMessage, now: int, hops: int) -> None:
        ttl = self._ttl(message)
        if ttl != message.ttl_ms:
            header = message.header or Header()
            message.header = Header(
                durable=header.durable,
                priority=header.priority,
                ttl=ttl,
                first_acquirer=header.first_acquirer,
                delivery_count=header.delivery_count,
            )
        facts = message_facts(message, now)
        for sub in self.subscriptions.values():
            try:
                copies = sub.rules.copies(message, facts)
            except FilterEvaluationError as exc:
                sub.queue.dead_letter_new(message, now, FILTER_EVALUATION_FAILED, str(exc))
                continue
            for copy in copies:
                sub.queue.enqueue(copy, now, hops)

    # ------------------------------------------------------------------ scheduled

    def activate_scheduled(self, seq: int) -> None:
        """The scheduled time came: the message goes to the subscriptions now."""
        row = self.store.load(self.entity, [seq]).get(seq)
        if row is None:
            return
        self.store.delete(self.entity, seq, row.size)
        message = wire.parse_message((row.annotations or b"") + row.bare)
        now = now_ms(self.clock)
        if row.expires_ms is not None:
            if row.expires_ms <= now:
                return  # expired while scheduled
            # the TTL in force, counted from now on in each subscription (as on a send)
            message.header = Header(durable=True, ttl=row.expires_ms - (row.scheduled_ms or now))
        message.annotations.pop(SCHEDULED_ENQUEUE_TIME, None)
        self._fan_out(message, now, 0)

    def cancel_scheduled(self, seqs: list[int]) -> None:
        self.store.delete_scheduled(self.entity, seqs)
