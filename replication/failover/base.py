"""What every resolver returns and raises: the current namespace host, and how it was found.

A resolver answers one question: which namespace is primary right now? It is blocking (a
DNS query, a file read, an HTTP GET); async callers run it in a thread. It caches what it
may (DNS by TTL, a file by modification time) and ``invalidate`` drops that cache, so a
caller that sees persistent errors asks the source of truth again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class FailoverError(Exception):
    """Resolution failed; the message names what was missing or who did not answer."""


@dataclass(frozen=True, slots=True)
class Resolution:
    host: str
    """The namespace host: lower case, no trailing dot, no scheme (``sb1.servicebus.windows.net``),
    or ``host:port`` when the source of truth gave a port."""
    chain: tuple[str, ...] = ()
    """How it was found, one human-readable line per step (``resolve`` prints these)."""
    ttl: float | None = None
    """Seconds the answer may be reused without asking again (None: until it changes)."""


class Resolver(Protocol):
    def resolve(self) -> Resolution:
        """The current namespace host (from cache while valid); raises ``FailoverError``."""
        ...

    def invalidate(self) -> None:
        """Forget any cached answer: the next ``resolve`` asks the source of truth."""
        ...

    def describe(self) -> str:
        """One line for logs: ``dns servicebus.test.example.com via 127.0.0.1:5353``."""
        ...
