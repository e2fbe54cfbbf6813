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


@pytest.fixture
def processes() -> Iterator[Processes]:
    """Starts child processes (``processes.start(argv, ...)``) and ends their whole process
    groups at teardown, whatever the test's outcome."""
    started = Processes()
    try:
        yield started
    finally:
        started.end_all()
