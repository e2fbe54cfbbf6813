"""Durability of topics and sessions: kill -9 mid-stream, restart, nothing acknowledged lost.

A topic with a plain and a session-enabled subscription gets 3,000 messages over 10
sessions (batches of 10) while the broker process is killed with SIGKILL after about
1,000 were acknowledged. After a restart on the same data dir, each subscription holds
every acknowledged message exactly once (the batch in flight: all or nothing), each
session's messages come back in the order they were sent, and session state written
before the kill is still there.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable

import pytest
from azure.servicebus import ServiceBusMessage

from .conftest import BrokerProcess, QuickCloseClient, concurrently, make_config, take_all

StartBroker = Callable[..., BrokerProcess]
TOTAL = 3_000
BATCH = 10
KILL_AFTER = 1_000
SESSIONS = 10
CONFIG = make_config({}, topics={"events": {"Subscriptions": {
    "plain": {},
    "ordered": {"Properties": {"RequiresSession": True}},
}}})  # fmt: skip


def client_for(proc: BrokerProcess) -> QuickCloseClient:
    return QuickCloseClient.from_connection_string(proc.connection_string, retry_total=0)


def session_of(index: int) -> str:
    return f"s{index % SESSIONS}"


@pytest.mark.timeout(180)
def test_kill_9_keeps_subscription_copies_session_order_and_state(
    broker_process: StartBroker,
) -> None:
    proc = broker_process(CONFIG)
    run = uuid.uuid4().hex[:8]
    ids = [f"{run}-{i:05d}" for i in range(TOTAL)]

    with (  # session state before the stream
        client_for(proc) as client,
        client.get_subscription_receiver("events", "ordered", session_id="s3") as r,
    ):
        r.session.set_state(b"checkpoint 42")

    attempted: list[str] = []
    acked: list[str] = []
    killed = threading.Event()

    def watcher() -> None:
        while not killed.is_set():
            if len(acked) >= KILL_AFTER and len(attempted) > len(acked):
                proc.kill()
                killed.set()
                return
            time.sleep(0.0002)

    watch = threading.Thread(target=watcher, daemon=True)
    client = client_for(proc)
    try:
        sender = client.get_topic_sender("events")
        watch.start()
        for start in range(0, TOTAL, BATCH):
            chunk = list(range(start, min(start + BATCH, TOTAL)))
            attempted.extend(ids[i] for i in chunk)
            try:
                sender.send_messages(
                    [ServiceBusMessage(ids[i], message_id=ids[i], session_id=session_of(i))
                     for i in chunk], timeout=15,
                )  # fmt: skip
            except Exception:
                break
            acked.extend(ids[i] for i in chunk)
    finally:
        killed.set()
        watch.join(15)
        with contextlib.suppress(Exception):
            client.close()
    assert KILL_AFTER <= len(acked) < TOTAL
    in_flight = set(attempted) - set(acked)

    restarted = broker_process(CONFIG, data_dir=proc.data_dir)

    def drain(subscription: str, session: str | None = None) -> tuple[list[str], bytes | None]:
        """What the subscription (or one of its sessions) holds, in the order received, and
        the session's state."""
        with (
            client_for(restarted) as client,
            client.get_subscription_receiver(
                "events", subscription, session_id=session, prefetch_count=100
            ) as r,
        ):
            received = [str(m.message_id) for m in take_all(r, batch=100)]
            return received, r.session.get_state() if session else None

    sessions = [session_of(i) for i in range(SESSIONS)]  # every message is in one of them
    (plain, _), *drained = concurrently(
        lambda: drain("plain"), *(lambda s=s: drain("ordered", s) for s in sessions)
    )
    by_session = {
        session: received for session, (received, _) in zip(sessions, drained, strict=True)
    }
    state = drained[sessions.index("s3")][1]

    assert state == b"checkpoint 42"
    ordered = [message_id for received in by_session.values() for message_id in received]
    for name, received in (("plain", plain), ("ordered", ordered)):
        counts = Counter(received)
        assert not {i for i, n in counts.items() if n > 1}, f"{name}: duplicates"
        assert not set(acked) - set(counts), f"{name}: acknowledged messages lost"
        assert set(counts) - set(acked) in (set(), in_flight), f"{name}: partial batch"
    for session, received in by_session.items():
        expected = [i for i in ids if session_of(int(i.rsplit("-", 1)[1])) == session]
        assert received == [i for i in expected if i in set(received)], f"{session} out of order"
