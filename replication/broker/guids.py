"""Random GUIDs for what the broker names: message lock tokens and the message-ids it gives
messages sent without one.

Both are taken for every message, and ``uuid.uuid4()`` costs a system call plus
``UUID.__init__``'s checks each time; here the randomness comes from ``os.urandom`` 512
GUIDs at a time (a forked child starts a pool of its own, so it never repeats its parent's).
"""

from __future__ import annotations

import os
import uuid
from typing import Final

_BATCH: Final = 512
_VERSION_CLEAR: Final = ~((0xF000 << 64) | (0xC000 << 48))
_VERSION_4: Final = (0x4000 << 64) | (0x8000 << 48)
"""Version 4 and the RFC 4122 variant, as ``uuid.uuid4()`` sets them."""
_UNKNOWN: Final = uuid.SafeUUID.unknown  # an enum member: looked up once, not per token


class RandomGuids:
    def __init__(self) -> None:
        self._pool = b""
        self._at = 0
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._pool, self._at = b"", 0

    def _next_int(self) -> int:
        at = self._at
        if at >= len(self._pool):
            self._pool, at = os.urandom(16 * _BATCH), 0
        self._at = at + 16
        return int.from_bytes(self._pool[at : at + 16]) & _VERSION_CLEAR | _VERSION_4

    def uuid(self) -> uuid.UUID:
        """A random (version 4) ``UUID``."""
        guid = object.__new__(uuid.UUID)  # what UUID(int=...) stores, without its checks
        object.__setattr__(guid, "int", self._next_int())
        object.__setattr__(guid, "is_safe", _UNKNOWN)
        return guid

    def hex(self) -> str:
        """A random GUID as 32 hex digits, no dashes (``uuid.uuid4().hex``)."""
        return self._next_int().to_bytes(16, "big").hex()  # a third of what format() costs


GUIDS = RandomGuids()


def guid_bytes(guid: uuid.UUID) -> bytes:
    """``guid.bytes``, compiled: ``UUID``'s properties are plain Python, and a lock token's
    bytes go out with every delivery, twice (issue 42)."""
    return int(guid.int).to_bytes(16, "big")


def guid_bytes_le(guid: uuid.UUID) -> bytes:
    """``guid.bytes_le`` (the first three fields little-endian), compiled: the delivery tag
    of a locked message."""
    raw = int(guid.int).to_bytes(16, "big")
    return raw[3::-1] + raw[5:3:-1] + raw[7:5:-1] + raw[8:]
