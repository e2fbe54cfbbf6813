"""Child processes a test starts, each in a session of its own, ended with their whole
process group when the test ends, whatever its outcome: a failed assertion must not leave a
Spark driver, its JVM or a local host running after the suite (``processes`` fixture)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Any


class Processes:
    def __init__(self) -> None:
        self._started: list[subprocess.Popen[Any]] = []

    def start(self, argv: list[str], **options: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen(argv, **options)`` in a new session (its own process group)."""
        process: subprocess.Popen[Any] = subprocess.Popen(argv, start_new_session=True, **options)
        self._started.append(process)
        return process

    def end_all(self) -> None:
        """SIGKILL to each process group still there, then reap the leaders."""
        for process in reversed(self._started):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
            for stream in (process.stdin, process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
        self._started.clear()
