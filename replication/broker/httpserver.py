"""HTTP/1.1 on one connection: ``h11`` parses, an ``HttpApp`` answers, an upgrade hands over.

The broker serves a few HTTP requests (the management API, ``/health``) and WebSocket
upgrades for AMQP, on sockets whose first bytes the listener already read; listening on
loopback, only for a loopback Host and Origin (``loopback.py``: no DNS rebinding). Requests are
answered one at a time (keep-alive, pipelining by h11's rules); a client gets
``HEADER_TIMEOUT`` seconds for each request head and bodies are capped at ``MAX_BODY``, so
a slow or greedy client costs one socket and a little memory, never the broker's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from typing import Any, cast

import h11

from . import loopback, websocket
from .httpapi import HttpApp, Request, Response
from .layers import Layer

log = logging.getLogger("replication.broker.listener")

HEADER_TIMEOUT = 10.0
"""Seconds a client has to send a whole request head (also: keep-alive idle time)."""
BODY_TIMEOUT = 30.0
"""Seconds a request body may stall between two reads."""
MAX_BODY = 1024 * 1024
MAX_HEAD = 64 * 1024
READ_AHEAD = MAX_BODY + MAX_HEAD
"""Bytes buffered before the socket stops being read (a client pipelining without end)."""
LINGER = 2.0
"""Seconds a refused request's unread rest is read and dropped before the close, so the
client gets to read the answer (a 413 while it still sends) instead of a reset."""
SERVER = "replication-broker"


class _TooLarge(Exception):
    pass


def health(request: Request) -> Response | None:
    """``GET /health``: the broker is up and serving (for probes and compose files)."""
    if request.path != "/health" or request.method not in ("GET", "HEAD"):
        return None
    body = json.dumps({"status": "ok"}).encode()
    return Response(200, {"content-type": "application/json"}, body)


class HttpConnection(Layer):
    """Serves requests on one connection until either side closes it or it upgrades.

    ``websocket`` makes the protocol to run inside an accepted WebSocket (None: no upgrades).
    ``loopback_only``: the port listens on loopback, so requests for another Host, or
    changes from another Origin, are refused before anything answers (``loopback.py``).
    """

    def __init__(
        self,
        app: HttpApp,
        scheme: str,
        websocket: Callable[[], asyncio.Protocol] | None = None,
        loopback_only: bool = False,
    ) -> None:
        super().__init__()
        self.app = app
        self.scheme = scheme
        self.websocket = websocket
        self.loopback_only = loopback_only
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self._buffer = bytearray()
        self._eof = False
        self._eof_fed = False
        self._paused = False
        self._began = False
        """Some of the current request has arrived (a timeout then gets a 408)."""
        self._refused = False
        self._lingering = False
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._task = asyncio.get_running_loop().create_task(self._serve())

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)
            return
        if self._lingering:
            return
        self._buffer += data
        self._wakeup.set()
        if len(self._buffer) > READ_AHEAD and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        if self.inner is not None:
            return self.inner.eof_received()
        if self._lingering:
            return False
        self._eof = True
        self._wakeup.set()
        return True  # half-closed: the response can still go out

    def connection_lost(self, exc: Exception | None) -> None:
        if self._task is not None and self.inner is None:
            self._task.cancel()
        super().connection_lost(exc)

    # ------------------------------------------------------------------ serving

    async def _serve(self) -> None:
        try:
            while await self._serve_one():
                pass
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("HTTP connection failed")
        if self.inner is None:
            self._close()

    def _close(self) -> None:
        """Closes; after a refusal first reads (and drops) what is still coming for a while."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if not self._refused or self._eof:
            transport.close()
            return
        self._lingering = True
        self._buffer.clear()
        if self._paused:
            self._paused = False
            transport.resume_reading()
        asyncio.get_running_loop().call_later(LINGER, transport.close)

    async def _serve_one(self) -> bool:
        """Reads and answers one request; True when the connection stays open for more."""
        try:
            request = await self._read_request()
        except h11.RemoteProtocolError as exc:
            self._refuse(exc.error_status_hint, f"bad request: {exc}")
            return False
        except _TooLarge:
            self._refuse(413, f"request bodies are limited to {MAX_BODY} bytes")
            return False
        except TimeoutError:
            if self._began:  # part of a request came: say why it ends
                self._refuse(408, "request timed out")
            return False
        if request is None:
            return False
        response = self._guard(request)
        if response is None and self.websocket is not None and websocket.is_upgrade(request):
            response = websocket.handshake(request)
            if response.status == 101:
                self._upgrade(response)
                return False
        if response is None:
            response = await self._answer(request)
        if response.stream is not None and request.method != "HEAD":
            await self._stream(response, response.stream)
            return False
        self._send(response, request.method)
        if self.h11.our_state is not h11.DONE or self.h11.their_state is not h11.DONE:
            return False
        self.h11.start_next_cycle()
        return True

    async def _read_request(self) -> Request | None:
        """The next whole request, or None when the client closed between requests."""
        loop = asyncio.get_running_loop()
        self._began = bool(self._buffer)
        head = await self._next_event(loop.time() + HEADER_TIMEOUT)
        if not isinstance(head, h11.Request):
            return None
        headers: dict[str, str] = {}
        for raw_name, raw_value in head.headers:
            name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        with contextlib.suppress(ValueError):
            if int(headers.get("content-length", "0")) > MAX_BODY:
                raise _TooLarge
        if self.h11.client_is_waiting_for_100_continue:
            self._write(self.h11.send(h11.InformationalResponse(status_code=100, headers=[])))
        body = bytearray()
        while True:
            event = await self._next_event(loop.time() + BODY_TIMEOUT)
            if isinstance(event, h11.Data):
                body += cast(Any, event).data  # typed bytes, may be a bytearray: unchecked
                if len(body) > MAX_BODY:
                    raise _TooLarge
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                return None  # closed mid-body
        return Request(
            method=head.method.decode("ascii").upper(),
            target=head.target.decode("latin-1"),
            headers=headers,
            body=bytes(body),
            scheme=self.scheme,
        )

    async def _next_event(self, deadline: float) -> object:
        """h11's next event, feeding it what arrived and waiting (until ``deadline``) for more."""
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            if self._buffer:
                self._began = True
                data = bytes(self._buffer)
                self._buffer.clear()
                if self._paused and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
                self.h11.receive_data(data)
            elif self._eof and not self._eof_fed:
                self._eof_fed = True
                self.h11.receive_data(b"")
            else:
                self._wakeup.clear()
                remaining = deadline - asyncio.get_running_loop().time()
                await asyncio.wait_for(self._wakeup.wait(), max(remaining, 0.0))

    def _guard(self, request: Request) -> Response | None:
        """The refusal of a request a loopback-only port must not serve; None: serve it."""
        if not self.loopback_only:
            return None
        host, origin = request.headers.get("host"), request.headers.get("origin")
        refused = loopback.refusal(request.method, host, origin, websocket.is_upgrade(request))
        if refused is None:
            return None
        body = refused.message.encode() + b"\n"
        return Response(refused.status, {"content-type": "text/plain; charset=utf-8"}, body)

    async def _answer(self, request: Request) -> Response:
        response = health(request)
        if response is not None:
            return response
        try:
            return await self.app(request)
        except Exception:
            log.exception("HTTP app failed on %s %s", request.method, request.target)
            return Response(500, {"content-type": "text/plain; charset=utf-8"}, b"internal error\n")

    # ------------------------------------------------------------------ writing

    def _send(self, response: Response, method: str, close: bool = False) -> None:
        status = response.status
        bodiless = status in (204, 304) or status < 200
        headers = [
            (name, value)
            for name, value in response.headers.items()
            if name.lower() not in ("content-length", "transfer-encoding", "connection")
        ]
        headers.append(("server", SERVER))
        if not bodiless:
            headers.append(("content-length", str(len(response.body))))
        if close:
            headers.append(("connection", "close"))
        try:
            data = self.h11.send(
                h11.Response(status_code=status, headers=headers, reason=_reason(status))
            )
            if response.body and not bodiless and method != "HEAD":
                data += self.h11.send(h11.Data(data=response.body))
            data += self.h11.send(h11.EndOfMessage())
        except h11.LocalProtocolError as exc:
            log.warning("cannot send HTTP %d: %s", status, exc)
            return
        self._write(data)

    async def _stream(self, response: Response, stream: AsyncIterator[bytes]) -> None:
        """Sends the head, then each chunk as it comes (chunked), until the stream ends, the
        client goes or stops reading (``MAX_BODY`` unread bytes)."""
        headers = [
            (name, value)
            for name, value in response.headers.items()
            if name.lower() not in ("content-length", "transfer-encoding", "connection")
        ]
        headers.append(("server", SERVER))
        status = response.status
        head = h11.Response(status_code=status, headers=headers, reason=_reason(status))
        try:
            self._write(self.h11.send(head))
            async for chunk in stream:
                transport = self.transport
                if transport is None or transport.is_closing():
                    break
                if transport.get_write_buffer_size() > MAX_BODY:
                    log.info("HTTP stream closed: the client does not read")
                    break
                self._write(self.h11.send(h11.Data(data=chunk)))
            else:
                self._write(self.h11.send(h11.EndOfMessage()))
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    def _refuse(self, status: int, why: str) -> None:
        """An error answer, when the state still allows one; the connection closes after."""
        self._refused = True
        if self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            body = why.encode("utf-8", "replace") + b"\n"
            self._send(
                Response(status, {"content-type": "text/plain; charset=utf-8"}, body),
                "GET",
                close=True,
            )

    def _upgrade(self, response: Response) -> None:
        """Sends 101 and runs the WebSocket layer on this socket from here on."""
        assert self.websocket is not None and self.transport is not None
        headers = list(response.headers.items())
        self._write(self.h11.send(h11.InformationalResponse(status_code=101, headers=headers)))
        leftover = self.h11.trailing_data[0] + bytes(self._buffer)
        self._buffer.clear()
        if self._paused:
            self._paused = False
            self.transport.resume_reading()
        self.hand_over(websocket.WebSocketLayer(self.websocket()), self.transport, leftover)
        if self._eof and self.inner is not None:
            self.inner.eof_received()

    def _write(self, data: bytes) -> None:
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""
