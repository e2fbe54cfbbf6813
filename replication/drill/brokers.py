"""The drill's embedded namespaces: ``python -m replication broker`` as child processes.

A process of its own, not a broker on this process's loop, so that ``kill`` is a real crash
(SIGKILL: no goodbye to clients, nothing flushed but what the broker's commits wrote) and so
that the brokers do not share the drill's event loop. Each listens on a port from the OS
(``--port 0``) and says which in its log; its data stay in its folder after the drill, so
what it held can be looked at again by starting a broker over that folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import replication

from ..broker.auth import EMULATOR_KEY, EMULATOR_RULE_NAME

LISTENING = re.compile(r"broker listening on [^:\s]+:(\d+)")
"""What ``python -m replication broker`` logs once it listens (its AMQP port)."""
START_TIMEOUT = 60.0


class BrokerProcess:
    """One embedded namespace: ``start`` (waits until it listens), ``kill``, ``stop``."""

    def __init__(self, name: str, folder: Path, config: dict[str, Any]) -> None:
        self.name = name
        self.folder = folder
        self.config_path = folder / "Config.json"
        self.log_path = folder / "process.log"
        self.config = config
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def connection_string(self) -> str:
        """The emulator connection string of this broker (plain AMQP on its port)."""
        return (
            f"Endpoint=sb://localhost:{self.port};SharedAccessKeyName={EMULATOR_RULE_NAME};"
            f"SharedAccessKey={EMULATOR_KEY};UseDevelopmentEmulator=true;"
        )

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    async def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(json.dumps(self.config, indent=2), encoding="utf-8")
        package_parent = str(Path(replication.__file__).resolve().parents[1])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
        argv = [
            sys.executable,
            "-m",
            "replication",
            "broker",
            "--config",
            str(self.config_path),
            "--data-dir",
            str(self.folder / "data"),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--no-http",
            "--log-level",
            "INFO",
        ]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.port = await asyncio.to_thread(self._bound_port)

    def _bound_port(self) -> int:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            found = LISTENING.search(self.log_path.read_text(errors="replace"))
            if found:
                return int(found.group(1))
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the {self.name} broker exited with {self.process.returncode}: "
                    f"{self.log_path.read_text(errors='replace')[-2000:]}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"the {self.name} broker did not listen in {START_TIMEOUT} s")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL to its process group, and reaped: what a crash looks like to clients."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (the broker's graceful stop), SIGKILL if it does not end in ``timeout``."""
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
