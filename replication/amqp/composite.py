"""Composite types (spec 1.4): described lists whose fields have declared AMQP types.

A composite is a slotted dataclass whose fields carry their AMQP type in metadata:

    @composite(0x10, "amqp:open:list")
    @dataclass(slots=True)
    class Open:
        container_id: str = amqp_field("string", mandatory=True)

``composite`` generates, once per class, a straight-line encoder (typed by the field, trailing
nulls trimmed, the 8-bit list form when it fits) and a decoder that maps null to the field's
default and rejects a missing mandatory field, then registers both with the codec;
``encoder(cls)`` and ``decoder(cls)`` hand them, typed, to code that knows the class.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

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


def composite(code: int, name: str, *, trim: bool = True) -> Callable[[type[T]], type[T]]:
    """Class decorator: makes a dataclass an AMQP composite with descriptor ``code``/``name``.

    ``trim=False`` writes trailing null fields instead of dropping them (spec 1.4 allows
    both) for peers that index the list by position.
    """

    def decorate(cls: type[T]) -> type[T]:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"@composite makes a dataclass a composite; {cls.__name__} is not one")
        fields = dataclasses.fields(cls)
        label = name.split(":")[1] if ":" in name else name
        namespace: dict[str, Any] = {
            "EncodeError": EncodeError,
            "DecodeError": DecodeError,
            "write_list": _write_list,
            "cls": cls,
            "HEADER": bytes((0x00, 0x53, code)),
            "Array": Array,
        }
        enc = [
            "def _amqp_encode(out, self):",
            "    out += HEADER",
            "    body = bytearray()",
            "    cut = 0",
            "    n = 0",
        ]
        dec_args = []
        dec = [
            "def _from_value(f):",
            "    if type(f) is not list:",
            "        if not isinstance(f, list):",
            f"            raise DecodeError('{label} must be a list, got ' + type(f).__name__)",
            "    k = len(f)",
        ]
        for index, field in enumerate(fields):
            amqp_type = field.metadata["amqp"]
            mandatory = field.metadata["mandatory"]
            writer = f"w{index}"
            namespace[writer] = codec.FIELD_ENCODERS[amqp_type]
            enc.append(f"    v = self.{field.name}")
            if mandatory:
                enc.append("    if v is None:")
                enc.append(
                    f"        raise EncodeError('{label}.{_dashed(field.name)} is mandatory')"
                )
                enc.append(f"    {writer}(body, v)")
                enc.append(f"    cut = len(body); n = {index + 1}")
            else:
                enc.append("    if v is None:")
                enc.append("        body.append(0x40)")
                enc.append("    else:")
                enc.append(f"        {writer}(body, v)")
                enc.append(f"        cut = len(body); n = {index + 1}")
            arg = f"a{index}"
            dec.append(f"    {arg} = f[{index}] if k > {index} else None")
            bad = _TYPE_CHECKS.get(amqp_type)
            expected = amqp_type
            required = field.metadata.get("requires")
            if required is not None:
                namespace[f"r{index}"] = required
                bad = f"not isinstance({{v}}, r{index})"
                expected = required.DESCRIPTOR_NAME
            if bad is not None:
                dec.append(f"    if {arg} is not None and ({bad.format(v=arg)}):")
                dec.append(
                    f"        raise DecodeError('{label}.{_dashed(field.name)} must be "
                    f"{expected}, got ' + type({arg}).__name__)"
                )
            # a peer's string in a symbol field reads as a symbol, and a symbol in a string
            # field as a string: what we decode re-encodes to the same value
            if amqp_type == "symbol":
                namespace["symbol"] = symbol
                dec.append(f"    if type({arg}) is str:")
                dec.append(f"        {arg} = symbol({arg})")
            elif amqp_type == "string":
                namespace["symbol"] = symbol
                dec.append(f"    if type({arg}) is symbol:")
                dec.append(f"        {arg} = str({arg})")
            elif amqp_type in _INTEGER_CLASSES:  # any integer encoding that fits: as declared
                cls_name = f"c{index}"
                namespace[cls_name] = _INTEGER_CLASSES[amqp_type]
                dec.append(f"    if {arg} is not None and type({arg}) is not {cls_name}:")
                dec.append(f"        {arg} = {cls_name}({arg})")
            if mandatory:
                dec.append(f"    if {arg} is None:")
                dec.append(
                    f"        raise DecodeError('{label}.{_dashed(field.name)} is mandatory')"
                )
            elif field.default is not None:
                namespace[f"d{index}"] = field.default
                dec.append(f"    if {arg} is None:")
                dec.append(f"        {arg} = d{index}")
            if amqp_type.endswith("[]"):
                namespace["as_tuple"] = _as_tuple
                dec.append(f"    {arg} = as_tuple({arg})")
            dec_args.append(arg)
        if trim:
            enc.append("    del body[cut:]")
            enc.append("    write_list(out, body, n)")
        else:
            enc.append(f"    write_list(out, body, {len(fields)})")
        dec.append(f"    return cls({', '.join(dec_args)})")
        exec("\n".join(enc), namespace)
        exec("\n".join(dec), namespace)
        _install(cls, code, name, namespace["_amqp_encode"], namespace["_from_value"])
        return cls

    return decorate


def _integer(low: int, high: int) -> str:
    """Any integer encoding is taken, as long as the value fits the field's type (a peer's
    uint in a ubyte field is harmless; 38,797,312 there would break our re-encoding)."""
    return f"type({{v}}) is bool or not isinstance({{v}}, int) or not {low} <= {{v}} <= {high}"


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

_TYPE_CHECKS: dict[str, str] = {
    "boolean": "type({v}) is not bool",
    "ubyte": _integer(0, 0xFF),
    "ushort": _integer(0, 0xFFFF),
    "uint": _integer(0, 0xFFFFFFFF),
    "ulong": _integer(0, 2**64 - 1),
    "int": _integer(-(2**31), 2**31 - 1),
    "long": _integer(-(2**63), 2**63 - 1),
    "timestamp": _integer(-(2**63), 2**63 - 1),
    "binary": "not isinstance({v}, bytes)",
    "string": "not isinstance({v}, str)",
    "symbol": "not isinstance({v}, str)",
    "fields": "not isinstance({v}, dict)",
    "map": "not isinstance({v}, dict)",
    "list": "not isinstance({v}, list)",
    "symbol[]": "not isinstance({v}, str | Array)",
}
"""Per AMQP field type, the test that rejects a decoded value of the wrong type (a peer's bug
must become a decode error here, not a crash when the value is used or re-encoded)."""


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
_DECODERS: dict[type, Callable[[Any], Any]] = {}


def encoder(cls: type[T]) -> Callable[[bytearray, T], None]:
    """What writes a value of the composite (or wrapper) class ``cls``, descriptor first:
    for a caller that knows the class and so skips the codec's lookup by type."""
    return _ENCODERS[cls]


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
