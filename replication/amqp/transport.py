"""The thin asyncio shell around the sans-IO ``Connection``: sockets, TLS, timers.

``ConnectionDriver`` reads from a stream into the connection, hands each event to a handler,
writes what the connection wants to send, and ticks the idle timeout. ``serve`` accepts
connections for a server; ``connect`` opens a client connection. Nothing here knows AMQP rules.
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

READ_CHUNK = 256 * 1024

EventHandler = Callable[["ConnectionDriver", ev.Event], Awaitable[None] | None]


class ConnectionDriver:
    """Runs one ``Connection`` over an asyncio stream until either side closes it."""

    def __init__(
        self,
        connection: Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        handler: EventHandler | None = None,
    ) -> None:
        self.connection = connection
        self.reader = reader
        self.writer = writer
        self.handler = handler
        self.peer = writer.get_extra_info("peername")
        self.closed = asyncio.Event()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._waiters: list[tuple[Callable[[ev.Event], bool], asyncio.Future[ev.Event]]] = []

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.get_running_loop().create_task(self.run())
        return self._task

    def wake(self) -> None:
        """Asks the loop to collect and write output (call after acting on the connection)."""
        self._wake.set()

    async def wait_for(
        self, predicate: Callable[[ev.Event], bool], timeout: float | None = None
    ) -> ev.Event:
        """The next event matching ``predicate`` (for clients awaiting a reply)."""
        future: asyncio.Future[ev.Event] = asyncio.get_running_loop().create_future()
        self._waiters.append((predicate, future))
        self.wake()
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._waiters = [(p, f) for p, f in self._waiters if f is not future]

    async def run(self) -> None:
        read_task: asyncio.Task[bytes] | None = None
        wake_task: asyncio.Task[bool] | None = None
        try:
            await self._flush()
            while not self.connection.is_terminated:
                deadline = self.connection.tick(time.monotonic())
                await self._flush()
                if self.connection.is_terminated:
                    break
                if read_task is None:
                    read_task = asyncio.ensure_future(self.reader.read(READ_CHUNK))
                if wake_task is None:
                    wake_task = asyncio.ensure_future(self._wake.wait())
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                done, _ = await asyncio.wait(
                    {read_task, wake_task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if wake_task in done:
                    wake_task = None
                    self._wake.clear()
                if read_task in done:
                    try:
                        data = read_task.result()
                    except (ConnectionError, OSError) as exc:
                        log.debug("read from %s failed: %s", self.peer, exc)
                        data = b""
                    read_task = None
                    self.connection.receive_data(data)
                await self._dispatch()
            await self._flush()
        finally:
            for task in (read_task, wake_task):
                if task is not None:
                    task.cancel()
            await self._dispatch()
            for _, future in self._waiters:
                if not future.done():
                    future.set_exception(ConnectionError("AMQP connection closed"))
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
            self.closed.set()

    async def _dispatch(self) -> None:
        while (event := self.connection.next_event()) is not None:
            for predicate, future in list(self._waiters):
                if not future.done() and predicate(event):
                    future.set_result(event)
            if self.handler is not None:
                result = self.handler(self, event)
                if inspect.isawaitable(result):
                    await result
            await self._flush()

    async def _flush(self) -> None:
        data = self.connection.data_to_send()
        if data:
            self.writer.write(data)
            try:
                await self.writer.drain()
            except (ConnectionError, OSError) as exc:
                log.debug("write to %s failed: %s", self.peer, exc)
                self.connection.receive_data(b"")

    async def close(self, error: Any = None, timeout: float = 5.0) -> None:
        """Closes politely, waits for the peer's close (bounded), then drops the socket."""
        self.connection.close(error)
        self.wake()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.closed.wait(), timeout)
        if not self.closed.is_set() and self._task is not None:
            self._task.cancel()


async def serve(
    make_connection: Callable[[], Connection],
    handler: EventHandler | None,
    host: str = "127.0.0.1",
    port: int = 5672,
    *,
    ssl_context: ssl.SSLContext | None = None,
) -> asyncio.Server:
    """Listens for AMQP connections; each gets a fresh ``Connection`` and a driver task."""
    drivers: set[asyncio.Task[None]] = set()

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        driver = ConnectionDriver(make_connection(), reader, writer, handler)
        task = driver.start()
        drivers.add(task)
        task.add_done_callback(drivers.discard)
        try:
            await task
        except Exception:
            log.exception("connection from %s failed", driver.peer)

    return await asyncio.start_server(on_client, host, port, ssl=ssl_context, limit=READ_CHUNK)


async def connect(
    connection: Connection,
    host: str,
    port: int,
    *,
    handler: EventHandler | None = None,
    ssl_context: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
) -> ConnectionDriver:
    """Opens a TCP (or TLS) stream and starts driving ``connection`` over it."""
    reader, writer = await asyncio.open_connection(
        host, port, ssl=ssl_context, server_hostname=server_hostname if ssl_context else None,
        limit=READ_CHUNK,
    )  # fmt: skip
    driver = ConnectionDriver(connection, reader, writer, handler)
    driver.start()
    return driver
