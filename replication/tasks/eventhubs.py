"""Sending to an event hub: the target side of Service Bus -> Event Hubs and Event Hubs ->
Event Hubs, over ``azure-eventhub``'s async producer.

Where an event goes keeps the order that matters, as Microsoft's replication sample
(Azure-Samples/azure-messaging-replication-dotnet) does:

* a partition key goes with the send: the message's ``partition_key``, else its
  ``session_id`` (a Service Bus session stays in one partition, in order);
* an event read from an event hub without a key goes to the partition of the same id
  (``partition_id``), so each source partition's order holds in the target; when the
  target has fewer partitions, to ``id mod count`` (still one target partition per source
  partition);
* anything else goes without a key (the service spreads it round-robin).

``send_ordered`` hands a sender one group's messages (one session / partition key) in
order; each run of messages with the same destination is one ``send_batch`` (the SDK puts
the key on every event of the batch), and the next run goes only after it was accepted.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..adapters.eventhubs import to_event_data
from ..messages import Message

Destination = tuple[str | None, str | None]
"""(partition key, partition id): at most one of them set."""


def partition_key_of(message: Message) -> str | None:
    """The key an event is sent with: the partition key, else the session id."""
    return message.partition_key or message.session_id


class EventHubSender:
    """One event hub's producer, shared by every group that sends there."""

    def __init__(self, connection_string: str, eventhub: str, **client_options: Any) -> None:
        from azure.eventhub.aio import EventHubProducerClient

        self.eventhub = eventhub
        self.client = EventHubProducerClient.from_connection_string(
            connection_string, eventhub_name=eventhub, **client_options
        )
        self._partitions: list[str] | None = None
        self._lock = asyncio.Lock()

    async def send_messages(self, messages: list[Message]) -> None:
        for (key, partition), events in await self._runs(messages):
            if key is not None:
                await self.client.send_batch(events, partition_key=key)
            elif partition is not None:
                await self.client.send_batch(events, partition_id=partition)
            else:
                await self.client.send_batch(events)

    async def _runs(self, messages: list[Message]) -> list[tuple[Destination, list[Any]]]:
        runs: list[tuple[Destination, list[Any]]] = []
        for destination, message in zip(
            [await self.destination(m) for m in messages], messages, strict=True
        ):
            if not runs or runs[-1][0] != destination:
                runs.append((destination, []))
            runs[-1][1].append(to_event_data(message))
        return runs

    async def destination(self, message: Message) -> Destination:
        key = partition_key_of(message)
        if key is not None:
            return key, None
        if message.partition_id is None:
            return None, None
        partitions = await self.partition_ids()
        if message.partition_id in partitions:
            return None, message.partition_id
        try:
            return None, partitions[int(message.partition_id) % len(partitions)]
        except ValueError:  # not a number: no way to keep it apart; round-robin
            return None, None

    async def partition_ids(self) -> list[str]:
        async with self._lock:
            if self._partitions is None:
                self._partitions = list(await self.client.get_partition_ids())
        return self._partitions

    async def close(self) -> None:
        await self.client.close()
