"""Which partition an event sent to an event hub (not to a partition) lands in.

Event Hubs hashes the partition key with Bob Jenkins' lookup3 (``hashlittle2``, both seeds
0) over its UTF-8 bytes, folds the two 32-bit results into a signed 16-bit value and takes
``abs(hash % partition_count)`` with .NET's remainder (the sign of the dividend). The .NET
and Java SDKs' partition resolvers mirror the service this way, so a key maps to the same
partition here as in Azure. (The Python SDK's buffered producer uses Python's ``%``, which
differs for negative hashes: it then picks another partition than the service would, but
it sends there explicitly, so per-key order holds either way.)

Events without a key go round-robin over the partitions.
"""

from __future__ import annotations

import itertools

_MASK = 0xFFFFFFFF


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _MASK


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    a = (a - c) & _MASK ^ _rot(c, 4)
    c = (c + b) & _MASK
    b = (b - a) & _MASK ^ _rot(a, 6)
    a = (a + c) & _MASK
    c = (c - b) & _MASK ^ _rot(b, 8)
    b = (b + a) & _MASK
    a = (a - c) & _MASK ^ _rot(c, 16)
    c = (c + b) & _MASK
    b = (b - a) & _MASK ^ _rot(a, 19)
    a = (a + c) & _MASK
    c = (c - b) & _MASK ^ _rot(b, 4)
    b = (b + a) & _MASK
    return a, b, c


def _final(a: int, b: int, c: int) -> tuple[int, int, int]:
    c = (c ^ b) - _rot(b, 14) & _MASK
    a = (a ^ c) - _rot(c, 11) & _MASK
    b = (b ^ a) - _rot(a, 25) & _MASK
    c = (c ^ b) - _rot(b, 16) & _MASK
    a = (a ^ c) - _rot(c, 4) & _MASK
    b = (b ^ a) - _rot(a, 14) & _MASK
    c = (c ^ b) - _rot(b, 24) & _MASK
    return a, b, c


def lookup3(data: bytes, seed1: int = 0, seed2: int = 0) -> tuple[int, int]:
    """``hashlittle2``: the primary and secondary 32-bit hashes of ``data``."""
    a = b = c = (0xDEADBEEF + len(data) + seed1) & _MASK
    c = (c + seed2) & _MASK
    rest = data
    while len(rest) > 12:
        a = (a + int.from_bytes(rest[0:4], "little")) & _MASK
        b = (b + int.from_bytes(rest[4:8], "little")) & _MASK
        c = (c + int.from_bytes(rest[8:12], "little")) & _MASK
        a, b, c = _mix(a, b, c)
        rest = rest[12:]
    if not rest:
        return c, b
    tail = rest.ljust(12, b"\x00")  # the last block, zero-padded, as hashlittle2 reads it
    a = (a + int.from_bytes(tail[0:4], "little")) & _MASK
    b = (b + int.from_bytes(tail[4:8], "little")) & _MASK
    c = (c + int.from_bytes(tail[8:12], "little")) & _MASK
    a, b, c = _final(a, b, c)
    return c, b


def hash_code(partition_key: str) -> int:
    """The service's signed 16-bit hash of a partition key."""
    first, second = lookup3(partition_key.encode("utf-8"))
    folded = (first ^ second) & 0xFFFF
    return folded - 0x10000 if folded & 0x8000 else folded


def partition_for_key(partition_key: str, partition_count: int) -> int:
    """The partition index an event with this key goes to."""
    value = hash_code(partition_key)
    return abs(value) % partition_count  # .NET's %: the sign of the dividend, then Abs


class RoundRobin:
    """Partition indexes in turn, for events sent without a key."""

    def __init__(self, partition_count: int) -> None:
        self._next = itertools.cycle(range(partition_count))

    def next(self) -> int:
        return next(self._next)
