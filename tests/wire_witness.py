"""Watching the bytes a connection writes. The asyncio shell (``amqp/transport.py``) is plain
Python even when the engine is compiled, and the frames it writes are what a peer sees: tests
observe there, not by patching the engine's methods (compiled classes cannot be patched)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from replication.amqp.codec import decode_at
from replication.amqp.transport import ConnectionDriver


def watch_writes(
    monkeypatch: pytest.MonkeyPatch, seen: Callable[[ConnectionDriver, bytes], None]
) -> None:
    """Calls ``seen(driver, data)`` with every chunk a driver is about to write."""

    def flush(self: ConnectionDriver) -> None:  # ConnectionDriver._flush, telling ``seen``
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        data = self.connection.data_to_send()
        if data:
            seen(self, data)
            transport.write(data)
        if self.connection.is_terminated:
            transport.close()

    monkeypatch.setattr(ConnectionDriver, "_flush", flush)


def performatives(data: bytes) -> list[Any]:
    """The performatives of the whole frames in ``data`` (written after the opening headers)."""
    found = []
    pos = 0
    while pos + 8 <= len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        body = pos + 4 * data[pos + 4]
        if body < pos + size:  # not a heartbeat
            found.append(decode_at(data, body)[0])
        pos += size
    return found
