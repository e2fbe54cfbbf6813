"""``validate`` warns when a pipeline that can dead-letter is deployed with batch settlement."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.broker.conftest import REPO_ROOT

PIPELINES = """\
pipelines:
  - name: checked
    source: {connection: Bus, queue: in}
    steps:
      - validate: {json_schema: {type: object}}
    target: {connection: Bus, queue: out}
"""
BATCH_SETTLED_APP = """\
import azure.functions as func

app = func.FunctionApp()


@app.service_bus_queue_trigger(arg_name="messages", queue_name="in", connection="Bus",
                               cardinality="many")
def checked(messages: list[func.ServiceBusMessage]) -> None:
    pass

"""


def validate(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replication", "validate", str(folder / "pipelines.yaml")],
        capture_output=True, text=True, cwd=folder, timeout=120,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


@pytest.fixture
def app_folder(tmp_path: Path) -> Path:
    (tmp_path / "pipelines.yaml").write_text(PIPELINES)
    for name in ("function_app.py", "host.json", "requirements.txt"):
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    return tmp_path


def test_the_generated_functions_settle_per_message_no_warning(app_folder: Path) -> None:
    result = validate(app_folder)
    assert result.returncode == 0, result.stderr
    assert "warning:" not in result.stderr


def test_a_batch_settled_function_is_warned_about(app_folder: Path) -> None:
    (app_folder / "function_app.py").write_text(BATCH_SETTLED_APP)
    result = validate(app_folder)
    assert result.returncode == 0, result.stderr
    assert "function checked settles its batch as a whole" in result.stderr
    assert "can dead-letter (step validate)" in result.stderr


def test_requirements_without_the_extension_are_warned_about(app_folder: Path) -> None:
    requirements = app_folder / "requirements.txt"
    lines = requirements.read_text().splitlines()
    requirements.write_text("\n".join(x for x in lines if "bindings-servicebus" not in x))
    result = validate(app_folder)
    assert "azurefunctions-extensions-bindings-servicebus is not listed" in result.stderr


def test_an_error_target_takes_the_risk_away(app_folder: Path) -> None:
    (app_folder / "function_app.py").write_text(BATCH_SETTLED_APP)
    (app_folder / "pipelines.yaml").write_text(
        PIPELINES + "    error_target: {connection: Bus, queue: errors}\n"
    )
    result = validate(app_folder)
    assert result.returncode == 0, result.stderr
    assert "warning:" not in result.stderr
