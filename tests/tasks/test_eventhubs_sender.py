"""Where the Event Hubs target sends each message, asked of a real event hub on the embedded
broker: a key (partition key, else session id), else the source partition's id, kept apart
on a target with fewer partitions."""

from __future__ import annotations

from typing import Any

import pytest

from replication.messages import Message
from replication.tasks.eventhubs import EventHubSender
from tests.broker.eventhubs_support import eventhub_config

pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio]


async def test_destinations(broker_factory: Any) -> None:
    broker = broker_factory(eventhub_config({"small": {"PartitionCount": "2"}}))
    sender = EventHubSender(broker.connection_string, "small")
    try:
        assert await sender.destination(Message(partition_key="k", session_id="s")) == ("k", None)
        assert await sender.destination(Message(session_id="s")) == ("s", None)
        assert await sender.destination(Message(partition_id="1")) == (None, "1")
        # from a 4-partition source: 2 and 3 fold onto 0 and 1, each still on its own
        assert await sender.destination(Message(partition_id="3")) == (None, "1")
        assert await sender.destination(Message(partition_id="2")) == (None, "0")
        assert await sender.destination(Message()) == (None, None)  # round-robin
    finally:
        await sender.close()
