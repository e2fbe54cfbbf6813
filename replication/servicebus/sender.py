"""Sending to a Service Bus entity over our AMQP engine (the SDK's ``send_messages``, without
building SDK messages or going through its pure-Python AMQP).

One sender link per entity on the namespace's shared connection (``AmqpSource``), opened on
first use and again after the link or connection was lost. A call sends one message, or a
list as one batch transfer (``outgoing``), and returns once Service Bus accepted it; it raises
``SendError`` otherwise, with the error condition and whether another attempt may help
(what ``tasks.sender`` retries). The link's ``max-message-size`` bounds what is sent: a batch
over it is refused here with ``amqp:link:message-size-exceeded``, as the SDK refuses one.

Any number of coroutines may send on one ``AmqpSender`` at once: each transfer waits for its
own outcome.

Transactions (``transactions.py``): ``send_messages(..., transaction=txn)`` puts
``TransactionalState(txn-id)`` on the transfer; the messages reach the entity when ``txn``
commits. Send-via: ``AmqpSender(namespace, destination, via=entity)`` attaches to ``entity``
with the link property ``com.microsoft:transfer-destination-address`` = ``destination``, so
everything sent goes to the destination through the via entity: how one transaction may
reach an entity other than the one its settlements are on (Service Bus refuses a
transaction across entities otherwise). The connection puts a token for both.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mypy_extensions import mypyc_attr

from ..adapters.amqp import encode
from ..amqp.client import Sender
from ..amqp.errors import AMQPError
from ..amqp.outcomes import Accepted, Rejected, TransactionalState
from ..messages import Message
from ..symbols import TRANSFER_DESTINATION
from . import outgoing
from .client import AmqpConnection, AmqpSource, SourceError, source_error

if TYPE_CHECKING:
    from .transactions import Transaction

MESSAGE_SIZE_EXCEEDED = "amqp:link:message-size-exceeded"
DEFAULT_MAX_MESSAGE_SIZE = 256 * 1024
"""What a link that names no limit is taken to allow (Service Bus Standard)."""


@mypyc_attr(native_class=False)
class SendError(SourceError):
    """The entity did not take the message(s); ``condition`` says why when it said."""


class AmqpSender:
    """Sends to ``path``; with ``via``, through the entity ``via`` (send-via)."""

    def __init__(
        self,
        namespace: AmqpSource,
        path: str,
        *,
        timeout: float = 60.0,
        via: str | None = None,
        event_hub: bool = False,
    ) -> None:
        self.namespace = namespace
        self.path = path
        self.via = via
        self.event_hub = event_hub
        """``path`` is an event hub (or one of its partitions): a partition key is sent
        with every message, a session id or not (``adapters.amqp.encode``)."""
        self.timeout = timeout
        self._link: Sender | None = None
        self._connection: AmqpConnection | None = None
        self._opening = asyncio.Lock()

    @property
    def max_message_size(self) -> int:
        """The largest transfer the entity takes (its link's ``max-message-size``)."""
        remote = self._link.link.remote if self._link is not None else None
        size = remote.max_message_size if remote is not None else None
        return int(size) if size else DEFAULT_MAX_MESSAGE_SIZE

    async def _open(self) -> Sender:
        async with self._opening:
            link = self._link
            if link is not None and link.link.is_open and not link.client.driver.closed.is_set():
                return link
            try:
                connection = await self.namespace.connection()
                await connection.authorize(self.path)
                properties: dict[Any, Any] | None = None
                address = connection.endpoint.address(self.path)
                if self.via is not None:
                    await connection.authorize(self.via)
                    properties = {TRANSFER_DESTINATION: self.path}
                    address = connection.endpoint.address(self.via)
                link = await connection.client.sender(
                    address, properties=properties, timeout=self.timeout
                )
            except (AMQPError, OSError) as exc:
                where = self.path if self.via is None else f"{self.path} via {self.via}"
                raise _as_send_error(exc, f"cannot send to {where}") from exc
            self._link, self._connection = link, connection
            return link

    reports_queued = True
    """``send_messages`` takes ``queued`` (``tasks.sender.AsyncSender``)."""

    async def send_messages(
        self,
        messages: Message | list[Message],
        *,
        transaction: Transaction | None = None,
        queued: Callable[[], None] | None = None,
    ) -> None:
        """Sends one message, or a list as one batch; returns once the entity took them.
        ``transaction``: they reach the entity when it commits (nothing if it rolls back).
        ``queued``: called once they are on the link, ahead of anything sent after, before
        their outcome is in (so a caller may let the next batch go)."""
        batch = [messages] if isinstance(messages, Message) else list(messages)
        if not batch:
            return
        hub = self.event_hub
        encoded = [encode(message, event_hub=hub) for message in batch]
        if len(batch) == 1:
            payload, message_format = encoded[0], 0
        else:
            payload = outgoing.encode_batch(batch, encoded, event_hub=hub)
            message_format = outgoing.BATCH_FORMAT
        link = await self._open()
        state = None
        if transaction is not None:
            assert self._connection is not None
            state = transaction.enlist(self._connection)
        if len(payload) > self.max_message_size:
            raise SendError(
                f"{len(batch)} message(s) of {len(payload)} bytes exceed the "
                f"{self.max_message_size} bytes '{self.path}' takes",
                MESSAGE_SIZE_EXCEEDED,
            )
        future = None
        try:
            future = link.queue_encoded(payload, message_format=message_format, state=state)
            if queued is not None:
                queued()
            outcome = await asyncio.wait_for(link.outcome(future), self.timeout)
        except (AMQPError, OSError) as exc:  # TimeoutError included: no outcome in time
            self._link = None
            raise _as_send_error(exc, f"sending to {self.path} failed") from exc
        finally:
            if future is not None:
                future.cancel()  # no-op once the outcome is in
        if isinstance(outcome, TransactionalState):  # enlisted: its outcome inside
            outcome = outcome.outcome
        if isinstance(outcome, Accepted):
            return
        if isinstance(outcome, Rejected):
            error = outcome.error
            raise SendError(
                f"'{self.path}' rejected the message(s): "
                f"{getattr(error, 'description', None) or error}",
                str(getattr(error, "condition", None) or "amqp:internal-error"),
            )
        # released or modified: not taken this time (a busy or closing peer); try again
        raise SendError(f"'{self.path}' did not take the message(s): {outcome!r}")

    async def close(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            with contextlib.suppress(Exception):
                await link.close()


def _as_send_error(exc: BaseException, what: str) -> SendError:
    error = source_error(exc, what)
    return SendError(error.description, error.condition)
