"""Durability proof: kill -9 the broker process mid-stream and nothing acknowledged is lost.

The broker runs as a real child process (``python -m replication broker``) over a data dir in
``tmp_path``; the unmodified sync SDK sends and receives from the test's process. An id counts
as acknowledged only once ``send_messages`` returned without error, i.e. after the broker's
``accepted`` arrived, which the broker sends only after the message's group commit. So after
SIGKILL and a restart on the same data dir:

* every acknowledged id is there, exactly once;
* ids whose send was in flight at the kill may or may not be there (at most once);
* nothing that was never sent appears;
* locks are released by the crash: received-but-unsettled messages come back at once (not
  after the lock duration), and completed ones never come back.

The client runs with ``retry_total=0`` so the SDK does not retry behind the test's back: the
call that is in flight at the kill fails, and the sender stops there.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage, ServiceBusReceiveMode

from .conftest import BrokerProcess, QuickCloseClient, body_bytes, make_config, take_all

QUEUE = "crash"
CONFIG = make_config({QUEUE: {}})  # LockDuration: the default 1 minute
TOTAL = 10_000
BATCH = 10
KILL_AFTER = 3_000

StartBroker = Callable[..., BrokerProcess]


def client_for(proc: BrokerProcess) -> QuickCloseClient:
    return QuickCloseClient.from_connection_string(proc.connection_string, retry_total=0)


def body_for(message_id: str) -> bytes:
    return f"payload of {message_id}".encode()


def drain(proc: BrokerProcess) -> list[ServiceBusReceivedMessage]:
    """Receives and completes everything the queue holds; done once a peek finds nothing
    left (the broker answers at once: no quiet period to wait out)."""
    with (
        client_for(proc) as client,
        client.get_queue_receiver(QUEUE, prefetch_count=200) as receiver,
    ):
        return take_all(receiver, batch=200)


def assert_empty_after_another_crash(start: StartBroker, proc: BrokerProcess) -> None:
    """kill -9 once more and restart: settled messages stay settled (a peek from the first
    sequence number sees every message the queue holds, in any state)."""
    proc.kill()
    again = start(CONFIG, data_dir=proc.data_dir)
    with (
        client_for(again) as client,
        client.get_queue_receiver(QUEUE, prefetch_count=200) as receiver,
    ):
        leftovers = receiver.peek_messages(max_message_count=10, sequence_number=1)
    assert [m.message_id for m in leftovers] == []
    again.terminate()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("batch", [1, BATCH], ids=["single", "batch10"])
def test_kill_9_mid_stream_loses_no_acknowledged_message(
    broker_process: StartBroker, batch: int
) -> None:
    """10,000 sends, SIGKILL after 3,000 acknowledged, restart: every acknowledged message is
    there exactly once, the in-flight one at most once, nothing else."""
    proc = broker_process(CONFIG)
    run = uuid.uuid4().hex[:8]
    ids = [f"{run}-{i:05d}" for i in range(TOTAL)]
    attempted: list[str] = []  # every id whose send was started (the in-flight batch included)
    acked: list[str] = []  # appended only after send_messages returned without error
    send_error: list[BaseException] = []
    killed_at: list[int] = []
    stop_watching = threading.Event()

    def watcher() -> None:
        while not stop_watching.is_set():
            # 3,000 acknowledged and the next send under way: kill within the next ~2 ms, so the
            # in-flight send is sometimes committed (yet never acknowledged), sometimes not
            if len(acked) >= KILL_AFTER and len(attempted) > len(acked):
                time.sleep(random.uniform(0, 0.002))
                proc.kill()  # SIGKILL: no shutdown code runs in the broker
                killed_at.append(len(acked))
                return
            time.sleep(0.0002)

    watch = threading.Thread(target=watcher, name="crash-watcher", daemon=True)
    started = time.monotonic()
    client = client_for(proc)
    try:
        sender = client.get_queue_sender(QUEUE)
        watch.start()
        for start in range(0, TOTAL, batch):
            chunk = ids[start : start + batch]
            attempted += chunk
            messages = [ServiceBusMessage(body_for(i), message_id=i) for i in chunk]
            try:
                # one message goes as a plain transfer, a list as one batch transfer
                sender.send_messages(messages[0] if batch == 1 else messages, timeout=15)
            except Exception as exc:  # the kill: this call (or the next) fails; stop sending
                send_error.append(exc)
                break
            acked.extend(chunk)
    finally:
        stop_watching.set()
        watch.join(15)
        with contextlib.suppress(Exception):
            client.close()
    send_seconds = time.monotonic() - started

    assert killed_at, "the broker was never killed"
    assert send_error, "sending went on after the broker was killed"
    assert KILL_AFTER <= len(acked) < TOTAL
    # the broker died during the send that failed, or between two sends: exactly one batch
    # was in flight (started, never acknowledged)
    in_flight = set(attempted) - set(acked)
    assert len(in_flight) == batch

    restarted = broker_process(CONFIG, data_dir=proc.data_dir)
    received = drain(restarted)
    counts = Counter(m.message_id for m in received)

    duplicates = {i: n for i, n in counts.items() if n > 1}
    assert not duplicates, f"delivered more than once: {sorted(duplicates)[:10]}"
    unknown = set(counts) - set(attempted)
    assert not unknown, f"ids that were never sent: {sorted(unknown)[:10]}"
    lost = set(acked) - set(counts)
    assert not lost, f"{len(lost)} acknowledged ids lost, e.g. {sorted(lost)[:10]}"
    # the batch in flight at the kill is one transfer, one transaction: all of it or none
    assert set(counts) - set(acked) in (set(), in_flight)
    for message in received:  # bodies intact, nothing redelivered
        assert body_bytes(message) == body_for(message.message_id)
        assert message.delivery_count == 0
    sequence_numbers = [m.sequence_number for m in received]
    assert len(set(sequence_numbers)) == len(received)
    # sent in id order on one link: stored (and delivered) in that order
    assert [m.message_id for m in sorted(received, key=lambda m: m.sequence_number)] == sorted(
        counts
    )
    print(
        f"sent {len(acked)} acknowledged (+{len(in_flight)} in flight) in {send_seconds:.1f} s, "
        f"killed at {killed_at[0]} acked, recovered {len(received)} "
        f"({len(set(counts) & in_flight)} of the in-flight batch)"
    )

    assert_empty_after_another_crash(broker_process, restarted)


@pytest.mark.timeout(90)
def test_kill_9_releases_locks_and_keeps_settlements(broker_process: StartBroker) -> None:
    """Messages received but not settled before the kill come back right after the restart
    (locks live in the broker's memory only; nobody waits for the 60 s lock duration). Their
    delivery count is unchanged: the broker counts a delivery attempt only when a lock expires
    or the message is abandoned, never for a lock lost in a crash. Completed messages never come
    back; an abandon before the kill keeps the delivery count it raised."""
    proc = broker_process(CONFIG)
    run = uuid.uuid4().hex[:8]
    ids = [f"{run}-{i:03d}" for i in range(100)]
    with client_for(proc) as client, client.get_queue_sender(QUEUE) as sender:
        for start in range(0, len(ids), BATCH):
            sender.send_messages(
                [ServiceBusMessage(body_for(i), message_id=i) for i in ids[start : start + BATCH]]
            )

    client = client_for(proc)
    held: list[ServiceBusReceivedMessage] = []
    try:
        receiver = client.get_queue_receiver(QUEUE, prefetch_count=0)
        deadline = time.monotonic() + 20
        while len(held) < 60:
            assert time.monotonic() < deadline, f"received only {len(held)} of 60"
            held += receiver.receive_messages(max_message_count=60 - len(held), max_wait_time=2)
        assert [m.message_id for m in held] == ids[:60]
        assert all(m.delivery_count == 0 for m in held)
        completed, abandoned, locked = held[:20], held[20:30], held[30:]
        for message in completed:
            receiver.complete_message(message)  # returns once the broker echoed (committed)
        for message in abandoned:
            receiver.abandon_message(message)
        max_sequence = max(m.sequence_number for m in held)
        proc.kill()  # the receiver still holds 30 locks (and may have taken abandoned ones)
    finally:
        with contextlib.suppress(Exception):
            client.close()

    restarted = broker_process(CONFIG, data_dir=proc.data_dir)
    started = time.monotonic()
    received = drain(restarted)
    elapsed = time.monotonic() - started

    by_id: dict[str, Any] = {}
    for message in received:
        assert message.message_id not in by_id, f"{message.message_id} delivered twice"
        by_id[message.message_id] = message
    completed_ids = {m.message_id for m in completed}
    assert not completed_ids & set(by_id), "a completed message came back"
    assert set(by_id) == set(ids) - completed_ids
    assert elapsed < 20, f"unsettled messages took {elapsed:.1f} s to come back"
    for message in abandoned:
        assert by_id[message.message_id].delivery_count == 1
    for message in locked:
        assert by_id[message.message_id].delivery_count == 0
    for message_id in ids[60:]:
        assert by_id[message_id].delivery_count == 0
    for message in held:  # same message, same sequence number
        if message.message_id in by_id:
            assert by_id[message.message_id].sequence_number == message.sequence_number

    # sequence numbers are never reused after a crash
    with client_for(restarted) as client:
        with client.get_queue_sender(QUEUE) as sender:
            sender.send_messages(ServiceBusMessage(b"after", message_id=f"{run}-after"))
        with client.get_queue_receiver(
            QUEUE, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        ) as receiver:
            (after,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
    assert after.message_id == f"{run}-after"
    assert after.sequence_number > max(max_sequence, *(m.sequence_number for m in received))

    assert_empty_after_another_crash(broker_process, restarted)
