"""The dashboard behind the local host's ``http.server`` (the ``/metrics`` port).

That server answers each request on a thread of its own; the dashboard lives on the host's
event loop (its namespaces' clients, the brokers). A request is handed to the loop and its
answer written back; a stream (server-sent events) is read from the loop one chunk at a
time until the client goes.
"""

from __future__ import annotations

import asyncio
import contextlib
from http.server import BaseHTTPRequestHandler
from typing import Any

from ..broker.httpapi import Request
from .app import Dashboard

MAX_BODY = 1024 * 1024
ANSWER_TIMEOUT = 120.0
"""Seconds a request may take on the loop (a resubmit of many dead letters)."""


def serve(
    handler: BaseHTTPRequestHandler, dashboard: Dashboard, loop: asyncio.AbstractEventLoop
) -> bool:
    """Answers the request ``handler`` holds when it is the dashboard's; False when not."""
    length = int(handler.headers.get("content-length") or 0)
    if length > MAX_BODY:
        _write(handler, 413, {"content-type": "text/plain"}, b"request body too large\n")
        return True
    body = handler.rfile.read(length) if length else b""
    headers = {name.lower(): value for name, value in handler.headers.items()}
    request = Request(handler.command, handler.path, headers, body, scheme="http")
    future = asyncio.run_coroutine_threadsafe(dashboard.handle(request), loop)
    response = future.result(ANSWER_TIMEOUT)
    if response is None:
        return False
    if response.stream is None:
        with contextlib.suppress(OSError):  # the client went before the answer
            _write(handler, response.status, response.headers, response.body)
        return True
    stream = response.stream
    handler.close_connection = True
    handler.send_response(response.status)
    for name, value in response.headers.items():
        handler.send_header(name, value)
    handler.end_headers()
    try:
        while True:
            chunk = asyncio.run_coroutine_threadsafe(_next(stream), loop).result(ANSWER_TIMEOUT)
            if chunk is None:
                break
            handler.wfile.write(chunk)
            handler.wfile.flush()
    except (OSError, RuntimeError):  # the client went, or the loop stopped
        pass
    finally:
        with contextlib.suppress(Exception):
            aclose = getattr(stream, "aclose", None)
            if aclose is not None and not loop.is_closed():
                asyncio.run_coroutine_threadsafe(aclose(), loop).result(5)
    return True


async def _next(stream: Any) -> bytes | None:
    try:
        chunk: bytes = await anext(stream)
    except StopAsyncIteration:
        return None
    return chunk


def _write(
    handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str], body: bytes
) -> None:
    handler.send_response(status)
    for name, value in headers.items():
        if name.lower() != "content-length":
            handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)
