"""Replication with event hubs through the local host's triggers, over the real embedded
broker and the unmodified SDKs: Service Bus -> Event Hubs, Event Hubs -> Service Bus and
Event Hubs -> Event Hubs, and a loop guard in an active/active pair of event hubs."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from azure.eventhub import EventData
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient

from replication.host.trigger import TriggerRunner
from tests.broker.conftest import make_config
from tests.broker.eventhubs_support import eventhub_config

from .eventhubs_host import events_done, read_hub, run_host, send_events, text
from .support import pipeline_app, settled

pytestmark = [pytest.mark.timeout(180), pytest.mark.asyncio]

PARTITIONS = "4"


def hubs(*names: str, groups: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    return {
        name: {"PartitionCount": PARTITIONS, "ConsumerGroups": [{"Name": g} for g in groups]}
        for name in names
    }


@pytest.mark.parametrize("backend", ["amqp", "sdk"])
async def test_service_bus_to_event_hubs_keeps_identity_stamps_and_sessions(
    broker_factory: Any, tmp_path: Path, backend: str
) -> None:
    """Each session's messages land in one partition, in order, with identity and stamps,
    sent over our AMQP client or azure-eventhub's producer."""
    broker = broker_factory(eventhub_config(
        hubs("orders-hub"), queues={"orders": {"RequiresSession": True}}
    ))  # fmt: skip
    settings = {"ServiceBus": broker.connection_string, "EventHubs": broker.connection_string}
    app = pipeline_app(f"""\
pipelines:
  - name: sb-to-eh
    source: {{connection: ServiceBus, queue: orders, sessions: true}}
    target: {{connection: EventHubs, eventhub: orders-hub}}
    backend: {backend}
""", settings)  # fmt: skip
    sessions, per_session = 5, 12
    async with (
        ServiceBusClient.from_connection_string(broker.connection_string) as client,
        client.get_queue_sender("orders") as sender,
    ):
        await sender.send_messages([
            ServiceBusMessage(
                json.dumps({"n": i}), session_id=f"s{s}", message_id=f"s{s}-{i}",
                content_type="application/json", subject="order", correlation_id=f"c{i}",
                application_properties={"region": "eu", "n": i},
            )
            for i in range(per_session) for s in range(sessions)
        ])  # fmt: skip
    total = sessions * per_session
    await run_host(app, settings, tmp_path, settled(total))
    found = await read_hub(broker.connection_string, "orders-hub", total)
    by_session: dict[str, list[tuple[str, EventData]]] = defaultdict(list)
    for partition, events in found.items():
        for event in events:
            by_session[text(event.partition_key) or ""].append((partition, event))
    assert sorted(by_session) == [f"s{s}" for s in range(sessions)]
    for session, placed in by_session.items():
        assert len({partition for partition, _ in placed}) == 1, session  # one partition
        ids = [text(event.message_id) for _, event in placed]
        assert ids == [f"{session}-{i}" for i in range(per_session)]  # in order, once each
    _, first = by_session["s0"][0]
    assert first.body_as_json() == {"n": 0}
    assert first.content_type == "application/json" and first.correlation_id == "c0"
    assert text(first.raw_amqp_message.properties.subject) == "order"
    assert text(first.raw_amqp_message.properties.group_id) == "s0"  # the session id kept
    props = {text(k): text(v) for k, v in first.properties.items()}
    assert props["region"] == "eu" and props["n"] == 0
    assert props["repl-sequence"].isdigit() and props["repl-enqueue-time"].endswith("Z")
    assert "repl-offset" not in props  # a Service Bus source has no offset
    assert props["repl-path"] == f"localhost:{broker.port}"


async def test_event_hubs_to_service_bus_keeps_key_order_as_sessions(
    broker_factory: Any, tmp_path: Path
) -> None:
    """``session_id_from: partition_key``: each key's events become one session, in order,
    stamped with the event's enqueued time, offset and sequence number."""
    broker = broker_factory(eventhub_config(
        hubs("telemetry", groups=("replication",)),
        queues={"telemetry-sessions": {"RequiresSession": True}},
    ))  # fmt: skip
    settings = {"ServiceBus": broker.connection_string, "EventHubs": broker.connection_string}
    app = pipeline_app("""\
pipelines:
  - name: eh-to-sb
    source: {connection: EventHubs, eventhub: telemetry, consumer_group: replication,
             session_id_from: partition_key}
    target: {connection: ServiceBus, queue: telemetry-sessions}
""", settings)  # fmt: skip
    keys, per_key = ["device-1", "device-2", "device-3"], 15
    sent = []
    for i in range(per_key):
        for key in keys:
            event = EventData(json.dumps({"key": key, "i": i}))
            event.message_id = f"{key}-{i}"
            event.properties = {"i": i}
            sent.append((key, None, event))
    await send_events(broker.connection_string, "telemetry", sent)
    await run_host(app, settings, tmp_path, events_done(len(sent)))
    got: dict[str, list[Any]] = {}
    async with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        for _ in keys:
            async with client.get_queue_receiver(
                "telemetry-sessions", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
            ) as receiver:
                messages = await receiver.receive_messages(per_key, max_wait_time=5)
                for message in messages:
                    await receiver.complete_message(message)
                got[str(receiver.session.session_id)] = messages
    assert sorted(got) == keys
    for key, messages in got.items():
        assert [str(m.message_id) for m in messages] == [f"{key}-{i}" for i in range(per_key)]
        assert all(m.session_id == key for m in messages)
    props = {text(k): text(v) for k, v in got["device-1"][0].application_properties.items()}
    assert props["i"] == 0
    assert props["repl-offset"].lstrip("-").isdigit()
    assert props["repl-sequence"].isdigit() and props["repl-enqueue-time"].endswith("Z")


async def test_event_hubs_to_event_hubs_keeps_partition_affinity(
    broker_factory: Any, tmp_path: Path
) -> None:
    """A keyed event lands where its key maps in the target (same count: same partition),
    a keyless one in the partition of the same id; each key's order, and each source
    partition's order of its keyless events, holds (keys sharing a partition interleave
    as their batches were sent, as with the replication sample)."""
    broker = broker_factory(eventhub_config(hubs("source-hub", "target-hub")))
    settings = {"EventHubs": broker.connection_string}
    app = pipeline_app("""\
pipelines:
  - name: eh-to-eh
    source: {connection: EventHubs, eventhub: source-hub}
    target: {connection: EventHubs, eventhub: target-hub}
""", settings)  # fmt: skip
    sent = []
    for i in range(10):
        for key in ("a", "b", "c"):
            event = EventData(f"{key}{i}")
            event.message_id = f"{key}-{i}"
            sent.append((key, None, event))
        for partition in ("0", "1", "2", "3"):
            event = EventData(f"p{partition}-{i}")
            event.message_id = f"p{partition}-{i}"
            sent.append((None, partition, event))
    await send_events(broker.connection_string, "source-hub", sent)
    await run_host(app, settings, tmp_path, events_done(len(sent)))
    source, target = await asyncio.gather(  # side by side: each read waits out a close
        read_hub(broker.connection_string, "source-hub", len(sent)),
        read_hub(broker.connection_string, "target-hub", len(sent)),
    )

    def placement(found: dict[str, list[EventData]]) -> dict[str, dict[str, list[str]]]:
        """Partition -> stream (key, or p<n> for keyless) -> its ids in partition order."""
        placed: dict[str, dict[str, list[str]]] = {}
        for partition, events in found.items():
            for e in events:
                name = str(text(e.message_id))
                placed.setdefault(partition, {}).setdefault(name.split("-")[0], []).append(name)
        return placed

    assert placement(target) == placement(source)  # same partitions, each stream in order
    assert sum(len(v) for v in target.values()) == len(sent)
    event = target["0"][0]
    props = {text(k): text(v) for k, v in event.properties.items()}
    assert props["repl-offset"] == source["0"][0].offset


async def test_an_active_active_pair_of_event_hubs_does_not_loop(
    broker_factory: Any, tmp_path: Path
) -> None:
    """Two namespaces, each hub merged into the other's: an event crosses once, its copy
    is dropped by the loop guard on the way back."""
    east = broker_factory(eventhub_config(hubs("mirror", groups=("replicate",))))
    west = broker_factory(eventhub_config(hubs("mirror", groups=("replicate",))))
    settings = {"East": east.connection_string, "West": west.connection_string}
    app = pipeline_app("""\
pipelines:
  - name: east-to-west
    source: {connection: East, eventhub: mirror, consumer_group: replicate}
    target: {connection: West, eventhub: mirror}
    loop_guard: true
  - name: west-to-east
    source: {connection: West, eventhub: mirror, consumer_group: replicate}
    target: {connection: East, eventhub: mirror}
    loop_guard: true
""", settings)  # fmt: skip
    sides = (("east", east.connection_string), ("west", west.connection_string))
    sends = []
    for side, connection in sides:
        events = []
        for i in range(5):
            event = EventData(f"{side} {i}")
            event.message_id = f"{side}-{i}"
            events.append((f"k{i}", None, event))
        sends.append(send_events(connection, "mirror", events))
    await asyncio.gather(*sends)  # the two namespaces side by side
    # each side reads its 5 own events and the other side's 5 copies (dropped)
    await run_host(app, settings, tmp_path, events_done(20))
    both = await asyncio.gather(*(read_hub(connection, "mirror", 10) for _, connection in sides))
    for found in both:
        ids = sorted(str(text(e.message_id)) for events in found.values() for e in events)
        assert ids == sorted([f"east-{i}" for i in range(5)] + [f"west-{i}" for i in range(5)])


async def test_a_topic_and_an_event_hub_mirror_each_other_without_a_loop(
    broker_factory: Any, tmp_path: Path
) -> None:
    """Active/active across services: a Service Bus topic in one namespace and an event hub
    in another, each merged into the other; every message crosses once (the loop guard reads
    ``repl-path`` whichever service wrote it)."""
    topics = {"mirror": {"Subscriptions": {"replicate": {}, "check": {}}}}
    east = broker_factory(make_config({}, topics=topics))
    west = broker_factory(eventhub_config(hubs("mirror-hub", groups=("replicate",))))
    settings = {"East": east.connection_string, "West": west.connection_string}
    app = pipeline_app("""\
pipelines:
  - name: east-to-west
    source: {connection: East, topic: mirror, subscription: replicate}
    target: {connection: West, eventhub: mirror-hub}
    loop_guard: true
  - name: west-to-east
    source: {connection: West, eventhub: mirror-hub, consumer_group: replicate}
    target: {connection: East, topic: mirror}
    loop_guard: true
""", settings)  # fmt: skip
    async with (
        ServiceBusClient.from_connection_string(east.connection_string) as client,
        client.get_topic_sender("mirror") as sender,
    ):
        await sender.send_messages([ServiceBusMessage(f"east {i}", message_id=f"east-{i}")
                                    for i in range(5)])  # fmt: skip
    events = []
    for i in range(5):
        event = EventData(f"west {i}")
        event.message_id = f"west-{i}"
        events.append((f"k{i}", None, event))
    await send_events(west.connection_string, "mirror-hub", events)

    def crossed(runners: list[Any]) -> bool:  # each side read its 5 and the other's 5 copies
        topic = [r for r in runners if isinstance(r, TriggerRunner)]
        return settled(10)(topic) and events_done(10)(runners)

    await run_host(app, settings, tmp_path, crossed)

    async def read_topic() -> list[str]:
        async with (
            ServiceBusClient.from_connection_string(east.connection_string) as client,
            client.get_subscription_receiver("mirror", "check", max_wait_time=3) as receiver,
        ):
            ids: list[str] = []
            while len(ids) < 10:  # one receive may return part of them (a starved machine)
                batch = await receiver.receive_messages(20, 3)
                if not batch:
                    break
                ids += [str(m.message_id) for m in batch]
            return sorted(ids)

    found, in_topic = await asyncio.gather(  # side by side: each read waits out a close
        read_hub(west.connection_string, "mirror-hub", 10), read_topic()
    )
    in_hub = sorted(str(text(e.message_id)) for evs in found.values() for e in evs)
    both = sorted([f"east-{i}" for i in range(5)] + [f"west-{i}" for i in range(5)])
    assert in_hub == both and in_topic == both
