"""The local host's Event Hubs checkpoint store: one SQLite file under the host's data
directory, behind ``azure-eventhub``'s ``CheckpointStore`` interface.

In Azure the Event Hubs trigger keeps checkpoints and partition ownership in blobs of
``AzureWebJobsStorage``; here they live in ``<data dir>/eventhubs-checkpoints.sqlite``, so
the SDK's own ``EventHubConsumerClient`` does the load balancing and ownership (several
host processes on one file share the partitions) and a restarted host starts each partition
after its last checkpoint. Ownership claims are optimistic as with blobs: a claim wins only
with the etag the claimer last saw (or when nobody owns the partition yet); checkpoints
overwrite. Every write is committed before the call returns (SQLite's WAL, synchronous
FULL), so a checkpoint the host was told of survives the host being killed.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from azure.eventhub.aio import CheckpointStore

FILE_NAME = "eventhubs-checkpoints.sqlite"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS ownership (
    namespace TEXT NOT NULL, eventhub TEXT NOT NULL, consumer_group TEXT NOT NULL,
    partition_id TEXT NOT NULL, owner_id TEXT NOT NULL, etag TEXT NOT NULL,
    last_modified REAL NOT NULL,
    PRIMARY KEY (namespace, eventhub, consumer_group, partition_id));
CREATE TABLE IF NOT EXISTS checkpoint (
    namespace TEXT NOT NULL, eventhub TEXT NOT NULL, consumer_group TEXT NOT NULL,
    partition_id TEXT NOT NULL, "offset" TEXT, sequence_number INTEGER,
    PRIMARY KEY (namespace, eventhub, consumer_group, partition_id));
"""


# the SDK's key of each column the lists read (``offset`` is an SQL keyword: quoted)
_OWNERSHIP = {
    "partition_id": "partition_id",
    "owner_id": "owner_id",
    "etag": "etag",
    "last_modified_time": "last_modified",
}
_CHECKPOINT = {
    "partition_id": "partition_id",
    "offset": '"offset"',
    "sequence_number": "sequence_number",
}


def _key(namespace: str, eventhub: str, group: str) -> tuple[str, str, str]:
    """Names compare without case, as Event Hubs resolves them."""
    return namespace.lower(), eventhub.lower(), group.lower()


class SqliteCheckpointStore(CheckpointStore):
    """Checkpoints and ownership in one SQLite file (see the module)."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.clock = clock
        """Seconds since the epoch: the SDK compares ownership times with ``time.time()``."""
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)
        self._lock = asyncio.Lock()

    @classmethod
    def in_directory(cls, data_dir: Path) -> SqliteCheckpointStore:
        return cls(data_dir / FILE_NAME)

    async def list_ownership(
        self,
        fully_qualified_namespace: str,
        eventhub_name: str,
        consumer_group: str,
        **kwargs: Any,
    ) -> Iterable[dict[str, Any]]:
        return self._rows(
            "ownership", _OWNERSHIP, fully_qualified_namespace, eventhub_name, consumer_group
        )

    async def claim_ownership(
        self, ownership_list: Iterable[dict[str, Any]], **kwargs: Any
    ) -> Iterable[dict[str, Any]]:
        claimed = []
        async with self._lock:
            for ownership in ownership_list:
                key = (
                    *_key(
                        ownership["fully_qualified_namespace"],
                        ownership["eventhub_name"],
                        ownership["consumer_group"],
                    ),
                    ownership["partition_id"],
                )
                etag, now = str(uuid.uuid4()), self.clock()
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    row = self._db.execute(
                        "SELECT etag FROM ownership WHERE namespace = ? AND eventhub = ? AND "
                        "consumer_group = ? AND partition_id = ?",
                        key,
                    ).fetchone()
                    if row is not None and row[0] != ownership.get("etag"):
                        self._db.execute("ROLLBACK")
                        continue  # someone claimed it since this claimer looked
                    self._db.execute(
                        "INSERT OR REPLACE INTO ownership VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (*key, ownership["owner_id"], etag, now),
                    )
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                claimed.append({**ownership, "etag": etag, "last_modified_time": now})
        return claimed

    async def update_checkpoint(self, checkpoint: dict[str, Any], **kwargs: Any) -> None:
        key = _key(
            str(checkpoint["fully_qualified_namespace"]),
            str(checkpoint["eventhub_name"]),
            str(checkpoint["consumer_group"]),
        )
        offset = checkpoint.get("offset")
        self._db.execute(
            "INSERT OR REPLACE INTO checkpoint VALUES (?, ?, ?, ?, ?, ?)",
            (
                *key,
                str(checkpoint["partition_id"]),
                None if offset is None else str(offset),
                checkpoint.get("sequence_number"),
            ),
        )

    async def list_checkpoints(
        self,
        fully_qualified_namespace: str,
        eventhub_name: str,
        consumer_group: str,
        **kwargs: Any,
    ) -> Iterable[dict[str, Any]]:
        return self._rows(
            "checkpoint", _CHECKPOINT, fully_qualified_namespace, eventhub_name, consumer_group
        )

    def _rows(
        self, table: str, columns: dict[str, str], namespace: str, eventhub: str, group: str
    ) -> list[dict[str, Any]]:
        """``table``'s rows of one hub and consumer group as the SDK's dicts (``columns``:
        the SDK's key for each column), named as the caller named them."""
        rows = self._db.execute(
            f"SELECT {', '.join(columns.values())} FROM {table} "
            "WHERE namespace = ? AND eventhub = ? AND consumer_group = ?",
            _key(namespace, eventhub, group),
        ).fetchall()
        names = {
            "fully_qualified_namespace": namespace,
            "eventhub_name": eventhub,
            "consumer_group": group,
        }
        return [{**names, **dict(zip(columns, row, strict=True))} for row in rows]

    def close(self) -> None:
        self._db.close()
