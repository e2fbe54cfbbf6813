"""Service Bus transactions over our AMQP connection: sends, settlements and ``$management``
requests that take effect together at commit, or not at all.

What goes on the wire (AMQP 1.0 part 4, as Service Bus and the broker implement it;
docs/transactions.md has the captured frames):

- The controller: a sender link on the namespace connection whose target is a
  ``Coordinator`` (capability ``amqp:local-transactions``), attached on first use.
- ``Declare()`` in an amqp-value, answered with ``Declared(txn-id)``; ``Discharge(txn-id,
  fail)`` answered with ``accepted`` (committed, or rolled back when ``fail``), or
  ``rejected`` with ``amqp:transaction:rollback`` / ``timeout`` / ``unknown-id``.
- Work is enlisted by ``TransactionalState(txn-id)``: on a transfer (``AmqpSender``), on a
  receiver's disposition (``AmqpReceiver``: the outcome wrapped in it, sent unsettled; the
  service echoes ``TransactionalState(txn-id, outcome)`` or refuses, e.g. with
  message-lock-lost), or on a ``$management`` request transfer (``Management``).

A transaction belongs to the connection that declared it: every link its work goes on must
be on that connection (``AmqpSource`` shares one, so its senders, receivers and management
links all are). Service Bus lets one transaction reach several entities only through a via
entity: a sender created with ``via=`` sends through the entity the transaction's other
work is on (``com.microsoft:transfer-destination-address``).

``commit`` first waits for the service's answers to the settlements sent in the
transaction; when one was refused (a lock lost), it rolls the whole transaction back and
raises ``TransactionError`` with that condition, so a commit never leaves the copies sent
and their source message unsettled. Use it as a scope::

    async with namespace.transaction() as txn:
        await sender.send_messages(copies, transaction=txn)
        receiver.complete(batch, transaction=txn)
    # committed here; an exception in the block rolls everything back
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
import uuid
import weakref
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ..amqp.client import Sender
from ..amqp.errors import AMQPError
from ..amqp.message import BodyType, encode_message
from ..amqp.message import Message as AmqpMessage
from ..amqp.outcomes import (
    Accepted,
    Coordinator,
    Declare,
    Declared,
    Discharge,
    Rejected,
    TransactionalState,
)
from ..amqp.types import symbol
from .client import SourceError, source_error

if TYPE_CHECKING:
    from .client import AmqpConnection, AmqpSource

log = logging.getLogger("replication.servicebus.transactions")

LOCAL_TRANSACTIONS = symbol("amqp:local-transactions")


class TransactionError(SourceError):
    """The transaction could not be declared, used or discharged; ``condition`` says why
    (``amqp:transaction:rollback``, ``...:timeout``, ``...:unknown-id``, or the condition of
    the settlement that made ``commit`` roll back, e.g. ``com.microsoft:message-lock-lost``).
    Not retryable: its work is gone; start over in a new transaction."""

    retryable = False


class TransactionState(enum.Enum):
    ACTIVE = "active"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled back"
    UNKNOWN = "unknown"
    """The discharge got no answer (the connection went): committed or not, nobody says."""


class Transaction:
    """One declared transaction: pass it as ``transaction=`` to sends, settlements and
    management requests on its connection; end it with ``commit`` or ``rollback`` (or use
    ``AmqpSource.transaction()``, which does)."""

    def __init__(self, controller: TransactionController, txn_id: bytes) -> None:
        self.controller = controller
        self.txn_id = txn_id
        self.state = TransactionState.ACTIVE
        self._pending: list[tuple[asyncio.Future[Any], str]] = []
        """Answers the service owes to settlements sent in the transaction, and what each was."""

    def __repr__(self) -> str:
        return f"Transaction({self.txn_id.hex()}, {self.state.value})"

    @property
    def connection(self) -> AmqpConnection:
        return self.controller.connection

    @property
    def active(self) -> bool:
        return self.state is TransactionState.ACTIVE

    def enlist(self, connection: AmqpConnection) -> TransactionalState:
        """The state that enlists work on ``connection`` in this transaction; raises
        ``TransactionError`` when it ended, or when ``connection`` is not its own."""
        if not self.active:
            raise TransactionError(
                f"transaction {self.txn_id.hex()} was {self.state.value}: declare a new one "
                "for more work",
                "amqp:transaction:unknown-id",
            )
        if connection is not self.connection:
            raise TransactionError(
                f"transaction {self.txn_id.hex()} belongs to another connection: send, "
                "receive and settle through the namespace (AmqpSource) that declared it "
                "(if its connection was lost, the transaction was rolled back with it)",
                "amqp:transaction:unknown-id",
            )
        if connection.closed:
            self.state = TransactionState.ROLLED_BACK
            raise TransactionError(
                f"the connection of transaction {self.txn_id.hex()} was lost: the service "
                "rolled it back",
                "amqp:transaction:rollback",
            )
        return TransactionalState(txn_id=self.txn_id)

    def expect(self, answers: list[asyncio.Future[Any]], what: str) -> None:
        """Settlements sent in the transaction: ``commit`` waits for their answers first."""
        self._pending.extend((answer, what) for answer in answers)

    async def commit(self) -> None:
        """Commits; raises ``TransactionError`` if the service rolled it back instead (and
        rolls back itself when a settlement sent in it was refused)."""
        self.enlist(self.connection)  # still active, on a live connection
        problem = await self._refused()
        if problem is not None:
            description, condition = problem
            await self._discharge(fail=True)
            raise TransactionError(
                f"transaction {self.txn_id.hex()} rolled back: {description}", condition
            )
        await self._discharge(fail=False)

    async def rollback(self) -> None:
        """Rolls back: nothing sent in it arrives, nothing settled in it is settled (the
        messages stay locked until their locks expire, or are settled again)."""
        if self.state is not TransactionState.ACTIVE:
            return
        self._forget_pending()
        await self._discharge(fail=True)

    async def _refused(self) -> tuple[str, str | None] | None:
        """Waits for the answers to this transaction's settlements; the first refusal."""
        pending, self._pending = self._pending, []
        if not pending:
            return None
        deadline = time.monotonic() + self.connection.timeout
        for answer, what in pending:
            try:
                state = await asyncio.wait_for(
                    asyncio.shield(answer), max(0.0, deadline - time.monotonic())
                )
            except TimeoutError:
                return f"no answer to {what} within {self.connection.timeout:g} s", None
            except (AMQPError, OSError) as exc:
                error = source_error(exc, what)
                return error.description, error.condition
            if isinstance(state, TransactionalState):
                continue
            refusal = state.error if isinstance(state, Rejected) else None
            condition = str(refusal.condition) if refusal and refusal.condition else None
            reason = (refusal.description if refusal else None) or repr(state)
            return f"{what} was refused: {reason}", condition
        return None

    def _forget_pending(self) -> None:
        for answer, _ in self._pending:
            answer.cancel()
        self._pending.clear()

    async def _discharge(self, *, fail: bool) -> None:
        try:
            outcome = await self.controller.control(Discharge(txn_id=self.txn_id, fail=fail))
        except TransactionError:
            self.state = TransactionState.UNKNOWN if not fail else TransactionState.ROLLED_BACK
            raise
        if isinstance(outcome, Accepted):
            self.state = TransactionState.ROLLED_BACK if fail else TransactionState.COMMITTED
            log.debug("transaction %s %s", self.txn_id.hex(), self.state.value)
            return
        self.state = TransactionState.ROLLED_BACK
        error = outcome.error if isinstance(outcome, Rejected) else None
        raise TransactionError(
            f"the {'rollback' if fail else 'commit'} of transaction {self.txn_id.hex()} was "
            f"refused: {(error.description if error else None) or outcome!r}",
            str(error.condition) if error and error.condition else None,
        )


class TransactionController:
    """The connection's link to its transaction coordinator (one per connection)."""

    def __init__(self, connection: AmqpConnection) -> None:
        self.connection = connection
        self._link: Sender | None = None
        self._opening = asyncio.Lock()

    async def _open(self) -> Sender:
        async with self._opening:
            if self._link is not None and self._link.link.is_open:
                return self._link
            client = self.connection.client
            try:
                link = await client.sender(
                    None,
                    name=f"txn-controller-{uuid.uuid4()}",
                    target=Coordinator(capabilities=(LOCAL_TRANSACTIONS,)),
                    timeout=self.connection.timeout,
                )
            except (AMQPError, OSError) as exc:
                error = source_error(exc, "cannot attach to the transaction coordinator")
                raise TransactionError(error.description, error.condition) from exc
            offered = getattr(link.link.remote_target, "capabilities", None) or ()
            offered = (offered,) if isinstance(offered, str) else offered
            if LOCAL_TRANSACTIONS not in offered:
                await link.close()
                raise TransactionError(
                    "the namespace's coordinator does not offer local transactions "
                    f"(capabilities: {list(offered)})",
                    "amqp:not-implemented",
                )
            self._link = link
            return link

    async def control(self, body: Declare | Discharge) -> Any:
        """Sends ``Declare`` or ``Discharge``; the coordinator's outcome."""
        link = await self._open()
        what = "declare" if isinstance(body, Declare) else "discharge"
        payload = encode_message(AmqpMessage(body=body, body_type=BodyType.VALUE))
        try:
            return await asyncio.wait_for(link.send_encoded(payload), self.connection.timeout)
        except (AMQPError, OSError) as exc:  # TimeoutError included
            self._link = None
            error = source_error(exc, f"the transaction {what} got no answer")
            raise TransactionError(error.description, error.condition) from exc

    async def declare(self) -> Transaction:
        outcome = await self.control(Declare())
        if isinstance(outcome, Declared):
            return Transaction(self, bytes(outcome.txn_id))
        error = outcome.error if isinstance(outcome, Rejected) else None
        raise TransactionError(
            f"the coordinator refused to declare a transaction: "
            f"{(error.description if error else None) or outcome!r}",
            str(error.condition) if error and error.condition else None,
        )


_controllers: weakref.WeakKeyDictionary[AmqpConnection, TransactionController] = (
    weakref.WeakKeyDictionary()
)


def controller_of(connection: AmqpConnection) -> TransactionController:
    """The connection's controller (made on first use)."""
    controller = _controllers.get(connection)
    if controller is None:
        controller = _controllers[connection] = TransactionController(connection)
    return controller


async def declare(namespace: AmqpSource) -> Transaction:
    """A new transaction on the namespace's connection (commit or roll it back yourself)."""
    return await controller_of(await namespace.connection()).declare()


@contextlib.asynccontextmanager
async def transaction(namespace: AmqpSource) -> AsyncIterator[Transaction]:
    """``async with``: commits when the block ends normally (unless it ended the transaction
    itself), rolls back when it raises (the exception goes on; a failed rollback is only
    logged: the service rolls back a transaction whose connection is gone)."""
    txn = await declare(namespace)
    try:
        yield txn
    except BaseException:
        if txn.active:
            try:
                await txn.rollback()
            except (SourceError, asyncio.CancelledError) as exc:
                log.warning("rolling back transaction %s failed: %s", txn.txn_id.hex(), exc)
        raise
    if txn.active:
        await txn.commit()


__all__ = [
    "Transaction",
    "TransactionController",
    "TransactionError",
    "TransactionState",
    "controller_of",
    "declare",
    "transaction",
]
