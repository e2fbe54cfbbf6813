"""Delivery dispatch: hands ready messages to the links that receive from a queue.

A consumer's link is pumped when it gets credit, when its queue has new ready messages
(after the commit that made them so) and when its connection's socket drains; each pump
takes at most one batch, so a huge credit never pulls a whole queue into memory. Session
receivers get one session's messages; a next-available session receiver waits here for a
free session. Settlements from the consumer's link land on the queue's locks.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from ..amqp.errors import MessageSizeExceededError
from ..amqp.link import Delivery, Link, LinkState
from ..amqp.outcomes import ACCEPTED, Accepted, Modified, Rejected, Released
from ..amqp.performatives import SND_SETTLED
from ..symbols import (
    LOCKED_UNTIL_UTC,
    MESSAGE_LOCK_LOST,
    SESSION_CANNOT_BE_LOCKED,
    SESSION_FILTER,
    SESSION_LOCK_LOST,
    TIMEOUT,
)
from . import wire
from .clock import Clock, now_ms
from .commit import GroupCommit
from .errors import error
from .guids import guid_bytes_le
from .peer import Peer
from .queue import (
    Lock,
    LockLostError,
    Queue,
    SessionCannotBeLockedError,
    SessionLock,
    SessionLockLostError,
)
from .registry import Entity, touch
from .store import StoredMessage

PUMP_BATCH: Final = 100
"""Most deliveries one pump hands a consumer's link; the next batch follows once this one is
written, so a huge credit never pulls a whole queue into memory and a reader that stops
reading is held back (``driver.paused``) after one batch."""
PUMP_BYTES: Final = 1024 * 1024
"""...and at most about this many message bytes (at least one message), so a batch of
256 KiB messages does not hold 25 MB at once."""
DEFAULT_SESSION_WAIT_MS: Final = 60_000
"""How long a next-available session receiver waits when it names no timeout."""
NET_TICKS_AT_EPOCH: Final = 621_355_968_000_000_000


def net_ticks(ms: int) -> int:
    """A time as .NET ticks (100 ns since 0001-01-01), as Service Bus sends lock expiries."""
    return NET_TICKS_AT_EPOCH + ms * 10_000


@dataclass(slots=True, eq=False)
class Consumer:
    """Our sending link to a peer that receives from a queue."""

    link: Link
    queue: Queue
    peer: Peer
    receive_and_delete: bool
    locks: dict[Delivery, Lock] = field(default_factory=dict)
    """The lock each unsettled delivery holds."""
    in_flight: int = 0
    """Receive-and-delete messages taken and waiting for their delete to commit."""
    session: SessionLock | None = None
    """A session receiver's lock: it gets that session's messages only."""


@dataclass(slots=True, eq=False)
class SessionWaiter:
    """A next-available session receiver whose attach waits for a free session."""

    consumer: Consumer
    deadline: float


class Dispatcher:
    """Every consumer by queue, and the session receivers waiting for a session."""

    def __init__(self, clock: Clock, commits: GroupCommit) -> None:
        self.clock = clock
        self.commits = commits
        self._consumers: dict[Queue, list[Consumer]] = {}
        self._waiters: list[SessionWaiter] = []

    # ------------------------------------------------------------------ consumers

    def attach(self, peer: Peer, link: Link, queue: Queue) -> None:
        """Answers a receiver's attach to ``queue`` (a session receiver: once it has one)."""
        remote = link.remote
        assert remote is not None
        filters = getattr(link.remote_source, "filter", None) or {}
        wants_session = SESSION_FILTER in filters
        if wants_session != queue.sessions_enabled:
            link.refuse(
                error(
                    "amqp:not-allowed",
                    (
                        f"'{queue.name}' requires sessions: accept a session to receive from it"
                        if queue.sessions_enabled
                        else f"'{queue.name}' does not require sessions: use a plain receiver"
                    ),
                )
            )
            return
        consumer = Consumer(link, queue, peer, remote.snd_settle_mode == SND_SETTLED)
        peer.entity_links[link] = queue.name
        if not wants_session:
            link.accept(properties={LOCKED_UNTIL_UTC: NET_TICKS_AT_EPOCH})
            self._add(consumer)
            return
        requested = filters[SESSION_FILTER]
        try:
            session = queue.lock_session(
                None if requested is None else str(requested), consumer, now_ms(self.clock)
            )
        except SessionCannotBeLockedError as exc:
            peer.entity_links.pop(link, None)
            link.refuse(error(SESSION_CANNOT_BE_LOCKED, str(exc)))
            return
        if session is not None:
            self._start_session(consumer, session)
            return
        wait_ms = (remote.properties or {}).get(TIMEOUT, DEFAULT_SESSION_WAIT_MS)
        deadline = self.clock.monotonic() + max(0, int(wait_ms)) / 1000
        self._waiters.append(SessionWaiter(consumer, deadline))

    def _start_session(self, consumer: Consumer, session: SessionLock) -> None:
        """Answers a session receiver's attach: the session it got, and until when."""
        link = consumer.link
        source = link.remote_source
        filters = dict(getattr(source, "filter", None) or {})
        filters[SESSION_FILTER] = session.session_id
        consumer.session = session
        link.accept(
            source=dataclasses.replace(source, filter=filters),
            properties={LOCKED_UNTIL_UTC: net_ticks(session.until_ms)},
        )
        self._add(consumer)
        self.pump(consumer)

    def _add(self, consumer: Consumer) -> None:
        consumer.peer.consumers[consumer.link] = consumer
        self._consumers.setdefault(consumer.queue, []).append(consumer)

    def remove(self, peer: Peer, link: Link) -> None:
        """The link detached: its locks are released (a session's too)."""
        consumer = peer.consumers.pop(link, None)
        if consumer is None:
            return
        consumers = self._consumers.get(consumer.queue, [])
        if consumer in consumers:
            consumers.remove(consumer)
        consumer.queue.release_owner(consumer)
        self.commits.soon()

    def forget_peer(self, peer: Peer) -> None:
        """The connection closed: its session receivers stop waiting."""
        self._waiters = [w for w in self._waiters if w.consumer.peer is not peer]

    def forget_entities(self, removed: list[Entity]) -> None:
        """The entities were deleted (their links are detached already)."""
        self._waiters = [w for w in self._waiters if w.consumer.queue not in removed]
        for entity in removed:
            if isinstance(entity, Queue):
                self._consumers.pop(entity, None)

    def serve_session_waiters(self) -> None:
        """Next-available session receivers: a session for each that can get one now; a
        ``com.microsoft:timeout`` detach for those that waited long enough."""
        if not self._waiters:
            return
        now, clock = now_ms(self.clock), self.clock.monotonic()
        waiting: list[SessionWaiter] = []
        for waiter in self._waiters:
            consumer = waiter.consumer
            link = consumer.link
            if link.state is not LinkState.ATTACH_RECEIVED:
                continue  # the peer gave up (detached or closed) first
            session = consumer.queue.lock_session(None, consumer, now)
            if session is not None:
                self._start_session(consumer, session)
            elif clock >= waiter.deadline:
                consumer.peer.entity_links.pop(link, None)
                link.refuse(
                    error(
                        "com.microsoft:timeout",
                        f"no session of '{consumer.queue.name}' became available in time",
                    )
                )
            else:
                waiting.append(waiter)
                continue
            self.commits.wake(consumer.peer.driver)
            self.commits.soon()  # sends the answer (and wakes the driver)
        self._waiters = waiting

    # ------------------------------------------------------------------ deliveries out

    def deliver(self, queue: Queue) -> None:
        """The queue has ready messages (``Queue.on_ready``): its consumers take them."""
        for consumer in list(self._consumers.get(queue, [])):
            self.pump(consumer)
            if not queue.ready:
                break

    def pump(self, consumer: Consumer) -> None:
        """Sends the consumer what its credit asks for, one batch at most."""
        link = consumer.link
        want = link.link_credit - link.queued - consumer.in_flight
        if want <= 0 or not link.is_open or consumer.peer.driver.paused:
            return  # a slow reader holds back only its own deliveries
        queue = consumer.queue
        session = consumer.session
        if session is not None and queue.session_locks.get(session.session_id) is not session:
            return  # the session lock was lost: nothing more for this receiver
        now = now_ms(self.clock)
        rows = queue.take(min(want, PUMP_BATCH), now, session.session_id if session else None)
        if rows:
            touch(queue, now)
        size = 0
        for index, row in enumerate(rows):
            if size >= PUMP_BYTES:  # big messages: the rest waits for the next batch
                queue.untake(rows[index:])
                rows = rows[:index]
                break
            size += len(row.bare)
        if consumer.receive_and_delete:
            fits = _fitting(link, queue, rows)
            if fits < len(rows):  # what fits goes out, then the link ends
                queue.untake(rows[fits:])
                too_big = rows[fits]
                self._send_deleted(
                    consumer, rows[:fits], lambda: self._end_too_small(consumer, too_big)
                )
                self.commits.wake(consumer.peer.driver)
                return
            self._send_deleted(consumer, rows)
        else:
            for index, row in enumerate(rows):
                lock = queue.lock(row, now, owner=consumer, session=session)
                try:
                    delivery = link.send(queue.payload(row, lock), tag=guid_bytes_le(lock.token))
                except MessageSizeExceededError:
                    queue.abandon(lock.token, now, count=False)  # not a delivery attempt
                    queue.untake(rows[index + 1 :])
                    self._end_too_small(consumer, row)
                    return
                consumer.locks[delivery] = lock
        if rows:
            self.commits.wake(consumer.peer.driver)
            self.commits.soon()
            if want > len(rows) and queue.ready:  # the next batch once this one is written
                consumer.peer.driver.wake()
                asyncio.get_running_loop().call_soon(self._pump_more, consumer)

    def _end_too_small(self, consumer: Consumer, row: StoredMessage) -> None:
        """The receiver's max-message-size is below the next message: its link ends saying
        so (as our Event Hubs face does), and the message stays for another receiver."""
        link = consumer.link
        link.detach(
            error(
                MessageSizeExceededError.default_condition,
                (
                    f"message {row.seq} of {consumer.queue.name} does not fit the link: "
                    f"{len(row.bare)} bytes, the receiver takes at most {_limit(link)}"
                ),
            )
        )
        self.remove(consumer.peer, link)
        self.commits.wake(consumer.peer.driver)

    def _send_deleted(
        self, consumer: Consumer, rows: list[StoredMessage], then: Callable[[], None] | None = None
    ) -> None:
        """Receive-and-delete: the delete commits first, then the settled transfers go out.

        So a broker crash after the commit loses these messages (at-most-once, as Service
        Bus defines the mode) but never delivers one twice; a link that detaches before the
        commit lands gets nothing, and its messages are put back.
        """
        queue = consumer.queue
        for row in rows:
            queue.store.delete(queue.entity, row.seq, row.size)
        consumer.in_flight += len(rows)

        def send() -> None:
            consumer.in_flight -= len(rows)
            if consumer.link.is_open:
                for row in rows:
                    consumer.link.send(queue.payload(row, None), settled=True)
            else:
                queue.restore(rows)
                self.commits.soon()
            if then is not None:
                then()

        self.commits.soon(send)

    def _pump_more(self, consumer: Consumer) -> None:
        if consumer.peer.consumers.get(consumer.link) is consumer:  # still attached
            self.pump(consumer)

    # ------------------------------------------------------------------ settlements in

    def settle(self, consumer: Consumer, delivery: Delivery) -> None:
        """The receiver settled a delivery: complete, dead-letter, defer or abandon its
        message; the echo goes out after the commit."""
        lock = consumer.locks.pop(delivery, None)
        state = delivery.remote_state
        if lock is None:
            return
        queue = consumer.queue
        now = now_ms(self.clock)
        try:
            if isinstance(state, Accepted):
                queue.complete(lock.token, now)
                reply: Any = ACCEPTED
            elif isinstance(state, Rejected):
                info = (state.error.info or {}) if state.error else {}
                queue.dead_letter_locked(
                    lock.token,
                    now,
                    wire.optional_text(info.get("DeadLetterReason")),
                    wire.optional_text(info.get("DeadLetterErrorDescription")),
                )
                reply = Rejected()
            elif isinstance(state, Modified) and state.undeliverable_here:
                queue.defer(lock.token, now)
                reply = state
            elif isinstance(state, Modified):
                queue.abandon(lock.token, now)  # an abandon counts, delivery-failed or not
                reply = state
            elif isinstance(state, Released):
                queue.abandon(lock.token, now, count=False)
                reply = state
            else:
                return
        except LockLostError as exc:
            session = isinstance(exc, SessionLockLostError)
            condition = SESSION_LOCK_LOST if session else MESSAGE_LOCK_LOST
            delivery.update(Rejected(error=error(condition, str(exc))))
            self.commits.wake(consumer.peer.driver)
            return
        self.commits.soon(lambda: delivery.update(reply))


OUR_ANNOTATIONS: Final = 1024
"""More than the broker adds to a stored message on its way out (sequence number, times,
lock token, state, dead-letter source), so most sizes are known to fit without encoding."""


def _fitting(link: Link, queue: Queue, rows: list[StoredMessage]) -> int:
    """How many of ``rows`` fit the receiver's max-message-size, from the first."""
    limit = _limit(link)
    if not limit:
        return len(rows)
    for index, row in enumerate(rows):
        surely_fits = len(row.bare) + len(row.annotations or b"") + OUR_ANNOTATIONS <= limit
        if not surely_fits and len(queue.payload(row, None)) > limit:
            return index
    return len(rows)


def _limit(link: Link) -> int | None:
    """The receiver's max-message-size (0 or unset: none, spec 2.7.3)."""
    return int(link.remote.max_message_size or 0) or None if link.remote is not None else None
