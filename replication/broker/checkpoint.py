"""The store's WAL checkpoints, on a thread of their own.

SQLite copies its write-ahead log back into the database file every 1,000 pages by itself,
inside the commit that crosses the mark: on the broker's event loop, with an fsync of the
database file (and of the log) that took 3 to 5 ms on the benchmark's disk, stalling every
connection meanwhile: the slowest single round trips (issue 42). The store turns that off
(``PRAGMA wal_autocheckpoint=0``) and asks this thread instead, which runs ``PRAGMA
wal_checkpoint(PASSIVE)`` on its own connection: it copies what is committed without
waiting for, or holding up, the loop's writes; a crash meanwhile loses nothing (the log
still has it all).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger("replication.broker")


class Checkpointer:
    """Checkpoints ``path``'s WAL when asked (``request``); the thread starts on the first
    request and ends with ``close``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ran = threading.Event()
        """Set after each checkpoint (what a test waits for)."""
        self.failed = False
        """A checkpoint failed and the thread ended: the store checkpoints by itself again."""
        self._wanted = threading.Event()
        self._closing = False
        self._worker: threading.Thread | None = None

    def request(self) -> None:
        """A checkpoint soon (requests made while one runs fold into the next)."""
        if self._worker is None:
            self._worker = threading.Thread(
                target=self._run, name=f"checkpoint {self.path.name}", daemon=True
            )
            self._worker.start()
        self._wanted.set()

    def close(self) -> None:
        """Stops the thread after the checkpoint it is running, if any."""
        worker, self._worker = self._worker, None
        if worker is not None:  # (not "_thread": mypyc would name it __thread, a C keyword)
            self._closing = True
            self._wanted.set()
            worker.join()

    def _run(self) -> None:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            while True:
                self._wanted.wait()
                self._wanted.clear()
                if self._closing:
                    return
                db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                self.ran.set()
        except sqlite3.Error:
            self.failed = True
            log.exception("WAL checkpoint of %s failed; SQLite's own take over", self.path)
        finally:
            db.close()
