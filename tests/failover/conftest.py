"""Failover tests: a seeded in-process DNS server, and the broker fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.broker.conftest import (  # noqa: F401  (fixtures, found by name)
    broker,
    broker_factory,
    pytest_configure,
)

from .dns_server import DnsServer, seed_zone


@pytest.fixture
def dns_server() -> Iterator[DnsServer]:
    """A running DNS server on a random 127.0.0.1 port with the guidance's zones."""
    with DnsServer() as server:
        yield seed_zone(server)
