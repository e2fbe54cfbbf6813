"""Service Bus ``$management`` requests over our AMQP connection: renewing message and session
locks while work on them is still in flight (a Spark micro-batch can outlast a lock), and
peeking at what an entity holds without locking or taking it (``python -m replication peek``).

A request goes on a sender link to ``<entity>/$management`` with ``operation`` in the
application properties and a map body; the answer comes on a receiver link from the same
node, matched by ``correlation-id``, with ``statusCode`` in its application properties.
Lock tokens are the delivery tags read as .NET GUIDs (``UUID(bytes_le=tag)``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from ..amqp.client import ReceivedMessage, Receiver, Sender
from ..amqp.errors import AMQPError
from ..amqp.message import BodyType, Properties
from ..amqp.message import Message as AmqpMessage
from ..amqp.types import int32
from ..messages import Message
from .client import AmqpConnection, AmqpReceiver, SourceError, _source_error
from .incoming import decode_to_message


def lock_key(message: Message) -> bytes | None:
    """What identifies a message's lock, cheaply: its delivery tag (None if not ours)."""
    received = message.source
    if not isinstance(received, ReceivedMessage):
        return None
    return bytes(received.delivery.tag)


def lock_token(message: Message) -> uuid.UUID | None:
    """The lock token of a message received with ``AmqpReceiver`` (None for others)."""
    received = message.source
    if not isinstance(received, ReceivedMessage):
        return None
    return uuid.UUID(bytes_le=bytes(received.delivery.tag))


class Management:
    """One request/response link pair per entity on a connection, opened on first use."""

    def __init__(self, connection: AmqpConnection) -> None:
        self.connection = connection
        self._links: dict[str, tuple[Sender, Receiver, asyncio.Lock]] = {}

    async def request(self, path: str, operation: str, body: dict[str, Any]) -> dict[str, Any]:
        """Runs ``operation`` on ``path``'s management node; the reply body, or
        ``SourceError`` with the service's status and condition."""
        sender, receiver, lock = await self._pair(path)
        message_id = uuid.uuid4()
        reply_to = str(receiver.link.target.address)  # type: ignore[union-attr]
        request = AmqpMessage(
            body=body, body_type=BodyType.VALUE,
            properties=Properties(message_id=message_id, reply_to=reply_to),
            application_properties={"operation": operation},
        )  # fmt: skip
        async with lock:
            try:
                await sender.send(request)
                reply = await self._reply(receiver, message_id, operation, path)
            except (AMQPError, OSError) as exc:
                raise _source_error(exc, f"{operation} on {path} failed") from exc
        props = reply.application_properties or {}
        status = props.get("statusCode", props.get("status-code"))
        if not isinstance(status, int) or not 200 <= status < 300:
            description = props.get("statusDescription", props.get("status-description", ""))
            condition = props.get("errorCondition", props.get("error-condition"))
            raise SourceError(f"{operation} on {path}: {status} {description}".strip(),
                              str(condition) if condition else None)  # fmt: skip
        return reply.body if isinstance(reply.body, dict) else {}

    async def renew_locks(self, receiver: AmqpReceiver, messages: Iterable[Message]) -> datetime:
        """Renews the locks of ``messages`` (received on ``receiver``); the earliest new
        expiry. A session receiver renews its session lock instead (messages of a session
        are locked by it)."""
        if receiver.session_id is not None:
            reply = await self.request(
                receiver.path, "com.microsoft:renew-session-lock",
                {"session-id": receiver.session_id},
            )  # fmt: skip
            return _utc(reply.get("expiration"))
        tokens = [t for t in map(lock_token, messages) if t is not None]
        if not tokens:
            return datetime.now(UTC)
        reply = await self.request(receiver.path, "com.microsoft:renew-lock",
                                   {"lock-tokens": tokens})  # fmt: skip
        expirations = [_utc(e) for e in reply.get("expirations") or []]
        return min(expirations, default=datetime.now(UTC))

    async def peek(
        self, path: str, count: int = 1, *, from_sequence_number: int = 1,
        session_id: str | None = None,
    ) -> list[Message]:  # fmt: skip
        """Up to ``count`` messages of ``path`` from ``from_sequence_number`` on, in sequence
        order, without locking them (``path`` may end in ``/$DeadLetterQueue``); of one
        session when ``session_id`` is given. A reply may hold fewer than asked (Service Bus
        does not promise them all at once), so it asks again from past the last one until
        it has ``count`` or the entity gives none."""
        peeked: list[Message] = []
        start = from_sequence_number
        while len(peeked) < count:
            body: dict[str, Any] = {
                "from-sequence-number": start, "message-count": int32(count - len(peeked)),
            }  # fmt: skip
            if session_id is not None:
                body["session-id"] = session_id
            reply = await self.request(path, "com.microsoft:peek-message", body)
            batch = [decode_to_message(bytes(item["message"]))
                     for item in reply.get("messages") or []
                     if isinstance(item, dict) and "message" in item]  # fmt: skip
            last = batch[-1].sequence_number if batch else None
            peeked.extend(batch[: count - len(peeked)])
            if last is None or last < start:  # nothing more (or no way to go on past it)
                break
            start = last + 1
        return peeked

    async def _pair(self, path: str) -> tuple[Sender, Receiver, asyncio.Lock]:
        node = f"{path}/$management"
        pair = self._links.get(node)
        if pair is None:
            await self.connection.authorize(path)
            client, timeout = self.connection.client, self.connection.timeout
            reply_to = f"{node}-reply-{uuid.uuid4()}"
            try:
                receiver = await client.receiver(node, credit=10, target=reply_to,
                                                 timeout=timeout)  # fmt: skip
                sender = await client.sender(node, timeout=timeout)
            except (AMQPError, OSError) as exc:
                raise _source_error(exc, f"cannot attach to {node}") from exc
            pair = self._links[node] = (sender, receiver, asyncio.Lock())
        return pair

    async def _reply(self, receiver: Receiver, message_id: uuid.UUID, operation: str,
                     path: str) -> AmqpMessage:  # fmt: skip
        deadline = time.monotonic() + self.connection.timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SourceError(f"no answer to {operation} on {path}", "com.microsoft:timeout")
            try:
                received = await receiver.receive(remaining)
            except TimeoutError:
                continue
            received.accept()
            properties = received.message.properties
            if properties is not None and properties.correlation_id == message_id:
                return received.message


def _utc(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value / 1000, UTC)
    return datetime.now(UTC)
