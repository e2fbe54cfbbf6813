"""docs/pipeline-reference.md is what ``python -m replication schema --markdown`` generates
from the models, and names every step, endpoint field and failover option."""

from __future__ import annotations

import subprocess
import sys

from replication.pipeline import json_schema
from replication.pipeline.reference import markdown_reference
from replication.tasks import registry
from tests.broker.conftest import REPO_ROOT

DOC = REPO_ROOT / "docs" / "pipeline-reference.md"


def test_the_committed_reference_is_the_generated_one() -> None:
    generated = markdown_reference(json_schema())
    assert DOC.read_text(encoding="utf-8") == generated, (
        "docs/pipeline-reference.md is stale: python -m replication schema --markdown "
        "-o docs/pipeline-reference.md"
    )


def test_the_reference_covers_every_step_and_field() -> None:
    text = markdown_reference(json_schema())
    for name in registry.names():
        if name != "route":  # routes are the pipeline's `routes`, not a step
            assert f"### Step `{name}`" in text, name
    for field in ("connection", "subscription", "sessions", "failover", "loop_guard",
                  "recheck_interval", "nameserver", "route_mode", "error_target"):  # fmt: skip
        assert f"| `{field}` |" in text, field
    assert "Exactly one of `source`, `sources`." in text
    assert "[Endpoint](#endpoint)" in text and "\n## Endpoint\n" in text


def test_the_command_prints_it() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "replication", "schema", "--markdown"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=60,
    )  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == DOC.read_text(encoding="utf-8")
