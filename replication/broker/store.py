"""Durable message storage: SQLite in WAL mode, one row per message, group-committed.

Why SQLite/WAL rather than a hand-written log: it gives atomic multi-row transactions (a
dead-letter move is one delete + one insert), crash recovery that is proven, an index for
sequence-ordered scans and point lookups (peek, receive-by-sequence-number, dedupe), and
appends that are sequential writes to the WAL. The broker batches every change made during
one event-loop turn into a single transaction (group commit) and only then sends the
dispositions that depend on it, so "accepted" always means "in the WAL".

``synchronous=NORMAL`` (the default here) writes the WAL before a commit returns but lets the
OS decide when to fsync: an accepted message survives a crash of the broker process (kill -9),
not a power cut. ``synchronous=FULL`` fsyncs every commit for the latter, at a throughput cost.

Only message bodies and per-message metadata live here; the broker keeps in memory just the
sequence numbers that are ready for delivery and the locks it has handed out, so memory
stays small however deep a queue grows. Besides that, the rows written last (up to
``HOT_BYTES``) stay in memory until deleted or changed: a message delivered soon after it was
sent, the usual case, is read without asking SQLite.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, cast

from .checkpoint import Checkpointer

STATE_ACTIVE: Final = 0
STATE_DEFERRED: Final = 1
STATE_SCHEDULED: Final = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entity (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE COLLATE NOCASE
);
CREATE TABLE IF NOT EXISTS message (
    id INTEGER PRIMARY KEY,  -- entity << 40 | seq: one B-tree key, rows in sequence order
    state INTEGER NOT NULL,
    delivery_count INTEGER NOT NULL,
    enqueued_ms INTEGER NOT NULL,
    expires_ms INTEGER,
    scheduled_ms INTEGER,
    message_id TEXT,
    session_id TEXT,
    dead_letter_source TEXT,
    annotations BLOB,
    bare BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS message_expiry ON message (expires_ms) WHERE expires_ms IS NOT NULL;
CREATE INDEX IF NOT EXISTS message_schedule ON message (scheduled_ms)
    WHERE scheduled_ms IS NOT NULL;
CREATE TABLE IF NOT EXISTS dedupe (
    entity INTEGER NOT NULL,
    message_id TEXT NOT NULL,
    seen_ms INTEGER NOT NULL,
    PRIMARY KEY (entity, message_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS dedupe_age ON dedupe (seen_ms);
CREATE TABLE IF NOT EXISTS session_state (
    entity INTEGER NOT NULL,
    session_id TEXT NOT NULL,
    state BLOB NOT NULL,
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY (entity, session_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rule_set (
    entity INTEGER PRIMARY KEY,  -- a subscription
    configured TEXT NOT NULL,    -- the Config.json rules these started from (JSON)
    rules TEXT NOT NULL          -- the rules now in force (JSON), changed through $management
);
CREATE TABLE IF NOT EXISTS sequence (
    entity INTEGER PRIMARY KEY,
    last_seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS managed_entity (
    name TEXT PRIMARY KEY COLLATE NOCASE,  -- queue, topic or <topic>/Subscriptions/<name>
    kind TEXT NOT NULL,         -- queue, topic, subscription
    configured TEXT,            -- the Config.json definition this started from; NULL: API-made
    settings TEXT,              -- the settings in force (JSON); NULL: as configured
    description TEXT,           -- management-only properties (JSON), e.g. UserMetadata
    deleted INTEGER NOT NULL,   -- 1: a Config.json entity deleted through the API
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
"""

SEQ_BITS: Final = 40
"""Sequence numbers below 2**40 per entity; the entity number sits above them in the key."""
_SEQ_MASK: Final = (1 << SEQ_BITS) - 1


# sqlite3 binds int, float and str as they are but sends every other parameter (bytes and None
# included) through its adapter lookup, which ends in a formatted AttributeError for each one:
# a third of the cost of writing a message row (measured with callgrind, issue 42). An adapter
# registered for the type is found first; these two give back the value unchanged
# (``bytes.__bytes__`` returns exact bytes themselves, ``{}.get`` None for None: both C).
sqlite3.register_adapter(bytes, bytes.__bytes__)
sqlite3.register_adapter(type(None), cast(Callable[[None], None], {}.get))


def _key(entity: int, seq: int) -> int:
    return (entity << SEQ_BITS) | seq


HOT_BYTES = 16 * 1024 * 1024
"""Message bytes (bare + annotations) the store keeps in memory beside SQLite, newest first
in, until their row is deleted or changed: a bound, so a deep queue still costs no memory."""
CHECKPOINT_BYTES: Final = 4 * 1024 * 1024
CHECKPOINT_COMMITS: Final = 100
"""A WAL checkpoint (``checkpoint.py``) is asked for after this many message bytes written or
commits made since the last one: about SQLite's own 1,000 pages."""
HOT_ROWS: Final = 50_000
"""And at most this many rows (each costs a tuple besides its bytes)."""

_MESSAGE_SIZE: Final = "length(bare) + ifnull(length(annotations), 0)"
"""A message's size as quotas and ``SizeInBytes`` count it: what the broker keeps of it."""

_COLUMNS: Final = (
    "id & 1099511627775, state, delivery_count, enqueued_ms, expires_ms, scheduled_ms, message_id, "
    "session_id, dead_letter_source, annotations, bare"
)


_CHUNK_SIZES: Final = (64, 32, 16, 8, 4, 2, 1)
"""Rows per statement when buffered writes go to SQLite: one statement of many rows costs
less than ``executemany`` (a sixth less per message, measured); a few fixed sizes keep
the statements in sqlite3's cache, and 64 x 11 values stays under SQLite's old limit of 999
parameters."""
_INSERT_ROWS: Final = {
    size: "INSERT INTO message VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * size)
    for size in _CHUNK_SIZES
}
_DELETE_KEYS: Final = {
    size: "DELETE FROM message WHERE id IN (" + ", ".join("?" * size) + ")" for size in _CHUNK_SIZES
}


def _chunk_sizes(count: int) -> Iterator[int]:
    """``count`` split into ``_CHUNK_SIZES``, largest first."""
    for size in _CHUNK_SIZES:
        while count >= size:
            yield size
            count -= size


@dataclass(slots=True)
class ManagedEntity:
    """An entity's definition as the management API (or the first start) recorded it."""

    name: str
    kind: str
    configured: str | None
    settings: str | None
    description: str | None
    deleted: bool
    created_ms: int
    updated_ms: int


@dataclass(slots=True)
class EntityStats:
    """What the management API reports of an entity's messages."""

    active: int = 0
    """Active and deferred messages (Service Bus counts deferred ones as active)."""
    deferred: int = 0
    """Of ``active``, the deferred ones (the broker's own figure: Service Bus has none)."""
    scheduled: int = 0
    size: int = 0


Row = tuple[
    int,
    int,
    int,
    int,
    int | None,
    int | None,
    str | None,
    str | None,
    str | None,
    bytes | None,
    bytes,
]
"""A message row as written: key, then ``StoredMessage``'s fields after ``seq``."""


@dataclass(slots=True, init=False)
class StoredMessage:
    """A message as the broker keeps it: the sender's bare message plus broker metadata.

    ``annotations`` is the sender's encoded message-annotations map (or None); ``bare`` the
    encoded properties, application-properties, body and footer sections, kept byte for byte.

    Its ``__init__`` is written out (``init=False``): the one ``dataclass`` writes is plain
    Python, which mypyc does not compile, four times the cost of this one per message
    (callgrind, issue 42); the same goes for the other per-message dataclasses.
    """

    seq: int
    state: int
    delivery_count: int
    enqueued_ms: int
    expires_ms: int | None
    scheduled_ms: int | None
    message_id: str | None
    session_id: str | None
    dead_letter_source: str | None
    annotations: bytes | None
    bare: bytes

    def __init__(
        self,
        seq: int,
        state: int,
        delivery_count: int,
        enqueued_ms: int,
        expires_ms: int | None,
        scheduled_ms: int | None,
        message_id: str | None,
        session_id: str | None,
        dead_letter_source: str | None,
        annotations: bytes | None,
        bare: bytes,
    ) -> None:
        self.seq = seq
        self.state = state
        self.delivery_count = delivery_count
        self.enqueued_ms = enqueued_ms
        self.expires_ms = expires_ms
        self.scheduled_ms = scheduled_ms
        self.message_id = message_id
        self.session_id = session_id
        self.dead_letter_source = dead_letter_source
        self.annotations = annotations
        self.bare = bare

    def row(self, entity: int) -> Row:
        return (
            _key(entity, self.seq),
            self.state,
            self.delivery_count,
            self.enqueued_ms,
            self.expires_ms,
            self.scheduled_ms,
            self.message_id,
            self.session_id,
            self.dead_letter_source,
            self.annotations,
            self.bare,
        )

    @property
    def size(self) -> int:
        """Bytes it counts against its entity's quota (as ``_MESSAGE_SIZE`` in SQL)."""
        return len(self.bare) + len(self.annotations or b"")


class MessageStore:
    """The broker's only persistent state; used from the event-loop thread only."""

    def __init__(self, path: Path | str, *, synchronous: str = "NORMAL") -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError("synchronous must be NORMAL or FULL")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._sql = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._inserts: list[Row] = []
        self._deletes: dict[int, None] = {}
        """Message rows written and keys deleted in the open transaction, not yet handed to
        SQLite: a few multi-row statements (``_CHUNK_SIZES``) cost less than one per message."""
        self._hot: dict[int, Row] = {}
        """Rows as written (``StoredMessage.row``), by key, while unchanged: ``load`` reads
        them here. Within ``HOT_BYTES`` / ``HOT_ROWS``; a row past the bound is read from
        SQLite."""
        self._hot_bytes = 0
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA wal_autocheckpoint=0")  # the checkpointer's thread does it
        self._checkpoints = Checkpointer(self.path)
        self._since_checkpoint = 0
        """Commits since the last checkpoint was asked for."""
        self._written = 0
        """Message bytes inserted since then."""
        self._db.execute(f"PRAGMA synchronous={synchronous}")
        self._db.execute("PRAGMA cache_size=-16000")  # 16 MB page cache: bounded memory
        self._db.executescript(_SCHEMA)
        self._entities: dict[str, int] = {
            name.lower(): eid for eid, name in self._db.execute("SELECT id, name FROM entity")
        }
        self._last_seq: dict[int, int] = dict(
            self._db.execute("SELECT entity, last_seq FROM sequence")
        )
        self._sequences_used: set[int] = set()
        """Entities whose last sequence number the open transaction has not written yet."""
        self._in_transaction = False
        self.commits = 0
        self._sizes: dict[int, int] = {}
        """Bytes an entity holds (messages and session state): summed when first asked
        for, then kept up to date by every write, so a quota check costs a lookup."""

    def close(self) -> None:
        self.commit()
        self._checkpoints.close()
        self._db.close()  # the last connection: SQLite checkpoints and removes the log

    @property
    def _db(self) -> sqlite3.Connection:
        """The database with every buffered write in it (what each statement but the
        buffered ones goes through, so reads see them and writes keep their order)."""
        if self._inserts or self._deletes:
            self._write_buffered()
        return self._sql

    def _write_buffered(self) -> None:
        if self._inserts:
            rows, at = self._inserts, 0
            for size in _chunk_sizes(len(rows)):
                values = [value for row in rows[at : at + size] for value in row]
                self._sql.execute(_INSERT_ROWS[size], values)
                at += size
            self._inserts = []
        if self._deletes:
            keys, at = list(self._deletes), 0
            for size in _chunk_sizes(len(keys)):
                self._sql.execute(_DELETE_KEYS[size], keys[at : at + size])
                at += size
            self._deletes = {}

    @property
    def connection(self) -> sqlite3.Connection:
        """The database, for tables kept beside the messages (the Event Hubs logs): their
        writes go in after ``begin`` and are made durable by the same group commit."""
        return self._db

    def begin(self) -> None:
        """Opens the write transaction ``commit`` ends, if none is open."""
        self._begin()

    # ------------------------------------------------------------------ entities, sequence

    def entity_id(self, name: str) -> int:
        key = name.lower()
        eid = self._entities.get(key)
        if eid is None:
            self._begin()
            eid = self._db.execute("INSERT INTO entity(name) VALUES (?)", (name,)).lastrowid
            assert eid is not None
            self._entities[key] = eid
        return eid

    def next_sequence(self, entity: int) -> int:
        """Service Bus sequence numbers: per entity, increasing, never reused (even on restart).
        The entity's last number is written once, by the commit that makes them durable."""
        seq = self._last_seq.get(entity, 0) + 1
        self._last_seq[entity] = seq
        self._begin()
        self._sequences_used.add(entity)
        return seq

    # ------------------------------------------------------------------ writes (buffered)

    def _begin(self) -> None:
        if not self._in_transaction:
            self._db.execute("BEGIN")
            self._in_transaction = True

    def insert(self, entity: int, message: StoredMessage) -> None:
        self._begin()
        row = message.row(entity)
        if row[0] in self._deletes:  # put back (a restore): its delete goes first
            self._write_buffered()
        self._inserts.append(row)
        size = message.size
        self._written += size
        if entity in self._sizes:
            self._sizes[entity] += size
        if self._hot_bytes + size <= HOT_BYTES and len(self._hot) < HOT_ROWS:
            self._hot[row[0]] = row  # a new key, or one deleted (and forgotten) before
            self._hot_bytes += size

    @property
    def hot_bytes(self) -> int:
        """Message bytes kept in memory beside SQLite (at most ``HOT_BYTES``)."""
        return self._hot_bytes

    def _forget_hot(self, key: int) -> None:
        """The row ``key`` changes or goes: ``load`` must not answer from the copy."""
        row = self._hot.pop(key, None)
        if row is not None:
            self._hot_bytes -= len(row[10]) + len(row[9] or b"")

    def delete(self, entity: int, seq: int, size: int | None = None) -> None:
        """Deletes a message; ``size`` (its ``StoredMessage.size``), when the caller holds it,
        spares asking the database what the entity's quota gets back."""
        self._begin()
        key = _key(entity, seq)
        self._forget_hot(key)
        if size is None:
            self._delete("DELETE FROM message WHERE id = ?", entity, (key,))
            return
        self._deletes[key] = None  # after the buffered inserts: see insert
        if entity in self._sizes:
            self._sizes[entity] -= size

    def delete_scheduled(self, entity: int, seqs: list[int]) -> None:
        """Cancels scheduled messages; other states and unknown numbers are left alone."""
        self._begin()
        for seq in seqs:
            self._forget_hot(_key(entity, seq))
            self._delete(
                "DELETE FROM message WHERE id = ? AND state = ?",
                entity,
                (_key(entity, seq), STATE_SCHEDULED),
            )

    def _delete(self, sql: str, entity: int, args: tuple[int, ...]) -> None:
        if entity not in self._sizes:
            self._db.execute(sql, args)
            return
        row = self._db.execute(f"{sql} RETURNING {_MESSAGE_SIZE}", args).fetchone()
        if row is not None:
            self._sizes[entity] -= row[0]

    def set_delivery_count(self, entity: int, seq: int, count: int) -> None:
        self._begin()
        self._forget_hot(_key(entity, seq))
        self._db.execute(
            "UPDATE message SET delivery_count = ? WHERE id = ?", (count, _key(entity, seq))
        )

    def set_state(self, entity: int, seq: int, state: int, scheduled_ms: int | None = None) -> None:
        self._begin()
        self._forget_hot(_key(entity, seq))
        self._db.execute(
            "UPDATE message SET state = ?, scheduled_ms = ? WHERE id = ?",
            (state, scheduled_ms, _key(entity, seq)),
        )

    def activate_scheduled(self, entity: int, seq: int) -> None:
        """A scheduled message becomes active: it is enqueued as of its scheduled time (the
        instant its time to live counts from), as Service Bus materializes it then."""
        self._begin()
        self._forget_hot(_key(entity, seq))
        self._db.execute(
            "UPDATE message SET state = ?, enqueued_ms = ifnull(scheduled_ms, enqueued_ms), "
            "scheduled_ms = NULL WHERE id = ?",
            (STATE_ACTIVE, _key(entity, seq)),
        )

    def remember_message_id(self, entity: int, message_id: str, now_ms: int) -> None:
        self._begin()
        self._db.execute(
            "INSERT INTO dedupe VALUES (?, ?, ?) "
            "ON CONFLICT DO UPDATE SET seen_ms = excluded.seen_ms",
            (entity, message_id, now_ms),
        )

    def commit(self) -> bool:
        """Makes every buffered change durable in one transaction; True when there was any."""
        if not self._in_transaction:
            return False
        if self._sequences_used:
            self._db.executemany(
                "INSERT INTO sequence(entity, last_seq) VALUES (?, ?) "
                "ON CONFLICT(entity) DO UPDATE SET last_seq = excluded.last_seq",
                [(entity, self._last_seq[entity]) for entity in self._sequences_used],
            )
            self._sequences_used.clear()
        self._db.execute("COMMIT")
        self._in_transaction = False
        self.commits += 1
        self._since_checkpoint += 1
        if self._since_checkpoint >= CHECKPOINT_COMMITS or self._written >= CHECKPOINT_BYTES:
            self._since_checkpoint = self._written = 0
            if self._checkpoints.failed:
                self._sql.execute("PRAGMA wal_autocheckpoint=1000")  # SQLite's own, again
            else:
                self._checkpoints.request()
        return True

    # ------------------------------------------------------------------ reads

    def seen_message_id(self, entity: int, message_id: str, since_ms: int) -> bool:
        row = self._db.execute(
            "SELECT seen_ms FROM dedupe WHERE entity = ? AND message_id = ?", (entity, message_id)
        ).fetchone()
        return row is not None and row[0] >= since_ms

    def forget_message_ids(self, entity: int, before_ms: int) -> None:
        self._begin()
        self._db.execute("DELETE FROM dedupe WHERE entity = ? AND seen_ms < ?", (entity, before_ms))

    def load(self, entity: int, seqs: Iterable[int]) -> dict[int, StoredMessage]:
        """The messages with these sequence numbers (missing ones are simply absent)."""
        found: dict[int, StoredMessage] = {}
        wanted: list[int] = []
        hot = self._hot
        for seq in seqs:
            row = hot.get(_key(entity, seq))
            if row is None:
                wanted.append(seq)
            else:
                found[seq] = StoredMessage(seq, *row[1:])
        for start in range(0, len(wanted), 500):
            chunk = wanted[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for row in self._db.execute(
                f"SELECT {_COLUMNS} FROM message WHERE id IN ({marks})",
                [_key(entity, seq) for seq in chunk],
            ):
                found[row[0]] = StoredMessage(*row)
        return found

    def scan(
        self, entity: int, from_seq: int = 0, limit: int = 100, session_id: str | None = None
    ) -> list[StoredMessage]:
        """Messages in sequence order from ``from_seq`` (peek), of one session if given."""
        where = "id >= ? AND id <= ?"
        args: list[object] = [_key(entity, max(from_seq, 0)), _key(entity, _SEQ_MASK)]
        if session_id is not None:
            where += " AND session_id = ?"
            args.append(session_id)
        return [
            StoredMessage(*row)
            for row in self._db.execute(
                f"SELECT {_COLUMNS} FROM message WHERE {where} ORDER BY id LIMIT ?",
                (*args, limit),
            )
        ]

    def ready_sequences(self, entity: int) -> Iterator[tuple[int, str | None]]:
        """(seq, session id) of active messages, in order (rebuilds the ready set at start)."""
        for key, session_id in self._db.execute(
            "SELECT id, session_id FROM message WHERE id >= ? AND id <= ? AND state = ? "
            "ORDER BY id",
            (_key(entity, 0), _key(entity, _SEQ_MASK), STATE_ACTIVE),
        ):
            yield key & _SEQ_MASK, session_id

    def due_scheduled(self, now_ms: int) -> list[tuple[int, int]]:
        """(entity, seq) of scheduled messages whose time has come."""
        return [
            (key >> SEQ_BITS, key & _SEQ_MASK)
            for (key,) in self._db.execute(
                "SELECT id FROM message WHERE scheduled_ms IS NOT NULL "
                "AND scheduled_ms <= ? AND state = ?",
                (now_ms, STATE_SCHEDULED),
            )
        ]

    def expired(self, now_ms: int, limit: int = 1000) -> list[tuple[int, int]]:
        """(entity, seq) of messages whose time to live has passed."""
        return [
            (key >> SEQ_BITS, key & _SEQ_MASK)
            for (key,) in self._db.execute(
                "SELECT id FROM message WHERE expires_ms IS NOT NULL AND expires_ms <= ? LIMIT ?",
                (now_ms, limit),
            )
        ]

    def has_scheduled(self, entity: int) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM message WHERE id >= ? AND id <= ? AND state = ? LIMIT 1",
            (_key(entity, 0), _key(entity, _SEQ_MASK), STATE_SCHEDULED),
        ).fetchone()
        return row is not None

    def count(self, entity: int) -> int:
        return int(
            self._db.execute(
                "SELECT count(*) FROM message WHERE id >= ? AND id <= ?",
                (_key(entity, 0), _key(entity, _SEQ_MASK)),
            ).fetchone()[0]
        )

    def message_ids(self, entity: int) -> list[str | None]:
        """The message-id of every stored message (any state), in sequence order."""
        return [
            row[0]
            for row in self._db.execute(
                "SELECT message_id FROM message WHERE id >= ? AND id <= ? ORDER BY id",
                (_key(entity, 0), _key(entity, _SEQ_MASK)),
            )
        ]

    # ------------------------------------------------------------------ sessions

    def session_state(self, entity: int, session_id: str) -> bytes | None:
        row = self._db.execute(
            "SELECT state FROM session_state WHERE entity = ? AND session_id = ?",
            (entity, session_id),
        ).fetchone()
        return None if row is None else bytes(row[0])

    def set_session_state(
        self, entity: int, session_id: str, state: bytes | None, now_ms: int
    ) -> None:
        """Null clears the state (Service Bus semantics: a cleared session has no state)."""
        if entity in self._sizes:
            old = self.session_state(entity, session_id)
            self._sizes[entity] += len(state or b"") - len(old or b"")
        self._begin()
        if state is None:
            self._db.execute(
                "DELETE FROM session_state WHERE entity = ? AND session_id = ?",
                (entity, session_id),
            )
            return
        self._db.execute(
            "INSERT INTO session_state VALUES (?, ?, ?, ?) ON CONFLICT DO UPDATE SET "
            "state = excluded.state, updated_ms = excluded.updated_ms",
            (entity, session_id, state, now_ms),
        )

    def session_ids(self, entity: int, updated_since_ms: int | None) -> list[str]:
        """Sessions with active messages (deferred ones count, scheduled ones do not) or
        stored state (``None``); or with state updated since a time."""
        if updated_since_ms is not None:
            rows = self._db.execute(
                "SELECT session_id FROM session_state WHERE entity = ? AND updated_ms >= ? "
                "ORDER BY session_id",
                (entity, updated_since_ms),
            )
            return [row[0] for row in rows]
        rows = self._db.execute(
            "SELECT DISTINCT session_id FROM message WHERE id >= ? AND id <= ? "
            "AND session_id IS NOT NULL AND state != ? "
            "UNION SELECT session_id FROM session_state WHERE entity = ? ORDER BY 1",
            (_key(entity, 0), _key(entity, _SEQ_MASK), STATE_SCHEDULED, entity),
        )
        return [row[0] for row in rows]

    # ------------------------------------------------------------------ subscription rules

    def rule_set(self, entity: int) -> tuple[str, str] | None:
        """(configured, current) rules JSON of a subscription, as last saved."""
        row = self._db.execute(
            "SELECT configured, rules FROM rule_set WHERE entity = ?", (entity,)
        ).fetchone()
        return None if row is None else (row[0], row[1])

    def save_rule_set(self, entity: int, configured: str, rules: str) -> None:
        self._begin()
        self._db.execute(
            "INSERT INTO rule_set VALUES (?, ?, ?) ON CONFLICT DO UPDATE SET "
            "configured = excluded.configured, rules = excluded.rules",
            (entity, configured, rules),
        )

    # ------------------------------------------------------------------ managed entities

    def managed_entities(self) -> list[ManagedEntity]:
        return [
            ManagedEntity(row[0], row[1], row[2], row[3], row[4], bool(row[5]), row[6], row[7])
            for row in self._db.execute(
                "SELECT name, kind, configured, settings, description, deleted, created_ms, "
                "updated_ms FROM managed_entity ORDER BY rowid"
            )
        ]

    def save_managed_entity(self, record: ManagedEntity) -> None:
        self._begin()
        self._db.execute(
            "INSERT INTO managed_entity VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET "
            "name = excluded.name, kind = excluded.kind, configured = excluded.configured, "
            "settings = excluded.settings, description = excluded.description, "
            "deleted = excluded.deleted, created_ms = excluded.created_ms, "
            "updated_ms = excluded.updated_ms",
            (
                record.name,
                record.kind,
                record.configured,
                record.settings,
                record.description,
                int(record.deleted),
                record.created_ms,
                record.updated_ms,
            ),
        )

    def forget_managed_entity(self, name: str) -> None:
        self._begin()
        self._db.execute("DELETE FROM managed_entity WHERE name = ?", (name,))

    def size(self, entity: int) -> int:
        """Bytes the entity holds against its quota: messages in every state, and session
        state (Service Bus counts both)."""
        size = self._sizes.get(entity)
        if size is None:
            (messages,) = self._db.execute(
                f"SELECT ifnull(sum({_MESSAGE_SIZE}), 0) FROM message WHERE id >= ? AND id <= ?",
                (_key(entity, 0), _key(entity, _SEQ_MASK)),
            ).fetchone()
            (states,) = self._db.execute(
                "SELECT ifnull(sum(length(state)), 0) FROM session_state WHERE entity = ?",
                (entity,),
            ).fetchone()
            size = self._sizes[entity] = messages + states
        return size

    def stats(self, entity: int) -> EntityStats:
        """Message counts by state and their size, for the management API's CountDetails."""
        stats = EntityStats()
        for state, count, size in self._db.execute(
            f"SELECT state, count(*), sum({_MESSAGE_SIZE}) "
            "FROM message WHERE id >= ? AND id <= ? GROUP BY state",
            (_key(entity, 0), _key(entity, _SEQ_MASK)),
        ):
            if state == STATE_SCHEDULED:
                stats.scheduled += count
            else:
                stats.active += count
                stats.deferred += count if state == STATE_DEFERRED else 0
            stats.size += size or 0
        return stats

    def purge(self, entity: int) -> None:
        """Everything kept for a deleted entity: messages, dedupe ids, session state, rules.
        The entity's name and sequence stay, so a re-created entity never reuses a number."""
        self._begin()
        self._sizes.pop(entity, None)
        bounds = (_key(entity, 0), _key(entity, _SEQ_MASK))
        for key in [key for key in self._hot if bounds[0] <= key <= bounds[1]]:
            self._forget_hot(key)
        self._db.execute("DELETE FROM message WHERE id >= ? AND id <= ?", bounds)
        for table in ("dedupe", "session_state", "rule_set"):
            self._db.execute(f"DELETE FROM {table} WHERE entity = ?", (entity,))
