"""Drill tests use the broker fixtures (brokers on ports from the OS)."""

from tests.broker.conftest import (  # noqa: F401  (fixtures, found by name)
    broker_factory,
    broker_process,
    pytest_configure,
)
