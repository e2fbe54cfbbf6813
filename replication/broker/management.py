"""The ``<entity>/$management`` request/response operations of queues, topics, subscriptions.

Each request is an AMQP message with application property ``operation`` and a map body;
the response echoes the request's message-id as correlation-id and carries ``statusCode``
(200 ok, 204 nothing found), ``statusDescription`` and, on failure, ``errorCondition``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..amqp.link import Delivery
from ..amqp.message import decode_message
from ..amqp.outcomes import Accepted
from ..amqp.types import AMQPType, Array, timestamp
from . import wire
from .errors import SendRefusedError, tracked
from .peer import Peer
from .queue import (
    LockLostError,
    Queue,
    SessionLockLostError,
)
from .registry import Entity, touch
from .rules import RuleError, describe, spec_from_description
from .topic import Subscription, Topic

if TYPE_CHECKING:
    from .server import Broker  # it builds the node that calls handle_request

Operation = Callable[..., tuple[int, Any]]
MANAGEMENT_OPERATIONS: dict[str, Operation] = {}
SEND_OPERATIONS = ("com.microsoft:schedule-message", "com.microsoft:cancel-scheduled-message")
TOPIC_OPERATIONS = SEND_OPERATIONS


class ManagementError(Exception):
    def __init__(self, status: int, condition: str, description: str) -> None:
        super().__init__(description)
        self.status = status
        self.condition = condition
        self.description = description


def operation(name: str) -> Callable[[Operation], Operation]:
    def register(fn: Operation) -> Operation:
        MANAGEMENT_OPERATIONS[name] = fn
        return fn

    return register


def handle_request(broker: Broker, peer: Peer, entity: str, delivery: Delivery) -> None:
    """Runs one request and replies on the peer's ``<entity>/$management`` receiver link."""
    request = decode_message(delivery.payload)
    state = delivery.state  # the transfer's: a transactional-state enlists it (transactions.py)
    if not delivery.settled:
        delivery.update(Accepted())
    props = request.application_properties or {}
    name = str(props.get("operation", ""))
    node = entity + "/$management"
    handler = MANAGEMENT_OPERATIONS.get(name)
    try:
        target = broker.registry.entities.get(entity.lower())
        if target is None:
            raise ManagementError(
                404, "com.microsoft:entity-not-found", f"entity '{entity}' not found"
            )
        if handler is None:
            raise ManagementError(  # the SDKs do not retry this one
                501, "amqp:not-implemented", f"the operation {name!r} is not implemented"
            )
        if isinstance(target, Topic) and name not in TOPIC_OPERATIONS:
            raise ManagementError(
                400, "com.microsoft:not-supported", f"operation {name!r} on topic '{entity}'"
            )
        if name in SEND_OPERATIONS and target.name.lower() not in broker.registry.sendable:
            raise ManagementError(400, "amqp:not-allowed", f"cannot send or schedule to '{entity}'")
        # Listen for the rest, a subscription's rules too: the SDKs' rule managers need
        # "only Listen claims, whereas the administration client requires Manage claims"
        right = "Send" if name in SEND_OPERATIONS else "Listen"
        problem = broker.cbs.management_problem(peer, target.name, right)
        if problem is not None:
            raise ManagementError(401, "amqp:unauthorized-access", problem)
        touch(target, broker.now_ms())
        body = request.body if isinstance(request.body, dict) else {}
        if name == "com.microsoft:update-disposition" and isinstance(target, Queue):
            _check_session_owner(target, peer, _tokens(body), _session_id(body))  # txn or not
        enlisted = broker.transactions.enlist_request(peer, state, name, target, body)
        status, result = handler(broker, peer, target, body) if enlisted is None else enlisted
    except ManagementError as failed:
        peer.reply(
            node,
            request,
            {
                "statusCode": failed.status,
                "statusDescription": tracked(failed.description),
                "errorCondition": failed.condition,
            },
        )
        return
    except LockLostError as lost:
        condition = (
            "com.microsoft:session-lock-lost"
            if isinstance(lost, SessionLockLostError)
            else "com.microsoft:message-lock-lost"
        )
        peer.reply(
            node,
            request,
            {
                "statusCode": 410,
                "statusDescription": tracked(str(lost)),
                "errorCondition": condition,
            },
        )
        return
    except SendRefusedError as refused:
        peer.reply(
            node,
            request,
            {
                "statusCode": refused.status,
                "statusDescription": tracked(str(refused)),
                "errorCondition": refused.condition,
            },
        )
        return

    def send() -> None:
        peer.reply(node, request, {"statusCode": status, "statusDescription": "OK"}, result)
        broker.commits.wake(peer.driver)

    broker.commits.soon(send)


def _tokens(body: dict[str, Any]) -> list[uuid.UUID]:
    tokens = body.get("lock-tokens", [])
    return [t if isinstance(t, uuid.UUID) else uuid.UUID(str(t)) for t in tokens]


def _longs(values: list[int]) -> Array:
    return Array(AMQPType.LONG, [int(v) for v in values])


@operation("com.microsoft:renew-lock")
def _renew_lock(broker: Broker, peer: Peer, queue: Queue, body: dict[str, Any]) -> tuple[int, Any]:
    now = broker.now_ms()
    expirations = [timestamp(queue.renew(token, now)) for token in _tokens(body)]
    return 200, {"expirations": Array(AMQPType.TIMESTAMP, expirations)}


def _session_id(body: dict[str, Any]) -> str | None:
    value = body.get("session-id")
    return None if value is None else str(value)


@operation("com.microsoft:peek-message")
def _peek(broker: Broker, peer: Peer, queue: Queue, body: dict[str, Any]) -> tuple[int, Any]:
    start = int(body.get("from-sequence-number", 0))
    count = max(1, int(body.get("message-count", 1)))
    rows = broker.store.scan(queue.entity, start, count, _session_id(body))
    if not rows:
        return 204, {"messages": []}
    return 200, {"messages": [{"message": queue.payload(row, None)} for row in rows]}


@operation("com.microsoft:receive-by-sequence-number")
def _receive_deferred(
    broker: Broker, peer: Peer, queue: Queue, body: dict[str, Any]
) -> tuple[int, Any]:
    seqs = [int(s) for s in body.get("sequence-numbers", [])]
    receive_and_delete = int(body.get("receiver-settle-mode", 1)) == 0
    session_id = _session_id(body)
    session = None
    if session_id is not None:
        queue.check_session(session_id, broker.now_ms())
        session = queue.session_locks[session_id]
    rows = queue.deferred(seqs, session_id)
    if len(rows) != len(seqs):
        raise ManagementError(
            404,
            "com.microsoft:message-not-found",
            "some of the sequence numbers are not deferred messages of this entity",
        )
    now = broker.now_ms()
    messages: list[dict[str, Any]] = []
    for row in rows:
        if receive_and_delete:
            broker.store.delete(queue.entity, row.seq, row.size)
            messages.append({"message": queue.payload(row, None)})
            continue
        lock = queue.lock(row, now, session=session)
        messages.append({"lock-token": lock.token, "message": queue.payload(row, lock)})
    return 200, {"messages": messages}


MAX_DELETE_MESSAGE_COUNT = 4000
"""The most messages one ``batch-delete-messages`` may delete (the .NET SDK's limit)."""


@operation("com.microsoft:batch-delete-messages")
def _batch_delete(
    broker: Broker, peer: Peer, queue: Queue, body: dict[str, Any]
) -> tuple[int, Any]:
    """``deleteMessages`` / ``purgeMessages`` (JS 7.10 beta) and ``DeleteMessagesAsync``
    (.NET): messages available for delivery, enqueued before the time given, are deleted
    without being received."""
    count = int(body.get("message-count", 0))
    if not 1 <= count <= MAX_DELETE_MESSAGE_COUNT:
        raise ManagementError(
            400,
            "com.microsoft:argument-out-of-range",
            f"message-count must be from 1 to {MAX_DELETE_MESSAGE_COUNT}, got {count}",
        )
    now = broker.now_ms()
    before = body.get("enqueued-time-utc")
    session_id = _session_id(body)
    if session_id is not None and queue.sessions_enabled:
        queue.check_session(session_id, now)
    deleted = queue.delete_ready(count, now if before is None else int(before), session_id)
    if not deleted:
        raise ManagementError(
            204, "com.microsoft:message-not-found", "No messages to delete were found."
        )
    return 200, {"message-count": deleted}


@operation("com.microsoft:update-disposition")
def _update_disposition(
    broker: Broker, peer: Peer, queue: Queue, body: dict[str, Any]
) -> tuple[int, Any]:
    status = str(body.get("disposition-status", ""))
    now = broker.now_ms()
    session_id = _session_id(body)
    if session_id is not None:
        queue.check_session(session_id, now)
    for token in _tokens(body):
        if status == "completed":
            queue.complete(token, now)
        elif status == "abandoned":
            queue.abandon(token, now)
        elif status == "defered":  # sic: the SDK's spelling
            queue.defer(token, now)
        elif status == "suspended":
            queue.dead_letter_locked(
                token,
                now,
                wire.optional_text(body.get("deadletter-reason")),
                wire.optional_text(body.get("deadletter-description")),
            )
        else:
            raise ManagementError(400, "com.microsoft:argument-error", f"status {status!r}")
    return 200, {}


def _check_session_owner(
    queue: Queue, peer: Peer, tokens: list[uuid.UUID], session_id: str | None
) -> None:
    """A session's messages settle only through the session's own receiver, as on Service
    Bus: the request must name their session and come on the connection that holds its
    lock (the SDKs settle deferred session messages so). Any other connection, even one
    naming the session, gets session-lock-lost and the message stays locked."""
    for token in tokens:
        lock = queue.locks.get(token)
        if lock is None or lock.session is None:
            continue  # not a session message (or already gone: the settle says lock-lost)
        held = queue.session_locks.get(lock.session)
        owner = getattr(held.owner, "peer", None) if held is not None else None
        if session_id != lock.session or owner is not peer:
            raise SessionLockLostError(
                f"this receiver does not hold the session {lock.session!r} of {queue.name} "
                f"that the lock {token} belongs to"
            )


@operation("com.microsoft:schedule-message")
def _schedule(broker: Broker, peer: Peer, entity: Entity, body: dict[str, Any]) -> tuple[int, Any]:
    messages = [wire.parse_message(bytes(entry["message"])) for entry in body.get("messages", [])]
    return 200, {"sequence-numbers": _longs(broker.intake.send(entity, messages))}


@operation("com.microsoft:cancel-scheduled-message")
def _cancel(broker: Broker, peer: Peer, entity: Entity, body: dict[str, Any]) -> tuple[int, Any]:
    entity.cancel_scheduled([int(s) for s in body.get("sequence-numbers", [])])
    return 200, {}


# ---------------------------------------------------------------------- sessions


@operation("com.microsoft:renew-session-lock")
def _renew_session(
    broker: Broker, peer: Peer, queue: Queue, body: dict[str, Any]
) -> tuple[int, Any]:
    session_id = _required_session(queue, body)
    return 200, {"expiration": timestamp(queue.renew_session(session_id, broker.now_ms()))}


@operation("com.microsoft:get-session-state")
def _get_session_state(
    broker: Broker, peer: Peer, queue: Queue, body: dict[str, Any]
) -> tuple[int, Any]:
    session_id = _required_session(queue, body)
    queue.check_session(session_id, broker.now_ms())
    return 200, {"session-state": broker.store.session_state(queue.entity, session_id)}


@operation("com.microsoft:set-session-state")
def _set_session_state(
    broker: Broker, peer: Peer, queue: Queue, body: dict[str, Any]
) -> tuple[int, Any]:
    session_id = _required_session(queue, body)
    now = broker.now_ms()
    queue.check_session(session_id, now)
    state = body.get("session-state")
    if state is not None:
        state = (
            bytes(state)
            if isinstance(state, (bytes, bytearray, memoryview))
            else (str(state).encode())
        )
        if len(state) > queue.settings.max_message_size:
            raise ManagementError(
                400,
                "com.microsoft:argument-out-of-range",
                f"session state of {len(state)} bytes exceeds the limit of "
                f"{queue.settings.max_message_size} bytes",
            )
    broker.store.set_session_state(queue.entity, session_id, state, now)
    return 200, {}


DATETIME_MAX_MS = 253_402_300_799_999
""".NET's DateTime.MaxValue (9999-12-31T23:59:59.9999999Z) in whole milliseconds. Clients send
it as 253402300800000 (rounded up: the Python SDK 7.15, .NET, Java); .NET's decoder clamps
anything beyond it back to MaxValue, and Service Bus compares with MaxValue to pick the
listing without a cutoff. So any time from this one on means "no cutoff"."""


@operation("com.microsoft:get-message-sessions")
def _get_message_sessions(
    broker: Broker, peer: Peer, queue: Queue, body: dict[str, Any]
) -> tuple[int, Any]:
    if not queue.sessions_enabled:
        raise ManagementError(400, "amqp:not-allowed", f"'{queue.name}' does not require sessions")
    since = body.get("last-updated-time")
    since_ms = int(since) if since is not None else None
    if since_ms is not None and (since_ms <= 0 or since_ms >= DATETIME_MAX_MS):
        # DateTime.MaxValue (the Python SDK 7.15 and .NET send it for "no cutoff"), or
        # MinValue (older clients): every session with active messages or stored state
        since_ms = None
    skip = int(body.get("skip", 0))
    top = int(body.get("top", 2**31 - 1))
    ids = broker.store.session_ids(queue.entity, since_ms)[skip : skip + top]
    if not ids:
        return 204, {"sessions-ids": []}
    return 200, {"skip": skip + len(ids), "sessions-ids": ids}


def _required_session(queue: Queue, body: dict[str, Any]) -> str:
    session_id = _session_id(body)
    if session_id is None:
        raise ManagementError(400, "com.microsoft:argument-error", "session-id is required")
    if not queue.sessions_enabled:
        raise ManagementError(400, "amqp:not-allowed", f"'{queue.name}' does not require sessions")
    return session_id


# ---------------------------------------------------------------------- rules


def _subscription(broker: Broker, queue: Queue) -> Subscription:
    subscription = broker.registry.subscriptions.get(queue.name.lower())
    if subscription is None:
        raise ManagementError(
            400, "amqp:not-allowed", f"'{queue.name}' is not a subscription: it has no rules"
        )
    return subscription


@operation("com.microsoft:add-rule")
def _add_rule(broker: Broker, peer: Peer, queue: Queue, body: dict[str, Any]) -> tuple[int, Any]:
    subscription = _subscription(broker, queue)
    name = str(body.get("rule-name") or "")
    description = body.get("rule-description")
    if not name or not isinstance(description, dict):
        raise ManagementError(
            400, "com.microsoft:argument-error", "rule-name and rule-description are required"
        )
    try:
        subscription.rules.add(spec_from_description(name, description))
    except RuleError as bad_rule:
        raise ManagementError(400, "com.microsoft:argument-error", str(bad_rule)) from bad_rule
    except KeyError as exc:
        raise ManagementError(
            409,
            "com.microsoft:entity-already-exists",
            f"a rule named '{name}' already exists on '{queue.name}'",
        ) from exc
    broker.registry.save_rules(subscription)
    return 200, {}


@operation("com.microsoft:remove-rule")
def _remove_rule(broker: Broker, peer: Peer, queue: Queue, body: dict[str, Any]) -> tuple[int, Any]:
    subscription = _subscription(broker, queue)
    name = str(body.get("rule-name") or "")
    try:
        subscription.rules.remove(name)
    except KeyError as exc:
        raise ManagementError(
            404, "com.microsoft:entity-not-found", f"no rule named '{name}' on '{queue.name}'"
        ) from exc
    broker.registry.save_rules(subscription)
    return 200, {}


@operation("com.microsoft:enumerate-rules")
def _enumerate_rules(
    broker: Broker, peer: Peer, queue: Queue, body: dict[str, Any]
) -> tuple[int, Any]:
    subscription = _subscription(broker, queue)
    skip = int(body.get("skip", 0))
    top = int(body.get("top", 2**31 - 1))
    specs = subscription.rules.specs[skip : skip + top]
    if not specs:
        return 204, {"rules": []}
    return 200, {"rules": [{"rule-description": describe(spec)} for spec in specs]}
