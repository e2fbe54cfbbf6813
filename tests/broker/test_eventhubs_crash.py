"""kill -9 the broker while events stream in: every event the SDK saw acknowledged is in its
partition after the restart, in order, with the sequence numbers it had; numbering goes on
after the last durable event."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from azure.eventhub import EventData

from .conftest import BrokerProcess
from .eventhubs_support import eventhub_config, producer, receive

StartBroker = Callable[..., BrokerProcess]
TOTAL = 3_000
KILL_AFTER = 1_000


@pytest.mark.timeout(120)
def test_kill_9_keeps_every_acknowledged_event(broker_process: StartBroker) -> None:
    config = eventhub_config({"crash": {"PartitionCount": "1"}})
    proc = broker_process(config)
    acked: list[str] = []
    attempted: list[str] = []

    def watcher() -> None:
        while len(acked) < KILL_AFTER:
            time.sleep(0.0005)
        proc.kill()  # SIGKILL while the next sends are under way

    watch = threading.Thread(target=watcher, daemon=True)
    watch.start()
    client = producer(proc.port, "crash", retry_total=0)
    try:
        for n in range(TOTAL):
            body = f"event-{n:05d}"
            attempted.append(body)
            client.send_event(EventData(body))  # returns once the broker said accepted
            acked.append(body)
    except Exception:  # the send in flight at the kill fails: that is the point
        pass
    finally:
        client.close()
    watch.join(10)
    assert KILL_AFTER <= len(acked) < TOTAL

    again = broker_process(config, data_dir=proc.data_dir)
    with producer(again.port, "crash") as reader:
        stored = reader.get_partition_properties("0")["last_enqueued_sequence_number"] + 1
    assert len(acked) <= stored <= len(attempted)  # the one in flight may have made it
    events = receive(again.port, stored, hub="crash", starting_position="-1", timeout=60)
    assert [e.body_as_str() for e in events] == attempted[:stored]
    assert [e.sequence_number for e in events] == list(range(stored))

    with producer(again.port, "crash") as client:
        client.send_event(EventData("after"))
    (after,) = receive(again.port, 1, hub="crash", starting_position=stored - 1)
    assert (after.body_as_str(), after.sequence_number) == ("after", stored)
