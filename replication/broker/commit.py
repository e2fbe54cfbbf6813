"""The group commit: one store commit per loop turn, and what waits for it.

Changes made while handling events go into the store's open transaction; ``soon()`` asks for
one commit at the end of this loop turn. Whatever a peer must not hear before the disk has it
(a send's ``accepted``, a complete's echo, receive-and-delete transfers, a ``$management``
reply) is passed as ``then`` and runs right after that commit; connections given to ``wake``
are woken after it to write what it produced.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..amqp.transport import ConnectionDriver
from .store import MessageStore


class GroupCommit:
    """Commits ``store`` once per loop turn; ``after`` runs after each commit, before the
    connections are woken (the broker publishes what became ready there)."""

    def __init__(self, store: MessageStore, after: Callable[[], None]) -> None:
        self.store = store
        self._after = after
        self._then: list[Callable[[], None]] = []
        self._handle: asyncio.Handle | None = None
        self._woken: set[ConnectionDriver] = set()

    def soon(self, then: Callable[[], None] | None = None) -> None:
        """A commit at the end of this loop turn; ``then`` runs once it is on disk."""
        if then is not None:
            self._then.append(then)
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_soon(self.commit)

    def wake(self, driver: ConnectionDriver) -> None:
        """``driver`` writes what the next commit lets it send (it is woken after it)."""
        self._woken.add(driver)

    @property
    def waking(self) -> bool:
        """Some connection waits for the next commit to be woken."""
        return bool(self._woken)

    def commit(self) -> None:
        """Commits now (the loop's turn, or a caller that must answer after a durable change)."""
        self._handle = None
        self.store.commit()
        callbacks, self._then = self._then, []
        for callback in callbacks:
            callback()
        self._after()
        woken, self._woken = self._woken, set()
        for driver in woken:
            driver.wake()
