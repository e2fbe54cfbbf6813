"""The broker's HTTP surface as plain values: what the listener parsed, what an app answers.

The listener (``listener.py``) parses HTTP/1.1 on the broker's ports (inside TLS on the AMQP
port, in plain text on the HTTP port) and hands each request to an ``HttpApp``; the
management REST API (``admin/``) is one. Keeping the seam this small lets each side be
tested alone: the API with ``Request`` values, the listener with any app.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    """Upper case: GET, PUT, DELETE, ..."""
    target: str
    """The request target as sent: path and query, e.g. ``/orders?api-version=2021-05``."""
    headers: dict[str, str] = field(default_factory=dict)
    """Names in lower case; repeated headers joined with ``, ``."""
    body: bytes = b""
    scheme: str = "https"
    """``https`` inside TLS, ``http`` on the plain HTTP port."""

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> dict[str, str]:
        """Query parameters, the first value of each."""
        return {k: v[0] for k, v in parse_qs(urlsplit(self.target).query).items()}


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None
    """A body sent as it comes (server-sent events), instead of ``body``; the connection
    closes when it ends or the client goes."""


HttpApp = Callable[[Request], Awaitable[Response]]


async def not_found(request: Request) -> Response:
    """The app of a broker without the management API: every path is unknown."""
    return Response(
        404,
        {"content-type": "text/plain; charset=utf-8"},
        f"no such resource: {request.path}\n".encode(),
    )
