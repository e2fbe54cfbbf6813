"""The azure-servicebus receive path behind ``AmqpSource``'s interface (a pipeline's
``backend: sdk``).

``SdkSource``/``SdkReceiver`` do what ``client.AmqpSource``/``AmqpReceiver`` do, with the
asyncio SDK: peek-lock receivers with prefetch, the next available session
(``NEXT_AVAILABLE_SESSION``), batches of ``Message`` (``messages.from_received``: ``source``
is the SDK's ``ServiceBusReceivedMessage``), settlement, and the ``$management`` operations
the local host needs (``SdkManagement``: lock renewal for ``tasks.locks.LockKeeper``, session
state for the settlement service). SDK errors become ``SourceError`` with the condition
ours would carry, so whoever holds a source handles both the same way.

What the SDK cannot do the way our AMQP path does, and what happens instead:

- Settlement is one call per message (no ranged dispositions), and a call is a coroutine:
  ``complete``/``abandon``/... queue it and return at once, as ours do ("sent settled, not
  confirmed"); the calls go out in order before the next receive and before ``close``.
  A settlement that fails (the lock is gone) is logged; the message comes again.
- Release (give back without counting a delivery) has no SDK call: a session receiver's
  messages are left unsettled and go back with the session when the receiver closes (a
  lock that ends with its receiver, not by expiry, counts no delivery: our broker does as
  the Service Bus sessions guide describes); a plain receiver's are abandoned, which
  counts one.
- Abandon and defer cannot change properties on the way (``propertiesToModify``): the SDK
  settles them unchanged and a warning says what was dropped.
- Prefetched messages not taken yet are not visible (``unread`` is empty), so their locks
  are not renewed (a session lock covers them); they go back when the receiver closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
import weakref
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import Any, TypeVar

from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusReceivedMessage, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver
from azure.servicebus.exceptions import (
    MessageAlreadySettled,
    MessageLockLostError,
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)

from ..adapters.sdk import from_received
from ..messages import Message
from .client import AmqpReceiver, AuthenticationError, NoSessionAvailable, SourceError

log = logging.getLogger("replication.servicebus.sdk_source")
T = TypeVar("T")

DEAD_LETTER_QUEUE = "/$DeadLetterQueue"
MIN_WAIT = 0.01
"""Seconds: the shortest wait the SDK takes (it refuses 0)."""
SUBSCRIPTIONS = "/subscriptions/"

_tokens: weakref.WeakKeyDictionary[ServiceBusReceivedMessage, uuid.UUID] = (
    weakref.WeakKeyDictionary()
)
"""Lock tokens as received: the SDK's ``lock_token`` is None once a message is settled,
and ``LockKeeper`` must still find the lock it held."""

_CONDITIONS: tuple[tuple[type[BaseException], str], ...] = (
    (MessagingEntityNotFoundError, "amqp:not-found"),
    (MessagingEntityDisabledError, "com.microsoft:entity-disabled"),
    (SessionLockLostError, "com.microsoft:session-lock-lost"),
    (MessageLockLostError, "com.microsoft:message-lock-lost"),
    (MessageAlreadySettled, "com.microsoft:message-lock-lost"),
    (SessionCannotBeLockedError, "com.microsoft:session-cannot-be-locked"),
    (OperationTimeoutError, "com.microsoft:timeout"),
)
"""The AMQP condition Service Bus sends for what the SDK raises (``SourceError.retryable``
and ``tasks.locks.lock_lost`` read conditions)."""


def source_error(exc: BaseException, what: str) -> SourceError:
    """An SDK error as ours: a wrong key is ``AuthenticationError``, no such entity is not
    retryable, a lost lock says so, the rest is worth another try."""
    if isinstance(exc, SourceError):
        return exc
    description = f"{what}: {exc}"
    if isinstance(exc, ServiceBusAuthenticationError | ServiceBusAuthorizationError):
        return AuthenticationError(description)
    for kind, condition in _CONDITIONS:
        if isinstance(exc, kind):
            return SourceError(description, condition)
    return SourceError(description)


def lock_token(message: Message) -> uuid.UUID | None:
    """The lock token of a message received with ``SdkReceiver`` (None for others)."""
    received = message.source
    if not isinstance(received, ServiceBusReceivedMessage):
        return None
    token = _tokens.get(received)
    if token is None:
        raw = received.lock_token
        if raw is None:
            return None
        token = _tokens[received] = uuid.UUID(str(raw))
    return token


def lock_key(message: Message) -> bytes | None:
    """``management.lock_key`` for SDK messages: the delivery tag (the token's bytes)."""
    token = lock_token(message)
    return None if token is None else token.bytes_le


def sdk_receiver(
    client: ServiceBusClient, entity: str, subscription: str | None, **kwargs: Any
) -> ServiceBusReceiver:
    """A peek-lock receiver on a queue or subscription that settles without waiting.

    azure-servicebus 7.15 waits for the broker's echo of every settlement, one round trip
    per message (4x slower here). We settle only after the target accepted the copies, so
    at-least-once holds either way; an unconfirmed complete that is lost means one
    redelivery, a duplicate the target's duplicate detection removes.
    """
    if subscription is not None:
        receiver = client.get_subscription_receiver(entity, subscription, **kwargs)
    else:
        receiver = client.get_queue_receiver(entity, **kwargs)
    if hasattr(receiver, "_await_settlement_outcome"):
        receiver._await_settlement_outcome = False
    return receiver


async def without_retries(receiver: ServiceBusReceiver, opening: Awaitable[T]) -> T:
    """Opens without the SDK's retries. For the next available session they turn "none now"
    into four tries with backoff (about 20 s with its defaults), during which nobody sees a
    stop; the caller asks again itself, at once, as ``AmqpSource`` does."""
    config = getattr(receiver, "_config", None)
    retries = getattr(config, "retry_total", None)
    if config is None or retries is None:
        return await opening
    config.retry_total = 0
    try:
        return await opening
    finally:
        config.retry_total = retries


def split_path(path: str) -> tuple[str, str | None, bool]:
    """``queue``, ``topic/Subscriptions/sub``, either with ``/$DeadLetterQueue``: (entity,
    subscription or None, dead-letter queue?), as the SDK names them."""
    dead_letter = path.lower().endswith(DEAD_LETTER_QUEUE.lower())
    if dead_letter:
        path = path[: -len(DEAD_LETTER_QUEUE)]
    at = path.lower().find(SUBSCRIPTIONS)
    if at < 0:
        return path, None, dead_letter
    return path[:at], path[at + len(SUBSCRIPTIONS) :], dead_letter


class SdkSource:
    """A namespace through azure-servicebus: one ``ServiceBusClient``; each receiver opens
    its own connection (the SDK's default)."""

    def __init__(self, client: ServiceBusClient) -> None:
        self.client = client

    @classmethod
    def from_connection_string(cls, connection_string: str, **client_options: Any) -> SdkSource:
        return cls(ServiceBusClient.from_connection_string(connection_string, **client_options))

    async def receiver(
        self,
        path: str,
        *,
        prefetch: int = 100,
        session: bool = False,
        session_id: str | None = None,
        wait: float = 60.0,
    ) -> SdkReceiver:
        """``AmqpSource.receiver``: a peek-lock receiver on ``path``; ``session``: lock
        ``session_id``, or the next available session within ``wait`` seconds
        (``NoSessionAvailable`` when none came)."""
        entity, subscription, dead_letter = split_path(path)
        options: dict[str, Any] = {"prefetch_count": max(1, prefetch)}
        if dead_letter:
            options["sub_queue"] = ServiceBusSubQueue.DEAD_LETTER
        if session:
            options["session_id"] = NEXT_AVAILABLE_SESSION if session_id is None else session_id
            options["max_wait_time"] = max(wait, MIN_WAIT)
        receiver = sdk_receiver(self.client, entity, subscription, **options)
        try:
            if session and session_id is None:
                await without_retries(receiver, receiver.__aenter__())
            else:
                await receiver.__aenter__()
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await receiver.close()
            if session and session_id is None and isinstance(exc, OperationTimeoutError):
                raise NoSessionAvailable(
                    f"no session of {path} within {wait:g} s", "com.microsoft:timeout"
                ) from exc
            if isinstance(exc, ServiceBusError | OSError):
                raise source_error(exc, f"cannot receive from {path}") from exc
            raise
        return SdkReceiver(receiver, path)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.close()

    async def __aenter__(self) -> SdkSource:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


Settle = Callable[[ServiceBusReceivedMessage], Awaitable[None]]


class SdkReceiver:
    """``AmqpReceiver``'s interface over an SDK receiver (see the module for the
    differences)."""

    def __init__(self, receiver: ServiceBusReceiver, path: str) -> None:
        self.receiver = receiver
        self.path = path
        self.management = SdkManagement(self)
        self.session_id: str | None = None
        self.session_locked_until: datetime | None = None
        session = receiver.session
        if session is not None:
            self.session_id = session.session_id
            self.session_locked_until = _utc(session.locked_until_utc)
        self._closed = False
        self._failed = False
        self._settling: asyncio.Task[None] | None = None

    @property
    def is_open(self) -> bool:
        return not (self._closed or self._failed)

    async def receive(self, max_count: int = 100, max_wait: float | None = 1.0) -> list[Message]:
        """Up to ``max_count`` messages, waiting up to ``max_wait`` s for the first; ``[]``
        when none came; ``SourceError`` when the receiver failed."""
        await self._settled()
        wait = None if max_wait is None else max(max_wait, MIN_WAIT)  # the SDK wants > 0
        try:
            batch = await self.receiver.receive_messages(
                max_message_count=max_count, max_wait_time=wait
            )
        except (ServiceBusError, OSError, ValueError) as exc:
            self._failed = True
            raise source_error(exc, f"receiving from {self.path} failed") from exc
        messages = [from_received(received) for received in batch]
        for message in messages:
            lock_token(message)  # kept for after it is settled
        return messages

    def unread(self) -> list[Message]:
        """The SDK does not show its prefetch buffer."""
        return []

    # -- settlement: queued in order, sent before the next receive and before close

    def complete(self, messages: Iterable[Message]) -> int:
        return self._settle(messages, "complete", self.receiver.complete_message)

    def abandon(
        self, messages: Iterable[Message], annotations: dict[Any, Any] | None = None
    ) -> int:
        """Gives messages back, their delivery count goes up; ``annotations`` cannot go
        with them through the SDK (dropped, with a warning)."""
        self._unchanged("abandon", annotations)
        return self._settle(messages, "abandon", self.receiver.abandon_message)

    def defer(self, messages: Iterable[Message], annotations: dict[Any, Any] | None = None) -> int:
        """Sets messages aside (``annotations`` dropped, as for ``abandon``)."""
        self._unchanged("defer", annotations)
        return self._settle(messages, "defer", self.receiver.defer_message)

    def release(self, messages: Iterable[Message]) -> int:
        """No delivery counted: a session's messages are left to go back with the session
        when this receiver closes. A plain receiver cannot release: abandoned."""
        if self.session_id is not None:
            return sum(1 for m in messages if isinstance(m.source, ServiceBusReceivedMessage))
        return self._settle(messages, "abandon", self.receiver.abandon_message)

    def dead_letter(
        self, message: Message, reason: str | None = "", description: str | None = ""
    ) -> int:
        reason = None if reason is None else reason[:256]
        description = None if description is None else description[:1024]

        async def dead_letter(received: ServiceBusReceivedMessage) -> None:
            await self.receiver.dead_letter_message(
                received, reason=reason, error_description=description
            )

        return self._settle([message], "dead-letter", dead_letter)

    def _unchanged(self, what: str, annotations: dict[Any, Any] | None) -> None:
        if annotations:
            log.warning(
                "%s: azure-servicebus cannot modify properties on %s; %s dropped",
                self.path,
                what,
                ", ".join(map(str, annotations)),
            )

    def _settle(self, messages: Iterable[Message], what: str, settle: Settle) -> int:
        received = [m.source for m in messages if isinstance(m.source, ServiceBusReceivedMessage)]
        if not received:
            return 0
        if not self.is_open:  # the locks went with the receiver: the messages come again
            log.warning(
                "cannot %s %d message(s) of %s: the receiver is closed",
                what,
                len(received),
                self.path,
            )
            return 0
        previous = self._settling
        self._settling = asyncio.get_running_loop().create_task(
            self._settle_after(previous, what, settle, received), name=f"settle {self.path}"
        )
        return len(received)

    async def _settle_after(
        self,
        previous: asyncio.Task[None] | None,
        what: str,
        settle: Settle,
        received: list[ServiceBusReceivedMessage],
    ) -> None:
        if previous is not None:  # in order; it logs its own failures
            with contextlib.suppress(Exception):
                await asyncio.shield(previous)
        for message in received:
            try:
                await settle(message)
            except (ServiceBusError, OSError, ValueError) as exc:  # the lock is gone
                log.warning(
                    "%s: cannot %s %s (it comes again): %s",
                    self.path,
                    what,
                    message.message_id,
                    exc,
                )
            except Exception:  # one bad settlement must not stop the ones queued after it
                log.exception("%s: cannot %s %s", self.path, what, message.message_id)

    async def _settled(self) -> None:
        """Waits for the settlements queued so far."""
        while self._settling is not None:
            settling = self._settling
            with contextlib.suppress(Exception):  # each logged its own failures
                await asyncio.shield(settling)
            if self._settling is settling:
                self._settling = None

    async def close(self) -> None:
        """Sends what is queued, then closes (prefetched and released messages go back)."""
        with contextlib.suppress(Exception):
            await self._settled()
        self._closed = True
        with contextlib.suppress(Exception):
            await self.receiver.close()


class SdkManagement:
    """What ``tasks.locks.Management`` does for the host, through one SDK receiver: lock
    renewal (messages one request each; a session receiver renews its session) and the
    session-state requests of the settlement service."""

    def __init__(self, receiver: SdkReceiver) -> None:
        self.receiver = receiver

    async def renew_locks(self, receiver: SdkReceiver, messages: Iterable[Message]) -> datetime:
        """``Management.renew_locks``: the earliest new expiry."""
        sdk = receiver.receiver
        if receiver.session_id is not None:
            until = await self._call(sdk.session.renew_lock(), "renew the session lock")
            return _utc(until) or datetime.now(UTC)
        expiries = []
        for message in messages:
            if isinstance(message.source, ServiceBusReceivedMessage):
                until = await self._call(
                    sdk.renew_message_lock(message.source),
                    f"renew the lock of {message.message_id}",
                )
                expiries.append(_utc(until) or datetime.now(UTC))
        return min(expiries, default=datetime.now(UTC))

    async def request(self, path: str, operation: str, body: dict[str, Any]) -> dict[str, Any]:
        """``Management.request`` for the session-state operations (the SDK has no general
        request); others are ``amqp:not-implemented``."""
        session = self.receiver.receiver.session
        if session is not None and operation == "com.microsoft:get-session-state":
            return {"session-state": await self._call(session.get_state(), operation)}
        if session is not None and operation == "com.microsoft:set-session-state":
            await self._call(session.set_state(body.get("session-state")), operation)
            return {}
        raise SourceError(
            f"{operation} on {path} is not available through azure-servicebus",
            "amqp:not-implemented",
        )

    async def _call(self, call: Awaitable[Any], what: str) -> Any:
        try:
            return await call
        except (ServiceBusError, OSError, ValueError, TypeError) as exc:
            raise source_error(exc, f"{self.receiver.path}: cannot {what}") from exc


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


SourceReceiver = AmqpReceiver | SdkReceiver
"""Either backend's receiver: what the local host and ``LockKeeper`` take."""
