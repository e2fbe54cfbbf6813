"""The Python worker's part of an invocation, in the host's process.

In Azure the functions run in a worker process with its own event loop; the host talks to
it over gRPC and keeps receiving and settling meanwhile. Here the worker is a thread with
its own event loop: async functions run there (so a function may block its loop on a
synchronous settlement call without stopping the host's receivers, and every invocation
of an app shares one loop, as the clients it keeps expect), sync functions run in the
worker's thread pool.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import threading
from collections.abc import Callable
from typing import Any


class Worker:
    """Runs functions on the worker loop; ``invoke`` is awaited on the host's loop."""

    def __init__(self, max_threads: int = 16) -> None:
        self._loop = asyncio.new_event_loop()
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_threads, thread_name_prefix="function"
        )
        self._thread = threading.Thread(target=self._run, name="python-worker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    async def invoke(self, function: Callable[..., Any], arguments: dict[str, Any]) -> Any:
        """Calls ``function(**arguments)`` and waits for it (its exception is raised here)."""
        if inspect.iscoroutinefunction(function):
            future = asyncio.run_coroutine_threadsafe(function(**arguments), self._loop)
            return await asyncio.wrap_future(future)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, lambda: function(**arguments))

    def stop(self) -> None:
        """Cancels what still runs on the worker loop, then ends the thread."""

        async def shut_down() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await self._loop.shutdown_asyncgens()

        if self._loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(shut_down(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._loop.is_running():
            self._loop.close()
        self._threads.shutdown(wait=False, cancel_futures=True)
