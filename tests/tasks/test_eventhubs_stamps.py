"""Stamps across services: an event hub hop adds ``repl-offset`` beside ``repl-enqueue-time``
and ``repl-sequence``, and the three lists keep one entry per hop whatever the services."""

from __future__ import annotations

from datetime import UTC, datetime

from replication.messages import Message
from replication.tasks.stamping import ENQUEUE_TIME, OFFSET, SEQUENCE, stamp
from replication.tasks.task import PATH, ReplicationTask

AT = datetime(2026, 11, 25, 7, 0, 0, tzinfo=UTC)


def event(offset: str, sequence: int, **fields: object) -> Message:
    return Message(b"e", enqueued_time=AT, sequence_number=sequence, offset=offset, **fields)  # type: ignore[arg-type]


def test_an_event_gets_its_offset_stamped() -> None:
    stamped = stamp(event("4096", 7))
    assert stamped.application_properties == {
        ENQUEUE_TIME: "2026-11-25T07:00:00.0000000Z", SEQUENCE: "7", OFFSET: "4096",
    }  # fmt: skip


def test_a_service_bus_hop_has_no_offset_until_an_event_hub_hop() -> None:
    message = Message(b"m", enqueued_time=AT, sequence_number=1)
    first = stamp(message)
    assert OFFSET not in first.application_properties  # Service Bus only: as before
    second = stamp(first.copy(offset="128", sequence_number=5))
    third = stamp(second.copy(offset=None, sequence_number=9))
    props = third.application_properties
    assert str(props[SEQUENCE]).split(";") == ["1", "5", "9"]
    assert str(props[OFFSET]).split(";") == ["", "128", ""]  # one entry per hop
    assert len(str(props[ENQUEUE_TIME]).split(";")) == 3


def test_session_id_from_partition_key_comes_before_the_steps() -> None:
    task = ReplicationTask("t", source_namespace="hubs.example", session_id_from_key=True)
    (out,) = task.plan(event("0", 0, partition_key="customer-1")).outputs
    assert out.session_id == "customer-1"
    assert out.application_properties[PATH] == "hubs.example"
    (kept,) = task.plan(event("0", 0, partition_key="k", session_id="s")).outputs
    assert kept.session_id == "s"  # an event's own session id stays


def test_the_loop_guard_works_across_services() -> None:
    """An event that came through the Service Bus namespace is not sent back there."""
    task = ReplicationTask(
        "t", source_namespace="hubs.example", target_namespaces={None: "sb.example"},
        loop_guard=True,
    )  # fmt: skip
    came_back = event("0", 0, application_properties={PATH: "sb.example"})
    assert task.plan(came_back).outputs == []
    assert len(task.plan(event("0", 0)).outputs) == 1
