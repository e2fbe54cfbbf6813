"""AMQP 1.0 transactions (spec part 4) as Service Bus implements them, and send-via.

A controller attaches a link whose target is a ``Coordinator`` and sends ``Declare`` (answered
with ``Declared(txn-id)``) and ``Discharge(txn-id, fail)`` (answered with ``accepted``, or
``rejected`` with a transaction error). Work is enlisted by ``TransactionalState(txn-id)``:

- on a transfer to an entity: the message is kept in memory (not stored, not visible) and the
  transfer is answered at once with ``TransactionalState(txn-id, accepted)``;
- on a receiver's disposition (complete, abandon, dead-letter, defer): the lock stays held,
  the outcome is echoed as ``TransactionalState(txn-id, <outcome>)`` and applied at commit;
- on a ``$management`` request (``update-disposition``, ``cancel-scheduled-message``), as the
  .NET and Java SDKs send them: the request transfer carries the transactional state.

Enlisted work is a list of closures over the ``Queue`` API (``Work.apply``), each with a check
(``Work.check``) that says whether it can still be applied (a lock that expired or was
released cannot be completed). A commit runs every check first and only then every apply, all
in one event-loop turn: the changes land in the broker's one open store transaction (the
group commit) and reach the disk in one ``COMMIT``, or, when a check fails, none is made and
the discharge is rejected with ``amqp:transaction:rollback``. The discharge is accepted only
after that commit, so an accepted commit is durable. A rollback (``fail=true``), the
controller's link detaching, the connection closing, or the transaction timing out (2 minutes
after its first operation, as Service Bus) drops the work: messages locked by a rolled-back
disposition stay locked until the lock expires or is abandoned (receive is not part of a
transaction). Transaction ids belong to the connection that declared them.

Send-via: a sender attach to the *via* entity with the link property
``com.microsoft:transfer-destination-address`` = *destination* sends every message on that link
to the destination; both entities must exist and the connection needs the Send claim on both
(the Service Bus protocol guide asks for a token on both). Service Bus lets one transaction touch
several entities only through a via entity; this broker does not enforce that rule: one
transaction may span any entities of its connection.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..amqp.errors import AMQPError
from ..amqp.link import Delivery, Link
from ..amqp.message import decode_message
from ..amqp.outcomes import (
    Accepted,
    Coordinator,
    Declare,
    Declared,
    Discharge,
    Modified,
    Rejected,
    Released,
    TransactionalState,
)
from ..amqp.performatives import Error
from ..amqp.terminus import Source
from ..amqp.types import symbol
from ..symbols import TRANSFER_DESTINATION
from . import wire
from .cbs import Cbs
from .clock import Clock, now_ms
from .commit import GroupCommit
from .dispatch import Consumer
from .errors import SendRefusedError, error
from .limits import LINK_CREDIT, RECEIVE_LIMIT, Intake
from .management import ManagementError
from .nodes import Node
from .peer import Peer
from .queue import LockLostError, Queue
from .registry import Entity, Registry, entity_path

log = logging.getLogger("replication.broker.transactions")

CAPABILITIES = (
    symbol("amqp:local-transactions"),
    symbol("amqp:multi-txns-per-ssn"),
    symbol("amqp:multi-ssns-per-txn"),
)
"""What the coordinator offers in its attach (spec 4.5.1: the controller checks them)."""
UNKNOWN_ID = "amqp:transaction:unknown-id"
ROLLBACK = "amqp:transaction:rollback"
TIMEOUT = "amqp:transaction:timeout"
TIMEOUT_SECONDS = 120.0
"""Service Bus: a transaction times out 2 minutes after its first operation."""
IMMEDIATE_OPERATIONS = frozenset(
    {
        "com.microsoft:renew-lock",
        "com.microsoft:peek-message",
        "com.microsoft:receive-by-sequence-number",
    }
)
"""$management operations that run at once even inside a transaction (receiving and lock
renewal have nothing to undo). Other operations not enlisted below are refused in one."""


# ---------------------------------------------------------------------------- queue operations


def _enqueue(intake: Intake, entity: Entity, messages: list[wire.IncomingMessage]) -> None:
    """A committed send. The one place enlisted messages reach an entity (through
    ``Intake.send``, as every send does: forwarding, topics, sessions)."""
    intake.send(entity, messages)


def _settle(queue: Queue, token: uuid.UUID, outcome: Any, now: int) -> None:
    """A committed disposition: ``outcome`` is the receiver's (accepted, rejected, ...)."""
    if isinstance(outcome, Accepted):
        queue.complete(token, now)
    elif isinstance(outcome, Rejected):
        info = (outcome.error.info or {}) if outcome.error else {}
        queue.dead_letter_locked(
            token,
            now,
            wire.optional_text(info.get("DeadLetterReason")),
            wire.optional_text(info.get("DeadLetterErrorDescription")),
        )
    elif isinstance(outcome, Modified) and outcome.undeliverable_here:
        queue.defer(token, now)
    elif isinstance(outcome, Modified):
        queue.abandon(token, now)  # an abandon counts, delivery-failed or not
    else:  # Released
        queue.abandon(token, now, count=False)


def _settle_work(queue: Queue, token: uuid.UUID, outcome: Any) -> Work:
    """Settling one lock at commit, and what would stop it (checked before the commit)."""
    return Work(
        lambda at: _settle(queue, token, outcome, at), lambda at: _lock_problem(queue, token, at)
    )


def _lock_problem(queue: Queue, token: uuid.UUID, now: int) -> str | None:
    """Why ``_settle`` would raise ``LockLostError`` (the checks mirror ``Queue._take_lock``)."""
    lock = queue.locks.get(token)
    if lock is None or lock.until_ms <= now:
        return f"the lock {token} on {queue.name} has expired or was released"
    return None


def _management_outcome(status: str, body: dict[str, Any]) -> Any:
    """An update-disposition status as the link outcome it stands for (None: no such status)."""
    if status == "completed":
        return Accepted()
    if status == "abandoned":
        return Modified(delivery_failed=True)
    if status == "defered":  # sic: the SDKs' spelling
        return Modified(delivery_failed=True, undeliverable_here=True)
    if status == "suspended":
        info = {
            "DeadLetterReason": body.get("deadletter-reason"),
            "DeadLetterErrorDescription": body.get("deadletter-description"),
        }
        return Rejected(error=Error(condition=symbol("com.microsoft:dead-letter"), info=info))
    return None


# ---------------------------------------------------------------------------- state


@dataclass(slots=True, eq=False)
class Work:
    """One enlisted operation: ``apply(now)`` makes it, ``check(now)`` says why it can't,
    ``drop()`` tidies up when the transaction ends without it."""

    apply: Callable[[int], None]
    check: Callable[[int], str | None] | None = None
    drop: Callable[[], object] | None = None


@dataclass(slots=True, eq=False)
class Transaction:
    txn_id: bytes
    peer: Peer
    controller: Link
    work: dict[Any, Work] = field(default_factory=dict)
    """In enlistment order; a disposition is keyed by its lock, so a later one replaces it."""
    deadline: float | None = None
    """When it times out (the broker's monotonic clock); set by its first operation."""
    timed_out: bool = False


class TransactionCoordinator(Node):
    """Every connection's transactions and send-via links; the node of links whose target
    is a ``Coordinator`` (``nodes.py``), whatever their address."""

    def __init__(
        self,
        registry: Registry,
        cbs: Cbs,
        intake: Intake,
        commits: GroupCommit,
        clock: Clock,
        credit: int = LINK_CREDIT,
    ) -> None:
        self.registry = registry
        self.cbs = cbs
        self.intake = intake
        self.commits = commits
        self.clock = clock
        self.credit = credit
        self.timeout = TIMEOUT_SECONDS
        self.transactions: dict[bytes, Transaction] = {}
        self._controllers: dict[Link, Peer] = {}
        """Coordinator links and their connections."""
        self._via: dict[Link, tuple[Peer, str]] = {}
        """Send-via links, their connections and the destination's key."""
        self._serial = 0

    # ------------------------------------------------------------------ the node

    def accepts(self, link: Link, path: str) -> bool:
        return link.is_receiver and isinstance(link.remote_target, Coordinator)

    def attach(self, peer: Peer, link: Link, path: str) -> None:
        self.attach_controller(peer, link)

    def transfer(self, peer: Peer, link: Link, delivery: Delivery) -> None:
        self.on_control(peer, link, delivery)

    def detach(self, peer: Peer, link: Link) -> None:
        self.forget_link(link)

    # ------------------------------------------------------------------ links

    def attach_controller(self, peer: Peer, link: Link) -> None:
        """A link to the coordinator: accepted, given credit. No claim needed: the work a
        transaction enlists is authorised where it is done."""
        link.accept(
            source=link.remote_source if link.remote_source is not None else Source(),
            target=Coordinator(capabilities=CAPABILITIES),
        )
        link.flow(self.credit)
        self._controllers[link] = peer

    def attach_send_via(self, peer: Peer, link: Link) -> None:
        """A sender to a via entity whose messages go to the destination named in its link
        properties (the server checked that the via entity exists, is not a dead-letter queue,
        and that the peer may Send to it)."""
        target = str((link.remote_properties or {}).get(TRANSFER_DESTINATION) or "")
        path = entity_path(target)
        destination = self.registry.entities.get(path.lower())
        if destination is None:
            link.refuse(
                error(
                    "amqp:not-found",
                    f"The messaging entity '{path}' could not be found.",
                )
            )
            return
        if destination.name.lower() not in self.registry.sendable:
            link.refuse(
                error(
                    "amqp:not-allowed",
                    f"cannot send to '{path}': send to its queue or topic",
                )
            )
            return
        problem = self.cbs.problem(peer, destination.name, "Send")
        if problem is not None:
            link.refuse(error("amqp:unauthorized-access", problem))
            return
        peer.entity_links[link] = destination.name  # token expiry: destination
        self._via[link] = (peer, destination.name.lower())
        limit = destination.settings.max_message_size
        link.accept(max_message_size=limit, properties={TRANSFER_DESTINATION: target})
        link.receive_limit = max(RECEIVE_LIMIT, limit)
        link.flow(self.credit)

    def destination(self, link: Link, path: str) -> str:
        """The queue key a transfer on ``link`` goes to: a via link's destination, else ``path``."""
        entry = self._via.get(link)
        return entry[1] if entry is not None else path

    def forget_link(self, link: Link) -> None:
        """A detached controller link rolls back the transactions it declared."""
        self._via.pop(link, None)
        if self._controllers.pop(link, None) is None:
            return
        for txn in [t for t in self.transactions.values() if t.controller is link]:
            self._end(txn, "its controller link detached")

    def forget_peer(self, peer: Peer) -> None:
        """A closed connection rolls back every transaction it left open."""
        for txn in [t for t in self.transactions.values() if t.peer is peer]:
            self._end(txn, "the connection closed")
        for link in [k for k, owner in self._controllers.items() if owner is peer]:
            del self._controllers[link]
        for link in [k for k, (owner, _) in self._via.items() if owner is peer]:
            del self._via[link]

    # ------------------------------------------------------------------ declare / discharge

    def on_control(self, peer: Peer, link: Link, delivery: Delivery) -> None:
        """A transfer on a controller link: ``Declare`` or ``Discharge`` in an amqp-value."""
        try:
            body = decode_message(delivery.payload).body
        except AMQPError as exc:
            delivery.update(Rejected(error=error("amqp:decode-error", exc.description)))
            return
        if isinstance(body, Declare):
            if body.global_id is not None:
                delivery.update(
                    Rejected(
                        error=error(
                            "amqp:not-implemented",
                            "distributed transactions are not supported",
                        )
                    )
                )
                return
            if delivery.settled:
                return  # a pre-settled declare could never learn its id
            txn = Transaction(uuid.uuid4().bytes, peer, link)
            self.transactions[txn.txn_id] = txn
            delivery.update(Declared(txn_id=txn.txn_id))
        elif isinstance(body, Discharge):
            self._discharge(peer, delivery, body)
        else:
            delivery.update(
                Rejected(
                    error=error(
                        "amqp:not-implemented",
                        f"not a transaction control message: {body!r}",
                    )
                )
            )

    def _discharge(self, peer: Peer, delivery: Delivery, discharge: Discharge) -> None:
        txn = self._lookup(peer, discharge.txn_id)
        if isinstance(txn, Error):
            if str(txn.condition) == TIMEOUT:  # told once; the id is unknown from now on
                self.transactions.pop(bytes(discharge.txn_id), None)
            delivery.update(Rejected(error=txn))
            return
        if discharge.fail:
            self._end(txn, "rolled back")
            delivery.update(Accepted())
            return
        now = now_ms(self.clock)
        for work in txn.work.values():
            problem = work.check(now) if work.check is not None else None
            if problem is not None:
                self._end(txn, problem)
                delivery.update(
                    Rejected(
                        error=error(
                            ROLLBACK,
                            f"the transaction was rolled back: {problem}",
                        )
                    )
                )
                return
        self._end(txn, None)
        for work in txn.work.values():
            work.apply(now)
        self.commits.soon(lambda: delivery.update(Accepted()))

    def _lookup(self, peer: Peer, txn_id: Any) -> Transaction | Error:
        txn = self.transactions.get(bytes(txn_id or b""))
        if txn is None or txn.peer is not peer:
            return error(UNKNOWN_ID, f"unknown transaction {bytes(txn_id or b'').hex()}")
        if txn.timed_out:
            return error(TIMEOUT, "the transaction timed out and was rolled back")
        return txn

    def _end(self, txn: Transaction, reason: str | None) -> None:
        """Forgets the transaction; its work is applied by the caller (commit) or dropped."""
        self.transactions.pop(txn.txn_id, None)
        txn.deadline = None
        if reason is None or not txn.work:
            return
        log.info(
            "transaction %s: %d operations dropped, %s", txn.txn_id.hex(), len(txn.work), reason
        )
        for work in txn.work.values():
            if work.drop is not None:
                work.drop()

    def time_out(self, now: float) -> None:
        """Rolls back the transactions whose time is up (``now``: the broker's monotonic
        clock; called by the broker's sweep)."""
        for txn in list(self.transactions.values()):
            if txn.deadline is not None and now >= txn.deadline:
                self._end(txn, "timed out")
                txn.work.clear()
                txn.timed_out = True
                self.transactions[txn.txn_id] = txn  # kept so its id answers with a timeout

    def _enlist(self, txn: Transaction, key: Any, work: Work) -> None:
        if txn.deadline is None and not txn.work:  # the time starts with the first operation
            txn.deadline = self.clock.monotonic() + self.timeout
        txn.work[key] = work

    # ------------------------------------------------------------------ enlisting

    def enlist_send(
        self, peer: Peer, delivery: Delivery, entity: Entity, messages: list[wire.IncomingMessage]
    ) -> None:
        """A transfer with ``TransactionalState``: the messages are stored at commit (and
        checked now, as a plain send would be)."""
        state: TransactionalState = delivery.state
        txn = self._lookup(peer, state.txn_id)
        if isinstance(txn, Error):
            delivery.update(Rejected(error=txn))
            return
        try:
            self.intake.admit(entity, messages, now_ms(self.clock))
        except SendRefusedError as exc:
            delivery.update(Rejected(error=error(exc.condition, str(exc))))
            return
        self._serial += 1
        intake = self.intake
        self._enlist(
            txn, ("send", self._serial), Work(lambda now: _enqueue(intake, entity, messages))
        )
        delivery.update(TransactionalState(txn_id=txn.txn_id, outcome=Accepted()))

    def enlist_settle(self, consumer: Consumer, delivery: Delivery) -> None:
        """A receiver's disposition with ``TransactionalState``: applied at commit; the lock
        stays held (and may expire) until then."""
        state: TransactionalState = delivery.remote_state
        lock = consumer.locks.get(delivery)
        if lock is None:
            return  # settled before, or lost with an earlier answer
        txn = self._lookup(consumer.peer, state.txn_id)
        if isinstance(txn, Error):
            delivery.update(Rejected(error=txn))
            return
        outcome = state.outcome
        if not isinstance(outcome, Accepted | Rejected | Modified | Released):
            delivery.update(
                Rejected(
                    error=error(
                        "amqp:not-implemented",
                        f"no transactional outcome {outcome!r}",
                    )
                )
            )
            return
        queue = consumer.queue
        problem = _lock_problem(queue, lock.token, now_ms(self.clock))
        if problem is not None:
            consumer.locks.pop(delivery, None)
            delivery.update(Rejected(error=error("com.microsoft:message-lock-lost", problem)))
            return

        def apply(now: int) -> None:
            consumer.locks.pop(delivery, None)
            _settle(queue, lock.token, outcome, now)

        self._enlist(
            txn,
            ("lock", queue.entity, lock.token),
            Work(
                apply,
                lambda now: _lock_problem(queue, lock.token, now),
                # our echo settles the delivery: after a rollback only the lock is left (it expires,
                # or a $management update-disposition settles it); the link forgets the delivery
                lambda: consumer.locks.pop(delivery, None),
            ),
        )
        echo = Rejected() if isinstance(outcome, Rejected) else outcome  # as the SDKs expect
        delivery.update(TransactionalState(txn_id=txn.txn_id, outcome=echo))

    def enlist_request(
        self, peer: Peer, state: Any, operation: str, queue: Entity, body: dict[str, Any]
    ) -> tuple[int, Any] | None:
        """A ``$management`` request whose transfer had ``state``: a ``TransactionalState``
        enlists it and returns the response; None: not transactional, or it runs at once."""
        if not isinstance(state, TransactionalState) or operation in IMMEDIATE_OPERATIONS:
            return None
        txn = self._lookup(peer, state.txn_id)
        if isinstance(txn, Error):
            raise ManagementError(400, str(txn.condition), txn.description or "")
        if operation == "com.microsoft:update-disposition":
            if not isinstance(queue, Queue):  # a topic holds no locks
                raise ManagementError(400, "amqp:not-allowed", f"{queue.name} has no locks")
            status = str(body.get("disposition-status", ""))
            outcome = _management_outcome(status, body)
            if outcome is None:
                raise ManagementError(400, "com.microsoft:argument-error", f"status {status!r}")
            tokens = body.get("lock-tokens", [])
            tokens = [t if isinstance(t, uuid.UUID) else uuid.UUID(str(t)) for t in tokens]
            now = now_ms(self.clock)
            for token in tokens:
                problem = _lock_problem(queue, token, now)
                if problem is not None:
                    raise LockLostError(problem)
            for token in tokens:
                work = _settle_work(queue, token, outcome)
                self._enlist(txn, ("lock", queue.entity, token), work)
            return 200, {}
        if operation == "com.microsoft:cancel-scheduled-message":
            seqs = [int(s) for s in body.get("sequence-numbers", [])]
            self._serial += 1
            self._enlist(
                txn, ("cancel", self._serial), Work(lambda at: queue.cancel_scheduled(seqs))
            )
            return 200, {}
        raise ManagementError(
            400, "amqp:not-implemented", f"{operation} is not supported in a transaction"
        )
