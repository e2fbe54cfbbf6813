"""`python -m replication validate`: a line per pipeline and exit 0, or the problems and 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .conftest import PRIMARY, REPO_ROOT, SECONDARY


def validate(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replication", "validate", *args],
        capture_output=True, text=True, cwd=cwd, timeout=120,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def test_validate_the_sample_by_default() -> None:
    result = validate()
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "orders-to-secondary: queue orders (PrimaryServiceBus, sessions) -> queue orders "
        "(SecondaryServiceBus) [function orders_to_secondary]"
    )
    assert lines[1].startswith("telemetry-to-json: queue telemetry-avro (PrimaryServiceBus) -> ")
    assert lines[-1] == "pipelines.yaml: 6 pipelines OK"
    assert len(lines) == 7
    assert result.stderr == ""


def test_validate_a_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "pipelines:\n"
        "  - name: orders\n"
        "    source: {connection: PrimaryServiceBus, queue: orders}\n"
        "    steps: [{transcod: {from: json, to: json}}]\n"
        "    target: {connection: SecondaryServiceBus, queue: orders, sessions: true}\n"
    )
    result = validate(str(bad))
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"{bad}:4:14: pipelines[0].steps[0].transcod: unknown step 'transcod' (did you mean "
        "'transcode'?)",
        f"{bad}:5:62: pipelines[0].target.sessions: 'sessions' is for sources (it makes the "
        "trigger read sessions); a target keeps each message's session id",
        f"{bad}: 2 problems",
    ]


def test_validate_against_local_settings(tmp_path: Path) -> None:
    settings = tmp_path / "local.settings.json"
    settings.write_text(
        json.dumps({"IsEncrypted": False, "Values": {"PrimaryServiceBus": PRIMARY}})
    )
    pipelines = str(REPO_ROOT / "pipelines.yaml")
    result = validate(pipelines, "--settings", str(settings))
    assert result.returncode == 1
    assert "pipelines[0].target.connection: setting 'SecondaryServiceBus' is not set" in (
        result.stderr
    )
    values = {"PrimaryServiceBus": PRIMARY, "SecondaryServiceBus": SECONDARY}
    values["SecondaryEventHubs"] = SECONDARY
    settings.write_text(json.dumps({"Values": values}))
    assert validate(pipelines, "--settings", str(settings)).returncode == 0


def test_validate_a_missing_file(tmp_path: Path) -> None:
    result = validate(cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.splitlines()[0] == (
        "pipelines.yaml: cannot read the file: No such file or directory"
    )


def test_the_existing_commands_are_still_there() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "replication", "--help"], capture_output=True, text=True,
        cwd=REPO_ROOT, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0
    for command in ("start", "broker", "validate", "schema", "test"):
        assert command in result.stdout
