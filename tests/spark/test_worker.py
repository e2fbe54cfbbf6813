"""What a Spark Python worker sets up once, in a fresh interpreter as Spark starts one."""

from __future__ import annotations

import subprocess
import sys

from replication.gc_tuning import GC_THRESHOLDS
from tests.broker.conftest import REPO_ROOT


def test_a_python_worker_tunes_its_cycle_collector_before_its_first_task() -> None:
    """In a fresh interpreter, as a Spark Python worker starts: the first ``run_async``
    freezes what is imported and sets ``GC_THRESHOLDS`` (``gc_tuning``)."""
    code = (
        "import asyncio, gc\n"
        "from replication.spark.worker import run_async\n"
        "before = gc.get_threshold()\n"
        "run_async(asyncio.sleep(0))\n"
        "print(before, gc.get_threshold(), gc.get_freeze_count() > 1000)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=60, check=True)  # fmt: skip
    assert done.stdout.split("\n")[0] == f"(700, 10, 10) {GC_THRESHOLDS} True"
