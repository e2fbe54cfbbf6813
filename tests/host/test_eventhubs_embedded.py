"""The local host's embedded brokers get the event hubs a pipeline file names, beside its
queues and topics, in the Event Hubs emulator's schema."""

from __future__ import annotations

from replication.broker.config import parse_config
from replication.host.embedded import EVENT_HUB_PARTITIONS, plan_brokers
from replication.pipeline import parse_pipelines

LOCAL = (
    "Endpoint=sb://localhost:{};SharedAccessKeyName=RootManageSharedAccessKey;"
    "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
)


def test_event_hubs_and_their_consumer_groups_are_planned() -> None:
    settings = {"Bus": LOCAL.format(5701), "Hubs": LOCAL.format(5701), "Far": LOCAL.format(5702)}
    pipelines = parse_pipelines("""\
pipelines:
  - name: in
    source: {connection: Hubs, eventhub: telemetry, consumer_group: replication,
             session_id_from: partition_key}
    target: {connection: Bus, queue: telemetry-sessions}
  - name: out
    source: {connection: Bus, queue: orders}
    target: {connection: Far, eventhub: orders-stream}
""")  # fmt: skip
    plan = plan_brokers(pipelines.pipelines, settings)
    near = parse_config(plan[5701].config())
    (hub,) = near.event_hubs
    assert (hub.name, hub.partition_count, hub.consumer_groups) == (
        "telemetry", EVENT_HUB_PARTITIONS, ("replication",),
    )  # fmt: skip
    queue = near.queue("telemetry-sessions")
    assert queue is not None and queue.properties.requires_session  # keys become sessions
    far = parse_config(plan[5702].config())
    assert [h.name for h in far.event_hubs] == ["orders-stream"]
    assert far.namespace.queues == []
