"""TLS as a layer over bytes already read: an ``ssl`` memory-BIO object, fed by the socket.

``loop.start_tls`` cannot take the ClientHello bytes the listener read while sniffing, so
the TLS state machine runs here on ``ssl.MemoryBIO``s instead: ciphertext in from the
socket, plaintext up to the inner protocol, and back. A failed handshake sends the alert,
closes this socket only, and never reaches the inner protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import Any

from .layers import Layer, LayerTransport

log = logging.getLogger("replication.broker.listener")

READ_SIZE = 64 * 1024


class TlsLayer(Layer):
    """The server side of one TLS connection; ``inner`` starts once the handshake is done."""

    def __init__(self, context: ssl.SSLContext, inner: asyncio.Protocol, timeout: float) -> None:
        super().__init__()
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self.ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._pending_inner: asyncio.Protocol | None = inner
        self._timeout = timeout
        self._timer: asyncio.TimerHandle | None = None
        self.upper: TlsTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.upper = TlsTransport(self, self.transport)  # type: ignore[arg-type]  # set just now
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._timeout, self._handshake_timed_out)

    def data_received(self, data: bytes) -> None:
        if self.upper is None or self.upper.closing:
            return
        self._incoming.write(data)
        if self._pending_inner is not None and not self._handshake():
            return
        self._read()

    def eof_received(self) -> bool | None:
        self._incoming.write_eof()
        if self.inner is None:
            return False
        self._read()
        return super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        super().connection_lost(exc)

    # ------------------------------------------------------------------ TLS

    def _handshake(self) -> bool:
        """Moves the handshake on; True once it is done (the inner protocol then starts)."""
        try:
            self.ssl.do_handshake()
        except ssl.SSLWantReadError:
            self.flush()
            return False
        except (ssl.SSLError, ValueError) as exc:
            peer = self.transport.get_extra_info("peername") if self.transport else None
            log.info("TLS handshake with %s failed: %s", peer, exc)
            self.flush()  # the alert, so the client learns why
            assert self.upper is not None
            self.upper.closing = True
            if self.transport is not None:
                self.transport.close()
            return False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush()
        inner, self._pending_inner = self._pending_inner, None
        assert inner is not None and self.upper is not None
        self.hand_over(inner, self.upper)
        return True

    def _read(self) -> None:
        """Hands every complete record's plaintext to the inner protocol."""
        upper = self.upper
        while self.inner is not None and upper is not None and not upper.closing:
            try:
                chunk = self.ssl.read(READ_SIZE)
            except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                break
            except ssl.SSLError as exc:
                log.info(
                    "TLS error from %s: %s",
                    self.transport and self.transport.get_extra_info("peername"),
                    exc,
                )
                upper.abort()
                return
            if not chunk:
                break
            self.inner.data_received(chunk)
        self.flush()  # key updates and tickets, and replies to alerts

    def flush(self) -> None:
        data = self._outgoing.read()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _handshake_timed_out(self) -> None:
        self._timer = None
        if self.transport is not None:
            log.info("TLS handshake with %s timed out", self.transport.get_extra_info("peername"))
            self.transport.abort()


class TlsTransport(LayerTransport):
    """Plaintext written here goes out encrypted; ``close`` says close_notify first."""

    def __init__(self, layer: TlsLayer, lower: asyncio.Transport) -> None:
        super().__init__(lower)
        self.layer = layer

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        sslobj = self.layer.ssl
        if name == "ssl_object":
            return sslobj
        if name == "peercert":
            return sslobj.getpeercert()
        if name == "cipher":
            return sslobj.cipher()
        return super().get_extra_info(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.closing or not data:
            return
        try:
            self.layer.ssl.write(data)
        except ssl.SSLError as exc:
            log.info("TLS write failed: %s", exc)
            self.abort()
            return
        self.layer.flush()

    def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        with contextlib.suppress(ssl.SSLError, ValueError):
            self.layer.ssl.unwrap()  # queues close_notify; the peer's answer is not awaited
        self.layer.flush()
        self.lower.close()
