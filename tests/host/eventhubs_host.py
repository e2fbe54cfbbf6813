"""Runs a pipelines app's Service Bus and Event Hubs triggers in this process as the local
host does (the real SDKs against the real embedded broker), and reads event hubs back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import azure.functions as func
from azure.eventhub import EventData
from azure.eventhub.aio import EventHubConsumerClient, EventHubProducerClient

from replication.host.checkpoints import SqliteCheckpointStore
from replication.host.discovery import service_bus_triggers
from replication.host.eventhubs import EventHubOptions, EventHubTriggerRunner, event_hub_triggers
from replication.host.trigger import TriggerRunner
from replication.host.worker import Worker

from .support import FAST, run_until

Runner = TriggerRunner | EventHubTriggerRunner


async def run_host(
    app: func.FunctionApp,
    settings: dict[str, str],
    data_dir: Path,
    until: Callable[[list[Runner]], bool],
    *,
    timeout: float = 60.0,
    batch: int = 10,
) -> list[Runner]:
    """Every trigger of ``app`` (both kinds) until ``until(runners)`` is true."""
    worker = Worker()
    store = SqliteCheckpointStore.in_directory(data_dir)
    runners: list[Runner] = [
        TriggerRunner(t, settings[t.connection], FAST.for_trigger(t), worker=worker)
        for t in service_bus_triggers(app, settings)
    ]
    runners += [
        EventHubTriggerRunner(t, settings[t.connection], store, worker, EventHubOptions(batch))
        for t in event_hub_triggers(app, settings)
    ]
    try:
        return await run_until(runners, worker, until, timeout)
    finally:
        store.close()


def events_done(total: int) -> Callable[[list[Runner]], bool]:
    """True once the Event Hubs triggers ran ``total`` events through."""
    return lambda runners: sum(
        r.stats.events for r in runners if isinstance(r, EventHubTriggerRunner)
    ) >= total  # fmt: skip


def hub_connection(connection_string: str, hub: str) -> str:
    return f"{connection_string.rstrip(';')};EntityPath={hub}"


async def send_events(
    connection_string: str, hub: str, events: list[tuple[str | None, str | None, EventData]]
) -> None:
    """Sends each ``(partition_key, partition_id, event)`` in order, one at a time."""
    async with EventHubProducerClient.from_connection_string(
        hub_connection(connection_string, hub)
    ) as producer:
        for key, partition, event in events:
            if key is not None:
                await producer.send_batch([event], partition_key=key)
            elif partition is not None:
                await producer.send_batch([event], partition_id=partition)
            else:
                await producer.send_batch([event])


async def read_hub(
    connection_string: str, hub: str, count: int, timeout: float = 30.0
) -> dict[str, list[EventData]]:
    """Every partition's events from the start, until ``count`` arrived (partition id ->
    events in partition order)."""
    found: dict[str, list[EventData]] = {}
    done = asyncio.Event()
    client = EventHubConsumerClient.from_connection_string(
        hub_connection(connection_string, hub), consumer_group="$Default"
    )

    async def on_event(context: Any, event: EventData | None) -> None:
        if event is None:
            return
        found.setdefault(context.partition_id, []).append(event)
        if sum(len(v) for v in found.values()) >= count:
            done.set()

    task = asyncio.create_task(client.receive(on_event, starting_position="-1"))
    try:
        await asyncio.wait_for(done.wait(), timeout)
        await asyncio.sleep(0.3)  # anything beyond ``count`` would arrive now
    finally:
        await client.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return found


def text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value
