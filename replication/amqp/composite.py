"""Composite types (spec 1.4): described lists whose fields have declared AMQP types.

A composite is a slotted dataclass whose fields carry their AMQP type in metadata:

    @composite(0x10, "amqp:open:list")
    @dataclass(slots=True)
    class Open:
        container_id: str = amqp_field("string", mandatory=True)

``composite`` reads the fields once per class and registers with the codec an encoder (typed
by the field, trailing nulls trimmed, the 8-bit list form when it fits) and a decoder that
maps null to the field's default and rejects a missing mandatory field or a value of the
wrong type; ``encoder(cls)`` and ``decoder(cls)`` hand them, typed, to code that knows the
class. Both are one loop over the fields, compiled with the rest of the hot path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Final, Protocol, TypeVar

from . import codec, types
from .errors import DecodeError, EncodeError
from .types import Array, symbol

T = TypeVar("T")


def amqp_field(
    amqp_type: str,
    *,
    mandatory: bool = False,
    default: Any = None,
    multiple: bool = False,
    requires: type | None = None,
) -> Any:
    """Declares a composite field: its AMQP type name (see ``codec.FIELD_ENCODERS``).

    ``requires`` restricts a ``*`` field to one composite type (e.g. ``error`` fields).
    """
    if multiple:
        amqp_type = amqp_type + "[]"
    return dataclasses.field(
        default=default,
        metadata={"amqp": amqp_type, "mandatory": mandatory, "requires": requires},
    )


def _dashed(name: str) -> str:
    return name.replace("_", "-")


# what a field's decoded value is checked against (``_bad``)
_ANY: Final = 0
_BOOLEAN: Final = 1
_INTEGER: Final = 2
_BINARY: Final = 3
_TEXT: Final = 4
_MAP: Final = 5
_LIST: Final = 6
_SYMBOLS: Final = 7
_REQUIRED: Final = 8
_KINDS = {
    "boolean": _BOOLEAN,
    "ubyte": _INTEGER,
    "ushort": _INTEGER,
    "uint": _INTEGER,
    "ulong": _INTEGER,
    "int": _INTEGER,
    "long": _INTEGER,
    "timestamp": _INTEGER,
    "binary": _BINARY,
    "string": _TEXT,
    "symbol": _TEXT,
    "fields": _MAP,
    "map": _MAP,
    "list": _LIST,
    "symbol[]": _SYMBOLS,
}
"""Per AMQP field type, the test that rejects a decoded value of the wrong type (a peer's bug
must become a decode error here, not a crash when the value is used or re-encoded)."""

_RANGES: dict[str, tuple[int, int]] = {
    "ubyte": (0, 0xFF),
    "ushort": (0, 0xFFFF),
    "uint": (0, 0xFFFFFFFF),
    "ulong": (0, 2**64 - 1),
    "int": (-(2**31), 2**31 - 1),
    "long": (-(2**63), 2**63 - 1),
    "timestamp": (-(2**63), 2**63 - 1),
}
"""Any integer encoding is taken, as long as the value fits the field's type (a peer's uint
in a ubyte field is harmless; 38,797,312 there would break our re-encoding)."""

_INTEGER_CLASSES: dict[str, type] = {
    "ubyte": types.ubyte,
    "ushort": types.ushort,
    "uint": types.uint,
    "ulong": types.ulong,
    "int": types.int32,
    "long": int,
    "timestamp": types.timestamp,
}
"""The Python class the codec decodes each integer type to."""


class _Field:
    """One field of a composite, as its encoder and decoder read it."""

    def __init__(self, cls_label: str, index: int, field: dataclasses.Field[Any]) -> None:
        amqp_type: str = field.metadata["amqp"]
        self.name = field.name
        self.index = index
        self.label = f"{cls_label}.{_dashed(field.name)}"
        self.write: codec.Encoder = codec.FIELD_ENCODERS[amqp_type]
        self.mandatory: bool = field.metadata["mandatory"]
        self.default: Any = field.default
        self.multiple = amqp_type.endswith("[]")
        required = field.metadata.get("requires")
        self.required: type = required if required is not None else object
        self.kind = _REQUIRED if required is not None else _KINDS.get(amqp_type, _ANY)
        self.expected: str = required.DESCRIPTOR_NAME if required is not None else amqp_type
        self.low, self.high = _RANGES.get(amqp_type, (0, 0))
        self.integer_class: type | None = _INTEGER_CLASSES.get(amqp_type)
        # a peer's string in a symbol field reads as a symbol, and a symbol in a string
        # field as a string: what we decode re-encodes to the same value
        self.to_symbol = amqp_type == "symbol"
        self.to_string = amqp_type == "string"


class _Composite:
    """A composite class's descriptor and fields: what ``_encode`` and ``_decode`` walk.

    One compiled loop for every composite (it used to be Python source generated per class
    and ``exec``-ed, which mypyc never compiled: a tenth of the broker's time per message,
    issue 42)."""

    def __init__(self, cls: type, code: int, label: str, trim: bool) -> None:
        self.cls = cls
        self.header = bytes((0x00, 0x53, code))
        self.label = label
        self.trim = trim
        self.fields = [_Field(label, i, f) for i, f in enumerate(dataclasses.fields(cls))]


def _bad(field: _Field, value: Any) -> bool:
    """``value`` (not None) is not of the field's AMQP type."""
    kind = field.kind
    if kind == _ANY:
        return False
    if kind == _INTEGER:
        return (
            type(value) is bool
            or not isinstance(value, int)
            or not field.low <= value <= field.high
        )
    if kind == _TEXT:
        return not isinstance(value, str)
    if kind == _BOOLEAN:
        return type(value) is not bool
    if kind == _BINARY:
        return not isinstance(value, bytes)
    if kind == _MAP:
        return not isinstance(value, dict)
    if kind == _LIST:
        return not isinstance(value, list)
    if kind == _SYMBOLS:
        return not isinstance(value, str | Array)
    return not isinstance(value, field.required)


def _decode(spec: _Composite, value: Any) -> Any:
    """The composite ``spec`` describes, from its decoded list: null fields get their
    defaults, a missing mandatory field or a value of the wrong type is a ``DecodeError``."""
    if not isinstance(value, list):
        raise DecodeError(f"{spec.label} must be a list, got {type(value).__name__}")
    items: list[Any] = value
    count = len(items)
    cls = spec.cls
    made: Any = object.__new__(cls)  # the fields are all set below, checked
    for field in spec.fields:
        item = items[field.index] if field.index < count else None
        if item is not None:
            if _bad(field, item):
                raise DecodeError(
                    f"{field.label} must be {field.expected}, got {type(item).__name__}"
                )
            if field.to_symbol:
                if type(item) is str:
                    item = symbol(item)
            elif field.to_string:
                if type(item) is symbol:
                    item = str(item)
            else:
                integer_class = field.integer_class
                if integer_class is not None and type(item) is not integer_class:
                    item = integer_class(item)
        elif field.mandatory:
            raise DecodeError(f"{field.label} is mandatory")
        else:
            item = field.default
        if field.multiple:
            item = _as_tuple(item)
        setattr(made, field.name, item)
    return made


def _encode(spec: _Composite, out: bytearray, value: Any, values: tuple[Any, ...] | None) -> None:
    """Writes the composite: descriptor, then its fields as a list (trailing nulls trimmed
    unless ``spec.trim`` is off); the fields are ``value``'s, or ``values`` (in their order)
    when given. A run of null fields is written once a field after it is not null (most
    fields of most performatives and properties are null: a byte appended per null, then
    cut, cost a sixth of writing them)."""
    out += spec.header
    body = bytearray()
    count = nulls = 0
    for field in spec.fields:
        item = getattr(value, field.name) if values is None else values[field.index]
        if item is None:
            if field.mandatory:
                raise EncodeError(f"{field.label} is mandatory")
            nulls += 1
        else:
            if nulls:
                body += _NULLS[nulls]
                nulls = 0
            field.write(body, item)
            count = field.index + 1
    if not spec.trim and nulls:
        body += _NULLS[nulls]
        count = len(spec.fields)
    _write_list(out, body, count)


_NULLS: Final = tuple(b"\x40" * n for n in range(64))
"""A run of n nulls, by n (no composite has 64 fields)."""


def composite(code: int, name: str, *, trim: bool = True) -> Callable[[type[T]], type[T]]:
    """Class decorator: makes a dataclass an AMQP composite with descriptor ``code``/``name``.

    ``trim=False`` writes trailing null fields instead of dropping them (spec 1.4 allows
    both) for peers that index the list by position.
    """

    def decorate(cls: type[T]) -> type[T]:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"@composite makes a dataclass a composite; {cls.__name__} is not one")
        spec = _Composite(cls, code, name.split(":")[1] if ":" in name else name, trim)

        def encode(out: bytearray, value: Any) -> None:
            _encode(spec, out, value, None)

        def encode_fields(out: bytearray, values: tuple[Any, ...]) -> None:
            _encode(spec, out, None, values)

        def decode(value: Any) -> Any:
            return _decode(spec, value)

        _install(cls, code, name, encode, decode)
        _FIELDS_ENCODERS[cls] = encode_fields
        return cls

    return decorate


def _write_list(out: bytearray, body: bytearray, count: int) -> None:
    if count == 0:
        out.append(0x45)
    else:
        codec.write_compound(out, body, count, 0xC0)


def _as_tuple(value: Any) -> tuple[Any, ...] | None:
    """Normalises a ``multiple`` field (single value or array) to a tuple."""
    if value is None or type(value) is tuple:
        return value
    if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
        return (value,)
    return tuple(value)


class Wrapper(Protocol):
    """A restricted type that describes one non-list value (a message section)."""

    value: Any

    def __init__(self, value: Any) -> None: ...


W = TypeVar("W", bound=Wrapper)


def described_wrapper(
    code: int, name: str, write_value: codec.Encoder, check: Callable[[Any], bool] | None = None
) -> Callable[[type[W]], type[W]]:
    """Class decorator for restricted types that describe a non-list value (sections)."""

    header = bytes((0x00, 0x53, code))

    def decorate(cls: type[W]) -> type[W]:
        def _amqp_encode(out: bytearray, self: W) -> None:
            out += header
            write_value(out, self.value)

        def _from_value(value: Any) -> W:
            if check is not None and not check(value):
                raise DecodeError(f"{name} holds the wrong type: {type(value).__name__}")
            return cls(value)

        _install(cls, code, name, _amqp_encode, _from_value)
        return cls

    return decorate


_ENCODERS: dict[type, codec.Encoder] = {}
_FIELDS_ENCODERS: dict[type, Callable[[bytearray, tuple[Any, ...]], None]] = {}
_DECODERS: dict[type, Callable[[Any], Any]] = {}


def encoder(cls: type[T]) -> Callable[[bytearray, T], None]:
    """What writes a value of the composite (or wrapper) class ``cls``, descriptor first:
    for a caller that knows the class and so skips the codec's lookup by type."""
    return _ENCODERS[cls]


def fields_encoder(cls: type) -> Callable[[bytearray, tuple[Any, ...]], None]:
    """What writes a composite of class ``cls`` from its fields' values, in their order: the
    bytes ``encoder(cls)`` writes for an object holding them, for a caller that has the
    values and need not build the object (a message's properties, per message sent)."""
    return _FIELDS_ENCODERS[cls]


def decoder(cls: type[T]) -> Callable[[Any], T]:
    """What makes a ``cls`` of the value its descriptor described (a composite's list),
    checked as the codec checks it."""
    return _DECODERS[cls]


def _install(
    cls: type, code: int, name: str, encode: codec.Encoder, decode: Callable[[Any], Any]
) -> None:
    """Gives ``cls`` its descriptor (``DESCRIPTOR``, ``DESCRIPTOR_NAME``: what frames and
    ``requires`` read) and its codec: ``encoder``/``decoder`` and the codec's registry
    (``codec.register_composite`` takes the class's ``_amqp_encode``)."""
    added: dict[str, Any] = {
        "DESCRIPTOR": code,
        "DESCRIPTOR_NAME": name,
        "_amqp_encode": staticmethod(encode),
    }
    for attribute, value in added.items():  # attributes mypy cannot see a decorator add
        setattr(cls, attribute, value)
    _ENCODERS[cls] = encode
    _DECODERS[cls] = decode
    codec.register_composite(code, name, decode, cls)
