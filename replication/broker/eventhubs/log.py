"""Event hub partitions as append-only logs in the broker's SQLite database.

One ``event`` row per event, keyed ``partition << 40 | sequence number`` like the
``message`` table, so a partition is one contiguous, ordered range of the B-tree: reading
from a position is a range scan and appending is a write at the range's end. Events are
never removed by reading (a log, not a queue); only retention removes them, oldest first.

Sequence numbers and offsets start at 0 and only grow. An event's offset is the byte
position it starts at in its partition (the sum of the sizes of the events before it), as
in Event Hubs, where offsets are opaque, increasing, and not contiguous. Within a partition
both, and the enqueued time, increase with the sequence number, and the sequence numbers
kept are contiguous (retention cuts a prefix), so finding a position by offset or time is
a binary search over sequence numbers, without another index.

Writes join the broker's open transaction (``begin``); consumers see only what a commit
made durable (``PartitionLog.publish``, called after the commit), so no consumer reads an
event a crash could still take back.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from .selector import ENQUEUED_TIME, OFFSET, Position, SelectorError

SEQ_BITS = 40

_SCHEMA = """
CREATE TABLE IF NOT EXISTS event (
    id INTEGER PRIMARY KEY,      -- partition << 40 | sequence number
    byte_offset INTEGER NOT NULL,
    enqueued_ms INTEGER NOT NULL,
    partition_key TEXT,
    annotations BLOB,            -- the sender's delivery- and message-annotations sections
    bare BLOB NOT NULL           -- properties .. footer, as the sender wrote them
);
CREATE TABLE IF NOT EXISTS event_partition (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE COLLATE NOCASE,  -- <event hub>/Partitions/<n>
    next_sequence INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    last_offset INTEGER NOT NULL,
    last_enqueued_ms INTEGER NOT NULL,
    created_ms INTEGER NOT NULL
);
"""


def _key(partition: int, seq: int) -> int:
    return (partition << SEQ_BITS) | seq


@dataclass(slots=True)
class Event:
    """One stored event."""

    sequence_number: int
    offset: int
    enqueued_ms: int
    partition_key: str | None
    annotations: bytes | None
    """The sender's delivery-annotations section, if it wrote one, then its
    message-annotations section (the partition key among them)."""
    bare: bytes


@dataclass(slots=True, frozen=True)
class PartitionState:
    """What ``$management`` reports of a partition (its committed events only)."""

    begin_sequence_number: int
    last_sequence_number: int
    last_offset: int
    last_enqueued_ms: int
    is_empty: bool


class EventLog:
    """Every partition's log; used from the broker's event-loop thread only."""

    def __init__(self, db: sqlite3.Connection, begin: Callable[[], None]) -> None:
        self._db = db
        self._begin = begin
        """Opens the broker's write transaction if none is open (joined, never committed here)."""
        begin()  # not executescript: it would commit the broker's open transaction
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)

    def partition(self, name: str, now_ms: int) -> PartitionLog:
        """The log of ``<hub>/Partitions/<n>``, made (empty, created ``now_ms``) on first use."""
        row = self._db.execute(
            "SELECT id, next_sequence, next_offset, last_offset, last_enqueued_ms, created_ms "
            "FROM event_partition WHERE name = ?",
            (name,),
        ).fetchone()
        if row is None:
            self._begin()
            cursor = self._db.execute(
                "INSERT INTO event_partition(name, next_sequence, next_offset, last_offset, "
                "last_enqueued_ms, created_ms) VALUES (?, 0, 0, -1, 0, ?)",
                (name, now_ms),
            )
            assert cursor.lastrowid is not None
            row = (cursor.lastrowid, 0, 0, -1, 0, now_ms)
        pid, next_seq, next_offset, last_offset, last_ms, created_ms = row
        first = self._db.execute(
            "SELECT min(id) FROM event WHERE id >= ? AND id < ?", (_key(pid, 0), _key(pid + 1, 0))
        ).fetchone()[0]
        begin = next_seq if first is None else first & ((1 << SEQ_BITS) - 1)
        partition = PartitionLog(
            self, name, pid, begin, next_seq, next_offset, last_offset, last_ms
        )
        partition.created_ms = created_ms
        return partition

    def drop(self, name: str) -> None:
        """Removes a partition and its events (its event hub left the config)."""
        row = self._db.execute("SELECT id FROM event_partition WHERE name = ?", (name,)).fetchone()
        if row is None:
            return
        self._begin()
        self._db.execute(
            "DELETE FROM event WHERE id >= ? AND id < ?", (_key(row[0], 0), _key(row[0] + 1, 0))
        )
        self._db.execute("DELETE FROM event_partition WHERE id = ?", (row[0],))

    def names(self) -> list[str]:
        return [name for (name,) in self._db.execute("SELECT name FROM event_partition")]


class PartitionLog:
    """One partition: appends, reads from a position, retention."""

    def __init__(
        self,
        log: EventLog,
        name: str,
        pid: int,
        begin: int,
        next_seq: int,
        next_offset: int,
        last_offset: int,
        last_ms: int,
    ) -> None:
        self._log = log
        self._db = log._db
        self.name = name
        self._pid = pid
        self.begin = begin
        """The oldest sequence number kept (``next`` when the partition is empty)."""
        self.next = next_seq
        """The sequence number the next event gets."""
        self._next_offset = next_offset
        self._last_offset = last_offset
        self._last_ms = last_ms
        self.visible = next_seq
        """Consumers read below this: what the last commit made durable."""
        self._committed = PartitionState(
            begin, next_seq - 1, last_offset, last_ms, begin >= next_seq
        )
        self.created_ms = 0
        """When the partition was first made (its event hub's ``created_at``)."""

    # ------------------------------------------------------------------ writes

    def append(
        self, events: list[tuple[str | None, bytes | None, bytes]], now_ms: int
    ) -> list[Event]:
        """Appends ``(partition key, sender annotations, bare message)`` in order; they
        become readable at ``publish`` after the broker's commit."""
        enqueued = max(now_ms, self._last_ms)  # never back in time within a partition
        rows = []
        appended = []
        for partition_key, section, bare in events:
            event = Event(self.next, self._next_offset, enqueued, partition_key, section, bare)
            rows.append(
                (
                    _key(self._pid, event.sequence_number),
                    event.offset,
                    enqueued,
                    partition_key,
                    section,
                    bare,
                )
            )
            appended.append(event)
            self._last_offset = event.offset
            self._next_offset += len(bare) + len(section or b"")
            self.next += 1
        if not rows:
            return appended
        self._last_ms = enqueued
        self._log._begin()
        self._db.executemany("INSERT INTO event VALUES (?, ?, ?, ?, ?, ?)", rows)
        self._db.execute(
            "UPDATE event_partition SET next_sequence = ?, next_offset = ?, last_offset = ?, "
            "last_enqueued_ms = ? WHERE id = ?",
            (self.next, self._next_offset, self._last_offset, self._last_ms, self._pid),
        )
        return appended

    def publish(self) -> bool:
        """After a commit: what was appended becomes readable. True if anything new did."""
        if self.visible == self.next:
            return False
        self.visible = self.next
        self._committed = PartitionState(
            self.begin, self.next - 1, self._last_offset, self._last_ms, self.begin >= self.next
        )
        return True

    def trim(self, before_ms: int) -> int:
        """Retention: removes the events enqueued before ``before_ms``; returns how many."""
        keep = self._first_at_or_after(ENQUEUED_TIME, before_ms, self.begin, self.visible)
        if keep <= self.begin:
            return 0
        self._log._begin()
        self._db.execute(
            "DELETE FROM event WHERE id >= ? AND id < ?",
            (_key(self._pid, self.begin), _key(self._pid, keep)),
        )
        removed, self.begin = keep - self.begin, keep
        self._committed = PartitionState(
            self.begin, *self._committed_tail(), self.begin >= self.visible
        )
        return removed

    def _committed_tail(self) -> tuple[int, int, int]:
        state = self._committed
        return state.last_sequence_number, state.last_offset, state.last_enqueued_ms

    # ------------------------------------------------------------------ reads

    @property
    def state(self) -> PartitionState:
        return self._committed

    def read(self, from_seq: int, limit: int, max_bytes: int | None = None) -> list[Event]:
        """Up to ``limit`` committed events from ``from_seq`` on (from the oldest kept when
        retention has passed it), and at most about ``max_bytes`` (at least one event)."""
        start = max(from_seq, self.begin)
        if start >= self.visible or limit <= 0:
            return []
        cursor = self._db.execute(
            "SELECT id, byte_offset, enqueued_ms, partition_key, annotations, bare FROM event "
            "WHERE id >= ? AND id < ? ORDER BY id LIMIT ?",
            (_key(self._pid, start), _key(self._pid, self.visible), limit),
        )
        events: list[Event] = []
        size = 0
        mask = (1 << SEQ_BITS) - 1
        for key, offset, enqueued, partition_key, section, bare in cursor:
            events.append(Event(key & mask, offset, enqueued, partition_key, section, bare))
            size += len(bare)
            if max_bytes is not None and size >= max_bytes:
                break
        return events

    def start(self, position: Position) -> int:
        """The sequence number a consumer attached at ``position`` receives first. Raises
        ``SelectorError`` for an offset past the partition's last, as Event Hubs refuses it
        (a checkpoint kept from a stream the partition no longer holds)."""
        if position.is_latest:
            return self.visible
        assert position.value is not None
        last = self._committed.last_offset
        if position.field == OFFSET and position.value > last:
            raise SelectorError(
                f"The supplied offset '{position.value}' is invalid. "
                f"The last offset in the system is '{last}'"
            )
        value = position.value if position.inclusive else position.value + 1
        if position.field == OFFSET and position.value == -1:
            return self.begin
        if position.field == OFFSET or position.field == ENQUEUED_TIME:
            return self._first_at_or_after(position.field, value, self.begin, self.visible)
        return min(max(value, self.begin), self.visible)

    def _first_at_or_after(self, field: str, value: int, lo: int, hi: int) -> int:
        """The first sequence number in ``[lo, hi)`` whose offset (or enqueued time) is at
        least ``value``; ``hi`` when none is."""
        column = "byte_offset" if field == OFFSET else "enqueued_ms"
        query = f"SELECT {column} FROM event WHERE id = ?"
        while lo < hi:
            mid = (lo + hi) // 2
            row = self._db.execute(query, (_key(self._pid, mid),)).fetchone()
            if row is not None and row[0] >= value:
                hi = mid
            else:
                lo = mid + 1
        return lo
