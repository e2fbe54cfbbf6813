"""The binding data the Functions host gives a Service Bus trigger, made by the local host.

For the SDK-type bindings (``azurefunctions-extensions-bindings-servicebus``) the host sends
each message as *model binding data*: source ``AzureServiceBusReceivedMessage``, content
type ``application/octet-stream``, and content = the 16 bytes of the lock token (.NET GUID
byte order) followed by the AMQP message. A batch (``cardinality=many``) is a collection of
them. The worker hands that to the extension's ``ServiceBusConverter``, which finds the
first ``x-opt-lock-token`` in the content, takes the lock token from the 16 bytes before
and decodes the AMQP message from the bytes *after* that symbol (with uamqp). So the
message bytes here start with a delivery-annotations section holding only the lock token,
and the message as it was received follows: header, annotations (enqueued time, sequence
number, locked-until), properties, application properties, body, without the delivery
annotations it came with (Service Bus sends the lock token there too). (With the sections
in wire order, header first, the converter would skip the header.)

The settlement argument (``ServiceBusMessageActions``) is the extension's own client: it
reads ``--host``, ``--port`` and ``--functions-grpc-max-message-length`` from the worker's
command line, the address of the host's gRPC server, and calls the ``Settlement`` service
there. The worker process (``language_worker.py``) gets them on its command line from the
host; a worker thread of the host's process (``worker.py``) has ``sys.argv`` carry them
while the client is made.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import azurefunctions.extensions.bindings.servicebus  # noqa: F401  (registers its converters)
from azurefunctions.extensions.base import Datum, get_binding_registry

from ..amqp import scan
from ..amqp.codec import decode_at, encode, skip_at
from ..amqp.errors import DecodeError
from ..amqp.message import Header, decode_message, encode_message
from ..amqp.message import Message as AmqpMessage
from ..amqp.types import char, decimal32, decimal64, decimal128
from ..symbols import LOCK_TOKEN

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusReceivedMessage
    from azurefunctions.extensions.bindings.servicebus import ServiceBusMessageActions

SOURCE = "AzureServiceBusReceivedMessage"
CONTENT_TYPE = "application/octet-stream"
VERSION = "1.0"
TRIGGER_BINDING = "serviceBusTrigger"
CLIENT_BINDING = "serviceBusClient"


@dataclass(slots=True, frozen=True)
class ModelBindingData:
    """The worker protocol's ``ModelBindingData`` (the fields the converter reads)."""

    content: bytes
    version: str = VERSION
    source: str = SOURCE
    content_type: str = CONTENT_TYPE


@dataclass(slots=True, frozen=True)
class CollectionModelBindingData:
    model_binding_data: list[ModelBindingData]


def _annotations_head() -> bytes:
    """The delivery-annotations section holding a lock token, but the token's 16 bytes (it
    ends the encoding, so a message's section is this and its token: no encoding each)."""
    blank = uuid.UUID(int=0)
    encoded = encode_message(AmqpMessage(body=[], delivery_annotations={LOCK_TOKEN: blank}))
    assert encoded.endswith(blank.bytes), encoded.hex()
    return encoded[: -len(blank.bytes)]


ANNOTATIONS_HEAD = _annotations_head()
_HEADER = bytes((0x00, 0x53, scan.HEADER))  # described by a smallulong: 00 53 code
_DELIVERY_ANNOTATIONS = bytes((0x00, 0x53, scan.DELIVERY_ANNOTATIONS))


def binding_content(payload: bytes, lock_token: uuid.UUID) -> bytes:
    """The content for one received message (``payload``: its transfer bytes). The delivery
    annotations Service Bus sends (the lock token again) give way to the head: one section
    of them, as in the content Azure's host writes, and none for uamqp to convert twice.
    The header counts this delivery, as Azure's host writes it (``functions_header``)."""
    header_end = skip_at(payload, len(_HEADER)) if payload.startswith(_HEADER) else 0
    rest = header_end
    if payload.startswith(_DELIVERY_ANNOTATIONS, header_end):
        rest = skip_at(payload, header_end + len(_DELIVERY_ANNOTATIONS))
    header = functions_header(payload[:header_end]) if header_end else b""
    return b"".join(
        (lock_token.bytes_le, ANNOTATIONS_HEAD, lock_token.bytes, header, payload[rest:])
    )


def functions_header(section: bytes) -> bytes:
    """A received message's header section as the Functions host hands it on: the .NET SDK
    counts the delivery being made (``DeliveryCount`` is the AMQP delivery-count plus one:
    1 the first time, where the AMQP header and the Python SDK say 0), and the extension
    writes the message from that (``GetRawAmqpMessage().ToBytes()``)."""
    header, _ = decode_at(section, 0)
    assert isinstance(header, Header), header
    header.delivery_count = (header.delivery_count or 0) + 1
    return encode(header)


def functions_received(message: ServiceBusReceivedMessage) -> ServiceBusReceivedMessage:
    """A detached copy of the SDK's message (``backend: sdk``) as the Functions host hands
    it on: its delivery counted as ``functions_header`` counts it; the SDK's own message,
    which settles it, is left as it is."""
    copied = copy.copy(message)
    raw = copy.copy(message.raw_amqp_message)
    if raw.header is not None:
        raw.header = copy.copy(raw.header)
        raw.header.delivery_count = (raw.header.delivery_count or 0) + 1
    copied._raw_amqp_message = raw  # the SDK has no setter: its copy, not its message
    return copied


_UAMQP_CANNOT: Final = (decimal32, decimal64, decimal128, char)
"""AMQP types uamqp, which the extension decodes with, cannot decode ("Cannot decode bytes");
.NET's SDK writes ``decimal`` and ``char`` properties as decimal128 and char."""
DECODE_FAILED: Final = "Failed to decode ServiceBus content"
"""What the extension's converter says of a message it could not decode, alone or inside its
error for the batch (the worker process sends it after "ValueError: ")."""


def undecodable(payload: bytes) -> str | None:
    """Why the extension cannot decode this delivery (its error names no message and no
    value), or None: the first value of a type uamqp cannot decode, and where it is."""
    try:
        message = decode_message(payload)
    except DecodeError as exc:
        return f"it is no valid AMQP message ({exc})"
    properties = message.application_properties or {}
    annotations = message.message_annotations or {}
    places = [(f"application property {key!r}", value) for key, value in properties.items()]
    places += [(f"message annotation {key!r}", value) for key, value in annotations.items()]
    places.append(("the body", message.body))
    for where, value in places:
        found = _first_undecodable(value)
        if found is not None:
            return f"{where} holds an AMQP {found}, which uamqp cannot decode"
    return None


def _first_undecodable(value: Any) -> str | None:
    """The name of the first type uamqp cannot decode in ``value`` (lists and maps too)."""
    if isinstance(value, _UAMQP_CANNOT):
        return type(value).__name__
    if isinstance(value, dict):
        value = [part for pair in value.items() for part in pair]
    if isinstance(value, list):
        for item in value:
            found = _first_undecodable(item)
            if found is not None:
                return found
    return None


def binding_datum(contents: list[bytes], many: bool) -> Datum:
    """What the worker decodes for the trigger parameter."""
    items = [ModelBindingData(content) for content in contents]
    if many:
        return Datum(CollectionModelBindingData(items), "collection_model_binding_data")
    return Datum(items[0], "model_binding_data")


def is_sdk_type(annotation: Any) -> bool:
    """True when the parameter takes the SDK types (``ServiceBusReceivedMessage`` or a list
    of them), as the worker decides it with the extension's registry."""
    return bool(get_binding_registry().check_supported_type(annotation))


def is_settlement_client(annotation: Any) -> bool:
    return bool(get_binding_registry().check_supported_grpc_client_type(annotation))


def decode(contents: list[bytes], many: bool, annotation: Any) -> Any:
    """The trigger argument, decoded by the extension's converter (the SDK's
    ``ServiceBusReceivedMessage``, or a list of them)."""
    converter = get_binding_registry().get(TRIGGER_BINDING)
    return converter.decode(binding_datum(contents, many), trigger_metadata={}, pytype=annotation)


def settlement_client(worker_arguments: list[str]) -> ServiceBusMessageActions:
    """The extension's ``ServiceBusMessageActions``, pointed at our settlement service."""
    with _command_line(worker_arguments):
        return get_binding_registry().get(CLIENT_BINDING).get_client()


@contextlib.contextmanager
def _command_line(arguments: list[str]) -> Iterator[None]:
    before = list(sys.argv)
    sys.argv[:] = [*before[:1], *arguments]
    try:
        yield
    finally:
        sys.argv[:] = before
