"""The unmodified asyncio ``azure-eventhub`` SDK against the broker's Event Hubs face."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from azure.eventhub import EventData
from azure.eventhub.aio import EventHubProducerClient

from replication.broker.eventhubs.partitioning import partition_for_key

from .conftest import BrokerHandle
from .eventhubs_support import HUB, eventhub_config, eventhub_connection_string, receive_async

StartBroker = Callable[..., BrokerHandle]
KEYED = str(partition_for_key("k", 2))
"""The partition the service's hash picks for key "k" of a 2-partition hub."""


def _producer(port: int, **kwargs: Any) -> EventHubProducerClient:
    return EventHubProducerClient.from_connection_string(eventhub_connection_string(port), **kwargs)


def test_async_send_receive_and_properties(broker_factory: StartBroker) -> None:
    port = broker_factory(eventhub_config()).port

    async def main() -> None:
        async with _producer(port) as client:
            batch = await client.create_batch(partition_key="k")
            for n in range(3):
                batch.add(EventData(f"a{n}"))
            await client.send_batch(batch)
            await client.send_event(EventData("direct"), partition_id="1")
            info = await client.get_eventhub_properties()
            assert info["eventhub_name"] == HUB and info["partition_ids"] == ["0", "1"]
            keyed = await client.get_partition_properties(KEYED)
        events = await receive_async(port, 3, partition_id=KEYED, starting_position="-1")
        bodies = [e.body_as_str() for e in events if e.partition_key == b"k"]
        assert bodies == ["a0", "a1", "a2"]
        assert keyed["last_enqueued_sequence_number"] >= 2
        from_seq = await receive_async(port, 1, partition_id="1", starting_position=-1)
        assert from_seq[0].sequence_number == 0

    asyncio.run(main())


def test_async_buffered_producer(broker_factory: StartBroker) -> None:
    port = broker_factory(eventhub_config()).port

    async def main() -> None:
        sent: list[EventData] = []

        async def on_success(events: list[EventData], _pid: str | None) -> None:
            sent.extend(events)

        async def on_error(_events: list[EventData], _pid: str | None, error: Exception) -> None:
            raise AssertionError(f"buffered send failed: {error}")

        client = _producer(port, buffered_mode=True, max_wait_time=0.2,
                           on_success=on_success, on_error=on_error)  # fmt: skip
        async with client:
            for n in range(10):
                await client.send_event(EventData(f"b{n}"), partition_id=str(n % 2))
            await client.flush()
        assert len(sent) == 10
        zero = await receive_async(port, 5, partition_id="0", starting_position="-1")
        assert [e.body_as_str() for e in zero] == [f"b{n}" for n in range(0, 10, 2)]

    asyncio.run(main())
