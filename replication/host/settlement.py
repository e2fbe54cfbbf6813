"""The host side of ``ServiceBusMessageActions``: the ``Settlement`` gRPC service.

The Functions host serves ``settlement.proto`` (shipped with
``azurefunctions-extensions-bindings-servicebus``) next to its worker channel; a function's
``message_actions.complete(message)`` becomes ``Complete(locktoken)`` there, and the host
settles the message on the receiver that holds it. Ours does the same for the local host:
one server per process (the extension's client is a process-wide singleton), on a port from
the OS, serving every trigger of every host in the process, for the functions in its worker
processes (``process.py``) as for those on a worker thread. A trigger registers the
messages it hands a function (``hold``) and the session it holds (``hold_session``); the
calls reach them on the trigger's own event loop, and go through the receiver of either
backend (``AmqpReceiver``, or ``SdkReceiver`` for ``backend: sdk``: lock renewal and
session state through the SDK's own calls).

Errors are the service's: an unknown lock token or session is ``FAILED_PRECONDITION``
(``LockToken ... not found.``), a message whose link is gone (its lock with it) is
``ABORTED``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from azurefunctions.extensions.bindings.protos import settlement_pb2 as pb
from azurefunctions.extensions.bindings.protos import settlement_pb2_grpc as pb_grpc
from google.protobuf import empty_pb2

from ..amqp import codec
from ..messages import Message
from ..servicebus.client import SourceError
from ..servicebus.sdk_source import SourceReceiver
from ..tasks.locks import lock_lost, management_of, renew_on

log = logging.getLogger("replication.host.settlement")

T = TypeVar("T")
MAX_MESSAGE_LENGTH = 2_147_483_647
"""What the Functions host passes as ``--functions-grpc-max-message-length``."""
CALL_TIMEOUT = 60.0


@dataclass(slots=True)
class Held:
    """A message a function holds, as the host knows it."""

    message: Message
    receiver: SourceReceiver
    loop: asyncio.AbstractEventLoop
    outcome: str | None = None
    """``complete``, ``abandon``, ``deadletter`` or ``defer`` once settled."""


@dataclass(slots=True)
class HeldSession:
    """A session a trigger holds: its receiver, and whether the function let it go."""

    receiver: SourceReceiver
    loop: asyncio.AbstractEventLoop
    released: bool = False
    abandoned: set[str] = field(default_factory=set)


class SettlementService(pb_grpc.SettlementServicer):
    """The registry of held messages and sessions, and the servicer that settles them."""

    _shared: SettlementService | None = None
    _shared_lock = threading.Lock()

    def __init__(self) -> None:
        self._messages: dict[str, Held] = {}
        self._sessions: dict[str, HeldSession] = {}
        self._lock = threading.Lock()
        self.port = 0
        self._server: grpc.Server | None = None

    @classmethod
    def shared(cls) -> SettlementService:
        """The process's service, started on first use."""
        with cls._shared_lock:
            if cls._shared is None:
                service = cls()
                service.start()
                cls._shared = service
            return cls._shared

    def start(self) -> None:
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_LENGTH),
            ("grpc.max_receive_message_length", MAX_MESSAGE_LENGTH),
        ]
        server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="settlement"),
            options=options,
        )
        pb_grpc.add_SettlementServicer_to_server(self, server)
        self.port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server = server
        log.info("settlement service on 127.0.0.1:%d", self.port)

    def worker_arguments(self) -> list[str]:
        """What the Functions host puts on the worker's command line for this service."""
        return [
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--functions-grpc-max-message-length",
            str(MAX_MESSAGE_LENGTH),
        ]

    # -- the registry (called on a trigger's loop)

    def hold(self, token: uuid.UUID, held: Held) -> None:
        with self._lock:
            self._messages[str(token)] = held

    def let_go(self, token: uuid.UUID) -> Held | None:
        with self._lock:
            return self._messages.pop(str(token), None)

    def hold_session(self, session_id: str, held: HeldSession) -> None:
        with self._lock:
            self._sessions[session_id] = held

    def let_go_session(self, session_id: str, held: HeldSession) -> None:
        with self._lock:
            if self._sessions.get(session_id) is held:
                del self._sessions[session_id]

    # -- the service (called on gRPC's threads)

    def Complete(self, request: Any, context: Any) -> Any:
        held = self._held(request.locktoken, context)
        self._settle(held, "complete", lambda: held.receiver.complete([held.message]), context)
        return empty_pb2.Empty()

    def Abandon(self, request: Any, context: Any) -> Any:
        return self._modify(request, context, "abandon")

    def Deadletter(self, request: Any, context: Any) -> Any:
        held = self._held(request.locktoken, context)
        # a field the function did not give is left off the message, as the .NET SDK does
        reason = request.deadletterReason.value if request.HasField("deadletterReason") else None
        description = (
            request.deadletterErrorDescription.value
            if request.HasField("deadletterErrorDescription")
            else None
        )
        self._settle(
            held,
            "deadletter",
            lambda: held.receiver.dead_letter(held.message, reason, description),
            context,
        )
        return empty_pb2.Empty()

    def Defer(self, request: Any, context: Any) -> Any:
        return self._modify(request, context, "defer")

    def _modify(self, request: Any, context: Any, outcome: str) -> Any:
        """Abandon or defer, with the properties to change on the message."""
        held = self._held(request.locktoken, context)
        annotations = _properties(request.propertiesToModify, context)
        settle = held.receiver.abandon if outcome == "abandon" else held.receiver.defer
        self._settle(held, outcome, lambda: settle([held.message], annotations), context)
        return empty_pb2.Empty()

    def RenewMessageLock(self, request: Any, context: Any) -> Any:
        held = self._held(request.locktoken, context)
        management = management_of(held.receiver)
        self._await(held.loop, lambda: renew_on(management, held.receiver, [held.message]), context)
        return empty_pb2.Empty()

    def GetSessionState(self, request: Any, context: Any) -> Any:
        session = self._session(request.sessionId, context)
        reply = self._await(
            session.loop,
            lambda: _session_request(session.receiver, "com.microsoft:get-session-state", {}),
            context,
        )
        state = reply.get("session-state")
        return pb.GetSessionStateResponse(sessionState=bytes(state or b""))

    def SetSessionState(self, request: Any, context: Any) -> Any:
        session = self._session(request.sessionId, context)
        state = bytes(request.sessionState) if request.sessionState else None
        self._await(
            session.loop,
            lambda: _session_request(
                session.receiver, "com.microsoft:set-session-state", {"session-state": state}
            ),
            context,
        )
        return empty_pb2.Empty()

    def ReleaseSession(self, request: Any, context: Any) -> Any:
        session = self._session(request.sessionId, context)
        session.released = True
        return empty_pb2.Empty()

    def RenewSessionLock(self, request: Any, context: Any) -> Any:
        session = self._session(request.sessionId, context)
        management = management_of(session.receiver)
        until = self._await(
            session.loop, lambda: renew_on(management, session.receiver, []), context
        )
        session.receiver.session_locked_until = until
        reply = pb.RenewSessionLockResponse()
        reply.lockedUntil.FromDatetime(until)
        return reply

    # -- helpers

    def _held(self, token: str, context: Any) -> Held:
        with self._lock:
            held = self._messages.get(str(token).lower())
        if held is None or held.outcome is not None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"LockToken {token} not found.")
        assert held is not None
        return held

    def _session(self, session_id: str, context: Any) -> HeldSession:
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"Session {session_id} not found.")
        assert session is not None
        return session

    def _settle(self, held: Held, outcome: str, settle: Callable[[], int], context: Any) -> None:
        """Settles on the trigger's loop without waiting for it: the disposition goes out
        with the loop's next turn, as every settlement of ours does (sent settled, not
        confirmed; a lost one means a redelivery). A closed link means a lost lock."""
        if not held.receiver.is_open:
            context.abort(
                grpc.StatusCode.ABORTED,
                f"the lock of message {held.message.message_id} is lost "
                f"(its receiver on {held.receiver.path} is closed)",
            )
        held.outcome = outcome
        try:
            held.loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop is closed: the host stopped, the lock went with it
            held.outcome = None
            context.abort(grpc.StatusCode.UNAVAILABLE, "the host is stopping")
        if outcome == "abandon" and held.message.session_id is not None:
            with self._lock:
                session = self._sessions.get(held.message.session_id)
            if session is not None:
                session.abandoned.add(str(held.message.message_id))

    def _await(
        self, loop: asyncio.AbstractEventLoop, make: Callable[[], Awaitable[T]], context: Any
    ) -> T:
        async def run() -> T:
            return await make()

        try:
            return asyncio.run_coroutine_threadsafe(run(), loop).result(CALL_TIMEOUT)
        except SourceError as exc:
            context.abort(_status(exc), str(exc))
            raise
        except RuntimeError:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the host is stopping")
            raise


async def _session_request(receiver: SourceReceiver, operation: str, body: dict[str, Any]) -> Any:
    management = management_of(receiver)
    return await management.request(
        receiver.path, operation, {"session-id": receiver.session_id, **body}
    )


def _properties(encoded: bytes, context: Any) -> dict[Any, Any] | None:
    """``propertiesToModify``: an AMQP map of application properties, or nothing."""
    if not encoded:
        return None
    try:
        value, _ = codec.decode_at(bytes(encoded), 0)
    except Exception as exc:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"propertiesToModify: {exc}")
        raise
    if not isinstance(value, dict):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "propertiesToModify is not a map")
    return dict(value)


def _status(error: SourceError) -> Any:
    return grpc.StatusCode.FAILED_PRECONDITION if lock_lost(error) else grpc.StatusCode.UNAVAILABLE
