"""AMQP over WebSockets: the upgrade handshake's checks, and a layer of binary messages.

Service Bus clients behind proxies that only pass HTTPS (``TransportType.AmqpOverWebsocket``)
open ``wss://host/$servicebus/websocket`` with subprotocol ``AMQPWSB10`` and then send the
AMQP byte stream in binary messages, cut anywhere. ``WebSocketLayer`` turns those messages
back into a stream for the AMQP driver and wraps what the driver writes into messages;
``wsproto`` does the framing (masking, fragments, pings, the close handshake).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, cast

from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import LocalProtocolError, generate_accept_token

from .httpapi import Request, Response
from .layers import Layer, LayerTransport

log = logging.getLogger("replication.broker.listener")

PATH = "/$servicebus/websocket"
SUBPROTOCOL = "AMQPWSB10"


def is_upgrade(request: Request) -> bool:
    """A WebSocket upgrade request (to any path)."""
    return request.method == "GET" and "websocket" in _tokens(request.headers.get("upgrade"))


def handshake(request: Request) -> Response:
    """Our answer to an upgrade request: 101 with the accept token, or why not (4xx)."""
    if request.path.lower() != PATH.lower():
        return _refuse(404, f"WebSockets are served on {PATH} only")
    if "upgrade" not in _tokens(request.headers.get("connection")):
        return _refuse(400, "Connection: Upgrade expected")
    if request.headers.get("sec-websocket-version", "").strip() != "13":
        return Response(426, {"sec-websocket-version": "13"}, b"WebSocket version 13 only\n")
    key = request.headers.get("sec-websocket-key", "").strip()
    if not key:
        return _refuse(400, "Sec-WebSocket-Key missing")
    protocols = request.headers.get("sec-websocket-protocol", "")
    if SUBPROTOCOL.lower() not in _tokens(protocols):
        return _refuse(400, f"subprotocol {SUBPROTOCOL} expected")
    return Response(
        101,
        {
            "upgrade": "websocket",
            "connection": "Upgrade",
            "sec-websocket-accept": generate_accept_token(key.encode()).decode(),
            "sec-websocket-protocol": SUBPROTOCOL,
        },
    )


def _tokens(value: str | None) -> set[str]:
    return {token.strip().lower() for token in (value or "").split(",")}


def _refuse(status: int, why: str) -> Response:
    return Response(status, {"content-type": "text/plain; charset=utf-8"}, why.encode() + b"\n")


class WebSocketLayer(Layer):
    """The server side of an upgraded connection: binary messages <-> a byte stream."""

    def __init__(self, inner: asyncio.Protocol) -> None:
        super().__init__()
        self.ws = Connection(ConnectionType.SERVER)
        self._inner = inner
        self.upper: WebSocketTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.upper = WebSocketTransport(self, self.transport)  # type: ignore[arg-type]  # set just now
        self.hand_over(self._inner, self.upper)

    def data_received(self, data: bytes) -> None:
        if self.ws.state is ConnectionState.CLOSED:
            return
        self.ws.receive_data(data)
        self._handle_events()

    def eof_received(self) -> bool | None:
        if self.ws.state is not ConnectionState.CLOSED:
            self.ws.receive_data(None)
        super().eof_received()
        return False

    def _handle_events(self) -> None:
        for event in self.ws.events():
            if isinstance(event, BytesMessage):
                data = cast(Any, event).data  # typed bytes, is a bytearray: unchecked
                if self.inner is not None and data:
                    self.inner.data_received(bytes(data))
            elif isinstance(event, Ping):
                self.send_raw(self.ws.send(event.response()))
            elif isinstance(event, TextMessage):
                self.close(CloseReason.UNSUPPORTED_DATA, "AMQP travels in binary messages")
                return
            elif isinstance(event, CloseConnection):
                if self.ws.state is ConnectionState.REMOTE_CLOSING:
                    self.send_raw(self.ws.send(event.response()))
                else:  # a framing error (wsproto reports it as a close): say so, then go
                    self.close(event.code, event.reason or "")
                if self.transport is not None:
                    self.transport.close()
                return

    def send_raw(self, data: bytes) -> None:
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self, code: int = CloseReason.NORMAL_CLOSURE, reason: str = "") -> None:
        """Starts the close handshake (once) and closes the socket after it is written."""
        if self.ws.state is ConnectionState.OPEN:
            with contextlib.suppress(LocalProtocolError):
                self.send_raw(self.ws.send(CloseConnection(code=code, reason=reason)))
        if self.upper is not None:
            self.upper.closing = True
        if self.transport is not None:
            self.transport.close()


class WebSocketTransport(LayerTransport):
    """What the AMQP driver writes goes out as one binary message per write."""

    def __init__(self, layer: WebSocketLayer, lower: asyncio.Transport) -> None:
        super().__init__(lower, {"subprotocol": SUBPROTOCOL})
        self.layer = layer

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.closing or not data or self.layer.ws.state is not ConnectionState.OPEN:
            return
        self.layer.send_raw(self.layer.ws.send(BytesMessage(data=bytes(data))))

    def close(self) -> None:
        if not self.closing:
            self.layer.close()
