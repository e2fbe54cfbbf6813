"""Settings resolution: what a pipeline's connection names hold in the app settings.

A pipeline names app settings (``connection: PrimaryServiceBus``), as Functions bindings do;
the values (connection strings, or ``<name>__fullyQualifiedNamespace`` for an identity-based
source) are read when checking with settings and when building.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TypeVar, overload

from ..configproblems import did_you_mean
from ..servicebus.connection_string import namespace_of
from .spec import Endpoint

T = TypeVar("T")

FQNS_SUFFIX = "__fullyQualifiedNamespace"
"""``<connection>__fullyQualifiedNamespace``: an identity-based connection, as Functions
bindings read it (sources only: targets are sent to with a connection string)."""

SETTING_CUTOFF = 0.8
"""Setting names share words ('PrimaryServiceBus', 'SecondaryServiceBus'): suggest only a
very near miss, never another real connection."""


def resolve_connection(settings: Mapping[str, str], name: str, *, role: str) -> str:
    """The connection string in setting ``name``; ``fqns`` for an identity-based source
    connection; ``!missing`` or ``!not-a-connection-string`` (see ``missing_reason``)."""
    value = settings.get(name)
    if not value:
        if role == "source" and settings.get(name + FQNS_SUFFIX):
            return "fqns"
        return "!missing"
    try:
        namespace_of(value)
    except ValueError:
        return "!not-a-connection-string"
    return value


def setting_namespace(settings: Mapping[str, str], name: str) -> str:
    """The namespace host the connection ``name`` points at (empty when not set)."""
    value = settings.get(name)
    if value:
        return namespace_of(value)
    return str(settings.get(name + FQNS_SUFFIX, "")).strip().strip("/").lower()


def missing_reason(resolved: str, endpoint: Endpoint, settings: Mapping[str, str]) -> str:
    """Why ``resolve_connection`` found no connection string, in words."""
    name = endpoint.connection
    if resolved == "!not-a-connection-string":
        service = "an Event Hubs" if endpoint.is_event_hub else "a Service Bus"
        return f"setting {name!r} does not hold {service} connection string (no 'Endpoint=')"
    return f"setting {name!r} is not set{did_you_mean(name, list(settings), SETTING_CUTOFF)}"


class RecordingSettings(Mapping[str, str]):
    """Settings that remember which names were asked for but missing."""

    def __init__(self, base: Mapping[str, str]) -> None:
        self.base = base
        self.missing: set[str] = set()

    def __getitem__(self, key: str) -> str:
        try:
            return self.base[key]
        except KeyError:
            self.missing.add(key)
            raise

    @overload
    def get(self, key: str, /) -> str | None: ...
    @overload
    def get(self, key: str, /, default: str | T) -> str | T: ...
    def get(self, key: str, /, default: object = None) -> object:
        value = self.base.get(key)
        if not value:
            self.missing.add(key)
            return default
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self.base)

    def __len__(self) -> int:
        return len(self.base)
