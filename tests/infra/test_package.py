"""``python -m replication package``: the zip a Functions deployment sends, unpacked into a
clean folder where function_app.py imports and registers its functions from the zip's own
code; what .funcignore leaves out stays out; a broken app is refused before it ships."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.infra.support import ROOT


def package(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replication", "package", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def test_the_package_unpacks_into_an_app_that_imports(tmp_path: Path) -> None:
    result = package("--out", str(tmp_path / "dist"))
    assert result.returncode == 0, result.stderr
    archive = tmp_path / "dist" / "functionapp.zip"
    assert str(archive) in result.stdout
    with zipfile.ZipFile(archive) as zipped:
        names = set(zipped.namelist())
        zipped.extractall(tmp_path / "app")
    assert {
        "function_app.py",
        "host.json",
        "requirements.txt",
        "pipelines.yaml",
        "replication/__init__.py",
        "replication/pipeline/model.py",
    } <= names
    for left_out in (
        ".venv/",
        "tests/",
        "bench/",
        "infra/",
        "local.settings",
        "__pycache__",
        ".pyc",
        "replication/spark/",
        ".git/",
        "pipelines_test.yaml",
        ".mypy_cache/",
        "test-artifacts/",
    ):
        assert not [n for n in names if left_out in n], left_out
    assert ".git" not in names  # a worktree's .git is a file
    probe = (
        "import json, pathlib, function_app, replication\n"
        "functions = [f.get_function_name() for f in function_app.app.get_functions()]\n"
        "print(json.dumps({'replication': replication.__file__, 'functions': functions}))\n"
    )
    # the app's own folder first, as in the Functions worker; the venv gives the packages
    ran = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=tmp_path / "app",
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    found = json.loads(ran.stdout.splitlines()[-1])
    assert Path(found["replication"]).is_relative_to(tmp_path / "app")  # not the checkout's
    assert "orders_to_secondary" in " ".join(found["functions"]).replace("-", "_")


def test_the_same_sources_give_the_same_zip(tmp_path: Path) -> None:
    assert package("--out", str(tmp_path / "a")).returncode == 0
    assert package("--out", str(tmp_path / "b")).returncode == 0
    first = (tmp_path / "a" / "functionapp.zip").read_bytes()
    assert first == (tmp_path / "b" / "functionapp.zip").read_bytes()


def small_app(folder: Path, pipelines: str) -> Path:
    folder.mkdir()
    for name in ("function_app.py", "host.json", "requirements.txt", ".funcignore"):
        shutil.copy(ROOT / name, folder / name)
    (folder / "replication").mkdir()
    (folder / "replication" / "__init__.py").write_text("")
    (folder / "pipelines.yaml").write_text(pipelines)
    return folder


SCHEMA_STEP = """\
pipelines:
  - name: checked
    source: {connection: Primary, queue: a}
    steps:
      - validate: {json_schema_file: schemas/order.json}
    target: {connection: Secondary, queue: b}
"""


def test_a_file_the_pipelines_name_must_be_in_the_package(tmp_path: Path) -> None:
    app = small_app(tmp_path / "app", SCHEMA_STEP)
    (app / "schemas").mkdir()
    (app / "schemas" / "order.json").write_text('{"type": "object"}')
    (app / ".funcignore").write_text((app / ".funcignore").read_text() + "schemas/\n")
    refused = package("--dir", str(app), "--out", str(tmp_path / "out"))
    assert refused.returncode == 2
    assert "pipelines.yaml names schemas/order.json, which is not in the package" in (
        refused.stderr
    )
    assert not (tmp_path / "out" / "functionapp.zip").exists()
    (app / ".funcignore").write_text((ROOT / ".funcignore").read_text())
    assert package("--dir", str(app), "--out", str(tmp_path / "out")).returncode == 0
    with zipfile.ZipFile(tmp_path / "out" / "functionapp.zip") as zipped:
        assert "schemas/order.json" in zipped.namelist()


def test_a_broken_pipeline_file_or_a_missing_file_is_refused(tmp_path: Path) -> None:
    app = small_app(tmp_path / "app", "pipelines:\n  - name: x\n")
    refused = package("--dir", str(app), "--out", str(tmp_path / "out"))
    assert refused.returncode == 2 and "pipelines.yaml" in refused.stderr
    (app / "pipelines.yaml").write_text(SCHEMA_STEP.replace("schemas/order.json", "none.json"))
    (app / "host.json").unlink()
    refused = package("--dir", str(app), "--out", str(tmp_path / "out"))
    assert refused.returncode == 2
    assert "not in the package: host.json" in refused.stderr


# Imported only when there, not needed: urllib3's SOCKS proxy support, and azure-core's
# OpenTelemetry plugin (the test extra's, for the SDK's own spans in tests/telemetry).
OPTIONAL_IMPORTS = {"pysocks", "azure-core-tracing-opentelemetry"}
IMPORTED_DISTRIBUTIONS = """
import importlib.metadata, sys
import function_app
owners = importlib.metadata.packages_distributions()
print("\\n".join(d for module in list(sys.modules) for d in owners.get(module.split(".")[0], [])))
"""


def test_requirements_txt_installs_everything_the_function_app_imports() -> None:
    """Azure installs requirements.txt, not pyproject.toml: each distribution the app's import
    loads must be pinned there or come with one that is (e.g. mypy-extensions, which the AMQP
    core imports for its compiled build, was missing)."""
    from packaging.requirements import Requirement

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    imported = subprocess.run(
        [sys.executable, "-c", IMPORTED_DISTRIBUTIONS],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    ).stdout.split()
    imported_names = {norm(name) for name in imported}
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    pending = [Requirement(line).name for line in lines if line.strip() and line[0] != "#"]
    installed: set[str] = set()
    while pending:
        name = norm(pending.pop())
        if name in installed:
            continue
        installed.add(name)
        pending.extend(
            spec.name
            for spec in map(Requirement, importlib.metadata.requires(name) or [])
            if spec.marker is None or spec.marker.evaluate({"extra": ""})
        )
    assert imported_names - installed - OPTIONAL_IMPORTS == {"replication"}
