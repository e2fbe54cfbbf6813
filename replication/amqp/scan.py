"""A message's sections found by offset, decoding only what the reader asks for.

The broker needs a send's header, annotations, properties and the span of its bare message,
never its body; a receiver needs the properties, a few annotations and the body bytes, never
the lock token. The general decoder (``codec`` + ``message``) builds every section and every
value; this walks the sections by their sizes instead. It reads the encodings peers use
(descriptors as smallulong, lists and maps in their 8- and 32-bit forms) and raises
``Unusual`` for anything else, including sections out of order and malformed sizes: the
caller then uses the general decoder, which accepts every valid form and says what is wrong
with an invalid one. So the two can never disagree on what a valid message means.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Final

from .codec import DECODERS, skip_at
from .errors import DecodeError


class Unusual(Exception):
    """This scanner does not read the payload; use the general decoder. The message says
    why (for someone wondering why a payload took the slow path), not what is wrong with
    it: the general decoder says that."""


HEADER: Final = 0x70
DELIVERY_ANNOTATIONS: Final = 0x71
MESSAGE_ANNOTATIONS: Final = 0x72
PROPERTIES: Final = 0x73
APPLICATION_PROPERTIES: Final = 0x74
DATA: Final = 0x75
AMQP_SEQUENCE: Final = 0x76
AMQP_VALUE: Final = 0x77
FOOTER: Final = 0x78
_RANK: Final = {
    HEADER: 0,
    DELIVERY_ANNOTATIONS: 1,
    MESSAGE_ANNOTATIONS: 2,
    PROPERTIES: 3,
    APPLICATION_PROPERTIES: 4,
    DATA: 5,
    AMQP_SEQUENCE: 5,
    AMQP_VALUE: 5,
    FOOTER: 6,
}
"""The order sections come in (spec 3.2); only body sections may repeat."""
_BARE_RANK: Final = _RANK[PROPERTIES]
_MALFORMED: Final = (
    IndexError,
    ValueError,
    DecodeError,
    struct.error,
    OverflowError,
    RecursionError,
)


@dataclass(slots=True, init=False)
class Sections:
    """Where a message's sections are, and the few values read on the way. Its ``__init__``
    is written out: the one ``dataclass`` writes is plain Python, which mypyc does not
    compile (four times the cost, per message; issue 42)."""

    header: list[Any] | None = None
    """The header's five fields, None-padded."""
    annotations_at: int = -1
    """Offset of the message-annotations map, -1 without one."""
    properties: list[Any] | None = None
    """The properties' thirteen fields, None-padded."""
    properties_span: tuple[int, int] | None = None
    """Where the properties section starts and ends (for a writer that replaces it)."""
    application_properties_at: int = -1
    """Offset of the application-properties map, -1 without one."""
    data: list[bytes] = field(default_factory=list)
    """The data sections' bytes; empty for an amqp-value or amqp-sequence body."""
    body_is_data: bool = True
    bare_start: int = 0
    bare_end: int = 0

    def __init__(self, bare_start: int = 0, bare_end: int = 0) -> None:
        self.header = None
        self.annotations_at = -1
        self.properties = None
        self.properties_span = None
        self.application_properties_at = -1
        self.data = []
        self.body_is_data = True
        self.bare_start = bare_start
        self.bare_end = bare_end


def scan(payload: bytes) -> Sections:
    """The sections of one encoded message.

    Delivery annotations after the bare message (the Python SDK writes them last) end it, as
    the broker reads such a send; any section after those is unusual."""
    data = payload
    end = len(data)
    found = Sections(bare_start=end, bare_end=end)
    last = -1
    pos = 0
    try:
        while pos < end:
            if data[pos] != 0x00 or data[pos + 1] != 0x53:
                raise Unusual(f"offset {pos}: not a section with a smallulong descriptor")
            section = data[pos + 2]
            rank = _RANK.get(section)
            if rank is None:
                raise Unusual(f"offset {pos}: descriptor {section:#04x} is not a section")
            start = pos
            pos += 3
            if section == DELIVERY_ANNOTATIONS and found.bare_start != end:
                found.bare_end = min(found.bare_end, start)  # the SDK's trailing ones
                pos = skip_at(data, pos)
                last = 7
                continue
            if rank < last or (rank == last and rank != 5):
                raise Unusual(f"offset {start}: section {section:#04x} out of order or repeated")
            last = rank
            if rank >= _BARE_RANK and found.bare_start == end:
                found.bare_start = start
            if section == DATA:
                code = data[pos]
                if code == 0xA0:
                    value_at, stop = pos + 2, pos + 2 + data[pos + 1]
                elif code == 0xB0:
                    value_at = pos + 5
                    stop = value_at + int.from_bytes(data[pos + 1 : pos + 5], "big")
                else:
                    raise Unusual(f"offset {pos}: a data section holding {code:#04x}, not binary")
                if stop > end:
                    raise Unusual(f"offset {pos}: the data section overruns the payload")
                found.data.append(data[value_at:stop])
                pos = stop
            elif section == PROPERTIES:
                found.properties, pos = fields(data, pos, 13)
                found.properties_span = (start, pos)
            elif section == HEADER:
                found.header, pos = fields(data, pos, 5)
            elif section == MESSAGE_ANNOTATIONS:
                found.annotations_at, pos = pos, _map_end(data, pos)
            elif section == APPLICATION_PROPERTIES:
                found.application_properties_at, pos = pos, _map_end(data, pos)
            else:  # delivery annotations before the bare message, other bodies, footer
                if section in (AMQP_SEQUENCE, AMQP_VALUE):
                    found.body_is_data = False
                pos = skip_at(data, pos)
    except RecursionError:
        raise Unusual("values nested too deeply") from None
    except _MALFORMED as exc:
        raise Unusual(f"malformed: {exc}") from None
    if pos != end:
        raise Unusual(f"the last section overruns the payload ({pos} > {end})")
    if found.data and not found.body_is_data:
        raise Unusual("a body of data and amqp-value or amqp-sequence sections")
    return found


def fields(data: bytes, pos: int, size: int) -> tuple[list[Any], int]:
    """A described list's fields (header, properties), padded with None to ``size``."""
    code = data[pos]
    if code == 0xC0:
        count, item, stop = data[pos + 2], pos + 3, pos + 2 + data[pos + 1]
    elif code == 0xD0:
        count = int.from_bytes(data[pos + 5 : pos + 9], "big")
        item, stop = pos + 9, pos + 5 + int.from_bytes(data[pos + 1 : pos + 5], "big")
    elif code == 0x45:
        return [None] * size, pos + 1
    else:
        raise Unusual(f"offset {pos}: {code:#04x} where a list belongs")
    values: list[Any] = [None] * max(size, count)
    for index in range(count):
        code = data[item]
        if code == 0x40:  # null, most fields
            item += 1
        elif code == 0xA1:  # str8, most of the rest
            stop_at = item + 2 + data[item + 1]
            values[index] = data[item + 2 : stop_at].decode("utf-8")
            item = stop_at
        else:
            values[index], item = DECODERS[code](data, item + 1)
    if item != stop:
        raise Unusual(f"offset {pos}: the list's fields end at {item}, its size at {stop}")
    return values, stop


def string_map(data: bytes, pos: int) -> dict[Any, Any]:
    """A map with (usually str8) keys: application properties."""
    count, item, stop = _map_bounds(data, pos)
    out: dict[Any, Any] = {}
    for _ in range(count // 2):
        code = data[item]
        if code == 0xA1:
            key_end = item + 2 + data[item + 1]
            key: Any = data[item + 2 : key_end].decode("utf-8")
            item = key_end
        elif code == 0xB1 or code == 0xA3 or code == 0xB3:
            key, item = DECODERS[code](data, item + 1)
        else:  # not a string: the general decoder names the error
            raise Unusual(f"offset {item}: an application-properties key {code:#04x}")
        out[key], item = DECODERS[data[item]](data, item + 1)
    if item != stop or count % 2:
        raise Unusual(
            f"offset {pos}: a map of {count} elements ending at {item}, its size at {stop}"
        )
    return out


def pick(data: bytes, pos: int, wanted: dict[bytes, str]) -> dict[str, Any]:
    """From a symbol-keyed map (annotations), the values of the ``wanted`` keys (encoded key
    -> name to give it), the others skipped undecoded. ``wanted`` is a dict, not any mapping:
    compiled, each key is then looked up directly, not through a ``get`` method call."""
    count, item, stop = _map_bounds(data, pos)
    out: dict[str, Any] = {}
    for _ in range(count // 2):
        code = data[item]
        if code == 0xA3:
            key_end = item + 2 + data[item + 1]
            name = wanted.get(data[item + 2 : key_end])
        elif code == 0xB3:
            key_end = item + 5 + int.from_bytes(data[item + 1 : item + 5], "big")
            name = wanted.get(data[item + 5 : key_end])
        else:
            raise Unusual(f"offset {item}: a map key {code:#04x} that is not a symbol")
        if name is None:
            item = skip_at(data, key_end)
        else:
            out[name], item = DECODERS[data[key_end]](data, key_end + 1)
    if item != stop or count % 2:
        raise Unusual(
            f"offset {pos}: a map of {count} elements ending at {item}, its size at {stop}"
        )
    return out


def map_items(data: bytes, pos: int) -> tuple[int, bytes]:
    """A map's entry count (keys and values) and its entries' bytes, undecoded."""
    count, item, stop = _map_bounds(data, pos)
    return count, data[item:stop]


def _map_bounds(data: bytes, pos: int) -> tuple[int, int, int]:
    code = data[pos]
    if code == 0xC1:
        return data[pos + 2], pos + 3, pos + 2 + data[pos + 1]
    if code == 0xD1:
        count = int.from_bytes(data[pos + 5 : pos + 9], "big")
        return count, pos + 9, pos + 5 + int.from_bytes(data[pos + 1 : pos + 5], "big")
    raise Unusual(f"offset {pos}: {code:#04x} where a map belongs")


def _map_end(data: bytes, pos: int) -> int:
    return _map_bounds(data, pos)[2]
