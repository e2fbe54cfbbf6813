"""A request/answer link pair on a ``$management`` node, the one way we ask a namespace
something (the SDKs' ``_pyamqp/management_link.py``): Service Bus's entity operations
(``management.Management``) and Event Hubs' property reads (``servicebus.eventhubs``).

A request goes on the sender link with a fresh ``message-id`` and ``reply-to`` naming the
receiver link; the answer is the message whose ``correlation-id`` is that id (answers to
requests given up on are taken and dropped). Its status is in the application properties,
under names that differ by service (``StatusKeys``); a status outside 2xx is raised as the
``SourceError`` its condition stands for (``client.error_for``), a missing answer after the
connection's timeout as ``com.microsoft:timeout``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..amqp.client import Receiver, Sender
from ..amqp.errors import AMQPError
from ..amqp.message import BodyType, Properties, encode_message
from ..amqp.message import Message as AmqpMessage
from .client import AmqpConnection, SourceError, error_for, source_error


@dataclass(frozen=True, slots=True)
class StatusKeys:
    """Where an answer's application properties put its status: the names of code,
    description and error condition, the node's own spelling first."""

    code: tuple[str, ...]
    description: tuple[str, ...]
    condition: tuple[str, ...] = ()

    def read(self, properties: Mapping[Any, Any]) -> tuple[Any, str, str | None]:
        """The answer's status code, description and condition (None: not named)."""
        code, description, condition = (
            next((properties[k] for k in keys if properties.get(k) is not None), None)
            for keys in (self.code, self.description, self.condition)
        )
        return code, str(description or ""), str(condition) if condition else None


SERVICE_BUS_STATUS = StatusKeys(
    ("statusCode", "status-code"),
    ("statusDescription", "status-description"),
    ("errorCondition", "error-condition"),
)
EVENT_HUBS_STATUS = StatusKeys(
    ("status-code", "statusCode"),
    ("status-description", "statusDescription"),
    ("error-condition", "errorCondition"),
)
CONDITION_BY_STATUS = {401: "amqp:unauthorized-access", 404: "amqp:not-found"}
"""The condition of a failed answer that names none (Event Hubs' reads name none)."""


class ManagementLink:
    """A sender and a receiver on ``node``; one request at a time (``request``)."""

    def __init__(
        self,
        connection: AmqpConnection,
        node: str,
        sender: Sender,
        receiver: Receiver,
        status: StatusKeys,
    ) -> None:
        self.connection = connection
        self.node = node
        self.sender = sender
        self.receiver = receiver
        self.status = status
        self._lock = asyncio.Lock()

    @classmethod
    async def attach(
        cls, connection: AmqpConnection, node: str, status: StatusKeys
    ) -> ManagementLink:
        """Attaches the pair (the caller has authorized the entity the node belongs to)."""
        client, timeout = connection.client, connection.timeout
        try:
            receiver = await client.receiver(
                node, credit=10, target=f"{node}-reply-{uuid.uuid4()}", timeout=timeout
            )
            sender = await client.sender(node, timeout=timeout)
        except (AMQPError, OSError) as exc:
            raise source_error(exc, f"cannot attach to {node}") from exc
        return cls(connection, node, sender, receiver, status)

    async def request(
        self, properties: dict[str, Any], body: Any, what: str, *, state: Any = None
    ) -> dict[str, Any]:
        """Sends ``body`` with application ``properties`` (``state`` on the transfer, e.g. a
        ``TransactionalState``) and returns the answer's map body; ``what`` names the
        request in errors."""
        message_id = uuid.uuid4()
        request = AmqpMessage(
            body=body,
            body_type=BodyType.VALUE,
            properties=Properties(
                message_id=message_id, reply_to=str(self.receiver.link.target.address)
            ),
            application_properties=properties,
        )
        async with self._lock:
            try:
                await self.sender.send_encoded(encode_message(request), state=state)
                reply = await self._answer(message_id, what)
            except (AMQPError, OSError) as exc:
                raise source_error(exc, f"{what} failed") from exc
        status, description, condition = self.status.read(reply.application_properties or {})
        if not isinstance(status, int) or not 200 <= status < 300:
            if condition is None and isinstance(status, int):
                condition = CONDITION_BY_STATUS.get(status)
            raise error_for(f"{what}: {status} {description}".strip(), condition)
        return reply.body if isinstance(reply.body, dict) else {}

    async def _answer(self, message_id: uuid.UUID, what: str) -> AmqpMessage:
        timeout = self.connection.timeout
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                received = await self.receiver.receive(remaining)
            except TimeoutError:
                continue
            received.accept()
            reply: AmqpMessage = received.message
            if reply.properties is not None and reply.properties.correlation_id == message_id:
                return reply
        raise SourceError(f"{what}: no answer within {timeout:g} s", "com.microsoft:timeout")
