"""Suite-wide settings: hypothesis profiles (CI runs many more examples), the
``processes`` fixture (child processes ended with their process groups), and ``--quick``
(the inner loop: only tests that need no other process, no JVM and no browser)."""

import os
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.processes import Processes

pytest_plugins = ["tests.cpu_report"]  # --cpu-report: wall and CPU seconds per test file

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


OTHER_PROCESSES = frozenset({"processes", "broker_process", "spark", "browser", "js_node"})
"""Fixtures that start another process: a broker or host, a JVM, Chromium, Node.js."""
STARTS_PROCESSES = re.compile(
    r"\bsubprocess\b|\bPopen\b|sys\.executable|\bpyspark\b|tests\.spark\.cluster"
)
"""What a module that starts a process (or a JVM: pyspark, the cluster) says."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick",
        action="store_true",
        help="the inner loop: leave out tests that start other processes (brokers, hosts, "
        "CLIs), a JVM (Spark) or a browser, and those marked slow (in-process, 10 s and more)",
    )


@cache
def _starts_processes(path: Path) -> bool:
    """A test module that runs something in another process itself (a CLI, a broker)."""
    return bool(STARTS_PROCESSES.search(path.read_text(encoding="utf-8")))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--quick"):
        return
    kept, left_out = [], []
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        slow = (
            bool(fixtures & OTHER_PROCESSES)
            or _starts_processes(item.path)
            or item.get_closest_marker("slow") is not None
        )
        (left_out if slow else kept).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept
