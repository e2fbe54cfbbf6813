"""The ``<entity>/$management`` request/response operations the SDK uses on queues.

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
from .queue import LockLostError, Queue, now_ms

if TYPE_CHECKING:
    from .server import Broker, Peer

Operation = Callable[..., tuple[int, Any]]
MANAGEMENT_OPERATIONS: dict[str, Operation] = {}
SEND_OPERATIONS = ("com.microsoft:schedule-message", "com.microsoft:cancel-scheduled-message")


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
        queue = broker.queues.get(entity.lower())
        if queue is None:
            raise ManagementError(
                404, "com.microsoft:entity-not-found", f"entity '{entity}' not found"
            )
        if handler is None:
            raise ManagementError(400, "com.microsoft:not-supported", f"operation {name!r}")
        right = "Send" if name in SEND_OPERATIONS else "Listen"
        problem = broker._authorization_problem(peer, queue.name, right)
        if problem is not None:
            raise ManagementError(401, "amqp:unauthorized-access", problem)
        body = request.body if isinstance(request.body, dict) else {}
        enlisted = broker.transactions.enlist_request(peer, state, name, queue, body)
        status, result = handler(broker, peer, queue, body) if enlisted is None else enlisted
    except ManagementError as exc:
        broker._reply(peer, node, request, {
            "statusCode": exc.status, "statusDescription": exc.description,
            "errorCondition": exc.condition,
        })  # fmt: skip
        return
    except LockLostError as exc:
        broker._reply(peer, node, request, {
            "statusCode": 410, "statusDescription": str(exc),
            "errorCondition": "com.microsoft:message-lock-lost",
        })  # fmt: skip
        return

    def send() -> None:
        broker._reply(
            peer, node, request, {"statusCode": status, "statusDescription": "OK"}, result
        )
        broker._touched.add(peer.driver)

    broker._commit_soon(send)


def _tokens(body: dict[str, Any]) -> list[uuid.UUID]:
    tokens = body.get("lock-tokens", [])
    return [t if isinstance(t, uuid.UUID) else uuid.UUID(str(t)) for t in tokens]


def _longs(values: list[int]) -> Array:
    return Array(AMQPType.LONG, [int(v) for v in values])


@operation("com.microsoft:renew-lock")
def _renew_lock(broker: Broker, peer: Peer, queue: Queue, body: dict[str, Any]) -> tuple[int, Any]:
    now = now_ms()
    expirations = [timestamp(queue.renew(token, now)) for token in _tokens(body)]
    return 200, {"expirations": Array(AMQPType.TIMESTAMP, expirations)}


@operation("com.microsoft:peek-message")
def _peek(broker: Broker, peer: Peer, queue: Queue, body: dict[str, Any]) -> tuple[int, Any]:
    start = int(body.get("from-sequence-number", 0))
    count = max(1, int(body.get("message-count", 1)))
    rows = broker.store.scan(queue.entity, start, count)
    if not rows:
        return 204, {"messages": []}
    return 200, {"messages": [{"message": queue.payload(row, None)} for row in rows]}


@operation("com.microsoft:receive-by-sequence-number")
def _receive_deferred(
    broker: Broker, peer: Peer, queue: Queue, body: dict[str, Any]
) -> tuple[int, Any]:
    seqs = [int(s) for s in body.get("sequence-numbers", [])]
    receive_and_delete = int(body.get("receiver-settle-mode", 1)) == 0
    rows = queue.deferred(seqs)
    if len(rows) != len(seqs):
        raise ManagementError(
            404, "com.microsoft:message-not-found",
            "some of the sequence numbers are not deferred messages of this entity",
        )  # fmt: skip
    now = now_ms()
    messages = []
    for row in rows:
        if receive_and_delete:
            broker.store.delete(queue.entity, row.seq)
            messages.append({"message": queue.payload(row, None)})
            continue
        lock = queue.lock(row, now)
        messages.append({"lock-token": lock.token, "message": queue.payload(row, lock)})
    return 200, {"messages": messages}


@operation("com.microsoft:update-disposition")
def _update_disposition(
    broker: Broker, peer: Peer, queue: Queue, body: dict[str, Any]
) -> tuple[int, Any]:
    status = str(body.get("disposition-status", ""))
    now = now_ms()
    for token in _tokens(body):
        if status == "completed":
            queue.complete(token, now)
        elif status == "abandoned":
            queue.abandon(token, now)
        elif status == "defered":  # sic: the SDK's spelling
            queue.defer(token, now)
        elif status == "suspended":
            queue.dead_letter_locked(
                token, now, wire.optional_text(body.get("deadletter-reason")),
                wire.optional_text(body.get("deadletter-description")),
            )  # fmt: skip
        else:
            raise ManagementError(400, "com.microsoft:argument-error", f"status {status!r}")
    return 200, {}


@operation("com.microsoft:schedule-message")
def _schedule(broker: Broker, peer: Peer, queue: Queue, body: dict[str, Any]) -> tuple[int, Any]:
    now = now_ms()
    seqs = []
    for entry in body.get("messages", []):
        message = wire.parse_message(bytes(entry["message"]))
        seq = queue.enqueue(message, now)
        if seq is not None:
            seqs.append(seq)
    return 200, {"sequence-numbers": _longs(seqs)}


@operation("com.microsoft:cancel-scheduled-message")
def _cancel(broker: Broker, peer: Peer, queue: Queue, body: dict[str, Any]) -> tuple[int, Any]:
    queue.cancel_scheduled([int(s) for s in body.get("sequence-numbers", [])])
    return 200, {}

