"""The ``$management`` reads of the Event Hubs SDKs: event hub and partition properties.

A request is a message to the namespace's ``$management`` node with application properties
``operation`` ``READ``, ``type`` ``com.microsoft:eventhub`` or ``com.microsoft:partition``,
``name`` (the event hub) and, for a partition, ``partition``; the answer carries
``status-code`` / ``status-description`` and an amqp-value map (keys as the service spells
them; the SDKs read exactly these).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...amqp.types import AMQPType, Array, timestamp
from .hub import EventHub

READ = "READ"
EVENTHUB_TYPE = "com.microsoft:eventhub"
PARTITION_TYPE = "com.microsoft:partition"


class ManagementError(Exception):
    """A request the node answers with an error status."""

    def __init__(self, status: int, description: str) -> None:
        super().__init__(description)
        self.status = status
        self.description = description


def is_event_hubs_request(props: Mapping[Any, Any]) -> bool:
    """Whether a ``$management`` request is one of ours (Service Bus ones name no ``type``)."""
    return str(props.get("type", "")) in (EVENTHUB_TYPE, PARTITION_TYPE)


def read(hubs: Mapping[str, EventHub], props: Mapping[Any, Any]) -> dict[str, Any]:
    """The body answering one request; raises ``ManagementError`` for a bad one."""
    operation = str(props.get("operation", ""))
    if operation != READ:
        raise ManagementError(400, f"the operation {operation!r} is not supported: only READ is")
    name = str(props.get("name", ""))
    hub = hubs.get(name.lower())
    if hub is None:
        raise ManagementError(404, f"The messaging entity '{name}' could not be found.")
    if str(props.get("type")) == EVENTHUB_TYPE:
        return {
            "name": hub.name,
            "type": EVENTHUB_TYPE,
            "created_at": timestamp(hub.created_ms),
            "partition_count": len(hub.partitions),
            "partition_ids": Array(AMQPType.STRING, list(hub.partition_ids)),
        }
    partition_id = str(props.get("partition", ""))
    partition = hub.partition(partition_id)
    if partition is None:
        raise ManagementError(
            404,
            f"The partition '{partition_id}' of event hub '{hub.name}' does not exist: it "
            f"has partitions {', '.join(hub.partition_ids)}.",
        )
    state = partition.state
    never_used = state.is_empty and state.last_sequence_number < 0
    return {
        "name": hub.name,
        "type": PARTITION_TYPE,
        "partition": partition_id,
        "begin_sequence_number": -1 if never_used else state.begin_sequence_number,
        "last_enqueued_sequence_number": state.last_sequence_number,
        "last_enqueued_offset": str(state.last_offset),
        "last_enqueued_time_utc": timestamp(state.last_enqueued_ms),
        "is_partition_empty": state.is_empty,
    }
