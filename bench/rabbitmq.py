"""The RabbitMQ reference for bench/broker.py: a private node with the AMQP 1.0 plugin.

Issue 20 sets the broker's goal against Debian's ``rabbitmq-server`` (3.10.8 on bookworm)
with its ``rabbitmq_amqp1_0`` plugin, measured in the same run as our broker, so the figures
share the machine's state. The system service is never used (it may not exist, run another
version, or be configured otherwise): ``RabbitMQNode`` starts its own node as a child process,
with everything in a temporary directory:

- ``HOME`` (so the Erlang cookie is private), ``RABBITMQ_MNESIA_BASE``, ``RABBITMQ_LOG_BASE``,
  ``RABBITMQ_ENABLED_PLUGINS_FILE`` (``[rabbitmq_amqp1_0].``), ``RABBITMQ_CONFIG_FILE``
  (``loopback_users.guest = true``: guest/guest from 127.0.0.1, the default) and an empty
  ``RABBITMQ_CONF_ENV_FILE``, so nothing in /etc/rabbitmq applies;
- node ``bench-<pid>@localhost``, AMQP on 127.0.0.1 and Erlang distribution on free ports;
- its own ``epmd`` on a free port (``ERL_EPMD_PORT``), a child process like the node, so a
  system epmd is neither needed nor touched, and stopping ours cannot hurt anyone else's.

The node is ready when its log says ``Server startup complete``; ``stop`` runs ``rabbitmqctl
stop`` (SIGTERM, then SIGKILL, to its process group if that fails), stops our epmd and removes
the directory. ``ensure_installed`` installs the package with apt-get when it is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
USER = "guest"
PASSWORD = "guest"
PACKAGE = "rabbitmq-server"
SCRIPTS = Path("/usr/lib/rabbitmq/bin")
"""Debian's real scripts (/usr/sbin/rabbitmq-server is a wrapper that su's to the rabbitmq
user and runs from /var/lib/rabbitmq)."""
INSTALL_TIMEOUT = 900.0
START_TIMEOUT = 90.0
CTL_TIMEOUT = 60.0
READY = "Server startup complete"
VERSION = re.compile(r"RabbitMQ (\d+\.\d+\.\d+)")
ERLANG = re.compile(r"Erlang:\s+(\S+)")
TROUBLE = re.compile(r"^(\S+ \[(?:warning|error|critical|alert|emergency)\] <[\d.]+>) ?(.*)")
"""A log line of a warning or worse: its report's key (time, level, Erlang pid), its text."""
EXPECTED = (
    "rebuilding indices from scratch",  # a fresh message store, every start here
    "AMQP 0-9-1 client call timeout",  # the AMQP 1.0 plugin's internal channel, at each connect
)
"""Warnings every healthy run of this node logs; anything else is reported."""
CLOSE_RACE = ("amqp_channel_sup_sup", "shutdown_error")
"""A supervisor report that 3.10's AMQP 1.0 plugin logs now and then as a client closes its
connection (its internal channel already gone: reason noproc or shutdown); counted apart."""


class RabbitMQError(Exception):
    """The reference node could not be installed, started or used."""


def scripts_dir() -> Path | None:
    """Where ``rabbitmq-server`` and ``rabbitmqctl`` can be run directly, if anywhere."""
    candidates = [SCRIPTS]
    found = shutil.which("rabbitmq-server")
    if found:
        candidates.append(Path(found).resolve().parent)
    for directory in candidates:
        if (directory / "rabbitmq-server").is_file() and (directory / "rabbitmqctl").is_file():
            if directory == Path("/usr/sbin"):
                continue  # Debian's su wrapper, see SCRIPTS
            return directory
    return None


def ensure_installed(install: bool = True) -> str | None:
    """None when the node can be started; otherwise why not. Installs Debian's package with
    apt-get when it is missing and ``install`` is set (root only), updating the package lists
    if the first attempt fails."""
    if scripts_dir() is not None and shutil.which("epmd"):
        return None
    if not install:
        return f"{PACKAGE} is not installed"
    if shutil.which("apt-get") is None:
        return f"{PACKAGE} is not installed and there is no apt-get to install it"
    if os.geteuid() != 0:
        return f"{PACKAGE} is not installed (run `apt-get install {PACKAGE}` as root)"
    print(f"installing {PACKAGE} with apt-get (once) ...", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    output = ""
    for step in ([], ["apt-get", "update", "-q"]):
        try:
            if step:
                subprocess.run(step, env=env, capture_output=True, timeout=INSTALL_TIMEOUT)
            done = subprocess.run(
                ["apt-get", "install", "-y", "-q", PACKAGE], env=env, capture_output=True,
                text=True, timeout=INSTALL_TIMEOUT,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return f"apt-get install {PACKAGE} did not finish in {INSTALL_TIMEOUT:.0f} s"
        output = (done.stdout + done.stderr).strip()
        if done.returncode == 0 and scripts_dir() is not None and shutil.which("epmd"):
            return None
    last = " | ".join(output.splitlines()[-3:])
    return f"apt-get install {PACKAGE} failed: {last or 'no output'}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class RabbitMQNode:
    """A private RabbitMQ node (see the module docstring); its output is drained by a thread."""

    def __init__(self) -> None:
        scripts = scripts_dir()
        epmd = shutil.which("epmd")
        if scripts is None or epmd is None:
            raise RabbitMQError(f"{PACKAGE} (and epmd) not found")
        self.scripts, self.epmd_binary = scripts, epmd
        self.workdir = Path(tempfile.mkdtemp(prefix="bench-rabbitmq-"))
        self.node = f"bench-{os.getpid()}@localhost"
        self.port, self.dist_port, self.epmd_port = free_port(), free_port(), free_port()
        self.version = self.erlang = "?"
        self.process: subprocess.Popen[str] | None = None
        self.epmd: subprocess.Popen[bytes] | None = None
        self.tail: deque[str] = deque(maxlen=60)
        self.reports: dict[str, list[str]] = {}  # warnings or worse, by TROUBLE's key
        self._ready = threading.Event()

    @property
    def label(self) -> str:
        return f"RabbitMQ {self.version} AMQP 1.0"

    def env(self) -> dict[str, str]:
        """The environment of the node and of every rabbitmqctl call that talks to it."""
        work = self.workdir
        return dict(
            os.environ,
            HOME=str(work),
            ERL_EPMD_PORT=str(self.epmd_port),
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_IP_ADDRESS=HOST,
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(work / "mnesia"),
            RABBITMQ_LOG_BASE=str(work / "log"),
            RABBITMQ_LOGS="-",  # to stdout, which we drain
            RABBITMQ_ENABLED_PLUGINS_FILE=str(work / "enabled_plugins"),
            RABBITMQ_CONFIG_FILE=str(work / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(work / "advanced.config"),  # absent: none
            RABBITMQ_CONF_ENV_FILE=str(work / "rabbitmq-env.conf"),
        )

    def start(self, timeout: float = START_TIMEOUT) -> None:
        work = self.workdir
        for name in ("mnesia", "log"):
            (work / name).mkdir()
        (work / "enabled_plugins").write_text("[rabbitmq_amqp1_0].\n")
        (work / "rabbitmq.conf").write_text("loopback_users.guest = true\n")
        (work / "rabbitmq-env.conf").write_text("")
        cookie = work / ".erlang.cookie"
        cookie.write_text("".join(secrets.choice(string.ascii_uppercase) for _ in range(20)))
        cookie.chmod(0o400)
        env = self.env()
        self.epmd = subprocess.Popen(
            [self.epmd_binary, "-port", str(self.epmd_port)], env=env, cwd=work,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        self.process = subprocess.Popen(
            [str(self.scripts / "rabbitmq-server")], env=env, cwd=work, text=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        threading.Thread(target=self._drain, args=(self.process.stdout,), daemon=True).start()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.1):
            if self.process.poll() is not None:
                raise RabbitMQError(
                    f"rabbitmq-server exited with {self.process.returncode} before it was "
                    f"ready:\n{self.log()}"
                )
            if time.monotonic() > deadline:
                raise RabbitMQError(f"RabbitMQ not ready after {timeout:.0f} s:\n{self.log()}")

    def _drain(self, stream: Any) -> None:
        for line in stream:
            line = line.rstrip("\n")
            self.tail.append(line)
            if not self._ready.is_set():
                if match := VERSION.search(line):
                    self.version = match.group(1)
                elif match := ERLANG.search(line):
                    self.erlang = match.group(1)
                elif READY in line:
                    self._ready.set()
            match = TROUBLE.match(line)
            if match and not any(expected in line for expected in EXPECTED):
                key, text = match.groups()
                if key in self.reports or len(self.reports) < 200:
                    self.reports.setdefault(key, []).append(text.strip())

    def trouble(self) -> tuple[list[str], int]:
        """The warnings and errors the node logged, one line per report (the close races of
        ``CLOSE_RACE`` left out), and how many close races there were."""
        reports = [f"{key} {' '.join(texts)}" for key, texts in self.reports.items()]
        races = [r for r in reports if all(word in r for word in CLOSE_RACE)]
        return [r for r in reports if r not in races], len(races)

    def log(self) -> str:
        return "\n".join(self.tail)

    def ctl(self, *args: str, timeout: float = CTL_TIMEOUT) -> str:
        """``rabbitmqctl -n <node> <args>``'s output; raises when it fails."""
        try:
            done = subprocess.run(
                [str(self.scripts / "rabbitmqctl"), "-n", self.node, *args], env=self.env(),
                cwd=self.workdir, capture_output=True, text=True, timeout=timeout,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise RabbitMQError(f"rabbitmqctl {' '.join(args)}: no answer in {timeout} s") from exc
        if done.returncode != 0:
            raise RabbitMQError(
                f"rabbitmqctl {' '.join(args)} failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()}"
            )
        return done.stdout

    def queue(self, name: str) -> dict[str, Any]:
        """The queue's ``durable``, ``messages`` and ``messages_persistent`` as the node says."""
        output = self.ctl(
            "list_queues", "-q", "--formatter", "json",
            "name", "durable", "messages", "messages_persistent",
        )  # fmt: skip
        for row in json.loads(output or "[]"):
            if row.get("name") == name:
                return dict(row)
        raise RabbitMQError(f"RabbitMQ has no queue {name!r}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> int | None:
        """Stops the node and our epmd, removes the directory; returns the node's exit code."""
        code = None
        if self.process is not None:
            if self.process.poll() is None:
                with contextlib.suppress(RabbitMQError):
                    self.ctl("stop", timeout=30)
                try:
                    self.process.wait(15)
                except subprocess.TimeoutExpired:
                    _kill_group(self.process, 10)
            code = self.process.returncode
        if self.epmd is not None and self.epmd.poll() is None:
            _kill_group(self.epmd, 5)
        shutil.rmtree(self.workdir, ignore_errors=True)
        return code


def _kill_group(process: subprocess.Popen[Any], grace: float) -> None:
    """SIGTERM to the child's own process group (it was started in a new session), then
    SIGKILL after ``grace`` seconds: the node's beam and its helper processes go with it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue
    print(f"process {process.pid} survived SIGKILL", file=sys.stderr)
