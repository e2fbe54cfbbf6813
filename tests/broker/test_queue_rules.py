"""Queue rules checked on the queue itself (no network): TTL of scheduled messages, DLQ of a DLQ."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from replication.amqp.message import Header, Message, Properties, encode_message
from replication.amqp.types import symbol, timestamp
from replication.broker import wire
from replication.broker.queue import DEAD_LETTER_SUFFIX, Queue, QueueSettings
from replication.broker.store import MessageStore


def _queues(tmp_path: Path) -> tuple[MessageStore, Queue, Queue]:
    store = MessageStore(tmp_path / "messages.db")
    dlq = Queue("q" + DEAD_LETTER_SUFFIX, store, QueueSettings())
    return store, Queue("q", store, QueueSettings(), dead_letter=dlq), dlq


def _message(**annotations: object) -> wire.IncomingMessage:
    return wire.parse_message(
        encode_message(
            Message.from_bytes(
                b"x", header=Header(ttl=1000), properties=Properties(message_id="m"),
                message_annotations={symbol(k): v for k, v in annotations.items()},
            )
        )
    )  # fmt: skip


def test_a_scheduled_message_lives_from_its_activation(tmp_path: Path) -> None:
    store, queue, _ = _queues(tmp_path)
    seq = queue.enqueue(_message(**{"x-opt-scheduled-enqueue-time": timestamp(50_000)}), 0)
    store.commit()
    assert seq is not None
    (row,) = store.load(queue.entity, [seq]).values()
    assert row.expires_ms == 51_000  # activation (50 s) + ttl (1 s), not send time + ttl


def test_dead_lettering_a_dead_letter_keeps_the_message(tmp_path: Path) -> None:
    store, queue, dlq = _queues(tmp_path)
    queue.enqueue(_message(), 0)
    store.commit()
    queue.publish()
    (row,) = queue.take(1, 0)
    queue.dead_letter_locked(queue.lock(row, 0).token, 0, "bad", None)
    store.commit()
    dlq.publish()
    (dead,) = dlq.take(1, 0)
    dlq.dead_letter_locked(dlq.lock(dead, 0).token, 0, "again", None)
    store.commit()
    dlq.publish()
    assert store.count(dlq.entity) == 1
    assert list(dlq.ready) == [dead.seq]


def test_default_ttl_caps_a_longer_message_ttl(tmp_path: Path) -> None:
    store = MessageStore(tmp_path / "messages.db")
    queue = Queue("q", store, QueueSettings(default_ttl=timedelta(milliseconds=500)))
    seq = queue.enqueue(_message(), 0)
    store.commit()
    assert seq is not None
    assert store.load(queue.entity, [seq])[seq].expires_ms == 500
