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


FILE_SECONDS = Path(__file__).with_name("file_seconds.txt")
"""Wall seconds per test file in a whole run on 2 cores (``--cpu-report tests/file_seconds.txt``
writes it; refresh it when files come or change much): the order files are handed out in."""
GUESS = {2: 300.0, 1: 60.0, 0: 10.0}
"""Seconds for a file not in FILE_SECONDS, by its weight."""


@cache
def _recorded_seconds() -> dict[str, float]:
    lines = FILE_SECONDS.read_text(encoding="utf-8").splitlines() if FILE_SECONDS.exists() else []
    rows = (line.split(None, 4) for line in lines[2:])  # a header, then "(all)"
    return {row[4]: float(row[0]) for row in rows if len(row) == 5}


def _weight(item: pytest.Item) -> int:
    """How long a test keeps its worker, roughly: 2 a JVM (Spark), 1 another process (a broker,
    a host, a CLI, a browser), 0 neither."""
    fixtures = set(getattr(item, "fixturenames", ()))
    if "spark" in fixtures or item.get_closest_marker("cluster") is not None:
        return 2
    return int(bool(fixtures & OTHER_PROCESSES) or _starts_processes(item.path))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--quick"):
        kept, left_out = [], []
        for item in items:
            slow = _weight(item) > 0 or item.get_closest_marker("slow") is not None
            (left_out if slow else kept).append(item)
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = kept
    # The longest files first: xdist (--dist loadfile --no-loadscope-reorder, as dev.py runs
    # it) hands out files in this order, so no worker starts a long one when the rest are done.
    recorded, seconds = _recorded_seconds(), {}
    for item in items:
        path = item.nodeid.split("::")[0]
        if path not in seconds:
            seconds[path] = recorded.get(path, GUESS[_weight(item)])
    items.sort(key=lambda item: -seconds[item.nodeid.split("::")[0]])  # stable within a file
