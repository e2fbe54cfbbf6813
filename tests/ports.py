"""Ports for the tests, from the OS wherever it can give them.

A process the test starts listens on port 0 and says which port it got (``bound_port``
reads that from its log): ``python -m replication broker --port 0`` logs ``broker listening
on HOST:PORT``, ``python -m replication start --metrics-port 0`` logs ``metrics on
http://127.0.0.1:PORT/metrics``. Picking a free port first and starting the process on it
(bind, close, reuse) is a race under pytest-xdist: between the close and the process's bind,
any socket of the machine may be given that port (the OS hands out the same range to
``bind(0)`` and to every outgoing connection).

Two kinds of port cannot come that way: one where nothing may listen (``unused_port``), and
one that settings must name before the server starts (``port_for_settings``: the local
host's embedded brokers listen on the ports its local.settings.json names).
"""

from __future__ import annotations

import random
import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
LISTENING = re.compile(r"broker listening on [^:\s]+:(\d+)")
"""What ``python -m replication broker`` logs once it listens (its AMQP port)."""
METRICS = re.compile(r"metrics on http://[^:\s]+:(\d+)/metrics")
"""What ``python -m replication start`` logs once ``/metrics`` is served."""
_RANDOM = random.SystemRandom()
"""Not the ``random`` module's generator: a test (or plugin) that seeds it would make every
pytest-xdist worker pick the same ports."""


def unused_port() -> int:
    """A port nothing listens on (a free one the OS handed out a moment ago): for a target
    that must be unreachable. Never start a server on it: the OS may give it to any other
    socket meanwhile (use port 0 and ``bound_port``)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def port_for_settings() -> int:
    """A free port for a server that settings name before it starts (the local host's
    embedded brokers: local.settings.json names their ports, and the host binds them).

    It is picked below the OS's ephemeral range (``ip_local_port_range``), from which the
    OS numbers ``bind(0)`` and outgoing connections: no socket can be given it between now
    and the server's bind, only a test picking this way as well could take it (one chance
    in thousands), or a server started on that fixed port meanwhile."""
    low = _ephemeral_low()
    for _ in range(100):
        port = _RANDOM.randrange(10_000, low) if low > 11_000 else 0
        with socket.socket() as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise RuntimeError(f"no free port below {low} after 100 tries")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def bound_port(
    log: Path,
    process: subprocess.Popen[Any],
    pattern: re.Pattern[str] = LISTENING,
    *,
    after: int = 0,
    timeout: float = 60.0,
) -> int:
    """The port ``process`` says (in ``log``, past its first ``after`` characters: a log it
    appends to across runs) it listens on, once it says so; fails if it exits first."""
    deadline = time.monotonic() + timeout
    while True:
        found = pattern.search(log.read_text(errors="replace")[after:])
        if found:
            return int(found.group(1))
        if process.poll() is not None:
            raise AssertionError(f"exited with {process.returncode}: {log.read_text()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {pattern.pattern!r} in {timeout} s: {log.read_text()}")
        time.sleep(0.05)
