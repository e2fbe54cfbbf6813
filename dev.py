"""Bootstrap for a fresh machine: make .venv, install the project, run the job or the tests.

Only the standard library is used, so a bare ``python3.11 dev.py start`` works before anything
is installed. Re-running skips the install while pyproject.toml is unchanged.

    python3.11 dev.py start [args]   # the quick-start demo (python -m replication start --demo)
    python3.11 dev.py test [args]    # ruff (check, format --check) and mypy, then pytest
    python3.11 dev.py lint           # ruff and mypy only
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("REPLICATION_VENV", ROOT / ".venv"))
STAMP = VENV / ".installed"


def say(text: str) -> None:
    print(f"[dev] {text}", flush=True)


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_environment() -> Path:
    if sys.version_info[:2] != (3, 11):
        sys.exit(f"[dev] Python 3.11 is required, this is {sys.version.split()[0]}")
    python = venv_python()
    if not python.exists():
        say(f"creating {VENV}")
        venv.EnvBuilder(with_pip=True, clear=VENV.exists()).create(VENV)
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if not STAMP.exists() or STAMP.read_text().strip() != wanted:
        say("installing dependencies (the first run takes a few minutes)")
        pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
        subprocess.run([*pip, "install", "-e", f"{ROOT}[test]"], check=True, cwd=ROOT)
        STAMP.write_text(wanted)
    return python


def run(command: list[str]) -> int:
    return subprocess.run(command, cwd=ROOT).returncode


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("start", "test", "lint"):
        print(__doc__)
        return 2
    action, rest = argv[0], argv[1:]
    try:
        python = str(ensure_environment())
    except subprocess.CalledProcessError as exc:
        say(f"installation failed (exit {exc.returncode}); see pip's output above")
        return 1
    if action == "start":  # no arguments: the demo (sample pipelines fed and shown)
        return run([python, "-m", "replication", "start", *(rest or ["--demo"])])
    lint = run([python, "-m", "ruff", "check", "."])
    if lint == 0:  # formatting is not a matter of taste here: ruff format decides
        lint = run([python, "-m", "ruff", "format", "--check", "."])
    if lint == 0:  # the package's types ([tool.mypy] in pyproject.toml)
        lint = run([python, "-m", "mypy"])
    if action == "lint" or lint != 0:
        return lint
    say("running the test suite")
    return run([python, "-m", "pytest", *_parallel(rest), *rest])


def _parallel(args: list[str]) -> list[str]:
    """pytest-xdist on every core (at most 4: each worker may start its own Spark), a test
    file's tests on one worker (they share module fixtures); not when the caller chose."""
    if any(a.startswith(("-n", "--numprocesses")) or a == "no:xdist" for a in args):
        return []
    return ["-n", "auto", "--maxprocesses", "4", "--dist", "loadfile"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
