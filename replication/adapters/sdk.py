"""``azure.servicebus`` messages: ``ServiceBusReceivedMessage`` in, ``ServiceBusMessage`` out.

Every field of ``fields.FIELDS`` with an ``sdk`` attribute is read from a received message;
the ``sent`` ones are the keywords of the message to send (source facts such as the
sequence number are the target's to assign). Application property keys are ``str``; string
values the SDK hands back as ``bytes`` become ``str`` (the SDK sends ``bytes`` values as
strings on the wire, so this is the value that was sent).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ..messages import Message
from .fields import FIELDS
from .values import properties_from_amqp, text, utc

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage

_CONVERTED = ("text", "duration", "time", "int")
_IN_PROPERTIES = tuple(
    (f.name, f.amqp.key)
    for f in FIELDS
    if f.sdk and f.kind == "text" and f.amqp.section == "properties"
)
"""The text fields of the properties section, read from the SDK's raw properties: each of
the SDK's eight getters for them first tests the properties' truth, which lists their
attributes (over half of reading a message: 27 -> 11 us), then decodes UTF-8 bytes as
``text`` does."""
_READ = tuple(
    (f.name, f.sdk, f.kind)
    for f in FIELDS
    if f.sdk and f.kind in _CONVERTED and (f.name, f.amqp.key) not in _IN_PROPERTIES
)
_SENT = tuple((f.name, f.sdk) for f in FIELDS if f.sdk and f.sent and f.kind in _CONVERTED)


def from_received(message: ServiceBusReceivedMessage) -> Message:
    """A message received with ``azure-servicebus``."""
    values: dict[str, Any] = {}
    properties = message.raw_amqp_message.properties
    for name, key in _IN_PROPERTIES:
        values[name] = None if properties is None else text(getattr(properties, key))
    for name, attribute, kind in _READ:
        if kind == "time":
            values[name] = _time(message, attribute)
        elif kind == "text":
            values[name] = text(getattr(message, attribute))
        else:
            values[name] = getattr(message, attribute)
    return Message(
        body=body_bytes(message),
        application_properties=properties_from_amqp(message.application_properties or {}),
        source=message,
        **values,
    )


def _time(message: ServiceBusReceivedMessage, attribute: str) -> Any:
    try:
        return utc(getattr(message, attribute))
    except (AttributeError, TypeError, ValueError):  # received and delete: no lock, ...
        return None


def to_sdk(message: Message) -> ServiceBusMessage:
    """The message to send with ``azure-servicebus``: the ``sent`` fields of the table. A
    partition key goes only without a session id (Service Bus requires them equal)."""
    from azure.servicebus import ServiceBusMessage

    values = {attribute: getattr(message, name) for name, attribute in _SENT}
    if message.session_id is not None:
        values["partition_key"] = None
    # the SDK's hint omits types its encoder takes (datetime, timedelta, None)
    values["application_properties"] = cast(Any, dict(message.application_properties) or None)
    return ServiceBusMessage(message.body, **values)


def body_bytes(message: ServiceBusReceivedMessage) -> bytes:
    """The body as bytes: data sections joined; an amqp-value string as UTF-8."""
    body = message.body
    if isinstance(body, bytes | bytearray):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    try:
        return b"".join(bytes(part) for part in body)
    except TypeError:
        return str(body).encode("utf-8")
