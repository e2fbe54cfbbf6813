"""The store's in-memory copies of the rows it wrote last: read instead of SQLite, never stale.

Each change to a row (delivery count, state, delete, purge) must drop the copy, or a load
would answer from before the change; and the copies stay within their bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from replication.broker import store as store_module
from replication.broker.store import (
    STATE_ACTIVE,
    STATE_DEFERRED,
    STATE_SCHEDULED,
    MessageStore,
    StoredMessage,
)


def _row(seq: int, body: bytes = b"body", state: int = STATE_ACTIVE) -> StoredMessage:
    return StoredMessage(
        seq=seq, state=state, delivery_count=0, enqueued_ms=1_000, expires_ms=None,
        scheduled_ms=5_000 if state == STATE_SCHEDULED else None, message_id=f"m{seq}",
        session_id=None, dead_letter_source=None, annotations=b"\x00ann", bare=body,
    )  # fmt: skip


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    store = MessageStore(tmp_path / "messages.db")
    yield store
    store.close()


def _from_disk(store: MessageStore, entity: int, seq: int) -> StoredMessage | None:
    """What a fresh store on the same file reads (no in-memory copies)."""
    store.commit()
    other = MessageStore(store.path)
    try:
        return other.load(entity, [seq]).get(seq)
    finally:
        other.close()


def test_a_row_loads_as_written_and_each_load_is_a_copy(store: MessageStore) -> None:
    entity = store.entity_id("q")
    store.insert(entity, _row(1))
    first = store.load(entity, [1])[1]
    assert first == _row(1)
    first.delivery_count = 7  # a caller changing what it loaded changes nothing stored
    assert store.load(entity, [1])[1].delivery_count == 0
    assert _from_disk(store, entity, 1) == _row(1)


def test_changes_to_a_row_are_what_the_next_load_sees(store: MessageStore) -> None:
    entity = store.entity_id("q")
    for seq in (1, 2, 3, 4):
        store.insert(entity, _row(seq, state=STATE_SCHEDULED if seq == 4 else STATE_ACTIVE))
    store.commit()
    store.set_delivery_count(entity, 1, 3)
    store.set_state(entity, 2, STATE_DEFERRED)
    store.delete(entity, 3, _row(3).size)
    store.delete_scheduled(entity, [4])
    rows = store.load(entity, [1, 2, 3, 4])
    assert rows[1].delivery_count == 3
    assert rows[2].state == STATE_DEFERRED
    assert set(rows) == {1, 2}
    assert _from_disk(store, entity, 1) == rows[1]


def test_a_purged_entity_loads_nothing(store: MessageStore) -> None:
    entity, other = store.entity_id("q"), store.entity_id("other")
    store.insert(entity, _row(1))
    store.insert(other, _row(1))
    store.purge(entity)
    assert store.load(entity, [1]) == {}
    assert store.load(other, [1])[1] == _row(1)


def test_a_restored_row_replaces_its_deleted_copy(store: MessageStore) -> None:
    entity = store.entity_id("q")
    store.insert(entity, _row(1, b"first"))
    store.delete(entity, 1, _row(1, b"first").size)
    store.insert(entity, _row(1, b"again"))
    assert store.load(entity, [1])[1].bare == b"again"
    assert _from_disk(store, entity, 1) == _row(1, b"again")


def test_rows_past_the_bound_are_read_from_sqlite(
    store: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "HOT_BYTES", 1_000)
    entity = store.entity_id("q")
    body = b"x" * 300
    for seq in range(1, 11):
        store.insert(entity, _row(seq, body))
    kept = store.hot_bytes
    assert 0 < kept <= 1_000
    rows = store.load(entity, range(1, 11))
    assert [rows[seq].bare for seq in range(1, 11)] == [body] * 10
    for seq in range(1, 11):
        store.delete(entity, seq, rows[seq].size)
    assert store.hot_bytes == 0
