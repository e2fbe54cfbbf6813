"""Shared by the dashboard tests: ``python -m replication broker`` as a child process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.broker.conftest import REPO_ROOT, make_config, write_config
from tests.ports import LISTENING
from tests.processes import Processes

HTTP = re.compile(r"HTTP on port (\d+)")


def start_broker(
    processes: Processes, tmp_path: Path, *args: str, config: dict[str, Any] | None = None
) -> tuple[int, int, str]:
    """Starts the broker (on ``config``, default one queue ``work``); returns its AMQP port,
    plain HTTP port and log so far."""
    written = write_config(tmp_path / "Config.json", config or make_config({"work": {}}))
    log = tmp_path / "broker.log"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    with log.open("ab") as out:
        process = processes.start(
            [sys.executable, "-m", "replication", "broker", "--config", str(written),
             "--port", "0", "--http-port", "0", "--data-dir", str(tmp_path / "data"), *args],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
        )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        text = log.read_text()
        amqp, http = LISTENING.search(text), HTTP.search(text)
        if amqp and http and ("--ui" not in args or "dashboard on" in text):
            return int(amqp.group(1)), int(http.group(1)), text
        time.sleep(0.05)
    raise TimeoutError(f"the broker did not start: {log.read_text()}")
