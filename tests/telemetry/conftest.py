"""Telemetry tests share the broker fixtures (a real broker on a free port)."""

from tests.broker.conftest import (  # noqa: F401  (fixtures, found by name)
    broker,
    broker_factory,
)
