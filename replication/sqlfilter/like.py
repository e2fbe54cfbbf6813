"""``LIKE`` patterns: ``%`` is any run of characters, ``_`` any one, the escape makes the next
character literal. Patterns become plain string tests where they can (``'ord%'`` is a
``startswith``), a regular expression otherwise; both are cached, patterns repeat."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

_ANY = object()
_ONE = object()


def _parts(pattern: str, escape: str | None) -> list[object]:
    """Literal runs (str) and ``_ANY`` / ``_ONE`` markers; ValueError on a trailing escape."""
    parts: list[object] = []
    literal: list[str] = []
    i = 0
    n = len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == escape:
            if i + 1 >= n:
                raise ValueError("the pattern ends with its escape character")
            literal.append(pattern[i + 1])
            i += 2
            continue
        if ch == "%" or ch == "_":
            if literal:
                parts.append("".join(literal))
                literal = []
            if ch == "_":
                parts.append(_ONE)
            elif not parts or parts[-1] is not _ANY:
                parts.append(_ANY)
        else:
            literal.append(ch)
        i += 1
    if literal:
        parts.append("".join(literal))
    return parts


def check_pattern(pattern: str, escape: str | None) -> str | None:
    """Why ``pattern`` cannot be used, or None if it can."""
    try:
        _parts(pattern, escape)
    except ValueError as exc:
        return str(exc)
    return None


@lru_cache(maxsize=1024)
def like_matcher(pattern: str, escape: str | None) -> Callable[[str], bool]:
    """A test of whole strings against ``pattern`` (case-sensitive, like ``=``)."""
    parts = _parts(pattern, escape)
    if not parts:
        return lambda s: s == ""
    if all(isinstance(p, str) for p in parts):
        text = parts[0]
        return lambda s: s == text
    if len(parts) == 1 and parts[0] is _ANY:
        return lambda s: True
    if len(parts) == 2 and isinstance(parts[0], str) and parts[1] is _ANY:
        prefix = parts[0]
        return lambda s: s.startswith(prefix)
    if len(parts) == 2 and parts[0] is _ANY and isinstance(parts[1], str):
        suffix = parts[1]
        return lambda s: s.endswith(suffix)
    if len(parts) == 3 and parts[0] is _ANY and parts[2] is _ANY and isinstance(parts[1], str):
        middle = parts[1]
        return lambda s: middle in s
    regex = "".join(".*" if p is _ANY else "." if p is _ONE else re.escape(str(p)) for p in parts)
    fullmatch = re.compile(regex, re.DOTALL).fullmatch
    return lambda s: fullmatch(s) is not None
