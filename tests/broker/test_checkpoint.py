"""The store's WAL checkpoints run on a thread of their own, not inside a commit on the
broker's loop; what they copy into the database file is the committed messages."""

from __future__ import annotations

import shutil
import sqlite3
import threading
from pathlib import Path

from replication.broker.store import (
    CHECKPOINT_COMMITS,
    STATE_ACTIVE,
    MessageStore,
    StoredMessage,
)


def _row(seq: int) -> StoredMessage:
    return StoredMessage(
        seq=seq,
        state=STATE_ACTIVE,
        delivery_count=0,
        enqueued_ms=1_000,
        expires_ms=None,
        scheduled_ms=None,
        message_id=f"m{seq}",
        session_id=None,
        dead_letter_source=None,
        annotations=None,
        bare=b"body %d" % seq,
    )


def test_the_database_file_gets_the_commits_from_the_checkpoint_thread(tmp_path: Path) -> None:
    store = MessageStore(tmp_path / "messages.db")
    entity = store.entity_id("q")
    store.commit()
    checkpoints = store._checkpoints
    seq = 0
    while store.commits < CHECKPOINT_COMMITS - 1:  # the entity's own commit counts too
        seq += 1
        store.insert(entity, _row(seq))
        store.commit()
    assert not checkpoints.ran.is_set()  # SQLite's own checkpoints are off, ours not due
    seq += 1
    store.insert(entity, _row(seq))
    store.commit()  # the one that asks for the checkpoint: it copies every row
    assert checkpoints.ran.wait(30)
    threads = [t for t in threading.enumerate() if t.name == "checkpoint messages.db"]
    assert threads and threads[0] is not threading.current_thread()

    copy = tmp_path / "copy.db"  # the database file alone, without its log
    shutil.copyfile(tmp_path / "messages.db", copy)
    with sqlite3.connect(copy) as db:
        (count,) = db.execute("SELECT count(*) FROM message").fetchone()
    assert count == seq

    store.close()
    assert not (tmp_path / "messages.db-wal").exists()  # the last close checkpointed it all
    reopened = MessageStore(tmp_path / "messages.db")
    try:
        assert sorted(reopened.load(entity, range(1, seq + 1))) == list(range(1, seq + 1))
    finally:
        reopened.close()
