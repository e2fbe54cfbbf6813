"""The ``servicebus`` source's holder and the driver's commit service, without Spark: a read
of an assignment (``holder.read_assignment``, as a task runs it) against the embedded
broker, and the verdicts that complete or give back what it holds (README "(b)")."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
from azure.servicebus import ServiceBusMessage

from replication.clock import ManualClock
from replication.servicebus.client import SourceError
from replication.spark import holder
from replication.spark.assignment import Assignment
from replication.spark.commits import COMMITTED, OPEN, RELEASE, UNKNOWN, CommitService
from replication.spark.holder import CommitServiceUnreachable, read_assignment
from replication.spark.options import Options
from tests.broker.conftest import BrokerHandle, make_config
from tests.clock_steps import step
from tests.spark.support import fill

pytestmark = pytest.mark.timeout(60)

CONFIG = make_config({"q": {"LockDuration": "PT5S"}})


@pytest.fixture
def service() -> Iterator[CommitService]:
    commits = CommitService("run-1")
    yield commits
    commits.close(grace=0.1)


def filled(broker_factory: Callable[..., BrokerHandle], total: int) -> BrokerHandle:
    broker = broker_factory(CONFIG)
    fill(broker, "q", [ServiceBusMessage(b"x", message_id=f"m-{i}") for i in range(total)])
    return broker


def assignment(service: CommitService, batch: int, slot: int = 0, share: int = 10) -> Assignment:
    return Assignment("run-1", batch, slot, "ns", "q", 0, share, 1.0, None, service.address)


def options(broker: BrokerHandle) -> Options:
    return Options.parse({"connectionString": broker.connection_string, "queue": "q"},
                         reading=True)  # fmt: skip


def wait_until(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def delivery_counts(broker: BrokerHandle) -> list[int]:
    """The delivery count of every message left (peeked: nothing counted by looking)."""
    with broker.client() as client, client.get_queue_receiver("q") as receiver:
        return [m.delivery_count or 0 for m in receiver.peek_messages(100)]


def test_committed_completes_on_the_receiving_link(
    broker_factory: Callable[..., BrokerHandle], service: CommitService
) -> None:
    broker = filled(broker_factory, 25)
    service.planned(1)
    rows = list(read_assignment(options(broker), assignment(service, 1)))
    assert [r[1] for r in rows] == [f"m-{i}" for i in range(10)]
    assert broker.count("q") == 25  # held, not settled
    service.committed(1)
    assert service.wait_told(1, timeout=10)
    wait_until(lambda: broker.count("q") == 15)


def test_a_batch_that_ends_without_a_commit_gives_its_messages_back(
    broker_factory: Callable[..., BrokerHandle], service: CommitService
) -> None:
    """The query stopped (or another run answers): the holder closes its link; the messages
    come back at once without a delivery counted."""
    broker = filled(broker_factory, 10)
    service.planned(1)
    assert len(list(read_assignment(options(broker), assignment(service, 1)))) == 10
    service.close(grace=5.0)
    wait_until(lambda: not holder._HOLDING, timeout=2.0)  # told before the service went
    assert sorted(delivery_counts(broker)) == [0] * 10


def test_an_unreachable_service_gives_back_after_one_lock_duration(
    broker_factory: Callable[..., BrokerHandle], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver died: the holder renews the locks (PT5S) while it cannot reach the
    service, for one lock duration, then gives the messages back: none was redelivered
    by an expired lock. The broker and the holder share a ``ManualClock``, stepped a second
    at a time once the locks' renewals are in (``clock_steps.step``)."""
    monkeypatch.setattr(holder, "LONG_POLL", 0.5)  # the poll in flight at the shutdown
    clock = ManualClock()
    broker = broker_factory(CONFIG, clock=clock)
    fill(broker, "q", [ServiceBusMessage(b"x", message_id=f"m-{i}") for i in range(10)])
    dying = CommitService("run-1")
    dying.planned(1)
    assert len(list(read_assignment(options(broker), assignment(dying, 1), clock))) == 10
    dying._server.shutdown()  # gone without a word, as when its process is killed
    dying._server.server_close()
    started = clock.monotonic()

    async def steps(done: Callable[[], bool]) -> None:
        while not done():
            assert clock.monotonic() - started < 30.0, "the holder never gave back"
            await step(broker, "q")

    asyncio.run(steps(lambda: clock.monotonic() - started >= 2.0))
    with broker.client() as client, client.get_queue_receiver("q") as receiver:
        assert receiver.receive_messages(max_message_count=10, max_wait_time=0.5) == []  # held
    asyncio.run(steps(lambda: not holder._HOLDING))
    assert clock.monotonic() - started >= 5.0  # one lock duration of trying
    assert sorted(delivery_counts(broker)) == [0] * 10  # given back, not expired


def test_a_slot_read_twice_gives_both_back(
    broker_factory: Callable[..., BrokerHandle],
    service: CommitService,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A retried task read other messages; which attempt's rows were written is unknown, so
    neither is completed (duplicates, never a loss)."""
    caplog.set_level(logging.WARNING, logger="replication.spark")
    broker = filled(broker_factory, 20)
    service.planned(1)
    first = list(read_assignment(options(broker), assignment(service, 1)))
    second = list(read_assignment(options(broker), assignment(service, 1)))
    assert {r[1] for r in first}.isdisjoint(r[1] for r in second)
    service.committed(1)
    assert service.wait_told(1, timeout=10)
    wait_until(lambda: not holder._HOLDING)
    assert sorted(delivery_counts(broker)) == [0] * 20
    assert "read by 2 task attempts" in caplog.text


def test_a_failed_attempt_unregisters_and_the_retry_completes(
    broker_factory: Callable[..., BrokerHandle], service: CommitService
) -> None:
    """The first attempt stops after two rows (its task failed): it gives its messages back
    and unregisters, so the retry, alone on the slot, completes its own."""
    broker = filled(broker_factory, 20)
    service.planned(1)
    failed = read_assignment(options(broker), assignment(service, 1))
    next(failed), next(failed)
    failed.close()
    retry = list(read_assignment(options(broker), assignment(service, 1)))
    assert len(retry) == 10
    service.committed(1)
    assert service.wait_told(1, timeout=10)
    wait_until(lambda: broker.count("q") == 10)
    assert sorted(delivery_counts(broker)) == [0] * 10


def test_a_read_the_service_refuses_gives_back_and_fails(
    broker_factory: Callable[..., BrokerHandle], service: CommitService
) -> None:
    broker = filled(broker_factory, 5)
    with pytest.raises(CommitServiceUnreachable, match=r"batch 7 is not open at the driver"):
        list(read_assignment(options(broker), assignment(service, 7)))
    assert sorted(delivery_counts(broker)) == [0] * 5


def test_a_missing_entity_fails_the_read_with_its_name(
    broker_factory: Callable[..., BrokerHandle], service: CommitService
) -> None:
    broker = filled(broker_factory, 1)
    service.planned(1)
    missing = replace(assignment(service, 1), path="missing")
    with pytest.raises(SourceError, match=r"missing"):
        list(read_assignment(options(broker), missing))
    with pytest.raises(SourceError, match=r"missing"):
        list(read_assignment(options(broker), replace(missing, sessions=2)))


def test_verdicts_long_poll_until_the_commit(service: CommitService) -> None:
    service.planned(3)
    assert service.register("run-1", 3, 0, "h", 4) == OPEN
    assert service.register("other-run", 3, 0, "h", 4) == UNKNOWN
    assert service.verdict("run-1", 3, 0, "h") == OPEN
    answers: list[str] = []
    poll = threading.Thread(target=lambda: answers.append(service.verdict("run-1", 3, 0, "h", 20)))
    poll.start()
    time.sleep(0.2)
    assert not answers
    service.committed(3)
    poll.join(5)
    assert answers == [COMMITTED]
    assert service.register("run-1", 3, 1, "late", 1) == UNKNOWN  # committed: too late
    assert service.verdict("run-1", 4, 0, "h") == UNKNOWN  # never planned
    service.planned(5)
    service.register("run-1", 5, 0, "a", 1)
    service.register("run-1", 5, 0, "b", 0)
    service.committed(5)
    assert service.verdict("run-1", 5, 0, "a") == RELEASE


def test_options_say_where_to_receive() -> None:
    base = {"connectionString": "Endpoint=sb://x/;SharedAccessKeyName=k;SharedAccessKey=v",
            "queue": "q"}  # fmt: skip
    assert Options.parse(base, reading=True).receive_on == "executors"
    assert Options.parse({**base, "receiveOn": "Driver"}, reading=True).receive_on == "driver"
    with pytest.raises(ValueError, match=r"'receiveOn' is 'executors' or 'driver'"):
        Options.parse({**base, "receiveOn": "both"}, reading=True)


def test_assignments_name_the_commit_service() -> None:
    from replication.spark.source import StreamReader

    reader = StreamReader(Options.parse({
        "connectionString": "Endpoint=sb://127.0.0.1:5672/;SharedAccessKeyName=k;"
                            "SharedAccessKey=v", "queue": "q", "numPartitions": "3",
        "maxMessagesPerTrigger": "90",
    }, reading=True))  # fmt: skip
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        planned = reader.partitions(start, end)
        assert end == {"run": reader.run, "batch": 1}
        assert [p.max_messages for p in planned] == [30, 30, 30]  # type: ignore[attr-defined]
        address = reader.service.address
        assert {p.commit_service for p in planned} == {address}  # type: ignore[attr-defined]
        assert address.startswith("127.0.0.1:")
        reader.commit(end)
        assert reader.service.verdict(reader.run, 1, 0, "nobody") == UNKNOWN
    finally:
        reader.stop()
