"""Service Bus ``$management`` requests over our AMQP connection, typed as the SDKs offer them:
renewing message and session locks while work on them is still in flight (a Spark
micro-batch can outlast a lock), peeking at what an entity holds without locking or taking
it (``python -m replication peek``), session state, scheduling and cancelling messages,
receiving deferred messages by sequence number and settling them, and a subscription's rules.

A request goes on a sender link to ``<entity>/$management`` with ``operation`` in the
application properties (and, as azure-servicebus sends them, ``com.microsoft:server-timeout``
in ms and, for a receiver's messages or session, ``associated-link-name``) and a map body;
the answer comes on a receiver link from the same node, matched by ``correlation-id``, with
``statusCode`` in its application properties (2xx: done; 204: nothing found) and, on
failure, ``statusDescription`` and ``errorCondition``, raised as the ``SourceError`` the
condition stands for (``client.error_for``: ``MessageLockLost``, ``SessionLockLost``,
``MessageNotFound``, ``EntityNotFound``, ``EntityAlreadyExists``, ...). The body maps are
the SDK's (``azure/servicebus/_servicebus_sender.py``, ``_servicebus_receiver.py``,
``_servicebus_session.py``; rules as the .NET and JavaScript SDKs send them: ``rules.py``).
Lock tokens are the delivery tags read as .NET GUIDs (``UUID(bytes_le=tag)``).

Requests that may be part of a transaction take ``transaction=`` (update-disposition and
cancel-scheduled-message): the request transfer carries its ``TransactionalState``, as the
.NET and Java SDKs send it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from ..adapters.amqp import decode_to_message, encode
from ..amqp import scan
from ..amqp.client import ReceivedMessage
from ..amqp.message import decode_message
from ..amqp.types import AMQPType, Array, int32, uint
from ..messages import Message
from ..symbols import (
    ASSOCIATED_LINK_NAME,
    ENQUEUED_TIME,
    MESSAGE_STATE,
    SEQUENCE_NUMBER,
    SERVER_TIMEOUT,
)
from .client import AmqpConnection, AmqpReceiver
from .management_link import SERVICE_BUS_STATUS, ManagementLink
from .rules import (
    TRUE_FILTER,
    Rule,
    RuleFilter,
    SqlAction,
    rule_description,
    rule_from_description,
)

if TYPE_CHECKING:
    from .transactions import Transaction

Settlement = Literal["complete", "abandon", "defer", "dead-letter"]
DISPOSITION_STATUS: dict[str, str] = {
    "complete": "completed",
    "abandon": "abandoned",
    "defer": "defered",  # sic
    "dead-letter": "suspended",
}
"""update-disposition's ``disposition-status`` for each settlement (the SDK's
``MESSAGE_MGMT_SETTLEMENT_TERM_MAP``, its spelling included)."""
PEEK_LOCK, RECEIVE_AND_DELETE = 1, 0
"""``receiver-settle-mode`` of receive-by-sequence-number (the AMQP rcv-settle-mode the
receive mode stands for: second = peek-lock, first = receive-and-delete)."""


@dataclass(frozen=True, slots=True)
class ManagementLock:
    """The lock of a message received through ``$management`` (a deferred message): it
    settles with update-disposition on ``path``'s node (``Management.settle``), not on a
    link; ``session_id`` names its session's lock, which it is held under."""

    path: str
    token: uuid.UUID
    session_id: str | None = None


ACTIVE, DEFERRED, SCHEDULED = 0, 1, 2
"""``x-opt-message-state`` of a peeked message (the SDK's ``ServiceBusMessageState``)."""


@dataclass(frozen=True, slots=True)
class PeekedHead:
    """What a peek tells of a message's place and age, without its body."""

    sequence_number: int
    """-1 when the message has none (then nothing can be peeked past it)."""
    enqueued_ms: int | None
    state: int = ACTIVE
    """``ACTIVE`` (or locked: a peek cannot tell), ``DEFERRED`` or ``SCHEDULED``."""
    ttl_ms: int | None = None

    def expired(self, now_ms: int) -> bool:
        """Its time to live has run out: it goes (or to the dead-letter queue) at the next
        receive, whatever anyone does (a peek may still show it)."""
        return (
            self.ttl_ms is not None
            and self.enqueued_ms is not None
            and self.enqueued_ms + self.ttl_ms <= now_ms
        )


_HEAD_ANNOTATIONS = {
    str(SEQUENCE_NUMBER).encode(): "sequence",
    str(ENQUEUED_TIME).encode(): "enqueued",
    str(MESSAGE_STATE).encode(): "state",
}


def peeked_head(payload: bytes) -> PeekedHead:
    """The ``PeekedHead`` of a peek reply's message: its annotations and header read where
    they are (``amqp.scan``), the body skipped; the general decoder for anything else."""
    try:
        sections = scan.scan(payload)
        found = (
            scan.pick(payload, sections.annotations_at, _HEAD_ANNOTATIONS)
            if sections.annotations_at >= 0
            else {}
        )
        ttl = sections.header[2] if sections.header is not None else None
    except scan.Unusual:
        amqp = decode_message(payload)
        annotations = amqp.message_annotations or {}
        found = {name: annotations.get(key) for key, name in _HEAD_KEYS.items()}
        ttl = amqp.header.ttl if amqp.header is not None else None
    return PeekedHead(
        _whole(found.get("sequence"), -1),
        _milliseconds(found.get("enqueued")),
        _whole(found.get("state"), ACTIVE),
        ttl if isinstance(ttl, int) else None,
    )


_HEAD_KEYS = {SEQUENCE_NUMBER: "sequence", ENQUEUED_TIME: "enqueued", MESSAGE_STATE: "state"}


def _whole(value: Any, default: int) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else default


def _milliseconds(value: Any) -> int | None:
    """A timestamp annotation as ms since the epoch (the codec may give a datetime)."""
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def lock_key(message: Message) -> bytes | None:
    """What identifies a message's lock, cheaply: its delivery tag (None if not ours)."""
    received = message.source
    if isinstance(received, ReceivedMessage):
        return bytes(received.delivery.tag)
    if isinstance(received, ManagementLock):
        return received.token.bytes_le
    return None


def lock_token(message: Message) -> uuid.UUID | None:
    """The lock token of a message received with ``AmqpReceiver`` or by sequence number
    (None for others)."""
    received = message.source
    if isinstance(received, ReceivedMessage):
        return uuid.UUID(bytes_le=bytes(received.delivery.tag))
    if isinstance(received, ManagementLock):
        return received.token
    return None


class Management:
    """One request/response link pair per entity on a connection, opened on first use."""

    def __init__(self, connection: AmqpConnection) -> None:
        self.connection = connection
        self._links: dict[str, ManagementLink] = {}

    async def request(
        self,
        path: str,
        operation: str,
        body: dict[str, Any],
        *,
        associated_link: str | None = None,
        transaction: Transaction | None = None,
    ) -> dict[str, Any]:
        """Runs ``operation`` on ``path``'s management node; the reply body, or the
        ``SourceError`` its status and condition stand for (``client.error_for``).
        ``associated_link``: the receiver link whose messages or session it is about;
        ``transaction``: the request is part of it (the service applies it at commit)."""
        state = None if transaction is None else transaction.enlist(self.connection)
        link = await self._link(path)
        properties: dict[str, Any] = {
            "operation": operation,
            SERVER_TIMEOUT: uint(min(2**32 - 1, int(self.connection.timeout * 1000))),
        }
        if associated_link is not None:
            properties[ASSOCIATED_LINK_NAME] = associated_link
        return await link.request(properties, body, f"{operation} on {path}", state=state)

    async def renew_locks(self, receiver: AmqpReceiver, messages: Iterable[Message]) -> datetime:
        """Renews the locks of ``messages`` (received on ``receiver``); the earliest new
        expiry. A session receiver renews its session lock instead (messages of a session
        are locked by it)."""
        if receiver.session_id is not None:
            reply = await self.request(
                receiver.path,
                "com.microsoft:renew-session-lock",
                {"session-id": receiver.session_id},
            )
            return _utc(reply.get("expiration"))
        tokens = [t for t in map(lock_token, messages) if t is not None]
        if not tokens:
            return datetime.now(UTC)
        reply = await self.request(
            receiver.path, "com.microsoft:renew-lock", {"lock-tokens": tokens}
        )
        expirations = [_utc(e) for e in reply.get("expirations") or []]
        return min(expirations, default=datetime.now(UTC))

    async def peek(
        self,
        path: str,
        count: int = 1,
        *,
        from_sequence_number: int = 1,
        session_id: str | None = None,
    ) -> list[Message]:
        """Up to ``count`` messages of ``path`` from ``from_sequence_number`` on, in sequence
        order, without locking them (``path`` may end in ``/$DeadLetterQueue``); of one
        session when ``session_id`` is given. A reply may hold fewer than asked (Service Bus
        does not promise them all at once), so it asks again from past the last one until
        it has ``count`` or the entity gives none."""
        payloads = await self._peek_payloads(path, count, from_sequence_number, session_id)
        return [decode_to_message(payload) for payload in payloads]

    async def peek_heads(
        self, path: str, count: int = 1, *, from_sequence_number: int = 1
    ) -> list[PeekedHead]:
        """As ``peek``, but only what tells a message's place and age (``PeekedHead``): the
        bodies are dropped as each reply is read, so a caller that must not hold them (the
        Spark driver) never does."""
        payloads = await self._peek_payloads(path, count, from_sequence_number, None)
        return [peeked_head(payload) for payload in payloads]

    async def _peek_payloads(
        self, path: str, count: int, start: int, session_id: str | None
    ) -> list[bytes]:
        peeked: list[bytes] = []
        while len(peeked) < count:
            body: dict[str, Any] = {
                "from-sequence-number": start,
                "message-count": int32(count - len(peeked)),
            }
            if session_id is not None:
                body["session-id"] = session_id
            reply = await self.request(path, "com.microsoft:peek-message", body)
            batch = [
                bytes(item["message"])
                for item in reply.get("messages") or []
                if isinstance(item, dict) and "message" in item
            ]
            if not batch:
                break
            last = peeked_head(batch[-1]).sequence_number
            peeked.extend(batch[: count - len(peeked)])
            if last < start:  # no way to go on past it
                break
            start = last + 1
        return peeked

    # ------------------------------------------------------------------ sessions

    async def get_session_state(self, receiver: AmqpReceiver) -> bytes | None:
        """The state of the session ``receiver`` holds (None when none was set)."""
        reply = await self._session_request(receiver, "com.microsoft:get-session-state", {})
        state = reply.get("session-state")
        return None if state is None else bytes(state)

    async def set_session_state(self, receiver: AmqpReceiver, state: bytes | str | None) -> None:
        """Sets (None: clears) the state of the session ``receiver`` holds; a ``str`` is
        stored as its UTF-8 bytes, as the SDK stores it."""
        value = state.encode("utf-8") if isinstance(state, str) else state
        await self._session_request(
            receiver,
            "com.microsoft:set-session-state",
            {
                "session-state": None if value is None else bytes(value),
            },
        )

    async def renew_session_lock(self, receiver: AmqpReceiver) -> datetime:
        """Renews the lock of the session ``receiver`` holds; its new expiry."""
        reply = await self._session_request(receiver, "com.microsoft:renew-session-lock", {})
        expiry = _utc(reply.get("expiration"))
        receiver.session_locked_until = expiry
        return expiry

    async def _session_request(
        self, receiver: AmqpReceiver, operation: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        if receiver.session_id is None:
            raise ValueError(
                f"{operation}: the receiver on {receiver.path} holds no session (open it "
                "with session=True)"
            )
        return await self.request(
            receiver.path,
            operation,
            {"session-id": receiver.session_id, **body},
            associated_link=receiver.link.link.name,
        )

    # ------------------------------------------------------------------ scheduling

    async def schedule_messages(
        self, path: str, messages: Message | Iterable[Message], when: datetime
    ) -> list[int]:
        """Enqueues ``messages`` at ``when`` (the entity holds them until then); their
        sequence numbers, for ``cancel_scheduled_messages``. Each is sent as the SDK
        schedules it: encoded with the scheduled time, its message-id (made up when it has
        none), session id and partition key beside it."""
        batch = [messages] if isinstance(messages, Message) else list(messages)
        if not batch:
            return []
        entries = []
        for message in batch:
            message_id = message.message_id if message.message_id is not None else str(uuid.uuid4())
            scheduled = message.copy(message_id=message_id, scheduled_enqueue_time=when)
            entry: dict[str, Any] = {"message-id": message_id}
            if message.session_id:
                entry["session-id"] = message.session_id
            if message.partition_key:
                entry["partition-key"] = message.partition_key
            entry["message"] = encode(scheduled)
            entries.append(entry)
        reply = await self.request(path, "com.microsoft:schedule-message", {"messages": entries})
        return [int(n) for n in reply.get("sequence-numbers") or []]

    async def cancel_scheduled_messages(
        self,
        path: str,
        sequence_numbers: int | Iterable[int],
        *,
        transaction: Transaction | None = None,
    ) -> None:
        """Cancels scheduled messages (``MessageNotFound`` for one that is not, or no
        longer, scheduled)."""
        numbers = _longs(sequence_numbers)
        if not numbers:
            return
        await self.request(
            path,
            "com.microsoft:cancel-scheduled-message",
            {"sequence-numbers": numbers},
            transaction=transaction,
        )

    # ------------------------------------------------------------------ deferred messages

    async def receive_deferred_messages(
        self,
        path: str,
        sequence_numbers: int | Iterable[int],
        *,
        session: AmqpReceiver | None = None,
        receive_and_delete: bool = False,
    ) -> list[Message]:
        """The deferred messages of ``path`` with these sequence numbers (of the session
        ``session`` holds, for a session entity), locked for this connection (settle them
        with ``settle``) or, with ``receive_and_delete``, taken. ``MessageNotFound`` when one
        is not a deferred message of the entity."""
        numbers = _longs(sequence_numbers)
        if not numbers:
            return []
        body: dict[str, Any] = {
            "sequence-numbers": numbers,
            "receiver-settle-mode": uint(RECEIVE_AND_DELETE if receive_and_delete else PEEK_LOCK),
        }
        link: str | None = None
        session_id = None if session is None else session.session_id
        if session is not None:
            if session_id is None:
                raise ValueError(f"the receiver on {session.path} holds no session")
            body["session-id"] = session_id
            link = session.link.link.name
        reply = await self.request(
            path, "com.microsoft:receive-by-sequence-number", body, associated_link=link
        )
        messages = []
        for item in reply.get("messages") or []:
            if not isinstance(item, dict) or "message" not in item:
                continue
            token = item.get("lock-token")
            source = None
            if token is not None and not receive_and_delete:
                token = token if isinstance(token, uuid.UUID) else uuid.UUID(str(token))
                source = ManagementLock(path, token, session_id)
            messages.append(decode_to_message(bytes(item["message"]), source))
        return messages

    async def settle(
        self,
        messages: Iterable[Message],
        settlement: Settlement,
        *,
        reason: str = "",
        description: str = "",
        transaction: Transaction | None = None,
    ) -> int:
        """Settles messages by lock token over ``$management`` (update-disposition), as the
        SDKs settle deferred messages: those ``receive_deferred_messages`` returned (and any
        of an ``AmqpReceiver`` on this connection, given its ``path``). ``reason`` and
        ``description`` go with a dead-letter. How many were settled."""
        status = DISPOSITION_STATUS[settlement]
        groups: dict[tuple[str, str | None], list[uuid.UUID]] = {}
        for message in messages:
            source = message.source
            if isinstance(source, ManagementLock):
                key = (source.path, source.session_id)
                groups.setdefault(key, []).append(source.token)
            elif isinstance(source, ReceivedMessage):
                raise ValueError("a message received on a link settles on its link (AmqpReceiver)")
        for (path, session_id), tokens in groups.items():
            body: dict[str, Any] = {
                "disposition-status": status,
                "lock-tokens": Array(AMQPType.UUID, tokens),
            }
            if session_id is not None:
                body["session-id"] = session_id
            if settlement == "dead-letter":
                body["deadletter-reason"] = reason[:256]
                body["deadletter-description"] = description[:1024]
            await self.request(
                path, "com.microsoft:update-disposition", body, transaction=transaction
            )
        return sum(len(tokens) for tokens in groups.values())

    # ------------------------------------------------------------------ rules

    async def add_rule(
        self,
        path: str,
        rule: Rule | str,
        rule_filter: RuleFilter | None = None,
        action: SqlAction | None = None,
    ) -> None:
        """Adds a rule to the subscription ``path`` (``topic/Subscriptions/name``): a
        ``Rule``, or its name, filter and action. ``EntityAlreadyExists`` when a rule of that
        name exists; a SQL error comes back as ``SourceError`` (argument-error)."""
        if isinstance(rule, str):
            rule = Rule(rule, TRUE_FILTER if rule_filter is None else rule_filter, action)
        elif rule_filter is not None or action is not None:
            raise TypeError("give a Rule, or a name with its filter and action, not both")
        await self.request(
            path,
            "com.microsoft:add-rule",
            {
                "rule-name": rule.name,
                "rule-description": rule_description(rule),
            },
        )

    async def remove_rule(self, path: str, name: str) -> None:
        """Removes the subscription's rule ``name`` (``EntityNotFound`` when there is none)."""
        await self.request(path, "com.microsoft:remove-rule", {"rule-name": name})

    async def list_rules(self, path: str, *, skip: int = 0, top: int | None = None) -> list[Rule]:
        """The subscription's rules, in the order the service keeps them."""
        reply = await self.request(
            path,
            "com.microsoft:enumerate-rules",
            {
                "top": int32(2**31 - 1 if top is None else top),
                "skip": int32(skip),
            },
        )
        return [
            rule_from_description(item["rule-description"])
            for item in reply.get("rules") or []
            if isinstance(item, dict) and "rule-description" in item
        ]

    # ------------------------------------------------------------------ links

    async def _link(self, path: str) -> ManagementLink:
        node = f"{path}/$management"
        link = self._links.get(node)
        if link is None:
            await self.connection.authorize(path)
            link = await ManagementLink.attach(self.connection, node, SERVICE_BUS_STATUS)
            self._links[node] = link
        return link


def _longs(sequence_numbers: int | Iterable[int]) -> Array:
    numbers = [sequence_numbers] if isinstance(sequence_numbers, int) else sequence_numbers
    return Array(AMQPType.LONG, [int(n) for n in numbers])


def _utc(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value / 1000, UTC)
    return datetime.now(UTC)
