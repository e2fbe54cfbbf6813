"""A Service Bus queue (or dead-letter sub-queue): ready set, peek-locks, settlement outcomes.

In memory a queue holds only the sequence numbers ready for delivery (sorted, per session,
so an abandoned message goes back in its place), the message locks it handed out and, on a
session entity, its session locks; message rows and session state live in the
``MessageStore``. Every state change is written through the store in the current
transaction; the broker commits before anyone hears of the change.

Auto-forwarding happens at enqueue, in the same transaction: a queue (or subscription)
with ``forward_to`` never keeps a message, it hands it on (Service Bus: "removes messages
placed in the source and puts them in the destination"), at most ``MAX_TRANSFER_HOPS`` times.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, Protocol

from ..symbols import DEAD_LETTER_SOURCE
from . import wire
from .clock import SYSTEM, Clock, now_ms
from .guids import GUIDS
from .ready import ReadySet
from .store import STATE_ACTIVE, STATE_DEFERRED, STATE_SCHEDULED, MessageStore, StoredMessage

DEAD_LETTER_SUFFIX = "/$DeadLetterQueue"
MAX_DELIVERY_COUNT_EXCEEDED = "MaxDeliveryCountExceeded"
TTL_EXPIRED = "TTLExpiredException"
SESSION_ID_IS_NULL = "Session ID is null"
MAX_TRANSFER_HOPS_EXCEEDED = "MaxTransferHopCountExceeded"
MAX_TRANSFER_HOPS: Final = 4
"""Service Bus forwards a message through at most four entities, then dead-letters it."""
DEFAULT_MAX_SIZE_MB = 1024


def effective_ttl(ttl_ms: int | None, default: timedelta | None) -> int | None:
    """A message's TTL cannot exceed its entity's default: Service Bus lowers it to that."""
    if default is None:
        return ttl_ms
    default_ms = int(default.total_seconds() * 1000)
    return default_ms if ttl_ms is None else min(ttl_ms, default_ms)


class DuplicateDetection(Protocol):
    requires_duplicate_detection: bool
    duplicate_detection_window: timedelta


def is_duplicate(
    store: MessageStore,
    entity: int,
    settings: DuplicateDetection,
    message_id: str | None,
    now: int,
) -> bool:
    """Seen within the entity's window (and remembered now if not): Service Bus drops it."""
    if not settings.requires_duplicate_detection or message_id is None:
        return False
    window = int(settings.duplicate_detection_window.total_seconds() * 1000)
    if store.seen_message_id(entity, message_id, now - window):
        return True
    store.remember_message_id(entity, message_id, now)
    return False


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
    forward_to: str | None = None
    forward_dead_lettered_messages_to: str | None = None
    status: str = "Active"
    """Active, Disabled, SendDisabled or ReceiveDisabled (``server.disabled``)."""
    max_size_mb: int = DEFAULT_MAX_SIZE_MB
    """The entity's quota: messages (dead-lettered ones too) and session state."""
    auto_delete_on_idle: timedelta | None = None
    """Deleted after this long without use; None: never."""


class Destination(Protocol):
    """Where a message can be sent or forwarded: a queue or a topic."""

    name: str

    def enqueue(self, message: wire.IncomingMessage, now: int, hops: int = 0) -> int | None: ...


@dataclass(slots=True, eq=False)
class SessionLock:
    """The exclusive lock one receiver holds on one session."""

    session_id: str
    owner: Any
    until_ms: int


@dataclass(slots=True, init=False)
class Lock:
    """A peek-lock on one message, held by one delivery (or a receive-by-sequence-number);
    ``__init__`` written out for mypyc (see ``StoredMessage``)."""

    token: uuid.UUID
    seq: int
    queue: Queue
    until_ms: int
    delivery_count: int
    owner: Any = None
    """What holds the lock (the broker's consumer), so a dropped connection releases it."""
    deferred: bool = False
    """Locked through receive-by-sequence-number: abandoning keeps the message deferred."""
    session: str | None = None
    """A session message: its lock lasts as long as the session's lock."""
    size: int | None = None
    """The locked message's ``StoredMessage.size``, so completing it needs no lookup."""

    def __init__(
        self,
        token: uuid.UUID,
        seq: int,
        queue: Queue,
        until_ms: int,
        delivery_count: int,
        owner: Any = None,
        deferred: bool = False,
        session: str | None = None,
        size: int | None = None,
    ) -> None:
        self.token = token
        self.seq = seq
        self.queue = queue
        self.until_ms = until_ms
        self.delivery_count = delivery_count
        self.owner = owner
        self.deferred = deferred
        self.session = session
        self.size = size


class LockLostError(Exception):
    """The lock expired or was released; the message may already be with someone else."""


class SessionLockLostError(LockLostError):
    """The session lock expired or was released (``com.microsoft:session-lock-lost``)."""


class SessionCannotBeLockedError(Exception):
    """Another receiver holds the session (``com.microsoft:session-cannot-be-locked``)."""


class Queue:
    def __init__(
        self,
        name: str,
        store: MessageStore,
        settings: QueueSettings,
        dead_letter: Queue | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        self.name = name
        self.clock = clock
        self.store = store
        self.settings = settings
        self.dead_letter = dead_letter
        self.entity = store.entity_id(name)
        self.sessions_enabled = settings.requires_session
        self.ready = ReadySet(
            (seq, session if self.sessions_enabled else None)
            for seq, session in store.ready_sequences(self.entity)
        )
        self.locks: dict[uuid.UUID, Lock] = {}
        self._locked_seqs: dict[int, Lock] = {}
        self.orphaned_locks: dict[uuid.UUID, Lock] = {}
        """Message locks whose receiving link went away (``release_owner``): no settlement
        finds them, and their messages stay locked until they expire."""
        self.session_locks: dict[str, SessionLock] = {}
        self.forward_to: Destination | None = None
        self.forward_dead_letters_to: Destination | None = None
        """Resolved by the broker from the settings once every entity exists."""
        self.pending_ready: list[tuple[int, str | None]] = []
        """Sequence numbers written in the open transaction, made ready when it commits."""
        self.on_ready: Callable[[Queue], None] | None = None
        """Called (after the commit that made messages deliverable) so consumers can pull."""
        self.accessed_ms = now_ms(clock)
        """Last send, receive, peek or change (``AccessedAt``; ``AutoDeleteOnIdle``)."""

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, ready={len(self.ready)}, locked={len(self.locks)})"

    # ------------------------------------------------------------------ enqueue

    def is_duplicate(self, message_id: str | None, now: int) -> bool:
        return is_duplicate(self.store, self.entity, self.settings, message_id, now)

    def enqueue(self, message: wire.IncomingMessage, now: int, hops: int = 0) -> int | None:
        """Stores (or forwards) a message; returns its sequence number here, or None when it
        was a duplicate or went on to another entity."""
        if self.is_duplicate(message.message_id, now):
            return None
        if self.forward_to is not None:
            if hops < MAX_TRANSFER_HOPS:
                self.forward_to.enqueue(message, now, hops + 1)
                return None
            return self.dead_letter_new(
                message,
                now,
                MAX_TRANSFER_HOPS_EXCEEDED,
                (
                    f"The maximum number of hops ({MAX_TRANSFER_HOPS}) allowed when forwarding "
                    "between entities was exceeded."
                ),
            )
        if self.sessions_enabled and message.session_id is None:
            return self.dead_letter_new(
                message,
                now,
                SESSION_ID_IS_NULL,
                "Session enabled entity doesn't allow a message whose session identifier is null.",
            )
        ttl = effective_ttl(message.ttl_ms, self.settings.default_ttl)
        scheduled = message.scheduled_ms
        # a scheduled message lives from when it becomes active, not from the send
        if scheduled is not None and scheduled > now:
            state, start = STATE_SCHEDULED, scheduled
        else:
            state, start = STATE_ACTIVE, now
        expires = start + ttl if ttl else None
        message = wire.with_expiry(message, start, expires)
        seq = self.store.next_sequence(self.entity)
        self.store.insert(
            self.entity,
            StoredMessage(
                seq=seq,
                state=state,
                delivery_count=0,
                enqueued_ms=now,
                expires_ms=expires,
                scheduled_ms=scheduled if state == STATE_SCHEDULED else None,
                message_id=message.message_id,
                session_id=message.session_id,
                dead_letter_source=None,
                annotations=wire.encode_annotations(message.annotations) or None,
                bare=message.bare,
            ),
        )
        if state == STATE_ACTIVE:
            self.pending_ready.append((seq, self._session_key(message.session_id)))
        return seq

    def _session_key(self, session_id: str | None) -> str | None:
        return session_id if self.sessions_enabled else None

    def dead_letter_new(
        self, message: wire.IncomingMessage, now: int, reason: str, description: str
    ) -> int | None:
        """A message that cannot enter this entity goes to its dead-letter queue instead."""
        bare = _with_dead_letter_reason(message.bare, reason, description)
        target = self.forward_dead_letters_to
        if target is not None:
            annotations = wire.encode_annotations(message.annotations)
            target.enqueue(self._forwarded_dead_letter(annotations + bare), now, 1)
            return None
        dlq = self.dead_letter
        if dlq is None:
            return None
        seq = dlq.store.next_sequence(dlq.entity)
        dlq.store.insert(
            dlq.entity,
            StoredMessage(
                seq=seq,
                state=STATE_ACTIVE,
                delivery_count=0,
                enqueued_ms=now,
                expires_ms=None,
                scheduled_ms=None,
                message_id=message.message_id,
                session_id=message.session_id,
                dead_letter_source=self.name,
                annotations=wire.encode_annotations(message.annotations) or None,
                bare=bare,
            ),
        )
        dlq.pending_ready.append((seq, None))
        return None

    def publish(self) -> None:
        """After the commit: what the transaction made deliverable may now be delivered."""
        if self.pending_ready:
            self.ready.add_many(self.pending_ready)
            self.pending_ready = []
        if self.ready and self.on_ready is not None:
            self.on_ready(self)

    def rollback(self) -> None:
        self.pending_ready = []

    # ------------------------------------------------------------------ deliver

    def take(self, count: int, now: int, session: str | None = None) -> list[StoredMessage]:
        """Up to ``count`` ready messages (of one session, on a session entity) in sequence
        order; expired ones are retired on the way."""
        taken: list[StoredMessage] = []
        while len(taken) < count:
            seqs = self.ready.pop_first(count - len(taken), session)
            if not seqs:
                break
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
        self.ready.add_many((row.seq, self._session_key(row.session_id)) for row in rows)

    def restore(self, rows: list[StoredMessage]) -> None:
        """Re-inserts deleted rows (a receive-and-delete whose link went away before delivery)."""
        for row in rows:
            self.store.insert(self.entity, row)
            self.pending_ready.append((row.seq, self._session_key(row.session_id)))

    def lock(
        self, row: StoredMessage, now: int, owner: Any = None, session: SessionLock | None = None
    ) -> Lock:
        if session is not None:
            until = session.until_ms
        else:
            until = now + int(self.settings.lock_duration.total_seconds() * 1000)
        token = GUIDS.uuid()
        lock = Lock(token, row.seq, self, until, row.delivery_count, owner, size=row.size)
        lock.deferred = row.state == STATE_DEFERRED
        lock.session = session.session_id if session is not None else None
        self.locks[lock.token] = lock
        self._locked_seqs[row.seq] = lock
        return lock

    def payload(self, row: StoredMessage, lock: Lock | None) -> bytes:
        # the TTL counts from the enqueued time, or from the scheduled time while it waits
        start = row.scheduled_ms if row.state == STATE_SCHEDULED else None
        ttl = row.expires_ms - (start or row.enqueued_ms) if row.expires_ms is not None else None
        return wire.delivery_payload(
            bare=row.bare,
            sender_annotations=row.annotations,
            sequence_number=row.seq,
            enqueued_ms=row.enqueued_ms,
            delivery_count=row.delivery_count,
            ttl_ms=ttl,
            locked_until_ms=lock.until_ms if lock else None,
            lock_token=lock.token if lock else None,
            state=row.state,
            dead_letter_source=row.dead_letter_source,
        )

    # ------------------------------------------------------------------ settle

    def _take_lock(self, token: uuid.UUID, now: int) -> Lock:
        lock = self.locks.get(token)
        if lock is None or lock.until_ms <= now:
            if lock is not None and lock.session is not None:
                raise SessionLockLostError(
                    f"the lock on session {lock.session!r} of {self.name} has expired"
                )
            raise LockLostError(f"the lock {token} on {self.name} has expired or was released")
        del self.locks[token]
        self._locked_seqs.pop(lock.seq, None)
        return lock

    def is_locked(self, seq: int) -> bool:
        return seq in self._locked_seqs

    def complete(self, token: uuid.UUID, now: int) -> None:
        lock = self._take_lock(token, now)
        self.store.delete(self.entity, lock.seq, lock.size)

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
        if not self.has_dead_letter:  # already a dead-letter queue: keep it, as an abandon would
            self._return(lock, count=False)
            return
        self._move_to_dead_letter(lock.seq, reason, description, count=1)

    def renew(self, token: uuid.UUID, now: int) -> int:
        """A lock's new end. A lock whose link went away renews too, though nothing can
        settle it any more: Service Bus renews a lock through any receiver ("for an
        unlimited amount of time", azure-sdk-for-net #30310) and keeps only settlement to
        the link that received the message."""
        lock = self.locks.get(token) or self.orphaned_locks.get(token)
        if lock is None or lock.until_ms <= now:
            raise LockLostError(f"the lock {token} on {self.name} has expired or was released")
        if lock.session is not None:
            return lock.until_ms  # held by the session lock: renew-session-lock extends it
        lock.until_ms = now + int(self.settings.lock_duration.total_seconds() * 1000)
        return lock.until_ms

    def release_owner(self, owner: Any) -> None:
        """A consumer went away. A session receiver's session lock ends, and its messages'
        locks with it, without counting a delivery attempt (the sessions guide: closing a
        receiver does not count). A plain receiver's message locks are lost to it but hold
        the message until they expire, and then count one, as on Service Bus: a message
        received and neither settled nor released before its link closed (or its connection
        dropped) cannot be settled any more ("the lock has expired or was released") and
        comes again after LockDuration with its delivery count raised. (The SDKs release
        what they prefetched and never handed out before they close a receiver; so does
        ``servicebus.client``.)"""
        for lock in [lk for lk in self.locks.values() if lk.owner is owner]:
            del self.locks[lock.token]
            if lock.session is None:
                self.orphaned_locks[lock.token] = lock
                continue
            self._locked_seqs.pop(lock.seq, None)
            if not lock.deferred:
                self.pending_ready.append((lock.seq, lock.session))
        for session in [sl for sl in self.session_locks.values() if sl.owner is owner]:
            del self.session_locks[session.session_id]

    def expire_locks(self, now: int) -> list[SessionLock]:
        """Locks past their time: the delivery counts as attempted (Service Bus semantics).
        Returns the session locks that expired, whose receivers have lost their session."""
        lost = [sl for sl in self.session_locks.values() if sl.until_ms <= now]
        for session in lost:
            del self.session_locks[session.session_id]
        for locks in (self.locks, self.orphaned_locks):
            for lock in [lk for lk in locks.values() if lk.until_ms <= now]:
                del locks[lock.token]
                self._locked_seqs.pop(lock.seq, None)
                self._return(lock, count=True)
        return lost

    def _return(self, lock: Lock, *, count: bool) -> None:
        delivery_count = lock.delivery_count + (1 if count else 0)
        if count and delivery_count >= self.settings.max_delivery_count and self.has_dead_letter:
            self._move_to_dead_letter(
                lock.seq,
                MAX_DELIVERY_COUNT_EXCEEDED,
                f"Message could not be consumed after {self.settings.max_delivery_count} "
                "delivery attempts.",
                count=delivery_count - lock.delivery_count,
            )
            return
        if count:
            self.store.set_delivery_count(self.entity, lock.seq, delivery_count)
        if not lock.deferred:
            self.pending_ready.append((lock.seq, lock.session))

    @property
    def has_dead_letter(self) -> bool:
        return self.dead_letter is not None or self.forward_dead_letters_to is not None

    # ------------------------------------------------------------------ sessions

    def lock_session(self, session_id: str | None, owner: Any, now: int) -> SessionLock | None:
        """Locks a named session (messages or not), or the next one with messages that
        nobody holds (None when there is none)."""
        if session_id is None:
            free = [s for s in self.ready.sessions() if not self._held(s, now)]
            if not free:
                return None
            session_id = free[0]
        elif self._held(session_id, now):
            raise SessionCannotBeLockedError(
                f"The requested session '{session_id}' cannot be accepted. It may be locked "
                "by another receiver."
            )
        until = now + int(self.settings.lock_duration.total_seconds() * 1000)
        session = SessionLock(session_id, owner, until)
        self.session_locks[session_id] = session
        return session

    def _held(self, session_id: str, now: int) -> bool:
        held = self.session_locks.get(session_id)
        return held is not None and held.until_ms > now

    def renew_session(self, session_id: str, now: int) -> int:
        session = self.session_locks.get(session_id)
        if session is None or session.until_ms <= now:
            raise SessionLockLostError(
                f"the lock on session {session_id!r} of {self.name} has expired or was released"
            )
        session.until_ms = now + int(self.settings.lock_duration.total_seconds() * 1000)
        for lock in self.locks.values():
            if lock.session == session_id:
                lock.until_ms = session.until_ms
        return session.until_ms

    def delete_ready(self, count: int, before_ms: int, session: str | None) -> int:
        """Deletes up to ``count`` messages ready for delivery (not locked, deferred or
        scheduled) that were enqueued before ``before_ms``, lowest sequence number first: of
        one session, or of every session when ``session`` is None. Returns how many."""
        every_session = self.sessions_enabled and session is None
        candidates = self.ready.ascending(self._session_key(session), every_session=every_session)
        doomed: list[int] = []
        while len(doomed) < count:
            chunk = list(itertools.islice(candidates, 500))
            if not chunk:
                break
            rows = self.store.load(self.entity, chunk)
            for seq in chunk:
                row = rows.get(seq)
                if row is not None and row.enqueued_ms < before_ms and len(doomed) < count:
                    doomed.append(seq)
        for seq in doomed:
            self.ready.discard(seq)
            self.store.delete(self.entity, seq)
        return len(doomed)

    def check_session(self, session_id: str, now: int) -> None:
        """Session operations (state, peek, deferred receive) need the session locked."""
        if not self._held(session_id, now):
            raise SessionLockLostError(
                f"the session {session_id!r} of {self.name} is not locked by this receiver"
            )

    def _move_to_dead_letter(
        self, seq: int, reason: str | None, description: str | None, count: int = 0
    ) -> None:
        """Moves a message (one delete + one insert in the same transaction) to the DLQ, or
        to the entity dead letters are forwarded to."""
        row = self.store.load(self.entity, [seq]).get(seq)
        if row is None:
            return
        self.store.delete(self.entity, seq, row.size)
        bare = _with_dead_letter_reason(row.bare, reason, description)
        if self.forward_dead_letters_to is not None:
            message = self._forwarded_dead_letter((row.annotations or b"") + bare)
            self.forward_dead_letters_to.enqueue(message, now_ms(self.clock), 1)
            return
        dlq = self.dead_letter
        if dlq is None:
            return
        dlq_seq = dlq.store.next_sequence(dlq.entity)
        row.bare = bare
        row.seq = dlq_seq
        row.state = STATE_ACTIVE
        row.delivery_count += count
        row.expires_ms = None
        row.scheduled_ms = None
        row.dead_letter_source = self.name
        dlq.store.insert(dlq.entity, row)
        dlq.pending_ready.append((dlq_seq, None))

    def _forwarded_dead_letter(self, payload: bytes) -> wire.IncomingMessage:
        """A dead letter on its way to ``ForwardDeadLetteredMessagesTo``: it names where it
        was dead-lettered (``x-opt-deadletter-source``, the case every SDK documents; seed
        000 has it on messages read from a dead-letter queue too, as ours are)."""
        message = wire.parse_message(payload)
        message.annotations[DEAD_LETTER_SOURCE] = self.name
        return message

    def expire(self, seq: int) -> None:
        """Retires a message whose time to live passed (the sweep found it)."""
        row = self.store.load(self.entity, [seq]).get(seq)
        if row is not None:
            self.ready.discard(seq)
            self._expire(row)

    def _expire(self, row: StoredMessage) -> None:
        if self.settings.dead_letter_on_expiration and self.has_dead_letter:
            self._move_to_dead_letter(
                row.seq, TTL_EXPIRED, "The message expired and was dead lettered."
            )
        else:
            self.store.delete(self.entity, row.seq, row.size)

    # ------------------------------------------------------------------ by sequence number

    def deferred(self, seqs: list[int], session_id: str | None = None) -> list[StoredMessage]:
        rows = self.store.load(self.entity, seqs)
        return [
            rows[s]
            for s in seqs
            if s in rows
            and rows[s].state == STATE_DEFERRED
            and (session_id is None or rows[s].session_id == session_id)
        ]

    def cancel_scheduled(self, seqs: list[int]) -> None:
        self.store.delete_scheduled(self.entity, seqs)

    def activate_scheduled(self, seq: int) -> None:
        row = self.store.load(self.entity, [seq]).get(seq)
        if row is None:
            return
        self.store.activate_scheduled(self.entity, seq)
        self.pending_ready.append((seq, self._session_key(row.session_id)))


def _with_dead_letter_reason(bare: bytes, reason: str | None, description: str | None) -> bytes:
    """The bare message with DeadLetterReason/-ErrorDescription application properties."""
    updates = {}
    if reason is not None:
        updates["DeadLetterReason"] = reason
    if description is not None:
        updates["DeadLetterErrorDescription"] = description
    return wire.with_application_properties(bare, updates) if updates else bare
