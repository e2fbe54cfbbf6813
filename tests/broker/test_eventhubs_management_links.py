"""Event Hubs' ``$management`` answers each request on the link its ``reply-to`` names: one
connection may hold a management link per client (a reader of two hubs, the dashboard),
and each gets its own answers, before and after another one closes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from replication.servicebus.client import AmqpSource
from replication.servicebus.eventhubs import EventHubClient

from .conftest import connection_string
from .eventhubs_support import eventhub_config

pytestmark = pytest.mark.timeout(60)


async def _alternate(port: int) -> list[list[str]]:
    source = AmqpSource.from_connection_string(connection_string(port), timeout=5)
    try:
        one, two = EventHubClient(source, "one"), EventHubClient(source, "two")
        answers = [await one.partition_ids(), await two.partition_ids()]
        answers += [await one.partition_ids(), await two.partition_ids()]
        link = two._management
        assert link is not None
        await link.receiver.close()  # its answers' link gone: the other's still answered
        await link.sender.close()
        answers.append(await one.partition_ids())
        return answers
    finally:
        await source.close()


def test_each_management_link_gets_its_own_answers(broker_factory: Any) -> None:
    handle = broker_factory(
        eventhub_config({"one": {"PartitionCount": "2"}, "two": {"PartitionCount": "1"}})
    )
    ones, twos = ["0", "1"], ["0"]
    assert asyncio.run(_alternate(handle.port)) == [ones, twos, ones, twos, ones]
