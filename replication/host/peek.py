"""``python -m replication peek <entity>``: what arrived at an entity, without taking it.

Peeks over our AMQP client (``servicebus.management``: a ``peek-message`` request, which
locks nothing, a session included) through the connection named by an app setting (default:
the secondary namespace). ``<entity>/$DeadLetterQueue`` is the entity's dead-letter sub-queue,
as Service Bus names it. When that connection is a local emulator that is not running, the
embedded broker is started on its data directory for the peek and stopped again.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..messages import Message
from ..servicebus.client import AmqpSource
from ..servicebus.management import Management
from .embedded import emulator_port, plan_brokers, served, start_brokers


async def peek(
    directory: Path,
    settings: Mapping[str, str],
    connection: str,
    entity: str,
    count: int,
    session: str | None = None,
) -> list[dict[str, Any]]:
    """Up to ``count`` messages at ``entity`` of the namespace the app setting ``connection``
    names (of ``session`` only, when given), as ``run_peek`` prints them."""
    if connection not in settings:
        raise KeyError(f"no app setting {connection!r} in the local settings")
    connection_string = settings[connection]
    brokers = []
    port = emulator_port(connection_string)
    if port is not None and not served(port):
        from ..pipeline import load_pipelines

        pipelines = load_pipelines(
            directory / settings.get("REPLICATION_PIPELINES", "pipelines.yaml"), settings=settings
        )
        plan = {p: e for p, e in plan_brokers(pipelines.pipelines, settings).items() if p == port}
        brokers = await start_brokers(plan, directory / ".replication")
    try:
        async with AmqpSource.from_connection_string(connection_string) as source:
            management = Management(await source.connection())
            peeked = await management.peek(entity, count, session_id=session)
        return [_describe(m) for m in peeked]
    finally:
        for broker in brokers:
            await broker.stop()


def _describe(message: Message) -> dict[str, Any]:
    try:
        body: Any = message.body.decode("utf-8")
    except UnicodeDecodeError:
        body = message.body.hex()
    return {
        "sequence_number": message.sequence_number,
        "message_id": message.message_id,
        "session_id": message.session_id,
        "content_type": message.content_type,
        "properties": {k: str(v) for k, v in message.application_properties.items()},
        "body": body,
    }


async def peek_events(connection_string: str, eventhub: str, wait: float = 3.0) -> list[Any]:
    """The events of an event hub, every partition from its start (read for ``wait``
    seconds through ``$Default``, which takes nothing from anyone), as ``(partition id,
    partition key, description)``, in partition order."""
    import asyncio

    from azure.eventhub.aio import EventHubConsumerClient

    from ..adapters.eventhubs import from_event_data

    found: list[Any] = []

    async def on_event(context: Any, event: Any) -> None:
        if event is not None:
            message = from_event_data(event, context.partition_id)
            found.append((context.partition_id, message.partition_key, _describe(message)))

    client = EventHubConsumerClient.from_connection_string(
        connection_string, consumer_group="$Default", eventhub_name=eventhub
    )
    task = asyncio.create_task(client.receive(on_event, starting_position="-1"))
    try:
        await asyncio.sleep(wait)
    finally:
        await client.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return sorted(found, key=lambda item: (item[0], item[2]["sequence_number"]))
