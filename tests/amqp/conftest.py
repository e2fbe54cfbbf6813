"""Fixtures for the interop tests: our in-memory AMQP server on a background event loop.

The server runs in its own thread with its own asyncio loop, so blocking clients (proton's
``BlockingConnection``) and asyncio clients on the test's loop can both talk to it over real
TCP. Teardown closes the listener, gives the server's connection tasks a moment to end (the
clients have closed by then), fails the test if any had to be cancelled, and joins the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TypeVar

import pytest

from replication.amqp.connection import Connection
from replication.amqp.memory_node import MemoryNode, start_memory_server

T = TypeVar("T")

HOST = "127.0.0.1"
USERS = {"u": "p"}


class LoopThread:
    """An asyncio event loop running forever in a daemon thread, stopped by ``close``."""

    def __init__(self, name: str = "amqp-server-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Awaitable[T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]

    def run(self, coro: Awaitable[T], timeout: float = 10.0) -> T:
        """Runs ``coro`` on the loop and waits for its result from another thread."""
        return self.submit(coro).result(timeout)

    def call(self, fn: Callable[[], T], timeout: float = 10.0) -> T:
        """Calls ``fn`` on the loop's thread (to read state the loop owns without racing it)."""

        async def _call() -> T:
            return fn()

        return self.run(_call(), timeout)

    def close(self, timeout: float = 10.0, grace: float = 3.0) -> list[str]:
        """Lets running tasks finish (for ``grace`` s), cancels the rest, stops the loop.

        Returns the tasks that had to be cancelled (a server connection still running after
        every client left is a leak worth failing a test for).
        """
        if not self._thread.is_alive():
            return []
        leftovers: list[str] = []

        async def _finish_all() -> None:
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            if tasks:
                await asyncio.wait(tasks, timeout=grace)
            for task in tasks:
                if not task.done():
                    leftovers.append(repr(task.get_coro()))
                    task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=timeout)

        try:
            self.run(_finish_all(), timeout + grace + 5)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
        assert not self._thread.is_alive(), "server loop thread did not stop"
        self.loop.close()
        return leftovers


@dataclass
class ServerHandle:
    """A running server: where it listens and the ``MemoryNode`` behind it."""

    host: str
    port: int
    node: MemoryNode
    server: asyncio.Server
    loop_thread: LoopThread
    users: dict[str, str] | None = None
    connections: list[Connection] = field(default_factory=list)
    """Every server-side ``Connection`` so far (read them on the loop: ``loop_thread.call``)."""

    def url(
        self, scheme: str = "amqp", user: str | None = None, password: str | None = None
    ) -> str:
        auth = f"{user}:{password}@" if user is not None else ""
        return f"{scheme}://{auth}{self.host}:{self.port}"

    def queue_depth(self, address: str) -> int:
        return self.loop_thread.call(lambda: len(self.node.queues.get(address, ())))

    def received(self) -> int:
        return self.loop_thread.call(lambda: self.node.received)


@contextlib.contextmanager
def running_server(
    *,
    users: dict[str, str] | None = None,
    start: Callable[[list[Connection]], Awaitable[tuple[asyncio.Server, MemoryNode]]] | None = None,
) -> Iterator[ServerHandle]:
    """Starts a memory server on a background loop; stops it and its connections on exit.

    ``start(connections)`` replaces ``start_memory_server`` (e.g. to serve over TLS); it
    should append each new server ``Connection`` to ``connections``.
    """
    loop_thread = LoopThread()
    connections: list[Connection] = []
    try:
        if start is None:
            server, node = loop_thread.run(
                start_memory_server(HOST, 0, users=users, on_connection=connections.append)
            )
        else:
            server, node = loop_thread.run(start(connections))
        port = server.sockets[0].getsockname()[1]
        handle = ServerHandle(HOST, port, node, server, loop_thread, users, connections)
        try:
            yield handle
        finally:

            async def _stop() -> None:
                server.close()
                await server.wait_closed()

            loop_thread.run(_stop())
    finally:
        leftovers = loop_thread.close()
    assert not leftovers, f"server connections still running after the test: {leftovers}"


@pytest.fixture
def auth_server() -> Iterator[ServerHandle]:
    """A memory server that demands SASL PLAIN with user ``u``, password ``p``."""
    with running_server(users=dict(USERS)) as handle:
        yield handle


@pytest.fixture
def anon_server() -> Iterator[ServerHandle]:
    """A memory server that accepts anyone (SASL ANONYMOUS or PLAIN, or no SASL at all)."""
    with running_server(users=None) as handle:
        yield handle


@pytest.fixture(params=["plain", "anonymous"])
def any_server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """Both variants, for tests that must hold whatever the server's SASL policy."""
    users = dict(USERS) if request.param == "plain" else None
    with running_server(users=users) as handle:
        yield handle
