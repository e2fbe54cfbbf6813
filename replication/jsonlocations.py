"""Where each value of a JSON document starts: line numbers for config errors.

The standard library's parser keeps no positions. A small walk over text that has already
parsed cleanly recovers the offset of every property and array item by path (and the
duplicate property names ``json`` silently collapses), so the broker's Config.json and the
pipeline files can both report ``file:line: path: reason``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

Loc = tuple[str | int, ...]
_WHITESPACE = re.compile(r"[ \t\n\r]*")


@dataclass(slots=True)
class JsonLocations:
    text: str
    offsets: dict[Loc, int] = field(default_factory=dict)
    """Path -> offset of the value (for a property: of its name)."""
    duplicates: list[tuple[Loc, int]] = field(default_factory=list)

    def line_column(self, offset: int) -> tuple[int, int]:
        return line_column(self.text, offset)


def line_column(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def json_locations(text: str) -> JsonLocations:
    """Offsets of every value in ``text`` (which must be valid JSON)."""
    result = JsonLocations(text)
    decoder = json.JSONDecoder()
    scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]  # not in typeshed

    def skip(i: int) -> int:
        match = _WHITESPACE.match(text, i)
        return match.end() if match else i

    def value(i: int, loc: Loc) -> int:
        i = skip(i)
        result.offsets.setdefault(loc, i)
        if text[i] == "{":
            i = skip(i + 1)
            if text[i] == "}":
                return i + 1
            seen: set[str] = set()
            while True:
                i = skip(i)
                key, end = scanstring(text, i + 1)
                member = (*loc, key)
                if key in seen:
                    result.duplicates.append((member, i))
                else:
                    result.offsets[member] = i
                seen.add(key)
                i = skip(value(skip(end) + 1, member))  # past the ':'
                if text[i] == "}":
                    return i + 1
                i += 1  # ','
        if text[i] == "[":
            i = skip(i + 1)
            if text[i] == "]":
                return i + 1
            index = 0
            while True:
                i = skip(value(i, (*loc, index)))
                index += 1
                if text[i] == "]":
                    return i + 1
                i += 1  # ','
        return decoder.raw_decode(text, i)[1]

    value(0, ())
    return result
