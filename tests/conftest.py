"""Suite-wide settings: hypothesis profiles (CI runs many more examples), the
``processes`` fixture (child processes ended with their process groups), and ``--quick``
(the inner loop: only tests that need no other process, no JVM and no browser)."""

import gc
import os
import re
from collections import Counter
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from replication.gc_tuning import GC_THRESHOLDS, collect_garbage_for_throughput
from tests.processes import Processes

pytest_plugins = ["tests.cpu_report"]  # --cpu-report: wall and CPU seconds per test file

settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "dev", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# The cycle collector as the broker and the host run it (gc_tuning), from before collection:
# with the defaults it walked the young objects every 700 allocations, and the whole heap
# often, while each xdist worker imported and collected the suite (3.25 CPU s, tuned 2.0).
gc.set_threshold(*GC_THRESHOLDS)

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
STARTS_PROCESSES_MARK = "starts_processes"
"""The mark of a test whose code under test starts a process of its own (the local host's
function worker: ``HostConfig.worker_process``), which neither its fixtures nor its text say."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{STARTS_PROCESSES_MARK}: the code under test starts another process (the local "
        "host's function worker); --quick leaves the test out",
    )


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


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """--quick leaves out every test of a module that starts processes: such a module is not
    even imported (each xdist worker collects the whole suite, and would import it, with all
    it imports, for nothing)."""
    if (
        config.getoption("--quick")
        and collection_path.name.startswith("test_")
        and collection_path.suffix == ".py"
        and _starts_processes(collection_path)
    ):
        return True
    return None


LONGEST_FIRST = (
    "tests/spark/test_cluster.py",
    "tests/spark/test_datasource.py",
    "tests/host/test_settlement.py",
    "tests/tasks/test_replicate.py",
    "tests/broker/test_eventhubs_sdk.py",
    "tests/host/test_host_settlement.py",
    "tests/host/test_eventhubs_replication.py",
    "tests/tasks/test_pump_locks.py",
    "tests/spark/test_executors.py",
    "tests/spark/test_pipeline.py",
)
"""The files that take longest (a minute or more of one xdist worker, ``--cpu-report``),
handed out first; the others follow, most tests first (xdist's own order, which put these
files of few long tests last: the suite's tail). The JVM files two at a time, the second two
once the first short files are done: four Spark applications at once on 2 cores time out."""


def _file(item: pytest.Item) -> str:
    return item.nodeid.partition("::")[0]


def _longest_first(items: list[pytest.Item]) -> None:
    rank = {name: at for at, name in enumerate(LONGEST_FIRST)}
    counts = Counter(_file(item) for item in items)

    def order(item: pytest.Item) -> tuple[int, int]:
        file = _file(item)
        return (rank[file], 0) if file in rank else (len(rank), -counts[file])

    items.sort(key=order)  # stable: a file's tests stay in their order


def pytest_collection_finish(session: pytest.Session) -> None:
    """The collected suite (modules, items) is frozen out of the collector's walks, as a
    broker's or host's setup is (``collect_garbage_for_throughput``)."""
    collect_garbage_for_throughput()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _longest_first(items)
    if not config.getoption("--quick"):
        return
    kept, left_out = [], []
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        slow = (
            bool(fixtures & OTHER_PROCESSES)
            or _starts_processes(item.path)
            or item.get_closest_marker("slow") is not None
            or item.get_closest_marker(STARTS_PROCESSES_MARK) is not None
        )
        (left_out if slow else kept).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept
