"""Waiting in async tests for something the code under test does in real time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(condition: Callable[[], object], what: str) -> None:
    """Polls for what the code does in real time (e.g. a keeper's renew request), up to
    30 s; not a measured wait."""
    for _ in range(3000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")
