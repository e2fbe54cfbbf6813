"""``--cpu-report``: where the suite waits. Each test phase's CPU seconds (the worker process,
its threads, and the children it reaped: brokers, hosts, JVMs) beside its wall seconds, summed
per test file at the end of the run, slowest files first; a file whose CPU is a small part of
its wall time is waiting (on sleeps, polls, timeouts, other processes), not working.

Works under xdist: the workers measure, the figures travel in the reports' user_properties."""

from __future__ import annotations

import resource
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

KEY = "cpu_seconds"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-report",
        metavar="FILE",
        default=None,
        help="per test file: wall and CPU seconds (with reaped child processes), written to "
        "FILE and summed in the terminal summary",
    )


def _cpu() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _measured(item: pytest.Item) -> Iterator[None]:
    if not item.config.getoption("--cpu-report"):
        yield
        return
    start = _cpu()
    yield
    item.user_properties.append((KEY, _cpu() - start))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _measured(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _measured(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield from _measured(item)


class _Totals:
    """Per test file: wall and CPU seconds, and how many tests (a plugin of the controller)."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.tests: dict[str, int] = defaultdict(int)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        cpus = [float(str(value)) for key, value in report.user_properties if key == KEY]
        if not cpus:
            return
        path = report.nodeid.split("::")[0]
        self.wall[path] += report.duration
        self.cpu[path] += cpus[-1]  # the phase's own figure: user_properties accumulate
        if report.when == "call":
            self.tests[path] += 1

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        lines = self.table()
        self.target.write_text("\n".join(lines) + "\n")
        terminalreporter.write_sep("=", f"wall and CPU seconds per test file ({self.target})")
        for line in lines[:32]:
            terminalreporter.write_line(line)

    def table(self) -> list[str]:
        wall_all, cpu_all = sum(self.wall.values()), sum(self.cpu.values())
        lines = [
            f"{'wall s':>8} {'cpu s':>8} {'cpu%':>5} {'tests':>5}  file",
            f"{wall_all:8.1f} {cpu_all:8.1f} {_share(cpu_all, wall_all):>5} "
            f"{sum(self.tests.values()):5d}  (all)",
        ]
        for path in sorted(self.wall, key=self.wall.__getitem__, reverse=True):
            wall, cpu = self.wall[path], self.cpu[path]
            lines.append(
                f"{wall:8.1f} {cpu:8.1f} {_share(cpu, wall):>5} {self.tests[path]:5d}  {path}"
            )
        return lines


def _share(cpu: float, wall: float) -> str:
    return f"{100 * cpu / wall:.0f}" if wall > 0 else "-"


def pytest_configure(config: pytest.Config) -> None:
    target = config.getoption("--cpu-report")
    if target and not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        config.pluginmanager.register(_Totals(Path(target)), "cpu-report-totals")
