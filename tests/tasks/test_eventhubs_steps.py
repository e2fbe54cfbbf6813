"""Editor steps and routers work on events as on messages: an event read with
``azure-eventhub`` goes through a pipeline's steps and routes into Service Bus and Event Hubs
targets, keeping what the steps did not change."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from azure.eventhub import EventData
from azure.eventhub._pyamqp._encode import encode_payload
from azure.eventhub._transport._pyamqp_transport import PyamqpTransport

from replication.adapters.eventhubs import from_event_data
from replication.messages import Message
from replication.pipeline import parse_pipelines

HUBS = "Endpoint=sb://hubs.example/;SharedAccessKeyName=k;SharedAccessKey=s"
BUS = "Endpoint=sb://bus.example/;SharedAccessKeyName=k;SharedAccessKey=s"
PIPELINE = """\
pipelines:
  - name: route-events
    source: {connection: Hubs, eventhub: telemetry}
    steps:
      - filter: {condition: "kind <> 'heartbeat'"}
      - transform: {drop: [secret]}
      - enrich: {properties: {origin: hubs}}
    routes:
      - when: "body.temperature > 30"
        target: {connection: Bus, queue: alerts}
    default: {connection: Hubs, eventhub: telemetry-archive}
"""


def received(body: dict[str, object], kind: str, key: str) -> Message:
    """An event as the SDK hands it to a consumer (encoded, then decoded, with the
    annotations a broker adds)."""
    event = EventData(json.dumps(body))
    event.message_id = f"{key}-{body['n']}"
    event.properties = {"kind": kind}
    raw = event.raw_amqp_message
    raw.annotations = {
        b"x-opt-partition-key": key, b"x-opt-offset": str(100 * int(str(body["n"]))),
        b"x-opt-sequence-number": int(str(body["n"])),
        b"x-opt-enqueued-time": datetime(2026, 11, 25, 7, 0, tzinfo=UTC),
    }  # fmt: skip
    outgoing = PyamqpTransport.to_outgoing_amqp_message(raw)
    payload = bytes(encode_payload(bytearray(), outgoing))
    return from_event_data(EventData.from_bytes(payload), partition_id="2")


def test_steps_and_routes_run_on_events() -> None:
    (pipeline,) = parse_pipelines(PIPELINE).pipelines
    built = pipeline.build({"Hubs": HUBS, "Bus": BUS})
    task = built.task
    hot = task.plan(received({"n": 1, "temperature": 35, "secret": "x"}, "reading", "dev-1"))
    cool = task.plan(received({"n": 2, "temperature": 20}, "reading", "dev-2"))
    beat = task.plan(received({"n": 3}, "heartbeat", "dev-1"))
    assert beat.outputs == []  # filtered
    (alert,) = hot.outputs
    assert alert.target == "route:0" and built.targets["route:0"].entity == "alerts"
    assert json.loads(alert.body) == {"n": 1, "temperature": 35}  # transformed
    assert alert.message_id == "dev-1-1" and alert.partition_key == "dev-1"
    props = alert.application_properties
    assert props["origin"] == "hubs" and props["kind"] == "reading"
    assert (props["repl-offset"], props["repl-sequence"]) == ("100", "1")
    assert props["repl-enqueue-time"] == "2026-11-25T07:00:00.0000000Z"
    (archived,) = cool.outputs
    assert archived.target == "default" and built.targets["default"].event_hub
    assert archived.partition_id == "2" and archived.partition_key == "dev-2"
