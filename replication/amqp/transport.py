"""The thin asyncio shell around the sans-IO ``Connection``: sockets, TLS, timers.

``ConnectionDriver`` is an ``asyncio.Protocol``: bytes that arrive go straight into the
connection, each resulting event goes to a handler, and whatever the connection then wants
to send is written at once; idle-timeout ticks run on a loop timer. Using callbacks rather
than streams keeps the per-message cost to a function call (no task or future per read).
``serve`` accepts connections for a server; ``connect`` opens a client connection. Nothing
here knows AMQP rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

from . import events as ev
from .connection import Connection

log = logging.getLogger(__name__)

EventHandler = Callable[["ConnectionDriver", ev.Event], Awaitable[None] | None]
"""Called for every event, in order. Keep it quick: it runs inside the socket callback. An
async handler is started as a task (for work that must wait), so later events may overtake it."""


class ConnectionDriver(asyncio.Protocol):
    """Runs one ``Connection`` over an asyncio transport until either side closes it."""

    def __init__(self, connection: Connection, handler: EventHandler | None = None) -> None:
        self.connection = connection
        self.handler = handler
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.peer: Any = None
        self.closed = asyncio.Event()
        self.paused = False
        """True while the socket's write buffer is full: producers should hold back."""
        self.on_resume: Callable[[], None] | None = None
        self._wake_pending = False
        self._timer: asyncio.TimerHandle | None = None
        self._waiters: list[tuple[Callable[[ev.Event], bool], asyncio.Future[ev.Event]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def writer(self) -> asyncio.Transport | None:
        """The transport (``get_extra_info`` gives peername, ssl_object, peercert)."""
        return self.transport

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream's: a Transport
        self.peer = transport.get_extra_info("peername")
        self._service()

    def data_received(self, data: bytes) -> None:
        self.connection.receive_data(data)
        self._dispatch()
        self.wake()  # written later in this loop turn: with what the group commit releases

    def eof_received(self) -> bool:
        self.connection.receive_data(b"")
        self._service()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            log.debug("connection to %s lost: %s", self.peer, exc)
        if not self.connection.is_terminated:
            self.connection.receive_data(b"")
        self._dispatch()
        if self._timer is not None:
            self._timer.cancel()
        for _, future in self._waiters:
            if not future.done():
                future.set_exception(ConnectionError("AMQP connection closed"))
        self._waiters.clear()
        self.closed.set()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.on_resume is not None:
            self.on_resume()
        self.wake()

    # ------------------------------------------------------------------ driving

    def wake(self) -> None:
        """Asks for output to be collected and written soon (after acting on the connection).

        Many wakes in one loop turn cost one write: that is where transfers batch up."""
        if not self._wake_pending and not self.closed.is_set():
            self._wake_pending = True
            self.loop.call_soon(self._on_wake)

    def _on_wake(self) -> None:
        self._wake_pending = False
        if self.transport is not None:
            self._service()

    def _service(self) -> None:
        self._dispatch()
        self._flush()
        self._tick()

    def _dispatch(self) -> None:
        connection = self.connection
        while (event := connection.next_event()) is not None:
            if self._waiters:
                for predicate, future in list(self._waiters):
                    if not future.done() and predicate(event):
                        future.set_result(event)
            if self.handler is not None:
                try:
                    result = self.handler(self, event)
                except Exception:
                    log.exception("event handler failed on %r", event)
                    continue
                if result is not None and inspect.isawaitable(result):
                    task = self.loop.create_task(_run_handler(result, self))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)

    def _flush(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        data = self.connection.data_to_send()
        if data:
            transport.write(data)
        if self.connection.is_terminated:
            transport.close()

    def _tick(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self.connection.tick(time.monotonic())
        self._flush()
        if deadline is not None and not self.closed.is_set():
            delay = max(0.0, deadline - time.monotonic())
            self._timer = self.loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._service()

    async def wait_for(
        self, predicate: Callable[[ev.Event], bool], timeout: float | None = None
    ) -> ev.Event:
        """The next event matching ``predicate`` (for clients awaiting a reply)."""
        future: asyncio.Future[ev.Event] = self.loop.create_future()
        if self.closed.is_set():
            raise ConnectionError("AMQP connection closed")
        self._waiters.append((predicate, future))
        self.wake()
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._waiters = [(p, f) for p, f in self._waiters if f is not future]

    async def close(self, error: Any = None, timeout: float = 5.0) -> None:
        """Closes politely, waits for the peer's close (bounded), then drops the socket."""
        self.connection.close(error)
        self.wake()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.closed.wait(), timeout)
        if not self.closed.is_set() and self.transport is not None:
            self.transport.abort()
            await self.closed.wait()


async def _run_handler(result: Awaitable[None], driver: ConnectionDriver) -> None:
    try:
        await result
    except Exception:
        log.exception("event handler failed")
    driver.wake()


async def serve(
    make_connection: Callable[[], Connection],
    handler: EventHandler | None,
    host: str = "127.0.0.1",
    port: int = 5672,
    *,
    ssl_context: ssl.SSLContext | None = None,
) -> asyncio.Server:
    """Listens for AMQP connections; each gets a fresh ``Connection`` and driver."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: ConnectionDriver(make_connection(), handler), host, port, ssl=ssl_context
    )


async def connect(
    connection: Connection,
    host: str,
    port: int,
    *,
    handler: EventHandler | None = None,
    ssl_context: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
) -> ConnectionDriver:
    """Opens a TCP (or TLS) connection and starts driving ``connection`` over it."""
    loop = asyncio.get_running_loop()
    _, driver = await loop.create_connection(
        lambda: ConnectionDriver(connection, handler),
        host,
        port,
        ssl=ssl_context,
        server_hostname=server_hostname if ssl_context else None,
    )
    return driver
