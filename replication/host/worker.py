"""The Python worker's loop and threads: where a function runs once its worker has it.

In Azure the functions run in a language worker process with its own event loop; the host
talks to it over gRPC and keeps receiving and settling meanwhile. ``Worker`` is that
loop: a thread with its own event loop, where async functions run (so a function may block
its loop on a synchronous settlement call without stopping the channel that feeds it, and
every invocation of an app shares one loop, as the clients it keeps expect), and a thread
pool for sync functions. The binding data is decoded there too (``invocation.arguments``).

The local host runs it inside the worker process (``process.WorkerProcess``, the default,
as ``func start`` does), or in the host's own process when the functions must share it:
an app built in the caller's process rather than imported from ``function_app.py``, or a
host on a ``ManualClock`` (a clock cannot cross a process boundary).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import threading
from typing import Any

from . import bindings
from .invocation import Invocation, arguments


class Worker:
    """Runs functions on the worker loop; ``invoke`` is awaited on the host's loop."""

    def __init__(self, max_threads: int = 16, settlement: list[str] | None = None) -> None:
        """``settlement``: the worker's command-line arguments that name the host's
        settlement service (None: this process's ``SettlementService``)."""
        self._loop = asyncio.new_event_loop()
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_threads, thread_name_prefix="function"
        )
        self._settlement = settlement
        self._actions: Any = None
        self._thread = threading.Thread(target=self._run, name="python-worker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    async def invoke(self, trigger: Any, invocation: Invocation) -> None:
        """Binds ``invocation`` for ``trigger``'s function and calls it; waits for it (its
        exception is raised here)."""
        function = trigger.function

        def bound() -> dict[str, Any]:
            return arguments(trigger, invocation, self._settlement_client)

        if inspect.iscoroutinefunction(function):

            async def call() -> Any:
                return await function(**bound())

            future = asyncio.run_coroutine_threadsafe(call(), self._loop)
            await asyncio.wrap_future(future)
            return
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._threads, lambda: function(**bound()))

    def _settlement_client(self) -> Any:
        if self._actions is None:
            worker_arguments = self._settlement
            if worker_arguments is None:
                from .settlement import SettlementService

                worker_arguments = SettlementService.shared().worker_arguments()
            self._actions = bindings.settlement_client(worker_arguments)
        return self._actions

    def stop(self, close_senders: bool = True) -> None:
        """Closes the pipelines' senders (unless told not to), cancels what still runs on
        the worker loop, then ends the thread."""

        async def shut_down() -> None:
            if close_senders:
                from ..functions import close_senders as close

                await close()  # while their connections' tasks still run
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
