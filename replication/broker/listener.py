"""The broker's ports: every connection says what it speaks in its first bytes.

One port serves AMQP, AMQP over TLS, HTTPS and AMQP over secure WebSockets, as clients
expect of a namespace host: ``AMQP`` starts an AMQP connection, a TLS ClientHello (``16 03``)
starts TLS and the same question is asked again inside, and a request line starts HTTP/1.1
(the management API, ``/health``, or a WebSocket upgrade carrying AMQP). Anything else gets
the SASL protocol header (what the AMQP spec answers to a header it cannot serve), or a 400
where HTTP is expected, and is closed; a connection that stays silent is closed after
``SNIFF_TIMEOUT``. Each connection is its own chain of protocols on the one event loop, so
no client can hold up another.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from .httpapi import HttpApp
from .httpserver import HttpConnection
from .layers import Layer
from .tlslayer import TlsLayer

log = logging.getLogger("replication.broker.listener")

SNIFF_TIMEOUT = 10.0
"""Seconds a new connection (or a new TLS or WebSocket layer) has to send its first bytes."""
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
"""The answer to a header the broker cannot serve (spec 2.2: the header it does support; it
offers SASL first, as the AMQP engine answers a wrong header too)."""
AMQP_TLS_HEADER = b"AMQP\x02\x01\x00\x00"
BAD_REQUEST = (
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: 33\r\n"
    b"connection: close\r\n\r\nnot a request this port can serve\n"
)
HTTP_METHODS = (b"GET", b"PUT", b"POST", b"DELETE", b"HEAD", b"OPTIONS", b"PATCH")
"""What starts an HTTP request here (so ``AMQX`` is junk at once, not a method to wait on)."""


class Kind(Enum):
    AMQP = "amqp"
    TLS = "tls"
    HTTP = "http"
    JUNK = "junk"


def sniff(data: bytes) -> Kind | None:
    """What a connection speaks, from its first bytes; None while it could still be several."""
    if not data:
        return None
    if b"AMQP".startswith(data[:4]):  # the whole 8-byte header: a partial one times out here
        return Kind.AMQP if len(data) >= len(AMQP_HEADER) else None
    if data[0] == 0x16:  # TLS record type handshake, then major version 3
        return None if len(data) < 2 else Kind.TLS if data[1] == 3 else Kind.JUNK
    for method in HTTP_METHODS:
        line = method + b" "
        if line.startswith(data[: len(line)]):
            return Kind.HTTP if len(data) >= len(line) else None
    return Kind.JUNK


@dataclass(frozen=True, slots=True)
class Surface:
    """What one port (or one layer inside a connection) serves."""

    kinds: frozenset[Kind]
    refusal: bytes
    """Written before closing a connection that speaks something else (HTTP gets a 400)."""
    scheme: str = "http"
    inside_tls: Surface | None = None


INSIDE_TLS = Surface(frozenset({Kind.AMQP, Kind.HTTP}), SASL_HEADER, "https")
AMQP_PORT = Surface(frozenset({Kind.AMQP, Kind.TLS, Kind.HTTP}), SASL_HEADER, "http", INSIDE_TLS)
TLS_PORT = Surface(frozenset({Kind.TLS}), AMQP_TLS_HEADER, "https", INSIDE_TLS)
"""5671: TLS only; a plain AMQP client hears the TLS header it should have used."""
HTTP_PORT = Surface(frozenset({Kind.HTTP}), BAD_REQUEST)
IN_WEBSOCKET = Surface(frozenset({Kind.AMQP}), SASL_HEADER)


class Sniffer(Layer):
    """Reads a connection's first bytes, then hands it (and them) to the protocol they name."""

    def __init__(self, surface: Surface, listener: Listener, root: Sniffer | None = None) -> None:
        super().__init__()
        self.surface = surface
        self.listener = listener
        self.root = root or self
        self.speaks_amqp = False
        """Set on the socket's outermost sniffer once AMQP runs anywhere inside it."""
        self._head = bytearray()
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self.root is self:
            self.listener.connections.add(self)
        self._timer = asyncio.get_running_loop().call_later(SNIFF_TIMEOUT, self._timed_out)

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)
            return
        if self.transport is None or self.transport.is_closing():
            return
        self._head += data
        kind = sniff(bytes(self._head))
        if kind is not None:
            self._dispatch(kind)

    def eof_received(self) -> bool | None:
        if self.inner is not None:
            return self.inner.eof_received()
        return False  # gone before saying anything: close

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self.listener.connections.discard(self)
        super().connection_lost(exc)

    def _dispatch(self, kind: Kind) -> None:
        self._cancel_timer()
        transport, data = self.transport, bytes(self._head)
        assert transport is not None
        self._head.clear()
        surface, listener = self.surface, self.listener
        if kind not in surface.kinds or (kind is Kind.TLS and listener.tls is None):
            self._refuse(BAD_REQUEST if kind is Kind.HTTP else surface.refusal, kind)
        elif kind is Kind.AMQP:
            self.root.speaks_amqp = True
            self.hand_over(listener.amqp(), transport, data)
        elif kind is Kind.TLS:
            assert listener.tls is not None and surface.inside_tls is not None
            inner = Sniffer(surface.inside_tls, listener, self.root)
            self.hand_over(TlsLayer(listener.tls, inner, SNIFF_TIMEOUT), transport, data)
        else:
            root = self.root
            http = HttpConnection(
                listener.app,
                surface.scheme,
                lambda: Sniffer(IN_WEBSOCKET, listener, root),
                loopback_only=listener.loopback_only,
            )
            self.hand_over(http, transport, data)

    def _refuse(self, answer: bytes, kind: Kind) -> None:
        assert self.transport is not None
        log.debug("refusing %s from %s", kind.value, self.transport.get_extra_info("peername"))
        self.transport.write(answer)
        self.transport.close()

    def _timed_out(self) -> None:
        self._timer = None
        if self.inner is None and self.transport is not None:
            log.debug(
                "%s sent nothing in %s s", self.transport.get_extra_info("peername"), SNIFF_TIMEOUT
            )
            self.transport.abort()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Listener:
    """The broker's listening sockets, and the connections on them that are not yet AMQP.

    ``amqp`` makes the protocol for an AMQP connection (a ``ConnectionDriver``), ``app``
    answers HTTP requests, ``tls`` is the server context (None: TLS is refused).
    ``loopback_only``: the sockets listen on loopback, so HTTP is served only for a loopback
    Host and Origin (no DNS rebinding; ``loopback.py``).
    """

    def __init__(
        self,
        amqp: Callable[[], asyncio.Protocol],
        app: HttpApp,
        tls: ssl.SSLContext | None,
        loopback_only: bool = False,
    ) -> None:
        self.amqp = amqp
        self.app = app
        self.tls = tls
        self.loopback_only = loopback_only
        self.servers: list[asyncio.Server] = []
        self.connections: set[Sniffer] = set()

    async def listen(self, host: str, port: int, surface: Surface) -> int:
        """Starts serving ``surface`` on ``host:port`` (0: any free port); the port it got."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: Sniffer(surface, self), host, port)
        self.servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    def close(self) -> None:
        """Stops accepting and drops the connections that speak no AMQP (their owner, the
        broker, closes AMQP connections politely)."""
        for server in self.servers:
            server.close()
        for sniffer in list(self.connections):
            if not sniffer.speaks_amqp and sniffer.transport is not None:
                sniffer.transport.abort()

    async def wait_closed(self) -> None:
        """Drops whatever is still connected and waits for the sockets to close."""
        self.close()
        for sniffer in list(self.connections):
            if sniffer.transport is not None:
                sniffer.transport.abort()
        for server in self.servers:
            await server.wait_closed()
