"""AMQP messages on the wire: a delivery's bytes to a ``Message``, a ``Message`` to the bytes
``azure-servicebus`` would send.

Decoding fills every field as ``sdk.from_received`` fills it from the SDK's
``ServiceBusReceivedMessage``, with the same values (tests/servicebus/test_client.py holds
the SDK up as the oracle). A delivery is read with ``amqp.scan``: the sections Service Bus
sends, only the annotations a ``Message`` keeps (not the lock token, ...), the body bytes as
they are; anything else (an amqp-value or amqp-sequence body, another encoding) goes through
the general decoder, which raises ``DecodeError`` for a malformed one. Which header field,
property, annotation or application property fills which ``Message`` field is
``fields.FIELDS``' ``amqp`` column, read once into the tuples below: this is the receive
path's hot loop (bench/replication.py).

Encoding writes what the SDK writes (docs/sdk-wire-notes.md section 3): a header only with a
time to live (``ttl`` in ms); message annotations ``x-opt-partition-key`` (only without a
session id, as ``to_sdk`` does) and ``x-opt-scheduled-enqueue-time`` (a timestamp);
properties (a new ``str(uuid4())`` message-id when the message has none, as the SDK's
constructor makes one); application properties with string keys (``property_value``); the
body as one data section.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from operator import attrgetter, itemgetter
from typing import Any

from ..amqp import codec, scan
from ..amqp.composite import encoder
from ..amqp.message import BodyType, Header, Properties, _enc_string_keyed_map, decode_message
from ..amqp.message import Message as AmqpMessage
from ..amqp.types import int32, timestamp
from ..messages import Message, PropertyValue
from .fields import FIELDS, Field, in_section, position
from .values import text

_CE_ZERO_MS = -62_135_596_800_000
"""What brokers write for "no time" (0001-01-01); the SDK makes it ``datetime.min``."""
_PLAIN = (str, int, float, bool, bytes, type(None))
_INT32 = range(-(2**31), 2**31)


def _time(ms: Any) -> datetime | None:
    if not ms or not isinstance(ms, int):
        return None
    moment = _times.get(ms)
    if moment is not None:  # a batch's messages were mostly enqueued, and locked, together
        return moment
    if ms == _CE_ZERO_MS:
        return datetime.min.replace(tzinfo=UTC)
    moment = datetime.fromtimestamp(ms / 1000.0, UTC)  # as the SDK does (float seconds)
    if len(_times) >= _TIMES_KEPT:
        _times.clear()
    _times[ms] = moment
    return moment


_times: dict[int, datetime] = {}
"""The times ``_time`` made lately, by ms (a datetime is immutable: sharing it is safe). By
value, not just the last one: a message's enqueued time and lock expiry take turns."""
_TIMES_KEPT = 256


def _duration(ms: Any) -> timedelta | None:
    return timedelta(milliseconds=ms) if ms else None


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


_READ: dict[str, Callable[[Any], Any]] = {
    "text": text,
    "time": _time,
    "duration": _duration,
    "int": _int,
}
_WRITE: dict[str, Callable[[Any], Any]] = {
    "text": lambda value: value,
    "time": timestamp.from_datetime,
    "duration": lambda value: int(value.total_seconds() * 1000),
}

# -- the table, read once: (Message field, where, converter)
_PROPERTIES = in_section("properties")
_PROPERTY_NAMES = tuple(f.name for f in _PROPERTIES)
_PROPERTY_AT = itemgetter(*(position("properties", f.amqp.key) for f in _PROPERTIES))
_PROPERTY_OF = attrgetter(*(f.amqp.key for f in _PROPERTIES))
_HEADER_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Header)}
_HEADER = tuple(
    (f.name, position("header", f.amqp.key), _HEADER_DEFAULTS[f.amqp.key], _READ[f.kind])
    for f in in_section("header")
)
"""(Message field, index in the header, the header's default, converter)."""
_ANNOTATIONS = tuple((f.name, f.amqp.key, _READ[f.kind]) for f in in_section("annotations"))
_WANTED_ANNOTATIONS = {key.encode(): key for _, key, _ in _ANNOTATIONS}
_APPLICATION = tuple((f.name, f.amqp.key) for f in in_section("application") if f.amqp.key)


def _sent(section: str) -> tuple[tuple[str, str, Callable[[Any], Any]], ...]:
    chosen: list[Field] = [f for f in FIELDS if f.sent and f.amqp.section == section]
    return tuple((f.name, f.amqp.key, _WRITE[f.kind]) for f in chosen)


_HEADER_SENT = _sent("header")
_ANNOTATIONS_SENT = _sent("annotations")
_PROPERTIES_SENT = tuple((f.name, f.amqp.key) for f in _PROPERTIES if f.sent)


# ---------------------------------------------------------------------- decoding


def decode_to_message(payload: bytes, source: Any = None) -> Message:
    """The ``Message`` of one delivery's bytes."""
    try:
        return _scanned(payload, source)
    except Exception:  # scan.Unusual, or a value the shortcut cannot hold: the general path says
        pass
    return to_message(decode_message(payload), source)


def decode_arrived(payload: bytes) -> Message | Exception:
    """Decodes as a delivery arrives (while the pump may be waiting on its target); a
    payload that cannot be decoded becomes its error, for the reader to deal with."""
    try:
        return decode_to_message(payload)
    except Exception as exc:  # e.g. DecodeError, or a timestamp no datetime can hold
        return exc


def to_message(amqp: AmqpMessage, source: Any = None) -> Message:
    """The ``Message`` of a message the general decoder built."""
    props = amqp.properties
    body = amqp.body
    if amqp.body_type is BodyType.DATA:
        body = body[0] if len(body) == 1 else b"".join(body)
    else:
        body = _other_body(body)
    header = amqp.header
    return _message(
        bytes(body),
        None if header is None else [getattr(header, name) for name in _HEADER_DEFAULTS],
        None if props is None else _PROPERTY_OF(props),
        amqp.message_annotations or {},
        amqp.application_properties,
        source,
    )


def _scanned(payload: bytes, source: Any) -> Message:
    found = scan.scan(payload)
    if not found.body_is_data:
        raise scan.Unusual("an amqp-value or amqp-sequence body")
    props = found.properties
    chunks = found.data
    return _message(
        chunks[0] if len(chunks) == 1 else b"".join(chunks),
        found.header,
        None if props is None else _PROPERTY_AT(props),
        (
            scan.pick(payload, found.annotations_at, _WANTED_ANNOTATIONS)
            if found.annotations_at >= 0
            else {}
        ),
        (
            scan.string_map(payload, found.application_properties_at)
            if found.application_properties_at >= 0
            else None
        ),
        source,
    )


def _written_out() -> Callable[..., Message]:
    """``_message``, written out from the table as ``dataclasses`` writes an ``__init__``:
    the receive path's hot function, with no loop or dict per message (a loop over the
    table cost 2.3 µs of 17 per message). For the table of today it reads::

        def _message(body, header, properties, annotations, app, source):
            if properties is not None:
                p0, p1, ... = map(text, properties)     # message_id, session_id, ...
            else:
                p0 = p1 = ... = None
            if header is not None:
                h0 = read_h0(d_h0 if (v := header[2]) is None else v)   # time_to_live
                ...
            if app:
                a0 = app.get('DeadLetterReason'); a0 = a0 if type(a0) is str else None
                ...
                props = _properties(app)
            get = annotations.get
            return Message(body=body, message_id=p0, ..., partition_key=read_n0(get(key_n0)),
                           ..., application_properties=props, source=source)

    ``header`` is the header's fields in order, ``properties`` the table's properties in
    table order (``_PROPERTY_AT`` / ``_PROPERTY_OF``)."""
    scope: dict[str, Any] = {"Message": Message, "text": text, "_properties": _properties}
    code = ["def _message(body, header, properties, annotations, app, source):"]
    keywords = ["body=body"]
    names = [f"p{i}" for i in range(len(_PROPERTY_NAMES))]
    code += [
        "    if properties is not None:",
        f"        {', '.join(names)}, = map(text, properties)",
        "    else:",
        f"        {' = '.join(names)} = None",
    ]
    keywords += [f"{field}={name}" for field, name in zip(_PROPERTY_NAMES, names, strict=True)]
    code.append("    if header is not None:")
    for i, (field, at, default, read) in enumerate(_HEADER):
        scope[f"read_h{i}"], scope[f"d_h{i}"] = read, default
        code.append(f"        h{i} = read_h{i}(d_h{i} if (v := header[{at}]) is None else v)")
        keywords.append(f"{field}=h{i}")
    code += ["    else:", f"        {' = '.join(f'h{i}' for i in range(len(_HEADER)))} = None"]
    code.append("    if app:")
    for i, (field, key) in enumerate(_APPLICATION):
        code.append(f"        a{i} = app.get({key!r}); a{i} = a{i} if type(a{i}) is str else None")
        keywords.append(f"{field}=a{i}")
    code += ["        props = _properties(app)", "    else:"]
    facts = [f"a{i}" for i in range(len(_APPLICATION))]
    code += [f"        {' = '.join(facts)} = None" if facts else "        pass"]
    code += ["        props = {}", "    get = annotations.get"]
    for i, (field, key, read) in enumerate(_ANNOTATIONS):
        scope[f"read_n{i}"], scope[f"key_n{i}"] = read, key
        keywords.append(f"{field}=read_n{i}(get(key_n{i}))")
    keywords += ["application_properties=props", "source=source"]
    code.append(f"    return Message({', '.join(keywords)})")
    exec("\n".join(code), scope)  # our own text, made from the table above
    made: Callable[..., Message] = scope["_message"]
    return made


def _properties(app: dict[Any, Any]) -> dict[str, PropertyValue]:
    out: dict[str, PropertyValue] = {}
    for key, value in app.items():
        kind = type(value)
        if kind is bytes:
            with contextlib.suppress(UnicodeDecodeError):  # as sdk.from_received does
                value = value.decode("utf-8")
        elif kind not in _PLAIN:  # our codec's marker types: the plain values the SDK gives
            if isinstance(value, str):
                value = str(value)
            elif isinstance(value, bool):
                value = bool(value)
            elif isinstance(value, int):
                value = int(value)
            elif isinstance(value, float):
                value = float(value)
        out[key if type(key) is str else str(key)] = value
    return out


def _other_body(body: Any) -> bytes:
    """amqp-value / amqp-sequence bodies, as ``sdk.body_bytes`` makes them."""
    if isinstance(body, bytes | bytearray):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    try:
        return b"".join(
            _other_body(part) if isinstance(part, str) else bytes(part) for part in body
        )
    except TypeError:
        return str(body).encode("utf-8")


_message = _written_out()
"""The one place the AMQP values become a ``Message`` (``_written_out`` says how)."""


# ---------------------------------------------------------------------- encoding


_write_header, _write_properties = encoder(Header), encoder(Properties)


def encode(message: Message, *, event_hub: bool = False) -> bytes:
    """The bytes of ``message`` as a sender puts them on the wire (see the module);
    ``event_hub``: as an event, whose partition key goes with a session id (group-id) too."""
    out = bytearray()
    header = {
        key: write(value)
        for name, key, write in _HEADER_SENT
        if (value := getattr(message, name)) is not None
    }
    if header:
        _write_header(out, Header(**header))
    annotations = _annotations(message, event_hub)
    if annotations:
        out += b"\x00\x53\x72"
        codec.encode_symbol_keyed_map(out, annotations)
    properties = {key: getattr(message, name) for name, key in _PROPERTIES_SENT}
    if properties["message_id"] is None:
        properties["message_id"] = str(uuid.uuid4())
    _write_properties(out, Properties(**properties))
    if message.application_properties:
        out += b"\x00\x53\x74"
        _enc_string_keyed_map(
            out,
            {key: property_value(value) for key, value in message.application_properties.items()},
        )
    out += b"\x00\x53\x75"
    codec._enc_binary(out, message.body)
    return bytes(out)


def _annotations(message: Message, event_hub: bool = False) -> dict[Any, Any]:
    annotations: dict[Any, Any] = {}
    for name, key, write in _ANNOTATIONS_SENT:
        value = getattr(message, name)
        if value is None or (
            name == "partition_key" and message.session_id is not None and not event_hub
        ):
            continue  # Service Bus wants a session's partition key to be its session id
        annotations[key] = write(value)
    return annotations


def property_value(value: Any) -> Any:
    """An application property value as the SDK encodes it: ints as AMQP int when they fit
    32 bits (its ``encode_int``), else long; bytes as strings when they are UTF-8 (the SDK
    decodes them, for parity with uamqp; it fails on other bytes, which go as binary here)."""
    if type(value) is int and value in _INT32:
        return int32(value)
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(value)
    if isinstance(value, datetime):
        return timestamp.from_datetime(value)
    return value
