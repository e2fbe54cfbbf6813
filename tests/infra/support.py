"""Helpers of the infra/ tests: the templates with parameters, and checkov in a venv of its own.

checkov 3.3.30 requires packaging<24 while pytest 9.2 requires packaging>=24, so checkov
cannot be installed into the project's .venv. It lives in ``<venv>/checkov`` (the venv running
the tests, so dev.py's .venv gets .venv/checkov; ``REPLICATION_CHECKOV_VENV`` overrides),
installed from tests/infra/checkov-requirements.txt (every version pinned) the first time and
again whenever that file changes. Several pytest processes wait for one another on a lock.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .bicep_eval import Instance, Template

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
EXAMPLE = INFRA / "main.parameters.example.json"
REQUIREMENTS = Path(__file__).with_name("checkov-requirements.txt")
INSTALL_TIMEOUT = 900


def checkov_venv() -> Path:
    configured = os.environ.get("REPLICATION_CHECKOV_VENV")
    if configured:
        return Path(configured)
    if sys.prefix != sys.base_prefix:  # running in a venv: keep checkov beside it
        return Path(sys.prefix) / "checkov"
    return ROOT / ".venv" / "checkov"


def ensure_checkov(home: Path) -> Path:
    """The checkov executable of the venv at ``home``, made or remade as the pins say."""
    scripts = home / ("Scripts" if os.name == "nt" else "bin")
    executable = scripts / ("checkov.cmd" if os.name == "nt" else "checkov")
    stamp = home / ".installed"
    wanted = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    home.parent.mkdir(parents=True, exist_ok=True)
    with (home.parent / f".{home.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if executable.exists() and stamp.exists() and stamp.read_text().strip() == wanted:
            return executable
        venv.EnvBuilder(with_pip=True, clear=True).create(home)
        python = scripts / ("python.exe" if os.name == "nt" else "python")
        subprocess.run(
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
             "-r", str(REQUIREMENTS)],
            check=True, timeout=INSTALL_TIMEOUT,
        )  # fmt: skip
        stamp.write_text(wanted)
    return executable


def run_checkov(executable: Path, directory: Path) -> tuple[int, dict[str, Any]]:
    """checkov's exit code and its JSON report for the .bicep files under ``directory``.
    ``--skip-download``: nothing is fetched (no Prisma Cloud account, so no severities)."""
    result = subprocess.run(
        [str(executable), "--directory", str(directory), "--framework", "bicep",
         "--output", "json", "--skip-download"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"checkov printed no JSON (exit {result.returncode}):\n{result.stderr}")
    if isinstance(report, list):  # one report per framework
        [report] = [r for r in report if r.get("check_type") == "bicep"]
    return result.returncode, report


# ---------------------------------------------------------------------- templates


def example_parameters() -> dict[str, Any]:
    document = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    return {name: entry["value"] for name, entry in document["parameters"].items()}


def deployment(**overrides: Any) -> Instance:
    """infra/main.bicep with the example parameters, changed by ``overrides``."""
    return Template.load(INFRA / "main.bicep").instance({**example_parameters(), **overrides})


def only(items: list[Any]) -> Any:
    assert len(items) == 1, items
    return items[0]


PLAN_MODULES = {"FC1": "flexSite", "EP1": "premiumSite"}
"""modules/functionapp.bicep's module per hosting plan (functionapp-flex.bicep,
functionapp-premium.bicep): the one of the chosen plan is deployed."""


def plan_module(main: Instance) -> Instance:
    """The deployed module of modules/functionapp.bicep that holds the plan and the site."""
    app = only(main.module("functionApp"))
    return only([m for symbol in PLAN_MODULES.values() for m in app.module(symbol)])


def site(main: Instance) -> dict[str, Any]:
    """The Function App's site resource, as the chosen plan deploys it."""
    return only(plan_module(main).resource("site"))


def app_settings(main: Instance) -> list[dict[str, Any]]:
    """The Function App's app settings (names concrete, values mostly ``Unknown``)."""
    return site(main)["properties"]["siteConfig"]["appSettings"]


def bicep_files() -> Iterator[Path]:
    return iter(sorted(INFRA.rglob("*.bicep")))
