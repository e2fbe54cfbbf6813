"""A fixed namespace: for tests and for setups that fail over by redeploying."""

from __future__ import annotations

from .base import Resolution
from .hosts import normalise_host


class StaticResolver:
    def __init__(self, host: str) -> None:
        self.host = normalise_host(host)

    def resolve(self) -> Resolution:
        return Resolution(self.host, (f"static {self.host}",))

    def invalidate(self) -> None:
        pass

    def describe(self) -> str:
        return f"static {self.host}"
