"""Event Hubs' ``azure.eventhub.EventData`` in and out, and the Functions host's
``azure.functions.EventHubEvent``.

An event is an AMQP message like a Service Bus message: the same properties section,
header and annotations (``x-opt-enqueued-time``, ``x-opt-sequence-number``,
``x-opt-partition-key``; plus ``x-opt-offset``). So ``from_event_data`` reads every field of
``fields.FIELDS`` from the SDK's ``raw_amqp_message`` where the table's AMQP column says, and
``to_event_data`` writes the ``sent`` ones there. The partition key is not written into the
event: the producer sends a batch with it (``tasks.eventhubs``), as the SDK wants.

``from_event_hub_event`` reads what the Functions Python worker hands an Event Hubs trigger
with ``cardinality=many``: the body, and per event the trigger metadata's
``SystemPropertiesArray`` (the AMQP properties by their AMQP names, the ``x-opt-*``
annotations, ``SequenceNumber``, ``Offset``, ``PartitionKey``, ``EnqueuedTimeUtc``) and
``PropertiesArray`` (application properties, as JSON: typed values arrive as JSON values).
``to_event_hub_events`` builds that list from received ``EventData`` as the Functions host
does (the local host needs it).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from ..messages import Message, PropertyValue
from .fields import FIELDS
from .sdk import body_bytes
from .values import binding_datum, properties_from_amqp, text, utc

if TYPE_CHECKING:
    import azure.functions as func
    from azure.eventhub import EventData

_HEADER_ATTRIBUTE = {"ttl": "time_to_live", "delivery_count": "delivery_count"}
"""Our ``Header`` field names -> ``AmqpMessageHeader``'s."""
_AMQP_NAMES = {
    "message_id": "message-id",
    "group_id": "group-id",
    "correlation_id": "correlation-id",
    "subject": "subject",
    "content_type": "content-type",
    "to": "to",
    "reply_to": "reply-to",
    "reply_to_group_id": "reply-to-group-id",
}
"""``Properties`` field names -> the AMQP names the Functions host's system properties use."""
_SENT = tuple(f for f in FIELDS if f.sent and f.amqp.section in ("properties", "header"))
_READ = tuple(f for f in FIELDS if f.amqp.section in ("properties", "header", "annotations"))


def from_event_data(event: EventData, partition_id: str | None = None) -> Message:
    """An event received with ``azure-eventhub`` (``partition_id``: the partition it was
    read from, which the event does not carry)."""
    raw = event.raw_amqp_message
    annotations = {text(k): v for k, v in (raw.annotations or {}).items()}
    values: dict[str, Any] = {}
    for f in _READ:
        section, key = f.amqp.section, f.amqp.key
        if section == "properties":
            value = getattr(raw.properties, key, None) if raw.properties else None
        elif section == "header":
            value = getattr(raw.header, _HEADER_ATTRIBUTE[key], None) if raw.header else None
        else:
            value = annotations.get(key)
        values[f.name] = _read(f.kind, value)
    if values.get("delivery_count") == 0:
        values["delivery_count"] = None
    return Message(
        body=_body(event),
        application_properties=properties_from_amqp(event.properties or {}),
        partition_id=partition_id,
        source=event,
        **values,
    )


def _read(kind: str, value: Any) -> Any:
    if value is None:
        return None
    if kind == "text":
        return text(value)
    if kind == "time":
        if isinstance(value, datetime):
            return utc(value)
        if isinstance(value, str):  # the Functions host's JSON
            return utc(datetime.fromisoformat(value))
        return datetime.fromtimestamp(int(value) / 1000.0, UTC) if value else None
    if kind == "duration":
        return timedelta(milliseconds=int(value)) if value else None
    if kind == "int":
        return int(value)
    return value


def _body(event: EventData) -> bytes:
    return body_bytes(event)  # type: ignore[arg-type]  # the same body shapes as the SB SDK


def to_event_data(message: Message) -> EventData:
    """The event to send with ``azure-eventhub``: the ``sent`` properties and header fields
    and the application properties (the partition key goes with the send, not here)."""
    from azure.eventhub import EventData

    event = EventData(message.body)
    raw = event.raw_amqp_message
    for f in _SENT:
        value = getattr(message, f.name)
        if value is None:
            continue
        if f.amqp.section == "header":
            if f.kind == "duration":
                value = int(value.total_seconds() * 1000)
            setattr(raw.header, _HEADER_ATTRIBUTE[f.amqp.key], value)
        else:
            setattr(raw.properties, f.amqp.key, value)
    if message.application_properties:
        event.properties = cast(dict[str | bytes, Any], dict(message.application_properties))
    return event


# ---------------------------------------------------------------------- Functions


def from_event_hub_event(event: func.EventHubEvent, index: int) -> Message:
    """Event ``index`` of a ``cardinality=many`` batch, as the Functions worker hands it
    (or a ``cardinality=one`` event, whose metadata is its own)."""
    metadata = event.metadata or {}
    system: dict[str, Any]
    props: dict[str, Any]
    if "SystemProperties" in metadata:
        system, props = _parsed(metadata["SystemProperties"]), _parsed(metadata.get("Properties"))
    else:
        systems = _listed(metadata.get("SystemPropertiesArray"))
        system = systems[index] if index < len(systems) else {}
        props_list = _listed(metadata.get("PropertiesArray"))
        props = props_list[index] if index < len(props_list) else {}
    values: dict[str, Any] = {}
    for f in _READ:
        section, key = f.amqp.section, f.amqp.key
        if section == "properties":
            values[f.name] = text(system.get(_AMQP_NAMES[key]))
        elif section == "annotations":
            values[f.name] = _read(f.kind, system.get(str(key)))
    partition = metadata.get("PartitionContext")
    partition_id = None
    if isinstance(partition, str):
        partition = json.loads(partition)
    if isinstance(partition, dict):
        partition_id = partition.get("PartitionId")
    values.update(
        enqueued_time=utc(event.enqueued_time) or values.get("enqueued_time"),
        sequence_number=event.sequence_number
        if event.sequence_number is not None
        else values.get("sequence_number"),
        offset=str(event.offset) if event.offset is not None else values.get("offset"),
        partition_key=event.partition_key or values.get("partition_key"),
    )
    return Message(
        body=event.get_body() or b"",
        application_properties=dict(props),
        partition_id=partition_id,
        source=event,
        **{k: v for k, v in values.items() if k in {f.name for f in _READ}},
    )


def _listed(value: Any) -> list[dict[str, Any]]:
    return list(_parsed(value) or [])


def _parsed(value: Any) -> Any:
    """A metadata value: JSON text as the host sends it, or what the worker parsed of it."""
    return json.loads(value) if isinstance(value, str) else (value or {})


def to_event_hub_events(
    events: list[EventData], partition_id: str, consumer_group: str, hub: str, *, many: bool = True
) -> list[func.EventHubEvent]:
    """What the Functions host hands an Event Hubs trigger for a batch of one partition:
    the bodies, and the trigger metadata (JSON, as the host serializes it). With
    ``cardinality=many`` (``many``) every event carries the batch's metadata, the system
    properties and application properties of each event in arrays; with ``one`` each carries
    its own: ``SystemProperties``, ``Properties``, ``PartitionKey``, ``Offset``,
    ``SequenceNumber``, ``EnqueuedTimeUtc`` (the Event Hubs extension's binding data)."""
    import azure.functions as func

    systems = []
    properties = []
    for event in events:
        message = from_event_data(event, partition_id)
        system: dict[str, Any] = {}
        raw = event.raw_amqp_message
        for key, name in _AMQP_NAMES.items():
            value = getattr(raw.properties, key, None) if raw.properties else None
            if value is not None:
                system[name] = text(value)
        system.update(
            {
                "x-opt-sequence-number": message.sequence_number,
                "x-opt-offset": message.offset,
                "x-opt-enqueued-time": _json_time(message.enqueued_time),
                "x-opt-partition-key": message.partition_key,
                "SequenceNumber": message.sequence_number,
                "Offset": message.offset,
                "PartitionKey": message.partition_key,
                "EnqueuedTimeUtc": _json_time(message.enqueued_time),
            }
        )
        systems.append(system)
        properties.append({k: _json_value(v) for k, v in message.application_properties.items()})
    context = binding_datum(
        {"ConsumerGroup": consumer_group, "EventHubName": hub, "PartitionId": partition_id}
    )
    batch = {
        "SystemPropertiesArray": binding_datum(systems),
        "PropertiesArray": binding_datum(properties),
        "PartitionContext": context,
    }
    out = []
    for event, system, props in zip(events, systems, properties, strict=True):
        metadata = batch if many else _single_metadata(system, props, context)
        out.append(
            func.EventHubEvent(
                body=_body(event),
                trigger_metadata=metadata,
                enqueued_time=_parse_time(system["EnqueuedTimeUtc"]),
                partition_key=system["PartitionKey"],
                sequence_number=system["SequenceNumber"],
                offset=system["Offset"],
            )
        )
    return out


def _single_metadata(system: dict[str, Any], props: dict[str, Any], context: Any) -> dict[str, Any]:
    """One event's trigger metadata for ``cardinality=one`` (what ``azure.functions`` takes
    for one: it tells the cardinalities apart by ``SystemProperties``)."""
    metadata = {
        "SystemProperties": binding_datum(system),
        "Properties": binding_datum(props),
        "PartitionContext": context,
    }
    for key in ("SequenceNumber", "Offset", "PartitionKey", "EnqueuedTimeUtc"):
        if system[key] is not None:
            metadata[key] = binding_datum(system[key])
    return metadata


def _json_time(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).isoformat()


def _parse_time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _json_value(value: PropertyValue) -> Any:
    """An application property as the host's JSON holds it (strings for what JSON lacks)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value.hex()
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)
