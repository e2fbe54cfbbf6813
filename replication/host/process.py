"""The worker process: where the local host's functions run, as the Functions host runs
them in a language worker process of their own.

The host (``app.Host``, ``python -m replication start``) receives, renews locks, serves
settlement (``settlement.py``) and decides what becomes of each message; the worker
(``python -m replication.host.language_worker``) imports ``function_app.py``, decodes the
binding data (``invocation.arguments``) and calls the function. The two run on two cores:
the extension's decoding of each message (uamqp), the function and its sends no longer
hold the GIL the host's receivers and the settlement server need. They talk over
``channel.py`` (a socket pair the worker inherits; one frame per invocation, a batch for
``cardinality=many``), and ``ServiceBusMessageActions`` in the worker calls the host's
``Settlement`` gRPC service, whose address the worker gets on its command line as from the
Functions host (``--host``, ``--port``, ``--functions-grpc-max-message-length``). Each reply
carries the metrics the worker counted meanwhile (``relay.py``).

A worker that dies (a function that calls ``os._exit``, a crash in native code) is noticed
when its end of the channel closes: every invocation it had fails with ``WorkerCrashed``
and the next one starts a new worker (``restarts`` counts them). The Functions host does
the same (it restarts the worker, and the host itself after repeated failures); for it
the invocation failed, so the Service Bus extension abandons the messages, or their locks
expire, and either costs each a delivery. Ours releases them (``trigger.py``): the message
was not the function's to fail (the process was lost under it), so it comes again
without a delivery counted, unless it was in a batch that crashed a worker before. A
worker that cannot start (``WorkerUnavailable``) ran nothing: its batch goes back with no
delivery counted, and the tries to start one wait longer and longer (``RESTART_BACKOFF``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..clock import SYSTEM, Clock
from ..telemetry.export import METRICS_EXPORTER
from .channel import read_frame, write_frame
from .invocation import Invocation
from .relay import apply

log = logging.getLogger("replication.host")

START_TIMEOUT = 120.0
"""Seconds a worker may take to import the app and say it is ready."""
RESTART_BACKOFF = (1.0, 30.0)
"""Seconds before the first new try after a worker could not start, doubling up to the
second figure while it goes on failing."""
STOP_TIMEOUT = 10.0
COUNT_SETTING = "FUNCTIONS_WORKER_PROCESS_COUNT"
MAX_PROCESSES = 10
WORKER_BOOTSTRAP = (
    "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
    "import runpy; runpy.run_module('replication.host.language_worker', run_name='__main__')"
)
"""How a worker starts. Ctrl-C in a terminal reaches the whole process group, and the host
lets the batches in flight finish and settle, then closes the channel, which is what ends a
worker: so a worker ignores SIGINT. It is started with SIGINT blocked (``_spawn``) and
ignores it before unblocking it, so no Ctrl-C can reach it before (one that ignored it
only once its module ran died of a Ctrl-C made while it imported: a traceback, and
``start`` ended with "the worker process exited before it was ready")."""


class WorkerCrashed(Exception):
    """The worker process ended while the function ran (its exit code in the message)."""


class WorkerUnavailable(WorkerCrashed):
    """No worker process could be started (it exited, or did not say ready in time, before
    any function ran): no message is to blame, and none is charged a delivery for it."""

    retry_in = 0.0
    """Seconds before the next try to start one."""


class FunctionFailed(Exception):
    """The function raised in the worker (its exception's type and text)."""


@dataclass(slots=True)
class _Channel:
    """One worker's end of the channel and the invocations it has."""

    process: subprocess.Popen[bytes]
    sock: socket.socket
    writer: asyncio.StreamWriter
    pending: dict[int, asyncio.Future[None]] = field(default_factory=dict)
    reading: asyncio.Task[None] | None = None


class WorkerProcess:
    """The host's side of the worker process for the app at ``app_path``."""

    def __init__(self, app_path: Path, settlement: list[str], clock: Clock = SYSTEM) -> None:
        """``settlement``: the worker command-line arguments naming the settlement service
        (``SettlementService.worker_arguments``); ``clock``: what the pause between tries to
        start a failing worker waits on."""
        self.app_path = app_path
        self.settlement = settlement
        self.clock = clock
        self.restarts = 0
        """Workers that died under the host (each one's successor starts on demand)."""
        self.failed_starts = 0
        """Tries to start a worker that failed (it exited or hung before it was ready)."""
        self.functions: list[str] = []
        """The functions the worker indexed (its ``ready`` frame)."""
        self._channel: _Channel | None = None
        self._ids = itertools.count()
        self._starting: asyncio.Lock | None = None
        self._stopped = False
        self._failing = 0
        """Tries that failed since the worker last started (what the pause grows with)."""
        self._next_start = 0.0
        """When (``clock.monotonic``) the next try to start may be made."""
        self._stop_requested: asyncio.Event | None = None

    def in_flight(self) -> int:
        """Invocations sent and not answered yet."""
        return 0 if self._channel is None else len(self._channel.pending)

    @property
    def pid(self) -> int | None:
        """The running worker's process id (None before it starts and after it died)."""
        return None if self._channel is None else self._channel.process.pid

    async def start(self) -> None:
        """Starts the worker unless it runs; returns once it imported the app. Raises
        ``WorkerUnavailable`` when it could not start; while it goes on failing (an app
        edited into a broken state after a worker died, say) each try waits longer than the
        one before (``RESTART_BACKOFF``), and so do the invocations that need it."""
        if self._starting is None:
            self._starting = asyncio.Lock()
            self._stop_requested = asyncio.Event()
        async with self._starting:
            if self._channel is not None:
                return
            await self._wait_to_retry()
            if self._stopped:
                raise WorkerCrashed("the worker is stopped")
            try:
                await self._spawn()
            except WorkerUnavailable as exc:
                self.failed_starts += 1
                self._failing += 1
                first, most = RESTART_BACKOFF
                pause = min(most, first * 2 ** (self._failing - 1))
                self._next_start = self.clock.monotonic() + pause
                exc.retry_in = pause
                raise
            self._failing = 0

    async def _wait_to_retry(self) -> None:
        """Waits out the pause after a failed start; ``stop`` ends it early."""
        pause = self._next_start - self.clock.monotonic()
        if pause <= 0 or self._stop_requested is None:
            return
        sleeping = asyncio.ensure_future(self.clock.sleep(pause))
        stopping = asyncio.ensure_future(self._stop_requested.wait())
        await asyncio.wait((sleeping, stopping), return_when=asyncio.FIRST_COMPLETED)
        sleeping.cancel()
        stopping.cancel()

    async def _spawn(self) -> None:
        ours, theirs = socket.socketpair()
        command = [
            sys.executable,
            "-c",
            WORKER_BOOTSTRAP,
            "--app",
            str(self.app_path),
            "--channel",
            str(theirs.fileno()),
            *self.settlement,
        ]
        # blocked, not ignored, here: a Ctrl-C meanwhile waits for the host, not lost
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            process = subprocess.Popen(command, pass_fds=(theirs.fileno(),), env=_environment())
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            theirs.close()
        reader, writer = await asyncio.open_connection(sock=ours)
        try:
            kind, functions = await asyncio.wait_for(read_frame(reader), START_TIMEOUT)
        except (EOFError, TimeoutError) as exc:
            writer.close()
            if isinstance(exc, TimeoutError):
                process.kill()
            code = await asyncio.to_thread(process.wait)
            why = (
                f"was not ready after {START_TIMEOUT:g} s (killed)"
                if isinstance(exc, TimeoutError)
                else f"exited (exit code {code}) before it was ready"
            )
            raise WorkerUnavailable(
                f"the worker process {process.pid} {why}: its output above says why"
            ) from None
        assert kind == "ready", kind
        self.functions = list(functions)
        channel = self._channel = _Channel(process, ours, writer)
        channel.reading = asyncio.create_task(self._read(reader, channel))
        log.info("worker process %d ready (%d functions)", process.pid, len(functions))

    async def invoke(self, trigger: Any, invocation: Invocation) -> None:
        """Runs ``invocation`` in the worker; raises ``FunctionFailed`` when the function
        raised, ``WorkerCrashed`` when the worker died meanwhile."""
        if self._channel is None:
            await self.start()
        channel = self._channel
        assert channel is not None
        number = next(self._ids)
        done = channel.pending[number] = asyncio.get_running_loop().create_future()
        write_frame(channel.writer, ("invoke", number, invocation))
        try:
            await done
        finally:
            channel.pending.pop(number, None)

    async def _read(self, reader: asyncio.StreamReader, channel: _Channel) -> None:
        """Replies until the worker is gone; then what it had fails with ``WorkerCrashed``
        (the next invocation starts another worker)."""
        try:
            while True:
                _, number, error, changes = await read_frame(reader)
                if changes:
                    apply(changes)
                done = channel.pending.get(number)
                if done is None or done.done():
                    continue
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(FunctionFailed(error))
        except EOFError:
            pass
        finally:
            if self._channel is channel:
                self._channel = None
            channel.writer.close()
        code = await asyncio.to_thread(channel.process.wait)
        if not self._stopped:
            self.restarts += 1
            log.error("the worker process %d ended (exit code %s)", channel.process.pid, code)
        crashed = WorkerCrashed(f"the worker process exited ({code})")
        for done in channel.pending.values():
            if not done.done():
                done.set_exception(crashed)

    def stop(self) -> None:
        """Closes the channel (the worker ends when it sees that) and waits for it. The
        socket is shut down here, not by the transport's close: that would wait for a turn
        of the loop this wait holds up."""
        self._stopped = True
        if self._stop_requested is not None:
            self._stop_requested.set()
        channel, self._channel = self._channel, None
        if channel is None:
            return
        if channel.reading is not None:
            channel.reading.cancel()
        with contextlib.suppress(OSError):
            channel.sock.shutdown(socket.SHUT_RDWR)
        channel.writer.close()
        try:
            channel.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            channel.process.kill()
            channel.process.wait()


class WorkerPool:
    """``FUNCTIONS_WORKER_PROCESS_COUNT`` worker processes for one app, as the Functions host
    keeps them (1 by default, at most 10): each invocation goes to the one with the fewest
    in flight, so a CPU-bound app uses more than one core."""

    def __init__(
        self, app_path: Path, settlement: list[str], count: int = 1, clock: Clock = SYSTEM
    ) -> None:
        if not 1 <= count <= MAX_PROCESSES:
            raise ValueError(f"{COUNT_SETTING} must be 1 to {MAX_PROCESSES}, not {count}")
        self.workers = [WorkerProcess(app_path, settlement, clock) for _ in range(count)]
        self._turn = itertools.count()

    @classmethod
    def from_settings(
        cls, app_path: Path, settlement: list[str], settings: Mapping[str, str]
    ) -> WorkerPool:
        return cls(app_path, settlement, int(settings.get(COUNT_SETTING) or 1))

    @property
    def restarts(self) -> int:
        return sum(w.restarts for w in self.workers)

    @property
    def failed_starts(self) -> int:
        return sum(w.failed_starts for w in self.workers)

    async def start(self) -> None:
        await asyncio.gather(*(w.start() for w in self.workers))

    async def invoke(self, trigger: Any, invocation: Invocation) -> None:
        turn = next(self._turn)
        count = len(self.workers)
        order = [self.workers[(turn + i) % count] for i in range(count)]
        await min(order, key=WorkerProcess.in_flight).invoke(trigger, invocation)

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()


def _environment() -> dict[str, str]:
    """This process's environment (the app settings are in it), with the ``replication``
    package this host runs first on the worker's path (the worker runs the same code), and
    no metrics exporter: the worker's counts reach the exporters once, through the host
    (``relay.py``); its traces and logs it exports itself."""
    import replication

    root = str(Path(replication.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}",
        METRICS_EXPORTER: "none",
    }
