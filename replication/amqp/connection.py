"""The connection state machine (spec 2.4): headers, SASL, open/close, channels, idle timeout.

Sans-IO, in the manner of h2: feed received bytes to ``receive_data``, read what happened with
``next_event``, act on sessions and links, then write ``data_to_send()`` to the socket. Time
enters only through ``tick(now)``. A peer that breaks the protocol gets a ``close`` carrying the
matching AMQP error condition and a ``ConnectionClosed`` event; nothing raises into the caller.
"""

from __future__ import annotations

import enum
import uuid
from collections import deque
from typing import Any

from . import events as ev
from .errors import AMQPError, ProtocolError
from .frames import (
    AMQP_HEADER,
    EMPTY_FRAME,
    FRAME_AMQP,
    FRAME_SASL,
    MIN_MAX_FRAME_SIZE,
    PROTOCOL_AMQP,
    PROTOCOL_SASL,
    SASL_HEADER,
    Frame,
    FrameReader,
    ProtocolHeader,
    encode_frame,
)
from .link import Link
from .performatives import (
    SASL_OK,
    Begin,
    Close,
    Error,
    Open,
    SaslChallenge,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    SaslResponse,
)
from .sasl import SaslClient, SaslServer
from .session import DEFAULT_WINDOW, LinkError, Session, SessionError, SessionState

DEFAULT_MAX_FRAME_SIZE = 256 * 1024


class Phase(enum.Enum):
    HEADER = "awaiting-header"
    SASL = "sasl"
    AMQP = "amqp"
    CLOSED = "closed"


class Connection:
    """One AMQP connection, client or server side."""

    def __init__(
        self,
        *,
        server: bool = False,
        container_id: str | None = None,
        hostname: str | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        channel_max: int = 0xFFFF,
        idle_timeout: float | None = None,
        properties: dict[Any, Any] | None = None,
        offered_capabilities: tuple[str, ...] | None = None,
        desired_capabilities: tuple[str, ...] | None = None,
        sasl: SaslClient | SaslServer | None = None,
        require_sasl: bool = True,
    ) -> None:
        if max_frame_size < MIN_MAX_FRAME_SIZE:
            raise ValueError(f"max-frame-size must be at least {MIN_MAX_FRAME_SIZE}")
        self.server = server
        self.container_id = container_id or f"replication-{uuid.uuid4()}"
        self.hostname = hostname
        self.max_frame_size = max_frame_size
        self.channel_max = channel_max
        self.idle_timeout = idle_timeout
        self.properties = properties
        self.offered_capabilities = offered_capabilities
        self.desired_capabilities = desired_capabilities
        self.sasl = sasl
        self.require_sasl = require_sasl and sasl is not None
        self.sasl_credentials: Any = None
        self.remote: Open | None = None
        self.remote_error: Error | None = None
        self.phase = Phase.HEADER
        self.sessions: dict[int, Session] = {}
        self._remote_sessions: dict[int, Session] = {}
        self._reader = FrameReader(max_frame_size)
        self._out = bytearray()
        self._deferred: list[bytes] = []
        self._events: deque[ev.Event] = deque()
        self._open_wanted = False
        self._open_sent = False
        self._close_sent = False
        self._close_received = False
        self._sasl_done = False
        self._terminated = False
        self._rx_activity = False
        self._tx_activity = False
        self._last_rx: float | None = None
        self._last_tx: float | None = None
        self._last_tick: float | None = None
        if not server:
            self._out += SASL_HEADER if sasl is not None else AMQP_HEADER

    # ------------------------------------------------------------------ public state

    @property
    def is_open(self) -> bool:
        return self._open_sent and self.remote is not None and not self._close_sent

    @property
    def is_terminated(self) -> bool:
        """Nothing more will be read or written: flush ``data_to_send`` and close the socket."""
        return self._terminated or (self._close_sent and self._close_received)

    @property
    def remote_max_frame_size(self) -> int:
        return self.remote.max_frame_size if self.remote else MIN_MAX_FRAME_SIZE

    # ------------------------------------------------------------------ user actions

    def open(self) -> None:
        """Sends our open (held back until SASL and the headers are done)."""
        self._open_wanted = True
        self._maybe_send_open()

    def close(self, error: Error | None = None) -> None:
        if self._close_sent or self._terminated:
            return
        if not self._open_sent:
            # headers exchanged: a close needs an open before it, even on a server whose peer
            # has not opened yet (spec 2.4.1), so the peer learns why
            if self.phase is not Phase.AMQP:
                self._terminate()
                return
            self._send_open_now()
        for session in self.sessions.values():
            session._flush_dispositions()
        self._write(encode_frame(0, Close(error=error)))
        self._close_sent = True
        if self._close_received:
            self.phase = Phase.CLOSED

    def begin_session(
        self,
        *,
        incoming_window: int = DEFAULT_WINDOW,
        outgoing_window: int = DEFAULT_WINDOW,
        handle_max: int = 0xFFFFFFFF,
        properties: dict[Any, Any] | None = None,
    ) -> Session:
        channel = self._allocate_channel()
        session = Session(
            self,
            channel,
            incoming_window=incoming_window,
            outgoing_window=outgoing_window,
            handle_max=handle_max,
            properties=properties,
        )
        self.sessions[channel] = session
        session.state = SessionState.BEGIN_SENT
        self._send_frame(channel, session._begin_performative())
        return session

    def next_event(self) -> ev.Event | None:
        return self._events.popleft() if self._events else None

    def events(self) -> list[ev.Event]:
        """Every queued event, oldest first."""
        out = list(self._events)
        self._events.clear()
        return out

    def data_to_send(self) -> bytes:
        """Bytes to write to the peer now: pending frames, transfers that credit allows."""
        if self.phase is Phase.AMQP and self._open_sent and not self._close_sent:
            limit = min(self.remote_max_frame_size, 0xFFFFFFFF)
            for session in list(self.sessions.values()):
                session._pump(limit)
        if not self._out:
            return b""
        data = bytes(self._out)
        self._out.clear()
        self._tx_activity = True
        return data

    def tick(self, now: float) -> float | None:
        """Applies the idle timeouts at monotonic time ``now``; returns when to tick next."""
        if self._rx_activity or self._last_rx is None:
            self._last_rx = now
            self._rx_activity = False
        previous_tick, self._last_tick = self._last_tick, now
        if self._tx_activity or self._last_tx is None:
            # bytes went out at some time since the previous tick: date them then, so the
            # next heartbeat is never late (dating them ``now`` skipped every other heartbeat)
            self._last_tx = now if previous_tick is None else previous_tick
            self._tx_activity = False
        if self.is_terminated or self._close_sent:
            return None
        deadlines = []
        if self.idle_timeout:
            expiry = self._last_rx + self.idle_timeout
            if now >= expiry:
                description = (
                    f"local-idle-timeout expired: nothing received for {self.idle_timeout:g} s"
                )
                if self.remote is None:  # the peer stalled in the headers, SASL or before open
                    self._fail("amqp:resource-limit-exceeded", description)
                    return None
                error = Error(condition="amqp:resource-limit-exceeded", description=description)
                self.close(error)
                self._emit(ev.ConnectionClosed(error, False))
                return None
            deadlines.append(expiry)
        if self.phase is not Phase.AMQP:
            return min(deadlines) if deadlines else None
        remote_idle = self.remote.idle_time_out if self.remote else None
        if remote_idle and self._open_sent:
            interval = remote_idle / 2000.0
            due = self._last_tx + interval
            if now >= due:
                self._write(EMPTY_FRAME)
                self._last_tx = now
                due = now + interval
            deadlines.append(due)
        return min(deadlines) if deadlines else None

    # ------------------------------------------------------------------ input

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Digests bytes from the peer; b"" means the peer closed its end of the stream."""
        if self.is_terminated:  # includes a finished close handshake: ignore what follows
            return
        if not data:
            if self._close_received:
                self._terminate()
            else:
                self._abort("amqp:connection:forced", "socket closed", by_peer=True)
            return
        self._rx_activity = True
        try:
            self._reader.feed(data)
            while not self.is_terminated:
                item = self._reader.next()
                if item is None:
                    break
                if isinstance(item, ProtocolHeader):
                    self._on_header(item)
                else:
                    self._on_frame(item)
        except AMQPError as exc:
            self._fail(exc.condition, exc.description)

    def _fail(self, condition: str, description: str) -> None:
        """Closes the connection because the peer broke a rule."""
        if self.server and self.phase is Phase.HEADER:
            # spec 2.2: a header we cannot read still gets the header we do support
            self._out += SASL_HEADER if self._sasl_pending else AMQP_HEADER
        if self.phase is Phase.AMQP and not self._close_sent:
            self.close(Error(condition=condition, description=description))
        self._abort(condition, description, by_peer=False)

    def _abort(self, condition: str, description: str, *, by_peer: bool) -> None:
        """Reports the end of the connection and stops; any close frame is already queued."""
        error = Error(condition=condition, description=description)
        self._emit(ev.ConnectionClosed(error, by_peer))
        self._terminate()

    @property
    def _sasl_pending(self) -> bool:
        return self.sasl is not None and not self._sasl_done

    def _terminate(self) -> None:
        self._terminated = True
        self.phase = Phase.CLOSED

    def _on_header(self, header: ProtocolHeader) -> None:
        if self.server:
            self._server_header(header)
            return
        expected = PROTOCOL_SASL if self._sasl_pending else PROTOCOL_AMQP
        if header.protocol_id != expected or not header.is_amqp_1_0:
            self._abort(
                "amqp:not-implemented",
                f"server answered with protocol header {header.to_bytes()!r}",
                by_peer=True,
            )
            return
        self.phase = Phase.SASL if expected == PROTOCOL_SASL else Phase.AMQP
        self._maybe_send_open()

    def _server_header(self, header: ProtocolHeader) -> None:
        wants_sasl = self._sasl_pending
        if header.is_amqp_1_0 and header.protocol_id == PROTOCOL_SASL and wants_sasl:
            assert isinstance(self.sasl, SaslServer)
            self._out += SASL_HEADER
            self._out += encode_frame(0, self.sasl.mechanisms_frame(), frame_type=FRAME_SASL)
            self.phase = Phase.SASL
            return
        if (
            header.is_amqp_1_0
            and header.protocol_id == PROTOCOL_AMQP
            and not (wants_sasl and self.require_sasl)
        ):
            self._out += AMQP_HEADER
            self.phase = Phase.AMQP
            return
        # spec 2.2: answer with the header we do support, then close the socket
        self._out += SASL_HEADER if wants_sasl else AMQP_HEADER
        self._abort(
            "amqp:not-implemented",
            f"unsupported protocol header {header.to_bytes()!r}",
            by_peer=False,
        )

    def _on_frame(self, frame: Frame) -> None:
        if self.phase is Phase.SASL:
            if frame.frame_type != FRAME_SASL:
                raise ProtocolError("AMQP frame during SASL", "amqp:connection:framing-error")
            self._on_sasl_frame(frame.body)
            return
        if frame.frame_type != FRAME_AMQP:
            raise ProtocolError("SASL frame after SASL", "amqp:connection:framing-error")
        body = frame.body
        if body is None:
            return  # heartbeat
        kind = type(body)
        if self.remote is None:
            if kind is not Open:
                raise ProtocolError(f"expected open, got {kind.__name__}", "amqp:illegal-state")
            self._on_open(body)
            return
        if kind is Close:
            self._on_close(body)
            return
        if self._close_sent:
            return  # spec 2.4.3: discard everything but close
        if kind is Open:
            raise ProtocolError("open received twice", "amqp:illegal-state")
        if kind is Begin:
            self._on_begin(frame.channel, body)
            return
        session = self._remote_sessions.get(frame.channel)
        if session is None:
            raise ProtocolError(
                f"{kind.__name__} on channel {frame.channel}, which has no session",
                "amqp:not-allowed",
            )
        try:
            session._on_frame(body, frame.payload)
        except LinkError as link_error:  # one name per clause: mypyc types each one
            link_error.link.detach(
                Error(condition=link_error.condition, description=link_error.description)
            )
        except SessionError as session_error:
            session.end(
                Error(condition=session_error.condition, description=session_error.description)
            )
            session.state = SessionState.DISCARDING

    def _on_sasl_frame(self, body: Any) -> None:
        sasl = self.sasl
        if self.server:
            assert isinstance(sasl, SaslServer)
            if type(body) is not SaslInit:
                raise ProtocolError(
                    f"expected sasl-init, got {type(body).__name__}",
                    "amqp:connection:framing-error",
                )
            outcome, credentials = sasl.handle_init(body)
            self._out += encode_frame(0, outcome, frame_type=FRAME_SASL)
            if outcome.code != SASL_OK:
                self._abort(
                    "amqp:unauthorized-access",
                    f"SASL {body.mechanism} authentication failed",
                    by_peer=False,
                )
                return
            self._finish_sasl(str(body.mechanism), credentials)
            return
        assert isinstance(sasl, SaslClient)
        kind = type(body)
        if kind is SaslMechanisms:
            init = sasl.init(body.sasl_server_mechanisms)
            self._out += encode_frame(0, init, frame_type=FRAME_SASL)
        elif kind is SaslChallenge:
            response = SaslResponse(response=sasl.challenge(body.challenge))
            self._out += encode_frame(0, response, frame_type=FRAME_SASL)
        elif kind is SaslOutcome:
            if body.code != SASL_OK:
                self._abort(
                    "amqp:unauthorized-access",
                    f"SASL {sasl.mechanism} refused (code {int(body.code)})",
                    by_peer=True,
                )
                return
            self._out += AMQP_HEADER
            self._finish_sasl(sasl.mechanism, None)
        else:
            raise ProtocolError(
                f"unexpected {kind.__name__} from a SASL server", "amqp:connection:framing-error"
            )

    def _finish_sasl(self, mechanism: str, credentials: Any) -> None:
        self._sasl_done = True
        self.sasl_credentials = credentials
        self.phase = Phase.HEADER
        self._reader.expect_header = True
        self._emit(ev.SaslCompleted(mechanism, credentials))

    def _on_open(self, remote: Open) -> None:
        self.remote = remote
        self._emit(ev.ConnectionOpened(remote))
        if self.server and not self._open_sent:
            self.open()

    def _on_close(self, close: Close) -> None:
        self._close_received = True
        self.remote_error = close.error
        by_peer = not self._close_sent
        for session in list(self.sessions.values()):
            for link in list(session.links.values()):
                self._emit(ev.LinkDetached(link, None, False, by_peer))
            self._emit(ev.SessionEnded(session, None, by_peer))
        self.sessions.clear()
        self._remote_sessions.clear()
        if not self._close_sent:
            self._emit(ev.ConnectionClosed(close.error, True))
            self.close()
        else:
            self._emit(ev.ConnectionClosed(close.error, False))
        self.phase = Phase.CLOSED

    def _on_begin(self, channel: int, begin: Begin) -> None:
        if channel > self.channel_max:
            raise ProtocolError(
                f"channel {channel} exceeds channel-max {self.channel_max}",
                "amqp:connection:framing-error",
            )
        if channel in self._remote_sessions:
            raise ProtocolError(f"channel {channel} already has a session", "amqp:not-allowed")
        if begin.remote_channel is not None:
            session = self.sessions.get(begin.remote_channel)
            if session is None or session.state is not SessionState.BEGIN_SENT:
                raise ProtocolError(
                    f"begin answers channel {begin.remote_channel}, which we did not begin",
                    "amqp:not-allowed",
                )
            session.remote_channel = channel
            self._remote_sessions[channel] = session
            session._on_begin_reply(begin)
            return
        session = Session(self, self._allocate_channel())
        session.remote_channel = channel
        self.sessions[session.channel] = session
        self._remote_sessions[channel] = session
        session._on_begin_reply(begin)
        session.state = SessionState.MAPPED
        self._send_frame(session.channel, session._begin_performative())
        self._emit(ev.SessionBegun(session))

    # ------------------------------------------------------------------ output plumbing

    def _allocate_channel(self) -> int:
        limit = min(self.channel_max, self.remote.channel_max if self.remote else 0xFFFF)
        for channel in range(limit + 1):
            if channel not in self.sessions:
                return channel
        raise ProtocolError(
            f"no channel left (channel-max {limit})", "amqp:resource-limit-exceeded"
        )

    def _maybe_send_open(self) -> None:
        if self._open_wanted and not self._open_sent and self.phase is Phase.AMQP:
            self._send_open_now()

    def _send_open_now(self) -> None:
        idle = int(self.idle_timeout * 1000) if self.idle_timeout else None
        self._out += encode_frame(
            0,
            Open(
                container_id=self.container_id,
                hostname=self.hostname,
                max_frame_size=self.max_frame_size,
                channel_max=self.channel_max,
                idle_time_out=idle,
                offered_capabilities=self.offered_capabilities,
                desired_capabilities=self.desired_capabilities,
                properties=self.properties,
            ),
        )
        self._open_sent = True
        for chunk in self._deferred:
            self._out += chunk
        self._deferred.clear()

    def _write(self, data: bytes) -> None:
        if self._open_sent:
            self._out += data
        else:
            self._deferred.append(data)

    def _send_frame(self, channel: int, performative: Any, payload: bytes = b"") -> None:
        if self._close_sent or self._terminated:
            return
        self._write(encode_frame(channel, performative, payload))

    def _forget_session(self, session: Session) -> None:
        self.sessions.pop(session.channel, None)
        if session.remote_channel is not None:
            self._remote_sessions.pop(session.remote_channel, None)
        session.state = SessionState.UNMAPPED

    def _emit(self, event: ev.Event) -> None:
        self._events.append(event)

    def find_link(self, name: str) -> Link | None:
        for session in self.sessions.values():
            for link in session.links.values():
                if link.name == name:
                    return link
        return None
