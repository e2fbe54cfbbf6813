"""A ``transform`` callable for the cluster test: stalls its Python worker once, on the
message whose ``stall`` property names a file, so the test can SIGKILL that worker while it
holds its batch of locked messages (not by luck between two short tasks). The file says
the worker's pid; shipped to the executors with ``--py-files`` (imported as ``stall``). A
test that does not kill the worker lets it go on with ``release``."""

from __future__ import annotations

import os
import time
from pathlib import Path

from replication.messages import Message

STALL = 60.0
"""Seconds the worker waits to be killed or let go (then it goes on, and the test fails)."""


def released(marker: Path) -> Path:
    """The file a test writes to let the stalled worker go on (``release``)."""
    return marker.with_name(f"{marker.name}.go")


def release(marker: Path) -> None:
    released(marker).write_text("")


def stall_once(message: Message) -> Message:
    path = message.application_properties.get("stall")
    if path:
        marker = Path(path.decode() if isinstance(path, bytes) else str(path))
        if not marker.exists():
            written = marker.with_name(f"{marker.name}.part")
            written.write_text(str(os.getpid()))
            written.replace(marker)  # whole or not there: the test reads it once it exists
            deadline = time.monotonic() + STALL
            while not released(marker).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
    return message
