"""Python values for AMQP 1.0 types that Python's built-ins cannot tell apart.

A plain ``int`` is an AMQP ``long``, ``float`` a ``double``, ``str`` a ``string`` and ``bytes`` a
``binary``; every other AMQP type has a marker subclass here so that decoding and re-encoding a
value gives back the same bytes (a broker must forward application properties with their types).
The names follow python-qpid-proton, which most AMQP users in Python already know.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime, timedelta
from typing import Any


class _Integer(int):
    """An integer marker: its repr names its AMQP type, its text is the number's (what a
    log line, ``peek`` or a format string shows of a property)."""

    __slots__ = ()

    def __str__(self) -> str:
        return int.__repr__(self)


class ubyte(_Integer):
    """AMQP ubyte (0..255)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"ubyte({int(self)})"


class ushort(_Integer):
    """AMQP ushort (0..65535)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"ushort({int(self)})"


class uint(_Integer):
    """AMQP uint (0..2**32-1)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"uint({int(self)})"


class ulong(_Integer):
    """AMQP ulong (0..2**64-1); also the type of numeric descriptors."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"ulong({int(self)})"


class byte(_Integer):
    """AMQP byte (-128..127)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"byte({int(self)})"


class short(_Integer):
    """AMQP short (-32768..32767)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"short({int(self)})"


class int32(_Integer):
    """AMQP int (-2**31..2**31-1); a plain Python int is an AMQP long."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"int32({int(self)})"


class long(_Integer):
    """AMQP long, marked where a plain ``int`` (an AMQP long to the codec too) would not stay
    one: the SDK's rule, which the replicator sends by, writes a plain int that fits 32 bits
    as an AMQP int, so a long read off the wire is kept as this to go out as a long again
    (``adapters.amqp``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"long({int(self)})"


class float32(float):
    """AMQP float (IEEE 754 binary32); a plain Python float is an AMQP double."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"float32({float(self)!r})"

    def __str__(self) -> str:
        return float.__repr__(self)


class decimal32(_Integer):
    """AMQP decimal32, carried as its raw 32 bits (IEEE 754 decimal32, BID)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"decimal32({int(self):#x})"


class decimal64(_Integer):
    """AMQP decimal64, carried as its raw 64 bits."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"decimal64({int(self):#x})"


class decimal128(bytes):
    """AMQP decimal128, carried as its raw 16 bytes."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"decimal128({bytes(self).hex()})"


class char(str):
    """AMQP char: one Unicode code point."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"char({str(self)!r})"


class symbol(str):
    """AMQP symbol: an ASCII name (capabilities, annotation keys, error conditions)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"symbol({str(self)!r})"


class timestamp(_Integer):
    """AMQP timestamp: milliseconds since the Unix epoch, UTC."""

    __slots__ = ()

    @classmethod
    def from_datetime(cls, value: datetime) -> timestamp:
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        delta = value - _EPOCH
        return cls((delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000)

    def to_datetime(self) -> datetime:
        return _EPOCH + timedelta(milliseconds=int(self))  # exact: no float seconds

    def __repr__(self) -> str:
        return f"timestamp({int(self)})"


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class AMQPType(enum.IntEnum):
    """Element types of an AMQP array, valued by the constructor code used to write them."""

    NULL = 0x40
    BOOLEAN = 0x56
    UBYTE = 0x50
    USHORT = 0x60
    UINT = 0x70
    ULONG = 0x80
    BYTE = 0x51
    SHORT = 0x61
    INT = 0x71
    LONG = 0x81
    FLOAT = 0x72
    DOUBLE = 0x82
    DECIMAL32 = 0x74
    DECIMAL64 = 0x84
    DECIMAL128 = 0x94
    CHAR = 0x73
    TIMESTAMP = 0x83
    UUID = 0x98
    BINARY = 0xB0
    STRING = 0xB1
    SYMBOL = 0xB3
    LIST = 0xD0
    MAP = 0xD1
    ARRAY = 0xF0


class Described:
    """A described value whose descriptor has no registered composite type."""

    __slots__ = ("descriptor", "value")

    def __init__(self, descriptor: Any, value: Any) -> None:
        self.descriptor = descriptor
        self.value = value

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Described)
            and self.descriptor == other.descriptor
            and self.value == other.value
        )

    def __hash__(self) -> int:
        return hash((self.descriptor, _freeze(self.value)))

    def __repr__(self) -> str:
        return f"Described({self.descriptor!r}, {self.value!r})"


class Array:
    """An AMQP array: elements of one type, written with a single constructor.

    Kept distinct from ``list`` (an AMQP list may mix types) so that a decoded array re-encodes
    as an array. ``descriptor`` is set for arrays of described values.
    """

    __slots__ = ("descriptor", "elements", "type")

    def __init__(self, type: AMQPType, elements: Any = (), descriptor: Any = None) -> None:
        self.type = AMQPType(type)
        self.elements = list(elements)
        self.descriptor = descriptor

    def __iter__(self) -> Any:
        return iter(self.elements)

    def __len__(self) -> int:
        return len(self.elements)

    def __getitem__(self, index: int) -> Any:
        return self.elements[index]

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Array)
            and self.type == other.type
            and self.descriptor == other.descriptor
            and self.elements == other.elements
        )

    def __hash__(self) -> int:
        return hash((self.type, self.descriptor, _freeze(self.elements)))

    def __repr__(self) -> str:
        described = f", descriptor={self.descriptor!r}" if self.descriptor is not None else ""
        return f"Array({self.type.name}, {self.elements!r}{described})"


def _freeze(value: Any) -> Any:
    """A hashable stand-in for nested lists and maps, so arrays can be map keys."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple((_freeze(k), _freeze(v)) for k, v in value.items())
    return value
