"""Helpers for the Event Hubs face's tests: configs in the Event Hubs emulator's schema,
connection strings, and receiving a known number of events with the unmodified SDK."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient
from azure.eventhub.aio import EventHubConsumerClient as AsyncEventHubConsumerClient

from .conftest import connection_string, make_config

HUB = "eh1"


def eventhub_config(
    hubs: dict[str, dict[str, Any]] | None = None, queues: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A config with the Service Bus part of ``make_config(queues)`` (no queues by default)
    and ``UserConfig.NamespaceConfig`` as the Event Hubs emulator writes it: ``hubs`` maps
    names to entity properties (default: ``eh1`` with 2 partitions and consumer group cg1)."""
    if hubs is None:
        hubs = {HUB: {"PartitionCount": "2", "ConsumerGroups": [{"Name": "cg1"}]}}
    config = make_config(queues or {})
    config["UserConfig"]["NamespaceConfig"] = [{
        "Type": "EventHub", "Name": "emulatorNs1",
        "Entities": [{"Name": name, **props} for name, props in hubs.items()],
    }]  # fmt: skip
    return config


def eventhub_connection_string(port: int, hub: str = HUB) -> str:
    return connection_string(port) + f"EntityPath={hub}"


def producer(port: int, hub: str = HUB, **kwargs: Any) -> EventHubProducerClient:
    return EventHubProducerClient.from_connection_string(
        eventhub_connection_string(port, hub), **kwargs
    )


def consumer(
    port: int, hub: str = HUB, group: str = "$Default", **kwargs: Any
) -> EventHubConsumerClient:
    return EventHubConsumerClient.from_connection_string(
        eventhub_connection_string(port, hub), consumer_group=group, **kwargs
    )


def receive(
    port: int,
    count: int,
    *,
    partition_id: str = "0",
    group: str = "$Default",
    hub: str = HUB,
    timeout: float = 20.0,
    then: Any = None,
    **options: Any,
) -> list[EventData]:
    """``count`` events from one partition with the sync SDK (``options`` go to ``receive``:
    ``starting_position``, ``starting_position_inclusive``); ``then()`` runs once the
    receiver is reading (after its first empty wait), e.g. to send what it should see.

    ``count`` is at least one: a reader that gets nothing ends only on ``timeout``. That a
    partition (or a position) holds nothing is shown by a marker sent after it, the one
    event received."""
    assert count > 0, "receive a marker sent after what must not be there"
    events: list[EventData] = []
    done = threading.Event()
    started = threading.Event()
    client = consumer(port, hub, group=group)

    def on_event(_context: Any, event: EventData | None) -> None:
        if event is None:
            started.set()
            return
        events.append(event)
        if len(events) >= count:
            done.set()

    worker = threading.Thread(
        target=client.receive,
        kwargs={"on_event": on_event, "partition_id": partition_id, "max_wait_time": 0.3,
                **options},
        daemon=True,
    )  # fmt: skip
    worker.start()
    try:
        if then is not None:
            assert started.wait(timeout), "the receiver did not start"
            then()
        deadline = time.monotonic() + timeout
        while not done.is_set() and time.monotonic() < deadline:
            done.wait(0.05)
        time.sleep(0.2)  # anything beyond ``count`` would arrive now
    finally:
        client.close()
        worker.join(10)
    assert len(events) >= count, f"got {len(events)} of {count} events"
    return events


async def receive_async(
    port: int, count: int, *, partition_id: str = "0", timeout: float = 20.0, **options: Any
) -> list[EventData]:
    """``receive`` with the asyncio SDK."""
    events: list[EventData] = []
    done = asyncio.Event()
    client = AsyncEventHubConsumerClient.from_connection_string(
        eventhub_connection_string(port), consumer_group="$Default"
    )

    async def on_event(_context: Any, event: EventData | None) -> None:
        if event is not None:
            events.append(event)
            if len(events) >= count:
                done.set()

    errors: list[Exception] = []

    async def on_error(_context: Any, error: Exception) -> None:
        errors.append(error)

    task = asyncio.create_task(client.receive(
        on_event=on_event, on_error=on_error, partition_id=partition_id, **options
    ))  # fmt: skip
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout)
    finally:
        await client.close()  # stops the partition's receiver; ``receive`` itself returns
        task.cancel()  # only after the SDK's load-balancing sleep (30 s): no need to wait
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert len(events) >= count, f"got {len(events)} of {count} events; errors: {errors}"
    return events
