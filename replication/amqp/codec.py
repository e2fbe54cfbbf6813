"""AMQP 1.0 type system encoding (spec part 1): Python values <-> bytes.

Writing picks the most compact legal encoding (uint0, smallulong, str8, list8, ...); reading
accepts every legal encoding. Decoders are table-driven (one function per constructor byte),
work on ``bytes`` with an offset and never trust a declared size: a size larger than the bytes
at hand, or an element count the bytes cannot hold, is a ``DecodeError`` before anything is
allocated. Composite types (performatives, sections) register themselves here so a described
list decodes straight into its class; this module knows none of them by name.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final

from .errors import DecodeError, EncodeError
from .types import (
    AMQPType,
    Array,
    Described,
    byte,
    char,
    decimal32,
    decimal64,
    decimal128,
    float32,
    int32,
    long,
    short,
    symbol,
    timestamp,
    ubyte,
    uint,
    ulong,
    ushort,
)

Encoder = Callable[[bytearray, Any], None]
Decoder = Callable[[bytes, int], tuple[Any, int]]

MAX_ZERO_WIDTH_ARRAY: Final = 255
"""Arrays of zero-width elements (null, true, uint0, ...) cost no bytes per element, so their
count is capped: at most 255 values from a 4-byte array8, which bounds what a small input can
make us allocate (lists and maps need a byte per element and are bounded by their size)."""

_S_B: Final = struct.Struct(">B")
_S_b: Final = struct.Struct(">b")
_S_H: Final = struct.Struct(">H")
_S_h: Final = struct.Struct(">h")
_S_I: Final = struct.Struct(">I")
_S_i: Final = struct.Struct(">i")
_S_Q: Final = struct.Struct(">Q")
_S_q: Final = struct.Struct(">q")
_S_f: Final = struct.Struct(">f")
_S_d: Final = struct.Struct(">d")
_S_BB: Final = struct.Struct(">BB")
_S_II: Final = struct.Struct(">II")
_S_BI: Final = struct.Struct(">BI")
_S_BQ: Final = struct.Struct(">BQ")
_S_Bq: Final = struct.Struct(">Bq")
_S_BBB: Final = struct.Struct(">BBB")
_S_BII: Final = struct.Struct(">BII")

_pack_I: Final = _S_I.pack
_pack_BI: Final = _S_BI.pack
_pack_BQ: Final = _S_BQ.pack
_pack_Bq: Final = _S_Bq.pack
_pack_BBB: Final = _S_BBB.pack
_pack_BII: Final = _S_BII.pack
_unpack_H: Final = _S_H.unpack_from
_BIN8: Final = tuple(bytes((0xA0, n)) for n in range(256))
_STR8: Final = tuple(bytes((0xA1, n)) for n in range(256))
_SYM8: Final = tuple(bytes((0xA3, n)) for n in range(256))
"""The constructor and size of a binary, string or symbol up to 255 bytes, by size (making
the two bytes each time cost a third of writing a short string)."""
_unpack_I: Final = _S_I.unpack_from
_unpack_II: Final = _S_II.unpack_from

# --------------------------------------------------------------------------------------------
# encoding


def _enc_null(out: bytearray, value: Any) -> None:
    out.append(0x40)


def _enc_bool(out: bytearray, value: Any) -> None:
    out.append(0x41 if value else 0x42)


def _range_error(kind: str, value: Any) -> EncodeError:
    return EncodeError(f"{int(value)} does not fit an AMQP {kind}")


def _enc_ubyte(out: bytearray, value: Any) -> None:
    if not 0 <= value <= 0xFF:
        raise _range_error("ubyte", value)
    out += bytes((0x50, value))


def _enc_ushort(out: bytearray, value: Any) -> None:
    if not 0 <= value <= 0xFFFF:
        raise _range_error("ushort", value)
    out += bytes((0x60, value >> 8, value & 0xFF))


def uint_bytes(value: int) -> bytes:
    """A uint's smallest encoding, as ``_enc_uint`` writes it (for callers that write a
    section or performative by hand from values known to be in range)."""
    if value == 0:
        return b"\x43"
    if value <= 0xFF:
        return bytes((0x52, value))
    return b"\x70" + value.to_bytes(4, "big")


def _enc_uint(out: bytearray, value: Any) -> None:
    if value == 0:
        out.append(0x43)
    elif 0 < value <= 0xFF:
        out += bytes((0x52, value))
    elif 0 < value <= 0xFFFFFFFF:
        out += _pack_BI(0x70, value)
    else:
        raise _range_error("uint", value)


def _enc_ulong(out: bytearray, value: Any) -> None:
    if value == 0:
        out.append(0x44)
    elif 0 < value <= 0xFF:
        out += bytes((0x53, value))
    elif 0 < value <= 0xFFFFFFFFFFFFFFFF:
        out += _pack_BQ(0x80, value)
    else:
        raise _range_error("ulong", value)


def _enc_byte(out: bytearray, value: Any) -> None:
    if not -0x80 <= value <= 0x7F:
        raise _range_error("byte", value)
    out += bytes((0x51, value & 0xFF))


def _enc_short(out: bytearray, value: Any) -> None:
    if not -0x8000 <= value <= 0x7FFF:
        raise _range_error("short", value)
    out += struct.pack(">Bh", 0x61, value)


def _enc_int(out: bytearray, value: Any) -> None:
    if -0x80 <= value <= 0x7F:
        out += bytes((0x54, value & 0xFF))
    elif -0x80000000 <= value <= 0x7FFFFFFF:
        out += struct.pack(">Bi", 0x71, value)
    else:
        raise _range_error("int", value)


def _enc_long(out: bytearray, value: Any) -> None:
    if -0x80 <= value <= 0x7F:
        out += bytes((0x55, value & 0xFF))
    elif -0x8000000000000000 <= value <= 0x7FFFFFFFFFFFFFFF:
        out += _pack_Bq(0x81, value)
    else:
        raise _range_error("long", value)


def _enc_float(out: bytearray, value: Any) -> None:
    try:
        out += struct.pack(">Bf", 0x72, value)
    except OverflowError:
        raise EncodeError(f"{value!r} does not fit an AMQP float") from None


def _enc_double(out: bytearray, value: Any) -> None:
    out += struct.pack(">Bd", 0x82, value)


def _enc_decimal32(out: bytearray, value: Any) -> None:
    if not 0 <= value <= 0xFFFFFFFF:
        raise _range_error("decimal32 (raw 32 bits)", value)
    out += _pack_BI(0x74, value)


def _enc_decimal64(out: bytearray, value: Any) -> None:
    if not 0 <= value <= 0xFFFFFFFFFFFFFFFF:
        raise _range_error("decimal64 (raw 64 bits)", value)
    out += _pack_BQ(0x84, value)


def _enc_decimal128(out: bytearray, value: Any) -> None:
    if len(value) != 16:
        raise EncodeError(f"decimal128 needs 16 bytes, got {len(value)}")
    out.append(0x94)
    out += value


def _char_code(value: Any) -> int:
    if len(value) != 1:
        raise EncodeError(f"AMQP char holds one code point, got {len(value)}")
    code = ord(value)
    if 0xD800 <= code <= 0xDFFF:
        raise EncodeError(f"AMQP char cannot hold the surrogate {code:#x}")
    return code


def _enc_char(out: bytearray, value: Any) -> None:
    out += _pack_BI(0x73, _char_code(value))


def _enc_timestamp(out: bytearray, value: Any) -> None:
    if not -0x8000000000000000 <= value <= 0x7FFFFFFFFFFFFFFF:
        raise _range_error("timestamp", value)
    out += _pack_Bq(0x83, value)


def _enc_datetime(out: bytearray, value: Any) -> None:
    _enc_timestamp(out, timestamp.from_datetime(value))


def _enc_uuid(out: bytearray, value: Any) -> None:
    out.append(0x98)
    out += value.bytes


def _enc_binary(out: bytearray, value: Any) -> None:
    n = len(value)
    if n <= 0xFF:
        out += _BIN8[n]
    else:
        out += _pack_BI(0xB0, n)
    out += value


def _enc_string(out: bytearray, value: Any) -> None:
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError:
        raise EncodeError(f"AMQP string cannot hold a lone surrogate: {value!r}") from None
    n = len(data)
    if n <= 0xFF:
        out += _STR8[n]
    else:
        out += _pack_BI(0xB1, n)
    out += data


def _enc_symbol(out: bytearray, value: Any) -> None:
    try:
        data = value.encode("ascii")
    except UnicodeEncodeError:
        raise EncodeError(f"AMQP symbol must be ASCII: {value!r}") from None
    n = len(data)
    if n <= 0xFF:
        out += _SYM8[n]
    else:
        out += _pack_BI(0xB3, n)
    out += data


def write_compound(out: bytearray, body: bytearray | bytes, count: int, small: int) -> None:
    """Writes a list, map or array header + body, choosing the 8-bit form when it fits."""
    size = len(body)
    if size < 0xFF and count <= 0xFF:
        out += bytes((small, size + 1, count))
    else:
        out += _pack_BII(small + 0x10, size + 4, count)
    out += body


def _enc_list(out: bytearray, value: Any) -> None:
    if not value:
        out.append(0x45)
        return
    body = bytearray()
    for item in value:
        encode_into(body, item)
    write_compound(out, body, len(value), 0xC0)


def _enc_map(out: bytearray, value: Any) -> None:
    body = bytearray()
    for key, item in value.items():
        encode_into(body, key)
        encode_into(body, item)
    write_compound(out, body, 2 * len(value), 0xC1)


def encode_symbol_keyed_map(out: bytearray, value: Any) -> None:
    """Writes a map whose ``str`` keys are symbols (annotations, fields, filter sets)."""
    body = bytearray()
    for key, item in value.items():
        if type(key) is str:
            _enc_symbol(body, key)
        else:
            encode_into(body, key)
        encode_into(body, item)
    write_compound(out, body, 2 * len(value), 0xC1)


def _enc_described(out: bytearray, value: Any) -> None:
    out.append(0x00)
    encode_into(out, value.descriptor)
    encode_into(out, value.value)


# Array element writers: one constructor for all elements, so fixed (non-compact) widths.
def _elem_fixed(fmt: str) -> Encoder:
    pack = struct.Struct(">" + fmt).pack

    def write(out: bytearray, value: Any) -> None:
        out += pack(value)

    return write


def _elem_bool(out: bytearray, value: Any) -> None:
    out.append(1 if value else 0)


def _elem_char(out: bytearray, value: Any) -> None:
    out += _pack_I(_char_code(value))


def _elem_uuid(out: bytearray, value: Any) -> None:
    out += value.bytes


def _elem_null(out: bytearray, value: Any) -> None:
    if value is not None:
        raise EncodeError(f"an array of null holds only None, got {value!r}")


def _elem_raw(out: bytearray, value: Any) -> None:
    if len(value) != 16:
        raise EncodeError(f"decimal128 needs 16 bytes, got {len(value)}")
    out += value


def _elem_compound(encode_whole: Encoder) -> Encoder:
    """Strips the constructor byte a whole-value writer adds (lists, maps, arrays as elements)."""

    def write(out: bytearray, value: Any) -> None:
        tmp = bytearray()
        encode_whole(tmp, value)
        if tmp[0] in (0x45, 0xC0, 0xC1, 0xE0):  # widen to the 32-bit form the constructor says
            tmp = _widen_compound(tmp)
        out += memoryview(tmp)[1:]

    return write


def _widen_compound(tmp: bytearray) -> bytearray:
    code = tmp[0]
    if code == 0x45:
        return bytearray(_pack_BII(0xD0, 4, 0))
    size, count = tmp[1], tmp[2]
    return bytearray(_pack_BII(code + 0x10, size + 3, count)) + tmp[3:]


_ELEMENT_WRITERS: Final[dict[AMQPType, Encoder]] = {
    AMQPType.NULL: _elem_null,
    AMQPType.BOOLEAN: _elem_bool,
    AMQPType.UBYTE: _elem_fixed("B"),
    AMQPType.USHORT: _elem_fixed("H"),
    AMQPType.UINT: _elem_fixed("I"),
    AMQPType.ULONG: _elem_fixed("Q"),
    AMQPType.BYTE: _elem_fixed("b"),
    AMQPType.SHORT: _elem_fixed("h"),
    AMQPType.INT: _elem_fixed("i"),
    AMQPType.LONG: _elem_fixed("q"),
    AMQPType.FLOAT: _elem_fixed("f"),
    AMQPType.DOUBLE: _elem_fixed("d"),
    AMQPType.DECIMAL32: _elem_fixed("I"),
    AMQPType.DECIMAL64: _elem_fixed("Q"),
    AMQPType.DECIMAL128: _elem_raw,
    AMQPType.CHAR: _elem_char,
    AMQPType.TIMESTAMP: _elem_fixed("q"),
    AMQPType.UUID: _elem_uuid,
}


def _variable_elements(
    out: bytearray, items: list[Any], kind: AMQPType, to_bytes: Callable[[Any], bytes]
) -> None:
    """Writes binary/string/symbol array elements, 8-bit lengths when every element fits."""
    raw = [to_bytes(v) for v in items]
    small = all(len(r) <= 0xFF for r in raw)
    out.append(kind - 0x10 if small else kind)
    for r in raw:
        if small:
            out.append(len(r))
        else:
            out += _pack_I(len(r))
        out += r


def _symbol_bytes(value: str) -> bytes:
    try:
        return value.encode("ascii")
    except UnicodeEncodeError:
        raise EncodeError(f"AMQP symbol must be ASCII: {value!r}") from None


def _enc_array(out: bytearray, value: Any) -> None:
    body = bytearray()
    if value.descriptor is not None:
        body.append(0x00)
        encode_into(body, value.descriptor)
    kind = value.type
    items = value.elements
    try:
        if kind == AMQPType.BINARY:
            _variable_elements(body, items, kind, bytes)
        elif kind == AMQPType.STRING:
            _variable_elements(body, items, kind, lambda v: v.encode("utf-8"))
        elif kind == AMQPType.SYMBOL:
            _variable_elements(body, items, kind, _symbol_bytes)
        else:
            body.append(kind)
            if kind == AMQPType.LIST:
                write = _elem_compound(_enc_list)
            elif kind == AMQPType.MAP:
                write = _elem_compound(_enc_map)
            elif kind == AMQPType.ARRAY:
                write = _elem_compound(_enc_array)
            else:
                write = _ELEMENT_WRITERS[kind]
            for item in items:
                write(body, item)
    except (struct.error, OverflowError, UnicodeEncodeError) as exc:
        raise EncodeError(f"array of {kind.name}: cannot encode an element: {exc}") from None
    write_compound(out, body, len(items), 0xE0)


ENCODERS: Final[dict[type, Encoder]] = {
    type(None): _enc_null,
    bool: _enc_bool,
    int: _enc_long,
    float: _enc_double,
    str: _enc_string,
    bytes: _enc_binary,
    bytearray: _enc_binary,
    memoryview: _enc_binary,
    list: _enc_list,
    tuple: _enc_list,
    dict: _enc_map,
    uuid.UUID: _enc_uuid,
    datetime: _enc_datetime,
    ubyte: _enc_ubyte,
    ushort: _enc_ushort,
    uint: _enc_uint,
    ulong: _enc_ulong,
    byte: _enc_byte,
    short: _enc_short,
    int32: _enc_int,
    long: _enc_long,
    float32: _enc_float,
    decimal32: _enc_decimal32,
    decimal64: _enc_decimal64,
    decimal128: _enc_decimal128,
    char: _enc_char,
    timestamp: _enc_timestamp,
    symbol: _enc_symbol,
    Array: _enc_array,
    Described: _enc_described,
}
"""Writer per exact Python type; composite classes add themselves (see ``register_composite``)."""


def _encoder_for(kind: type) -> Encoder:
    """Finds a writer for a subclass (IntEnum, OrderedDict, ...) through its MRO, and caches it."""
    for base in kind.__mro__[1:]:
        found = ENCODERS.get(base)
        if found is not None:
            ENCODERS[kind] = found
            return found
    raise EncodeError(f"no AMQP encoding for Python type {kind.__name__}")


def encode_into(out: bytearray, value: Any) -> None:
    """Appends the AMQP encoding of ``value`` to ``out``."""
    encoder = ENCODERS.get(type(value))
    if encoder is None:
        encoder = _encoder_for(type(value))
    encoder(out, value)


def encode(value: Any) -> bytes:
    """The AMQP encoding of ``value``."""
    out = bytearray()
    encode_into(out, value)
    return bytes(out)


# Typed writers for composite fields: the field's AMQP type decides, not the Python type.
FIELD_ENCODERS: Final[dict[str, Encoder]] = {
    "*": encode_into,
    "boolean": _enc_bool,
    "ubyte": _enc_ubyte,
    "ushort": _enc_ushort,
    "uint": _enc_uint,
    "ulong": _enc_ulong,
    "int": _enc_int,
    "long": _enc_long,
    "timestamp": _enc_timestamp,
    "binary": _enc_binary,
    "string": _enc_string,
    "symbol": _enc_symbol,
    "fields": encode_symbol_keyed_map,
    "map": _enc_map,
    "list": _enc_list,
}


def encode_symbols(out: bytearray, value: Any) -> None:
    """Writes a ``symbol[]`` field (``multiple="true"``): one symbol, or an array of them."""
    if isinstance(value, str):
        _enc_symbol(out, value)
    else:
        _enc_array(out, Array(AMQPType.SYMBOL, value))


FIELD_ENCODERS["symbol[]"] = encode_symbols

# --------------------------------------------------------------------------------------------
# decoding

Composite = Callable[[Any], Any]
COMPOSITES: Final[dict[Any, Composite]] = {}
"""Descriptor (ulong code and symbolic name) -> constructor from the decoded described value."""


def _need(data: bytes, end: int) -> None:
    if end > len(data):
        raise DecodeError(
            f"truncated AMQP encoding: a value needs {end} bytes, the data holds {len(data)}"
        )


def _dec_null(data: bytes, pos: int) -> tuple[Any, int]:
    return None, pos


def _dec_true(data: bytes, pos: int) -> tuple[Any, int]:
    return True, pos


def _dec_false(data: bytes, pos: int) -> tuple[Any, int]:
    return False, pos


def _dec_boolean(data: bytes, pos: int) -> tuple[Any, int]:
    b = data[pos]
    if b > 1:
        raise DecodeError(f"boolean byte must be 0 or 1, got {b}")
    return b == 1, pos + 1


def _dec_ubyte(data: bytes, pos: int) -> tuple[Any, int]:
    return ubyte(data[pos]), pos + 1


def _dec_byte(data: bytes, pos: int) -> tuple[Any, int]:
    return byte(_S_b.unpack_from(data, pos)[0]), pos + 1


def _dec_ushort(data: bytes, pos: int) -> tuple[Any, int]:
    return ushort(_unpack_H(data, pos)[0]), pos + 2


def _dec_short(data: bytes, pos: int) -> tuple[Any, int]:
    return short(_S_h.unpack_from(data, pos)[0]), pos + 2


_SMALL_UINTS: Final = tuple(uint(value) for value in range(256))
_SMALL_ULONGS: Final = tuple(ulong(value) for value in range(256))
"""The one-byte values, made once: handles, delivery ids, descriptors and counts decode
to these in every frame (the types are immutable ints)."""


def _dec_uint0(data: bytes, pos: int) -> tuple[Any, int]:
    return _SMALL_UINTS[0], pos


def _dec_smalluint(data: bytes, pos: int) -> tuple[Any, int]:
    return _SMALL_UINTS[data[pos]], pos + 1


def _dec_uint(data: bytes, pos: int) -> tuple[Any, int]:
    return uint(_unpack_I(data, pos)[0]), pos + 4


def _dec_ulong0(data: bytes, pos: int) -> tuple[Any, int]:
    return _SMALL_ULONGS[0], pos


def _dec_smallulong(data: bytes, pos: int) -> tuple[Any, int]:
    return _SMALL_ULONGS[data[pos]], pos + 1


def _dec_ulong(data: bytes, pos: int) -> tuple[Any, int]:
    return ulong(_S_Q.unpack_from(data, pos)[0]), pos + 8


def _dec_smallint(data: bytes, pos: int) -> tuple[Any, int]:
    return int32(_S_b.unpack_from(data, pos)[0]), pos + 1


def _dec_int(data: bytes, pos: int) -> tuple[Any, int]:
    return int32(_S_i.unpack_from(data, pos)[0]), pos + 4


def _dec_smalllong(data: bytes, pos: int) -> tuple[Any, int]:
    return _S_b.unpack_from(data, pos)[0], pos + 1


def _dec_long(data: bytes, pos: int) -> tuple[Any, int]:
    return _S_q.unpack_from(data, pos)[0], pos + 8


def _dec_float(data: bytes, pos: int) -> tuple[Any, int]:
    return float32(_S_f.unpack_from(data, pos)[0]), pos + 4


def _dec_double(data: bytes, pos: int) -> tuple[Any, int]:
    return _S_d.unpack_from(data, pos)[0], pos + 8


def _dec_decimal32(data: bytes, pos: int) -> tuple[Any, int]:
    return decimal32(_unpack_I(data, pos)[0]), pos + 4


def _dec_decimal64(data: bytes, pos: int) -> tuple[Any, int]:
    return decimal64(_S_Q.unpack_from(data, pos)[0]), pos + 8


def _dec_decimal128(data: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 16
    _need(data, end)
    return decimal128(data[pos:end]), end


def _dec_char(data: bytes, pos: int) -> tuple[Any, int]:
    code = _unpack_I(data, pos)[0]
    if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
        raise DecodeError(f"char {code:#x} is not a Unicode scalar value")
    return char(chr(code)), pos + 4


def _dec_timestamp(data: bytes, pos: int) -> tuple[Any, int]:
    return timestamp(_S_q.unpack_from(data, pos)[0]), pos + 8


def _dec_uuid(data: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 16
    _need(data, end)
    return uuid.UUID(bytes=data[pos:end]), end


def _dec_vbin8(data: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 1 + data[pos]
    if end > len(data):
        raise DecodeError(f"binary of {end - pos - 1} bytes overruns the buffer")
    return data[pos + 1 : end], end


def _dec_vbin32(data: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 4 + _unpack_I(data, pos)[0]
    if end > len(data):
        raise DecodeError(f"binary of {end - pos - 4} bytes overruns the buffer")
    return data[pos + 4 : end], end


def _utf8(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"string is not UTF-8: {exc.reason}") from None


def _dec_str8(data: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 1 + data[pos]
    if end > len(data):
        raise DecodeError("string overruns the buffer")
    return _utf8(data[pos + 1 : end]), end


def _dec_str32(data: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 4 + _unpack_I(data, pos)[0]
    if end > len(data):
        raise DecodeError("string overruns the buffer")
    return _utf8(data[pos + 4 : end]), end


def _ascii(raw: bytes) -> symbol:
    try:
        return symbol(raw.decode("ascii"))
    except UnicodeDecodeError:
        raise DecodeError("symbol is not ASCII") from None


def _dec_sym8(data: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 1 + data[pos]
    if end > len(data):
        raise DecodeError("symbol overruns the buffer")
    return _ascii(data[pos + 1 : end]), end


def _dec_sym32(data: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 4 + _unpack_I(data, pos)[0]
    if end > len(data):
        raise DecodeError("symbol overruns the buffer")
    return _ascii(data[pos + 4 : end]), end


def _dec_list0(data: bytes, pos: int) -> tuple[Any, int]:
    return [], pos


def _compound_bounds(
    data: bytes, pos: int, wide: bool, array: bool = False
) -> tuple[int, int, int]:
    """Reads size+count of a list/map/array; returns (first item pos, end pos, count)."""
    if wide:
        size, count = _unpack_II(data, pos)
        start, end = pos + 8, pos + 4 + size
        if size < 4:
            raise DecodeError(f"compound size {size} cannot hold its count")
    else:
        size, count = data[pos], data[pos + 1]
        start, end = pos + 2, pos + 1 + size
        if size < 1:
            raise DecodeError("compound size 0 cannot hold its count")
    if end > len(data):
        raise DecodeError(f"compound of {size} bytes overruns the buffer")
    if count > end - start and not (array and count <= MAX_ZERO_WIDTH_ARRAY):
        raise DecodeError(f"{count} elements cannot fit in {end - start} bytes")
    return start, end, count


def _items(data: bytes, pos: int, end: int, count: int) -> list[Any]:
    items: list[Any] = []
    append = items.append
    decoders = DECODERS
    for _ in range(count):
        code = data[pos]
        value, pos = decoders[code](data, pos + 1)
        append(value)
    if pos != end:
        raise DecodeError(f"compound declares {end} as its end but its elements end at {pos}")
    return items


def _dec_list8(data: bytes, pos: int) -> tuple[Any, int]:
    start, end, count = _compound_bounds(data, pos, False)
    return _items(data, start, end, count), end


def _dec_list32(data: bytes, pos: int) -> tuple[Any, int]:
    start, end, count = _compound_bounds(data, pos, True)
    return _items(data, start, end, count), end


def _to_map(items: list[Any]) -> dict[Any, Any]:
    if len(items) % 2:
        raise DecodeError("map has an odd number of elements")
    it = iter(items)
    try:
        return dict(zip(it, it, strict=True))
    except TypeError:
        raise DecodeError("map key is not hashable (list or map used as a key)") from None


def _dec_map8(data: bytes, pos: int) -> tuple[Any, int]:
    start, end, count = _compound_bounds(data, pos, False)
    return _to_map(_items(data, start, end, count)), end


def _dec_map32(data: bytes, pos: int) -> tuple[Any, int]:
    start, end, count = _compound_bounds(data, pos, True)
    return _to_map(_items(data, start, end, count)), end


_FIXED_WIDTH: Final[dict[int, int]] = {
    0x40: 0,
    0x41: 0,
    0x42: 0,
    0x43: 0,
    0x44: 0,
    0x45: 0,
    0x50: 1,
    0x51: 1,
    0x52: 1,
    0x53: 1,
    0x54: 1,
    0x55: 1,
    0x56: 1,
    0x60: 2,
    0x61: 2,
    0x70: 4,
    0x71: 4,
    0x72: 4,
    0x73: 4,
    0x74: 4,
    0x80: 8,
    0x81: 8,
    0x82: 8,
    0x83: 8,
    0x84: 8,
    0x94: 16,
    0x98: 16,
}

_ARRAY_TYPE: Final[dict[int, AMQPType]] = {
    0x40: AMQPType.NULL,
    0x41: AMQPType.BOOLEAN,
    0x42: AMQPType.BOOLEAN,
    0x56: AMQPType.BOOLEAN,
    0x50: AMQPType.UBYTE,
    0x60: AMQPType.USHORT,
    0x43: AMQPType.UINT,
    0x52: AMQPType.UINT,
    0x70: AMQPType.UINT,
    0x44: AMQPType.ULONG,
    0x53: AMQPType.ULONG,
    0x80: AMQPType.ULONG,
    0x51: AMQPType.BYTE,
    0x61: AMQPType.SHORT,
    0x54: AMQPType.INT,
    0x71: AMQPType.INT,
    0x55: AMQPType.LONG,
    0x81: AMQPType.LONG,
    0x72: AMQPType.FLOAT,
    0x82: AMQPType.DOUBLE,
    0x74: AMQPType.DECIMAL32,
    0x84: AMQPType.DECIMAL64,
    0x94: AMQPType.DECIMAL128,
    0x73: AMQPType.CHAR,
    0x83: AMQPType.TIMESTAMP,
    0x98: AMQPType.UUID,
    0xA0: AMQPType.BINARY,
    0xB0: AMQPType.BINARY,
    0xA1: AMQPType.STRING,
    0xB1: AMQPType.STRING,
    0xA3: AMQPType.SYMBOL,
    0xB3: AMQPType.SYMBOL,
    0x45: AMQPType.LIST,
    0xC0: AMQPType.LIST,
    0xD0: AMQPType.LIST,
    0xC1: AMQPType.MAP,
    0xD1: AMQPType.MAP,
    0xE0: AMQPType.ARRAY,
    0xF0: AMQPType.ARRAY,
}


def _array(data: bytes, pos: int, end: int, count: int) -> Array:
    descriptor = None
    if data[pos] == 0x00:
        descriptor, pos = _decode_at(data, pos + 1)
    code = data[pos]
    kind = _ARRAY_TYPE.get(code)
    if kind is None:
        raise DecodeError(f"invalid array element constructor {code:#04x}")
    decoder = DECODERS[code]
    pos += 1
    width = _FIXED_WIDTH.get(code)
    if width == 0 and count > MAX_ZERO_WIDTH_ARRAY:
        raise DecodeError(f"array of {count} zero-width elements exceeds {MAX_ZERO_WIDTH_ARRAY}")
    if count * (1 if width is None else width) > end - pos:  # variable width: >= 1 byte each
        raise DecodeError(f"{count} elements overrun the array's {end - pos} bytes")
    elements: list[Any] = []
    append = elements.append
    for _ in range(count):
        value, pos = decoder(data, pos)
        append(value)
    if pos != end:
        raise DecodeError(f"array declares {end} as its end but its elements end at {pos}")
    if descriptor is not None:
        ctor = COMPOSITES.get(descriptor)
        if ctor is not None:
            elements = [ctor(v) for v in elements]
    return Array(kind, elements, descriptor)


def _dec_array8(data: bytes, pos: int) -> tuple[Any, int]:
    start, end, count = _compound_bounds(data, pos, False, array=True)
    if count and start >= end:
        raise DecodeError("array has elements but no constructor")
    return _array(data, start, end, count), end


def _dec_array32(data: bytes, pos: int) -> tuple[Any, int]:
    start, end, count = _compound_bounds(data, pos, True, array=True)
    if count and start >= end:
        raise DecodeError("array has elements but no constructor")
    return _array(data, start, end, count), end


def _dec_described(data: bytes, pos: int) -> tuple[Any, int]:
    # fast path: descriptors are almost always smallulong codes
    if data[pos] == 0x53:
        descriptor: Any = _SMALL_ULONGS[data[pos + 1]]
        pos += 2
    else:
        descriptor, pos = _decode_at(data, pos)
    code = data[pos]
    value, pos = DECODERS[code](data, pos + 1)
    ctor = COMPOSITES.get(descriptor)
    if ctor is not None:
        return ctor(value), pos
    return Described(descriptor, value), pos


def _bad_constructor(code: int) -> Decoder:
    def fail(data: bytes, pos: int) -> tuple[Any, int]:
        raise DecodeError(f"invalid constructor {code:#04x} at offset {pos - 1}")

    return fail


DECODERS: Final[list[Decoder]] = [_bad_constructor(code) for code in range(256)]
for _code, _fn in {
    0x00: _dec_described,
    0x40: _dec_null,
    0x41: _dec_true,
    0x42: _dec_false,
    0x56: _dec_boolean,
    0x50: _dec_ubyte,
    0x51: _dec_byte,
    0x60: _dec_ushort,
    0x61: _dec_short,
    0x43: _dec_uint0,
    0x52: _dec_smalluint,
    0x70: _dec_uint,
    0x44: _dec_ulong0,
    0x53: _dec_smallulong,
    0x80: _dec_ulong,
    0x54: _dec_smallint,
    0x71: _dec_int,
    0x55: _dec_smalllong,
    0x81: _dec_long,
    0x72: _dec_float,
    0x82: _dec_double,
    0x74: _dec_decimal32,
    0x84: _dec_decimal64,
    0x94: _dec_decimal128,
    0x73: _dec_char,
    0x83: _dec_timestamp,
    0x98: _dec_uuid,
    0xA0: _dec_vbin8,
    0xB0: _dec_vbin32,
    0xA1: _dec_str8,
    0xB1: _dec_str32,
    0xA3: _dec_sym8,
    0xB3: _dec_sym32,
    0x45: _dec_list0,
    0xC0: _dec_list8,
    0xD0: _dec_list32,
    0xC1: _dec_map8,
    0xD1: _dec_map32,
    0xE0: _dec_array8,
    0xF0: _dec_array32,
}.items():
    DECODERS[_code] = _fn


def _decode_at(data: bytes, pos: int) -> tuple[Any, int]:
    return DECODERS[data[pos]](data, pos + 1)


_LEAKS = (IndexError, struct.error, ValueError, TypeError, OverflowError, MemoryError)


def decode_at(data: bytes, pos: int = 0) -> tuple[Any, int]:
    """Decodes one value at ``pos``; returns it and the offset just past it."""
    try:
        return DECODERS[data[pos]](data, pos + 1)
    except DecodeError:
        raise
    except RecursionError:
        raise DecodeError("values nested too deeply") from None
    except (IndexError, struct.error):  # indexing or unpacking past the end of the data
        if pos >= len(data):
            raise DecodeError(f"no AMQP value at offset {pos}: the data ends there") from None
        raise DecodeError(
            f"truncated AMQP encoding: the value at offset {pos} runs past the data's end"
            f" (offset {len(data)})"
        ) from None
    except _LEAKS as exc:
        raise DecodeError(f"malformed AMQP encoding: {exc}") from None


_SIZE8: Final = frozenset({0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0})
_SIZE32: Final = frozenset({0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0})


def skip_at(data: bytes, pos: int) -> int:
    """The offset just past the value at ``pos``, from its constructor and size alone: how a
    reader passes over what it does not need without building it. The caller checks the
    result against the data's length; an unknown constructor is a ``DecodeError``. A loop, not
    recursion: compiled, a chain of descriptors as long as a frame would overflow the C stack."""
    values = 1  # values still to pass: a described one is its descriptor, then its value
    while True:
        code = data[pos]
        if code == 0x00:
            values += 1
            pos += 1
            continue
        width = _FIXED_WIDTH.get(code)
        if width is not None:
            pos += 1 + width
        elif code in _SIZE8:
            pos += 2 + data[pos + 1]
        elif code in _SIZE32:
            pos += 5 + int.from_bytes(data[pos + 1 : pos + 5], "big")
        else:
            raise DecodeError(f"invalid constructor 0x{code:02x}")
        values -= 1
        if values == 0:
            return pos


def decode(data: bytes | bytearray | memoryview) -> Any:
    """Decodes exactly one value that fills ``data``."""
    data = bytes(data)
    value, pos = decode_at(data, 0)
    if pos != len(data):
        raise DecodeError(f"{len(data) - pos} bytes left after the value")
    return value


def decode_all(data: bytes | bytearray | memoryview) -> list[Any]:
    """Decodes the sequence of values that fills ``data`` (e.g. the sections of a message)."""
    data = bytes(data)
    values = []
    pos = 0
    end = len(data)
    while pos < end:
        value, pos = decode_at(data, pos)
        values.append(value)
    return values


def register_composite(descriptor_code: int, name: str, ctor: Composite, cls: type) -> None:
    """Makes described values with this descriptor decode through ``ctor`` and ``cls`` encode."""
    COMPOSITES[ulong(descriptor_code)] = ctor
    COMPOSITES[symbol(name)] = ctor
    encoder = getattr(cls, "_amqp_encode", None)
    if encoder is not None:
        ENCODERS[cls] = encoder
