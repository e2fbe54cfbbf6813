"""An AMQP-native Service Bus source for the pump: our own AMQP stack instead of the SDK's.

The azure-servicebus SDK spends about 0.33 ms of CPU per message receiving and completing in
peek-lock mode (it builds a ``ServiceBusReceivedMessage`` per message and settles each with
its own disposition). This source reads the same entity over ``replication.amqp``: each
transfer is decoded once, straight into ``replication.messages.Message``, and a batch's
completes go out as dispositions over delivery-id ranges (one frame for a run of
consecutive deliveries). Sending is ``servicebus.sender``'s.

What goes on the wire is what Service Bus (and our broker, see docs/sdk-wire-notes.md
sections 1, 2 and 4) expects of a peek-lock receiver:

- Connection: to the ``Endpoint`` (``endpoint.py``: host, port, TLS); SASL ANONYMOUS
  (MSSBCBS when ANONYMOUS is not offered): authorisation comes later, by CBS, with the
  endpoint's token provider (``tokens.py``).
- CBS: a ``$cbs`` sender and receiver on the connection; per entity a ``put-token`` of a SAS
  token for the audience ``sb://host[:port]/<entity path>``, renewed on the same links when
  90% of its lifetime has passed.
- Receiver link: ``snd-settle-mode`` unsettled, ``rcv-settle-mode`` second (peek-lock, as the
  SDK attaches), source ``amqps://host[:port]/<path>``; credit is a prefetch window that is
  topped up as the pump takes messages (at most ``prefetch`` wait unread, holding locks).
  Session entities: source filter ``com.microsoft:session-filter`` = session id, or null
  for the next available session with ``com.microsoft:timeout`` (ms) in the attach
  properties; the locked session comes back in the attach reply's filter, its lock expiry
  in ``com.microsoft:locked-until-utc``. No session in time: the attach is refused with
  ``com.microsoft:timeout``.
- Settlement, sent settled (as the SDK does without awaited outcomes): complete =
  ``accepted``, abandon = ``modified(delivery-failed)``, dead-letter = ``rejected`` with error
  ``com.microsoft:dead-letter`` and info ``DeadLetterReason``/``DeadLetterErrorDescription``;
  unread prefetched messages are ``released`` before the link closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from mypy_extensions import mypyc_attr

from ..adapters.amqp import decode_arrived
from ..adapters.values import text
from ..amqp.client import Client, ReceivedMessage, Receiver, Sender
from ..amqp.errors import AMQPError
from ..amqp.message import BodyType, Properties
from ..amqp.message import Message as AmqpMessage
from ..amqp.outcomes import Accepted, Modified, Rejected, Released, TransactionalState
from ..amqp.performatives import RCV_SECOND, SND_UNSETTLED, Error
from ..amqp.types import timestamp, uint
from ..messages import Message
from ..symbols import (
    CBS_NODE,
    DEAD_LETTER,
    DEAD_LETTER_DESCRIPTION,
    DEAD_LETTER_REASON,
    ENTITY_ALREADY_EXISTS,
    ENTITY_NOT_FOUND,
    LOCKED_UNTIL_UTC,
    MESSAGE_LOCK_LOST,
    MESSAGE_NOT_FOUND,
    NOT_FOUND,
    SESSION_FILTER,
    SESSION_LOCK_LOST,
    TIMEOUT,
    UNAUTHORIZED_ACCESS,
)
from .endpoint import Endpoint
from .tokens import ServiceBusSasl

if TYPE_CHECKING:
    from .transactions import Transaction

log = logging.getLogger("replication.servicebus.client")

NET_EPOCH_TICKS = 621_355_968_000_000_000
""".NET ticks (100 ns since 0001-01-01) at the Unix epoch."""
REFRESH_AT = 0.9
"""Fraction of a token's lifetime after which it is renewed (the SDKs: with 10% left)."""
MIN_REFRESH_DELAY = 1.0

NOT_RETRYABLE = frozenset(
    {
        "amqp:unauthorized-access",
        "amqp:not-found",
        "amqp:not-allowed",
        "amqp:not-implemented",
        "amqp:invalid-field",
        "amqp:decode-error",
        "com.microsoft:auth-failed",
        "com.microsoft:entity-disabled",
        "amqp:link:message-size-exceeded",
        "amqp:resource-limit-exceeded",
    }
)
"""Conditions that another attempt will not cure (wrong key, no such entity, ...)."""


# ---------------------------------------------------------------------- errors


@mypyc_attr(native_class=False)  # subclassed by interpreted modules (spark, transactions)
class SourceError(Exception):
    """The source failed; ``condition`` is the AMQP error condition when the peer gave one."""

    def __init__(self, description: str, condition: str | None = None) -> None:
        super().__init__(f"{description} ({condition})" if condition else description)
        self.description = description
        self.condition = condition

    @property
    def retryable(self) -> bool:
        return self.condition not in NOT_RETRYABLE


@mypyc_attr(native_class=False)
class AuthenticationError(SourceError):
    """CBS refused the token (wrong key or key name, expired signature, no Listen right)."""

    def __init__(self, description: str, condition: str = "amqp:unauthorized-access") -> None:
        super().__init__(description, condition)


@mypyc_attr(native_class=False)
class NoSessionAvailable(SourceError):
    """No session of the entity could be locked within the wait (``com.microsoft:timeout``)."""


@mypyc_attr(native_class=False)
class MessageLockLost(SourceError):
    """The message's lock expired or was released (``com.microsoft:message-lock-lost``): it
    cannot be settled or renewed any more; it will be delivered again."""

    retryable = False


@mypyc_attr(native_class=False)
class SessionLockLost(SourceError):
    """The session's lock expired or is held by another receiver
    (``com.microsoft:session-lock-lost``): take the session again to go on."""

    retryable = False


@mypyc_attr(native_class=False)
class MessageNotFound(SourceError):
    """No such message: a sequence number that is not deferred (or not scheduled) in the
    entity, or a lock token it does not know (``com.microsoft:message-not-found``)."""

    retryable = False


@mypyc_attr(native_class=False)
class EntityNotFound(SourceError):
    """No such queue, topic, subscription or rule (``amqp:not-found``,
    ``com.microsoft:entity-not-found``)."""

    retryable = False


@mypyc_attr(native_class=False)
class EntityAlreadyExists(SourceError):
    """It exists already, e.g. a rule of that name (``com.microsoft:entity-already-exists``)."""

    retryable = False


ERRORS_BY_CONDITION: dict[str, type[SourceError]] = {
    MESSAGE_LOCK_LOST: MessageLockLost,
    SESSION_LOCK_LOST: SessionLockLost,
    MESSAGE_NOT_FOUND: MessageNotFound,
    ENTITY_NOT_FOUND: EntityNotFound,
    NOT_FOUND: EntityNotFound,
    ENTITY_ALREADY_EXISTS: EntityAlreadyExists,
    UNAUTHORIZED_ACCESS: AuthenticationError,
}
"""The error a condition the service answers with stands for (what the SDKs map it to:
``MessageLockLostError``, ``SessionLockLostError``, ``MessageNotFoundError``,
``MessagingEntityNotFoundError``, ``MessagingEntityAlreadyExistsError``, ...)."""


def error_for(description: str, condition: str | None) -> SourceError:
    """A ``SourceError`` of the type ``condition`` stands for (``SourceError`` itself for
    the rest)."""
    kind = ERRORS_BY_CONDITION.get(condition or "", SourceError)
    return kind(description, condition) if condition else kind(description)


def source_error(exc: BaseException, what: str) -> SourceError:
    if isinstance(exc, SourceError):
        return exc
    if isinstance(exc, AMQPError):
        condition = getattr(exc, "condition", None)
        description = getattr(exc, "description", None) or str(exc)
        if condition == "amqp:unauthorized-access":
            return AuthenticationError(f"{what}: {description}", condition)
        if condition == "com.microsoft:timeout":
            return NoSessionAvailable(f"{what}: {description}", condition)
        return SourceError(f"{what}: {description}", condition)
    return SourceError(f"{what}: {exc!r}")


# ---------------------------------------------------------------------- connection + CBS


@mypyc_attr(native_class=False)  # weakly referenced (locks.management_for, transactions)
class AmqpConnection:
    """One AMQP connection to a namespace: CBS authorisation per entity, tokens renewed."""

    def __init__(self, endpoint: Endpoint, client: Client, *, timeout: float) -> None:
        self.endpoint = endpoint
        self.client = client
        self.timeout = timeout
        self._cbs_sender: Sender | None = None
        self._cbs_receiver: Receiver | None = None
        self._cbs_lock = asyncio.Lock()
        self._authorized: dict[str, float] = {}
        """audience -> expiry (Unix seconds) of the token last put."""
        self._refreshers: dict[str, asyncio.Task[None]] = {}

    @classmethod
    async def open(cls, endpoint: Endpoint, *, timeout: float = 30.0) -> AmqpConnection:
        """Connects (TCP or TLS, SASL, open, begin) and attaches the CBS links."""
        try:
            client = await asyncio.wait_for(
                Client.connect(
                    endpoint.host,
                    endpoint.port,
                    sasl=ServiceBusSasl(hostname=endpoint.host),
                    ssl_context=endpoint.tls_context(),
                    hostname=endpoint.host,
                    container_id=f"replication-source-{uuid.uuid4()}",
                    timeout=timeout,
                ),
                timeout,
            )
        except (AMQPError, OSError) as exc:  # TimeoutError is an OSError
            raise source_error(exc, f"cannot connect to {endpoint.host}:{endpoint.port}") from exc
        connection = cls(endpoint, client, timeout=timeout)
        failure: BaseException | None = None
        try:
            connection._cbs_receiver = await client.receiver(
                CBS_NODE, credit=10, target=CBS_NODE, timeout=timeout
            )
            connection._cbs_sender = await client.sender(CBS_NODE, timeout=timeout)
        except BaseException as error:  # closed below: no await inside a compiled handler
            failure = error
        if failure is not None:
            await connection.close()
            if isinstance(failure, AMQPError | OSError):
                raise source_error(failure, "cannot attach to $cbs") from failure
            raise failure
        return connection

    @property
    def closed(self) -> bool:
        return self.client.driver.closed.is_set()

    async def authorize(self, path: str) -> None:
        """Puts a token for ``path`` (once; renewed in the background until closed)."""
        audience = self.endpoint.audience(path)
        if audience in self._authorized:
            return
        issued = self.endpoint.clock.time()
        expiry = await self._put_token(audience)
        self._authorized[audience] = expiry
        self._refreshers[audience] = asyncio.create_task(
            self._refresh(audience, issued, expiry), name=f"cbs-refresh {audience}"
        )

    async def _refresh(self, audience: str, issued: float, expiry: float) -> None:
        """Renews the token with a tenth of its lifetime left, on the endpoint's clock."""
        clock = self.endpoint.clock
        while True:
            due = issued + (expiry - issued) * REFRESH_AT
            await clock.sleep(max(MIN_REFRESH_DELAY, due - clock.time()))
            if self.closed:
                return
            try:
                now = clock.time()
                new_expiry = await self._put_token(audience)
            except SourceError as exc:
                log.warning("renewing the token for %s failed (retrying): %s", audience, exc)
                issued, expiry = clock.time(), min(expiry, clock.time() + 30 / (1 - REFRESH_AT))
                continue
            if new_expiry <= expiry:
                log.warning(
                    "the token for %s cannot be renewed (it expires at %s)",
                    audience,
                    datetime.fromtimestamp(expiry, UTC).isoformat(),
                )
                return
            log.debug("token for %s renewed until %s", audience, new_expiry)
            issued, expiry = now, new_expiry
            self._authorized[audience] = expiry

    async def _put_token(self, audience: str) -> float:
        token, expiry = await self.endpoint.token_provider(audience)
        message_id = uuid.uuid4()
        request = AmqpMessage(
            body=token,
            body_type=BodyType.VALUE,
            properties=Properties(message_id=message_id, reply_to=CBS_NODE),
            application_properties={
                "operation": "put-token",
                "type": self.endpoint.token_type,
                "name": audience,
                "expiration": timestamp(int(expiry * 1000)),
            },
        )
        sender, receiver = self._cbs_sender, self._cbs_receiver
        assert sender is not None and receiver is not None
        async with self._cbs_lock:
            sent = asyncio.ensure_future(sender.send(request))
            try:
                reply = await self._cbs_reply(receiver, message_id, sent, audience)
            except (AMQPError, OSError) as exc:
                raise source_error(exc, f"CBS put-token for {audience} failed") from exc
            finally:
                if sent.done():
                    sent.exception()  # retrieved: its failure is reported through the reply
                else:
                    sent.cancel()
        status = reply.get("status-code", reply.get("statusCode"))
        description = reply.get("status-description", reply.get("statusDescription")) or ""
        if not isinstance(status, int) or not 200 <= status < 300:
            raise AuthenticationError(
                f"the namespace refused the token for {audience}: {status} {description}".strip()
            )
        return expiry

    async def _cbs_reply(
        self,
        receiver: Receiver,
        message_id: uuid.UUID,
        sent: asyncio.Future[Any],
        audience: str,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise TimeoutError
                received = await receiver.receive(remaining)
            except TimeoutError:
                if sent.done() and not sent.exception() and isinstance(sent.result(), Rejected):
                    error = sent.result().error
                    raise AuthenticationError(
                        f"CBS rejected the put-token for {audience}: "
                        f"{getattr(error, 'description', None) or error}",
                        getattr(error, "condition", None) or "amqp:unauthorized-access",
                    ) from None
                raise SourceError(
                    f"no CBS answer for {audience} within {self.timeout:g} s",
                    "com.microsoft:timeout",
                ) from None
            received.accept()
            props = received.message.properties
            if props is not None and props.correlation_id == message_id:
                return dict(received.message.application_properties or {})

    async def receiver(
        self,
        path: str,
        *,
        prefetch: int = 100,
        session: bool = False,
        session_id: str | None = None,
        wait: float = 60.0,
    ) -> AmqpReceiver:
        """A peek-lock receiver on ``path`` (a queue, ``topic/Subscriptions/sub``, or either
        with ``/$DeadLetterQueue``). ``session``: lock ``session_id``, or the next available
        session, waiting up to ``wait`` seconds (``NoSessionAvailable`` when none came)."""
        await self.authorize(path)
        filters: dict[Any, Any] | None = None
        properties: dict[Any, Any] | None = None
        attach_timeout = self.timeout
        if session:
            filters = {SESSION_FILTER: session_id}
            if session_id is None:
                properties = {TIMEOUT: uint(max(0, int(wait * 1000)))}
                attach_timeout += wait
        try:
            link = await self.client.receiver(
                self.endpoint.address(path),
                credit=max(1, prefetch),
                filter=filters,
                properties=properties,
                target=f"receiver-link-{uuid.uuid4()}",
                snd_settle_mode=SND_UNSETTLED,
                rcv_settle_mode=RCV_SECOND,
                credit_on_take=True,
                decode=decode_arrived,
                timeout=attach_timeout,
            )
        except TimeoutError as unanswered:  # the attach was never answered: the link is stuck
            await self.close()  # half-open; start over on a new connection
            raise SourceError(f"no answer to the attach of {path}") from unanswered
        except (AMQPError, OSError) as exc:
            raise source_error(exc, f"cannot receive from {path}") from exc
        return AmqpReceiver(self, path, link)

    async def close(self) -> None:
        for task in self._refreshers.values():
            task.cancel()
        self._refreshers.clear()
        with contextlib.suppress(Exception):
            await self.client.close()


# ---------------------------------------------------------------------- receiver


class AmqpReceiver:
    """A peek-lock receiver: batches of ``Message`` (``source`` = the delivery), settled in
    as few dispositions as the outcomes allow."""

    def __init__(self, connection: AmqpConnection, path: str, link: Receiver) -> None:
        self.connection = connection
        self.path = path
        self.link = link
        self.session_id: str | None = None
        self.session_locked_until: datetime | None = None
        remote = link.link.remote
        if remote is not None:
            filters = getattr(remote.source, "filter", None) or {}
            if SESSION_FILTER in filters:
                self.session_id = text(filters[SESSION_FILTER])
            ticks = (remote.properties or {}).get(LOCKED_UNTIL_UTC)
            if isinstance(ticks, int) and ticks > NET_EPOCH_TICKS:
                self.session_locked_until = datetime.fromtimestamp(
                    (ticks - NET_EPOCH_TICKS) / 10_000_000, UTC
                )

    @property
    def is_open(self) -> bool:
        return self.link.link.is_open and not self.connection.closed

    async def receive(self, max_count: int = 100, max_wait: float | None = 1.0) -> list[Message]:
        """Up to ``max_count`` messages: waits up to ``max_wait`` s for the first, then takes
        what has arrived. ``[]`` when none came; ``SourceError`` when the link is gone."""
        try:
            items = await self.link.receive_batch(max_count, max_wait)
        except (AMQPError, OSError) as exc:
            raise source_error(exc, f"receiving from {self.path} failed") from exc
        messages = []
        for item in items:
            message = item.message
            if type(message) is Message:
                message.source = item
                messages.append(message)
            else:  # given back: MaxDeliveryCount dead-letters it in the end
                log.error("cannot decode a message of %s (abandoned): %s", self.path, message)
                self.link.settle([item], Modified(delivery_failed=True))
        return messages

    def unread(self) -> list[Message]:
        """Prefetched messages not taken yet: locked since they arrived (``LockKeeper``)."""
        messages = []
        for item in self.link.unread():
            if type(item.message) is Message:
                item.message.source = item
                messages.append(item.message)
        return messages

    # -- settlement: sent settled, together with the rest of the loop turn's output; in a
    # transaction sent unsettled, the service's answer awaited by the commit

    def complete(
        self, messages: Iterable[Message], *, transaction: Transaction | None = None
    ) -> int:
        """Completes messages; consecutive deliveries share one disposition frame.
        ``transaction``: completed when it commits (``transactions.py``)."""
        return self._settle(messages, Accepted(), transaction)

    def abandon(
        self,
        messages: Iterable[Message],
        annotations: dict[Any, Any] | None = None,
        *,
        transaction: Transaction | None = None,
    ) -> int:
        """Gives messages back; their delivery count goes up (``modified(delivery-failed)``).
        ``annotations``: properties to change on them as they go back."""
        return self._modify(messages, False, annotations, transaction)

    def defer(
        self,
        messages: Iterable[Message],
        annotations: dict[Any, Any] | None = None,
        *,
        transaction: Transaction | None = None,
    ) -> int:
        """Sets messages aside, to be received by sequence number later
        (``modified(undeliverable-here)``, as the SDKs defer)."""
        return self._modify(messages, True, annotations, transaction)

    def _modify(
        self,
        messages: Iterable[Message],
        elsewhere: bool,
        annotations: dict[Any, Any] | None,
        transaction: Transaction | None,
    ) -> int:
        outcome = Modified(
            delivery_failed=True, undeliverable_here=elsewhere, message_annotations=annotations
        )
        return self._settle(messages, outcome, transaction)

    def release(self, messages: Iterable[Message]) -> int:
        """Gives messages back without counting a delivery attempt."""
        return self._settle(messages, Released())

    def dead_letter(
        self,
        message: Message,
        reason: str | None = "",
        description: str | None = "",
        *,
        transaction: Transaction | None = None,
    ) -> int:
        """Moves a message to the dead-letter queue with a reason and a description; None
        leaves that property off the dead-lettered message, as the .NET SDK leaves off one
        not given (the Functions extension's unset field), where "" sets it empty."""
        info = {}
        if reason is not None:
            info[DEAD_LETTER_REASON] = reason[:256]
        if description is not None:
            info[DEAD_LETTER_DESCRIPTION] = description = description[:1024]
        error = Error(condition=DEAD_LETTER, description=description or None, info=info or None)
        return self._settle([message], Rejected(error=error), transaction)

    def _settle(
        self, messages: Iterable[Message], outcome: Any, transaction: Transaction | None = None
    ) -> int:
        received = [m.source for m in messages if isinstance(m.source, ReceivedMessage)]
        if not received:
            return 0
        if transaction is not None:  # before the link check: a lost link fails the commit
            state = TransactionalState(
                txn_id=transaction.enlist(self.connection).txn_id, outcome=outcome
            )
            what = f"settling {len(received)} message(s) of {self.path}"
            transaction.expect(self.link.update(received, state), what)
            return len(received)
        if not self.is_open:  # the locks went with the link: the messages come again
            log.warning(
                "cannot settle %d message(s) of %s: the link is closed", len(received), self.path
            )
            return 0
        self.link.settle(received, outcome)
        return len(received)

    async def close(self) -> None:
        """Releases what was prefetched but not taken, then detaches. The credit is stopped
        first and the service's answer awaited, so a message on the wire (e.g. one released
        a moment ago and given straight back to this link) is released too, not left locked
        until its lock expires with a delivery counted."""
        if self.is_open:
            await self.link.stop_credit()
        if self.is_open:
            released = self.link.release_unread()
            if released:
                log.debug("released %d prefetched message(s) of %s", released, self.path)
        with contextlib.suppress(Exception):
            await self.link.close()


# ---------------------------------------------------------------------- what the pump holds


class AmqpSource:
    """A namespace for the pump: one connection (opened on first use, reopened when lost)
    that any number of receivers share."""

    def __init__(self, endpoint: Endpoint, *, timeout: float = 30.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._connection: AmqpConnection | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def from_connection_string(cls, connection_string: str, **options: Any) -> AmqpSource:
        return cls(Endpoint.from_connection_string(connection_string), **options)

    async def connection(self) -> AmqpConnection:
        async with self._lock:
            connection = self._connection
            if connection is None or connection.closed:
                if connection is not None:
                    await connection.close()
                    self._connection = None
                connection = await AmqpConnection.open(self.endpoint, timeout=self.timeout)
                self._connection = connection
            return connection

    async def receiver(self, path: str, **options: Any) -> AmqpReceiver:
        """See ``AmqpConnection.receiver``."""
        connection = await self.connection()
        try:
            return await connection.receiver(path, **options)
        except SourceError:
            if connection.closed:
                async with self._lock:
                    if self._connection is connection:
                        self._connection = None
            raise

    def transaction(self) -> contextlib.AbstractAsyncContextManager[Transaction]:
        """``async with namespace.transaction() as txn:`` a transaction on the namespace's
        connection, committed when the block ends, rolled back when it raises; pass ``txn``
        to ``AmqpSender.send_messages``, ``AmqpReceiver`` settlements and ``Management``
        requests of this namespace (``transactions.py``)."""
        from .transactions import transaction

        return transaction(self)

    async def close(self) -> None:
        async with self._lock:
            if self._connection is not None:
                await self._connection.close()
                self._connection = None

    async def __aenter__(self) -> AmqpSource:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


__all__ = [
    "AmqpConnection",
    "AmqpReceiver",
    "AmqpSource",
    "AuthenticationError",
    "NoSessionAvailable",
    "SourceError",
]
