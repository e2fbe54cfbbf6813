"""Suite-wide settings: hypothesis profiles (CI runs many more examples), and the
``processes`` fixture (child processes ended with their process groups)."""

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.processes import Processes

settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "dev", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# The Functions Service Bus binding's settlement client runs gRPC threads in the xdist worker
# that ran a host test; pyspark then forks its JVM launcher with a preexec_fn, and gRPC's fork
# handlers made that launch fail now and then (JAVA_GATEWAY_EXITED, "Other threads are
# currently calling into gRPC, skipping fork() handlers"). Fork+exec needs none of them.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")


@pytest.fixture
def processes() -> Iterator[Processes]:
    """Starts child processes (``processes.start(argv, ...)``) and ends their whole process
    groups at teardown, whatever the test's outcome."""
    started = Processes()
    try:
        yield started
    finally:
        started.end_all()
