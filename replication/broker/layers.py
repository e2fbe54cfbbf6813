"""Stacking protocols on one socket: a layer is a protocol below and a transport above.

The listener learns what a connection speaks only from its first bytes, and then may find
another layer inside (TLS, then HTTP, then a WebSocket carrying AMQP). Each layer is a
``Layer`` (the protocol its lower transport feeds) that hands what it decodes to an inner
protocol, and a ``LayerTransport`` that the inner protocol writes to. The AMQP
``ConnectionDriver`` and the HTTP server never know how deep they sit.
"""

from __future__ import annotations

import asyncio
from typing import Any


class Layer(asyncio.Protocol):
    """Forwards the connection's life to ``inner`` once there is one (the default: as is)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.inner: asyncio.Protocol | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream's: a Transport

    def hand_over(
        self, inner: asyncio.Protocol, transport: asyncio.BaseTransport, data: bytes = b""
    ) -> None:
        """From now on ``inner`` gets what arrives, starting with ``data`` (already read)."""
        self.inner = inner
        inner.connection_made(transport)
        if data and not transport.is_closing():
            inner.data_received(data)

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else False

    def connection_lost(self, exc: Exception | None) -> None:
        inner, self.inner = self.inner, None
        if inner is not None:
            inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()


class LayerTransport(asyncio.Transport):
    """What an inner protocol writes to: reading, buffers and peer details pass down."""

    def __init__(self, lower: asyncio.Transport, extra: dict[str, Any] | None = None) -> None:
        super().__init__(extra)
        self.lower = lower
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        extra: dict[str, Any] = self._extra  # type: ignore[attr-defined]  # asyncio's
        if name in extra:
            return extra[name]
        return self.lower.get_extra_info(name, default)

    def is_closing(self) -> bool:
        return self.closing or self.lower.is_closing()

    def abort(self) -> None:
        self.closing = True
        self.lower.abort()

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def is_reading(self) -> bool:
        return self.lower.is_reading()

    def pause_reading(self) -> None:
        self.lower.pause_reading()

    def resume_reading(self) -> None:
        self.lower.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.lower.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self.lower.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.lower.get_write_buffer_limits()
