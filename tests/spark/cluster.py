"""A Spark standalone cluster made of real processes, as a user would start one: a master
and workers through the ``spark-class`` that pyspark ships, the project's wheel, and
``spark-submit ... spark_submit.py``. Used by ``test_cluster.py`` and ``bench/spark.py``.

Every process is started in a session of its own (its own process group); ``kill_tree``
collects a process's descendants first (pyspark's worker daemon makes a process group of
its own, and children outlive a killed parent) and then SIGKILLs every group and process
among them, so nothing is left running whatever the outcome.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pyspark

REPO_ROOT = Path(__file__).resolve().parents[2]
SPARK_BIN = Path(pyspark.__file__).resolve().parent / "bin"
HOST = "127.0.0.1"
MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")


def children_map() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc."""
    tree: dict[int, list[int]] = {}
    for path in Path("/proc").iterdir():
        entry = path.name
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(parent, []).append(int(entry))
    return tree


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (those alive now)."""
    tree, found, todo = children_map(), [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(tree.get(current, []))
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def kill_tree(pid: int) -> None:
    """SIGKILLs ``pid``, its descendants and their process groups (never the caller's)."""
    pids = process_tree(pid)
    own = os.getpgid(0)
    groups = set()
    for member in pids:
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(member))
    for group in groups - {own}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    for member in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds the processes used so far (/proc/PID/stat)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def spark_env(work: Path, **more: str) -> dict[str, str]:
    """The environment of every Spark process here: loopback only, an empty conf folder,
    logs and scratch space under ``work``, this interpreter for the Python workers."""
    conf = work / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "spark-defaults.conf").write_text("spark.master.rest.enabled false\n")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # what a user has: the wheel, not this checkout
    env.update(
        SPARK_LOCAL_IP=HOST, SPARK_CONF_DIR=str(conf), SPARK_LOG_DIR=str(work / "logs"),
        SPARK_LOCAL_DIRS=str(work / "scratch"), PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable, **more,
    )  # fmt: skip
    return env


class Process:
    """A process in its own session, its output in a log file."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str], cwd: Path) -> None:
        self.args, self.log = args, log
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            self.popen = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                start_new_session=True,
            )  # fmt: skip

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for(self, pattern: str | re.Pattern[str], timeout: float = 120.0) -> re.Match[str]:
        """The first match of ``pattern`` in the log; fails if the process ends first."""
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, self.output())
            if found:
                return found
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.args[0]} ended ({self.popen.returncode}) before "
                                   f"{pattern!r}:\n{self.output()[-3000:]}")  # fmt: skip
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {pattern!r} in {self.log}:\n{self.output()[-3000:]}")
            time.sleep(0.1)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)

    def kill(self) -> None:
        """SIGKILL to the whole tree; reaped."""
        kill_tree(self.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL is not refused
            self.popen.wait(10)


class StandaloneCluster:
    """A master and ``workers`` workers of ``cores`` cores each (``spark-class``), on
    loopback, their ports chosen by the OS (``env`` adds to ``spark_env``'s). ``close``
    kills them all."""

    def __init__(
        self,
        work: Path,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1G",
        env: dict[str, str] | None = None,
    ) -> None:
        self.work = work
        self.env = spark_env(work, **(env or {}))  # the executors inherit the workers' env
        self.processes: list[Process] = []
        self.workers: list[Process] = []
        try:
            self.master = self._spawn("master", ["org.apache.spark.deploy.master.Master",
                                                 "--host", HOST, "--port", "0",
                                                 "--webui-port", "0"])  # fmt: skip
            self.url = self.master.wait_for(MASTER_URL).group(1)
            self.master.wait_for("elected leader")
            for index in range(workers):
                folder = work / f"worker-{index}"
                folder.mkdir(parents=True, exist_ok=True)
                self.workers.append(self._spawn(f"worker-{index}", [
                    "org.apache.spark.deploy.worker.Worker", "--host", HOST, "--cores",
                    str(cores), "--memory", memory, "--webui-port", "0", "--work-dir",
                    str(folder), self.url,
                ]))  # fmt: skip
            for worker in self.workers:
                worker.wait_for("Successfully registered with master")
        except BaseException:
            self.close()
            raise

    def _spawn(self, name: str, args: list[str]) -> Process:
        process = Process([str(SPARK_BIN / "spark-class"), *args], self.work / f"{name}.log",
                          self.env, self.work)  # fmt: skip
        self.processes.append(process)
        return process

    def python_workers(self) -> list[int]:
        """Pids of the Python processes under the workers (executors' pyspark daemons and
        the Python workers they forked)."""
        return [
            pid
            for worker in self.workers
            for pid in process_tree(worker.pid)
            if "python" in Path(cmdline(pid).split(" ", 1)[0]).name
        ]

    def close(self) -> None:
        for process in reversed(self.processes):
            process.kill()

    def __enter__(self) -> StandaloneCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def build_wheel(dest: Path) -> Path:
    """The project's wheel (``pip wheel --no-deps``), built from a copy of this checkout's
    package so that the build leaves nothing in the tree (about a second)."""
    source = dest / "src"
    shutil.copytree(REPO_ROOT / "replication", source / "replication",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-q", str(source), "-w", str(dest / "dist")],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = (dest / "dist").glob("replication-*.whl")
    return wheel


def submit(
    master: str, wheel: Path, folder: Path, log: Path, *args: str,
    conf: dict[str, str] | None = None, pipeline: str = "copy", py_files: Iterable[Path] = (),
    env: dict[str, str] | None = None,
) -> Process:  # fmt: skip
    """``spark-submit --master MASTER --py-files WHEEL[,PY_FILES] spark_submit.py --pipeline
    PIPELINE --dir FOLDER --no-brokers ARGS`` in its own session (the driver runs this
    interpreter; ``env`` adds to ``spark_env``'s)."""
    options = {"spark.ui.enabled": "false", "spark.driver.host": HOST, **(conf or {})}
    shipped = ",".join(str(path) for path in (wheel, *py_files))
    command = [str(SPARK_BIN / "spark-submit"), "--master", master, "--py-files", shipped]
    for key, value in options.items():
        command += ["--conf", f"{key}={value}"]
    command += [str(REPO_ROOT / "spark_submit.py"), "--pipeline", pipeline, "--dir", str(folder),
                "--no-brokers", *args]  # fmt: skip
    return Process(command, log, spark_env(folder / "spark", **(env or {})), folder)


def socket_owner(local_port: int, remote_port: int, pids: Iterable[int]) -> int | None:
    """Which of ``pids`` holds the TCP connection from ``local_port`` to ``remote_port``."""
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote = fields[1], fields[2]
            if (int(local.rsplit(":", 1)[1], 16) == local_port
                    and int(remote.rsplit(":", 1)[1], 16) == remote_port):  # fmt: skip
                inode = fields[9]
    if inode is None:
        return None
    wanted = f"socket:[{inode}]"
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                if str(fd.readlink()) == wanted:
                    return pid
        except OSError:
            continue
    return None
