"""A Service Bus queue (or dead-letter sub-queue): ready set, peek-locks, settlement outcomes.

In memory a queue holds only the sequence numbers ready for delivery (sorted, so an
abandoned message goes back in its place) and the locks it handed out; message rows live in
the ``MessageStore``. Every state change is written through the store in the current
transaction; the broker commits before anyone hears of the change.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sortedcontainers import SortedList

from ..amqp import codec
from ..amqp.message import ApplicationProperties, Properties
from . import wire
from .store import STATE_ACTIVE, STATE_DEFERRED, STATE_SCHEDULED, MessageStore, StoredMessage

DEAD_LETTER_SUFFIX = "/$DeadLetterQueue"
MAX_DELIVERY_COUNT_EXCEEDED = "MaxDeliveryCountExceeded"
TTL_EXPIRED = "TTLExpiredException"


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class QueueSettings:
    """The entity properties the queue logic needs (from Config.json)."""

    lock_duration: timedelta = timedelta(minutes=1)
    max_delivery_count: int = 10
    default_ttl: timedelta | None = None
    dead_letter_on_expiration: bool = False
    requires_duplicate_detection: bool = False
    duplicate_detection_window: timedelta = timedelta(minutes=10)
    requires_session: bool = False
    max_message_size: int = 256 * 1024


@dataclass(slots=True)
class Lock:
    """A peek-lock on one message, held by one delivery (or a receive-by-sequence-number)."""

    token: uuid.UUID
    seq: int
    queue: Queue
    until_ms: int
    delivery_count: int
    owner: Any = None
    """What holds the lock (the broker's consumer), so a dropped connection releases it."""
    deferred: bool = False
    """Locked through receive-by-sequence-number: abandoning keeps the message deferred."""
    on_lost: Callable[[], None] | None = field(default=None, repr=False)


class LockLostError(Exception):
    """The lock expired or was released; the message may already be with someone else."""


class Queue:
    def __init__(
        self,
        name: str,
        store: MessageStore,
        settings: QueueSettings,
        dead_letter: Queue | None = None,
    ) -> None:
        self.name = name
        self.store = store
        self.settings = settings
        self.dead_letter = dead_letter
        self.entity = store.entity_id(name)
        self.ready: SortedList = SortedList(store.ready_sequences(self.entity))
        self.locks: dict[uuid.UUID, Lock] = {}
        self._locked_seqs: dict[int, Lock] = {}
        self.pending_ready: list[int] = []
        """Sequence numbers written in the open transaction, made ready when it commits."""
        self.on_ready: Callable[[Queue], None] | None = None
        """Called (after the commit that made messages deliverable) so consumers can pull."""

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, ready={len(self.ready)}, locked={len(self.locks)})"

    # ------------------------------------------------------------------ enqueue

    def is_duplicate(self, message_id: str | None, now: int) -> bool:
        if not self.settings.requires_duplicate_detection or message_id is None:
            return False
        window = int(self.settings.duplicate_detection_window.total_seconds() * 1000)
        if self.store.seen_message_id(self.entity, message_id, now - window):
            return True
        self.store.remember_message_id(self.entity, message_id, now)
        return False

    def enqueue(self, message: wire.IncomingMessage, now: int) -> int | None:
        """Stores a sent message; returns its sequence number (None: a duplicate, dropped)."""
        if self.is_duplicate(message.message_id, now):
            return None
        ttl = message.ttl_ms
        if self.settings.default_ttl is not None:
            # A message's TTL cannot exceed the entity's default: Service Bus lowers it.
            default_ttl = int(self.settings.default_ttl.total_seconds() * 1000)
            ttl = default_ttl if ttl is None else min(ttl, default_ttl)
        scheduled = message.scheduled_ms
        state = STATE_SCHEDULED if scheduled is not None and scheduled > now else STATE_ACTIVE
        seq = self.store.next_sequence(self.entity)
        self.store.insert(
            self.entity,
            StoredMessage(
                seq=seq, state=state, delivery_count=0, enqueued_ms=now,
                # a scheduled message lives from when it becomes active, not from the send
                expires_ms=(scheduled if state == STATE_SCHEDULED else now) + ttl if ttl else None,
                scheduled_ms=scheduled if state == STATE_SCHEDULED else None,
                message_id=message.message_id, session_id=message.session_id,
                dead_letter_source=None,
                annotations=wire.encode_annotations(message.annotations) or None,
                bare=message.bare,
            ),
        )  # fmt: skip
        if state == STATE_ACTIVE:
            self.pending_ready.append(seq)
        return seq

    def publish(self) -> None:
        """After the commit: what the transaction made deliverable may now be delivered."""
        if self.pending_ready:
            self.ready.update(self.pending_ready)
            self.pending_ready = []
        if self.ready and self.on_ready is not None:
            self.on_ready(self)

    def rollback(self) -> None:
        self.pending_ready = []

    # ------------------------------------------------------------------ deliver

    def take(self, count: int, now: int) -> list[StoredMessage]:
        """Up to ``count`` ready messages in sequence order; expired ones are retired on the way."""
        taken: list[StoredMessage] = []
        while len(taken) < count and self.ready:
            seqs = [self.ready.pop(0) for _ in range(min(count - len(taken), len(self.ready)))]
            rows = self.store.load(self.entity, seqs)
            for seq in seqs:
                row = rows.get(seq)
                if row is None:
                    continue  # deleted meanwhile (e.g. expired by the sweep)
                if row.expires_ms is not None and row.expires_ms <= now:
                    self._expire(row)
                    continue
                taken.append(row)
        return taken

    def untake(self, rows: list[StoredMessage]) -> None:
        """Taken but not delivered: ready again, in their places."""
        self.ready.update(row.seq for row in rows)

    def restore(self, rows: list[StoredMessage]) -> None:
        """Re-inserts deleted rows (a receive-and-delete whose link went away before delivery)."""
        for row in rows:
            self.store.insert(self.entity, row)
            self.pending_ready.append(row.seq)

    def lock(self, row: StoredMessage, now: int, owner: Any = None) -> Lock:
        until = now + int(self.settings.lock_duration.total_seconds() * 1000)
        lock = Lock(uuid.uuid4(), row.seq, self, until, row.delivery_count, owner)
        lock.deferred = row.state == STATE_DEFERRED
        self.locks[lock.token] = lock
        self._locked_seqs[row.seq] = lock
        return lock

    def payload(self, row: StoredMessage, lock: Lock | None) -> bytes:
        ttl = row.expires_ms - row.enqueued_ms if row.expires_ms is not None else None
        return wire.delivery_payload(
            bare=row.bare, sender_annotations=row.annotations, sequence_number=row.seq,
            enqueued_ms=row.enqueued_ms, delivery_count=row.delivery_count, ttl_ms=ttl,
            locked_until_ms=lock.until_ms if lock else None,
            lock_token=lock.token if lock else None, state=row.state,
            dead_letter_source=row.dead_letter_source,
        )  # fmt: skip

    # ------------------------------------------------------------------ settle

    def _take_lock(self, token: uuid.UUID, now: int) -> Lock:
        lock = self.locks.get(token)
        if lock is None or lock.until_ms <= now:
            raise LockLostError(f"the lock {token} on {self.name} has expired or was released")
        del self.locks[token]
        self._locked_seqs.pop(lock.seq, None)
        return lock

    def complete(self, token: uuid.UUID, now: int) -> None:
        lock = self._take_lock(token, now)
        self.store.delete(self.entity, lock.seq)

    def abandon(self, token: uuid.UUID, now: int, *, count: bool = True) -> None:
        """Unlocks; the message is ready again once the transaction commits."""
        self._return(self._take_lock(token, now), count=count)

    def defer(self, token: uuid.UUID, now: int) -> None:
        lock = self._take_lock(token, now)
        if lock.deferred:
            return
        self.store.set_state(self.entity, lock.seq, STATE_DEFERRED)

    def dead_letter_locked(
        self, token: uuid.UUID, now: int, reason: str | None, description: str | None
    ) -> None:
        lock = self._take_lock(token, now)
        if self.dead_letter is None:  # already a dead-letter queue: keep it, as an abandon would
            self._return(lock, count=False)
            return
        self._move_to_dead_letter(lock.seq, reason, description, count=1)

    def renew(self, token: uuid.UUID, now: int) -> int:
        lock = self.locks.get(token)
        if lock is None or lock.until_ms <= now:
            raise LockLostError(f"the lock {token} on {self.name} has expired or was released")
        lock.until_ms = now + int(self.settings.lock_duration.total_seconds() * 1000)
        return lock.until_ms

    def release_owner(self, owner: Any) -> None:
        """A consumer went away: its locks end without counting a delivery attempt."""
        for lock in [lk for lk in self.locks.values() if lk.owner is owner]:
            del self.locks[lock.token]
            self._locked_seqs.pop(lock.seq, None)
            self.pending_ready.append(lock.seq)

    def expire_locks(self, now: int) -> None:
        """Locks past their time: the delivery counts as attempted (Service Bus semantics)."""
        for lock in [lk for lk in self.locks.values() if lk.until_ms <= now]:
            del self.locks[lock.token]
            self._locked_seqs.pop(lock.seq, None)
            if lock.on_lost is not None:
                lock.on_lost()
            self._return(lock, count=True)

    def _return(self, lock: Lock, *, count: bool) -> None:
        delivery_count = lock.delivery_count + (1 if count else 0)
        if count and delivery_count >= self.settings.max_delivery_count and self.dead_letter:
            self._move_to_dead_letter(
                lock.seq, MAX_DELIVERY_COUNT_EXCEEDED,
                f"Message could not be consumed after {self.settings.max_delivery_count} "
                "delivery attempts.", count=delivery_count - lock.delivery_count,
            )  # fmt: skip
            return
        if count:
            self.store.set_delivery_count(self.entity, lock.seq, delivery_count)
        if not lock.deferred:
            self.pending_ready.append(lock.seq)

    def _move_to_dead_letter(
        self, seq: int, reason: str | None, description: str | None, count: int = 0
    ) -> None:
        """Moves a message (one delete + one insert in the same transaction) to the DLQ."""
        dlq = self.dead_letter
        row = self.store.load(self.entity, [seq]).get(seq)
        if row is None:
            return
        self.store.delete(self.entity, seq)
        if dlq is None:
            return
        dlq_seq = dlq.store.next_sequence(dlq.entity)
        row.bare = _with_dead_letter_reason(row.bare, reason, description)
        row.seq = dlq_seq
        row.state = STATE_ACTIVE
        row.delivery_count += count
        row.expires_ms = None
        row.scheduled_ms = None
        row.dead_letter_source = self.name
        dlq.store.insert(dlq.entity, row)
        dlq.pending_ready.append(dlq_seq)

    def expire(self, seq: int) -> None:
        """Retires a message whose time to live passed (the sweep found it)."""
        row = self.store.load(self.entity, [seq]).get(seq)
        if row is not None:
            if seq in self.ready:
                self.ready.remove(seq)
            self._expire(row)

    def _expire(self, row: StoredMessage) -> None:
        if self.settings.dead_letter_on_expiration and self.dead_letter is not None:
            self._move_to_dead_letter(
                row.seq, TTL_EXPIRED, "The message expired and was dead lettered."
            )
        else:
            self.store.delete(self.entity, row.seq)

    # ------------------------------------------------------------------ by sequence number

    def deferred(self, seqs: list[int]) -> list[StoredMessage]:
        rows = self.store.load(self.entity, seqs)
        return [rows[s] for s in seqs if s in rows and rows[s].state == STATE_DEFERRED]

    def cancel_scheduled(self, seqs: list[int]) -> None:
        rows = self.store.load(self.entity, seqs)
        for seq in seqs:
            row = rows.get(seq)
            if row is not None and row.state == STATE_SCHEDULED:
                self.store.delete(self.entity, seq)

    def activate_scheduled(self, seq: int) -> None:
        self.store.set_state(self.entity, seq, STATE_ACTIVE)
        self.pending_ready.append(seq)


def _with_dead_letter_reason(bare: bytes, reason: str | None, description: str | None) -> bytes:
    """Re-encodes the bare message with DeadLetterReason/-ErrorDescription properties."""
    sections = codec.decode_all(bare)
    out = bytearray()
    props: dict[str, Any] = {}
    wrote = False
    for section in sections:
        if type(section) is ApplicationProperties:
            props = dict(section.value)
            continue
        if not wrote and type(section) is not Properties:
            _write_dead_letter_properties(out, props, reason, description)
            wrote = True
        codec.encode_into(out, section)
    if not wrote:
        _write_dead_letter_properties(out, props, reason, description)
    return bytes(out)


def _write_dead_letter_properties(
    out: bytearray, props: dict[str, Any], reason: str | None, description: str | None
) -> None:
    if reason is not None:
        props["DeadLetterReason"] = reason
    if description is not None:
        props["DeadLetterErrorDescription"] = description
    codec.encode_into(out, ApplicationProperties(props))
