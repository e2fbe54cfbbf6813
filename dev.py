"""Bootstrap for a fresh machine: make .venv, install the project, run the job or the tests.

Only the standard library is used, so a bare ``python3.11 dev.py start`` works before anything
is installed. Re-running skips the install while pyproject.toml is unchanged.

    python3.11 dev.py start [args]   # the quick-start demo (python -m replication start --demo)
    python3.11 dev.py test [args]    # ruff (check, format --check) and mypy, then pytest
    python3.11 dev.py test --quick   # the inner loop: no other processes, no JVM, no browser
    python3.11 dev.py lint           # ruff and mypy only
    python3.11 dev.py build          # compile the hot path (start and test do it when needed)

The hot path ([tool.replication.native] in pyproject.toml) is compiled with mypyc when a C
compiler is there, and runs as plain Python when not; replication/native.py picks at import.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
import venv
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("REPLICATION_VENV", ROOT / ".venv"))
STAMP = VENV / ".installed"
PACKAGE = ROOT / "replication"
MANIFEST = PACKAGE / ".native-build.json"  # read by replication/native.py
GROUP = "replication.hotpath"  # mypyc's shared library: replication/hotpath__mypyc.*.so
NATIVE_CACHE = VENV / "native-builds"  # compiled builds by their sources' digest
KEPT_BUILDS = 4
SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify
setup(
    name="replication-native",
    ext_modules=mypycify(sys.argv[1:], group_name={group!r}, target_dir="build/native"),
    script_args=["build_ext", "--inplace", "--parallel", "{jobs}"],
)
"""


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


def native_sources() -> list[Path]:
    """The modules to compile: [tool.replication.native] compile globs less its excludes."""
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["replication"]["native"]
    found = {path for pattern in spec["compile"] for path in ROOT.glob(pattern)}
    keep = [
        path
        for path in found
        if not any(fnmatch.fnmatch(path.relative_to(ROOT).as_posix(), x) for x in spec["exclude"])
    ]
    return sorted(keep)


def built_files() -> list[Path]:
    return [*PACKAGE.rglob("*.so"), *PACKAGE.rglob("*.pyd")]


def build(python: str) -> None:
    """Compiles the hot path unless the last build is of these very sources; any failure leaves
    plain Python running (and says so), never a half-built mix. A build is kept in the venv
    under its sources' digest, so a fresh clone of the same sources (a CI checkout, a second
    worktree) takes it instead of compiling again."""
    sources = native_sources()
    mypy = subprocess.run(
        [python, "-c", "import mypy.version; print(mypy.version.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    entries = {
        path.relative_to(PACKAGE).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sources
    }
    kept = NATIVE_CACHE / _build_key(mypy, entries)
    try:
        last = json.loads(MANIFEST.read_text())
        built = {k: v["sha256"] for k, v in last["sources"].items()}
        library = PACKAGE / last["library"]
        if last["mypy"] == mypy and built == entries and library.is_file():
            if not kept.is_dir():
                _keep(kept, library)
            return
    except (OSError, ValueError, KeyError, TypeError):
        pass
    MANIFEST.unlink(missing_ok=True)
    for stale in built_files():
        stale.unlink()
    if os.environ.get("REPLICATION_PURE_PYTHON", "") not in ("", "0"):
        say("REPLICATION_PURE_PYTHON is set: the hot path runs as plain Python")
        return
    if _restore(kept):
        _write_manifest(mypy, kept.joinpath("library").read_text().strip(), entries)
        say(f"hot path: the build of these sources kept in {kept.parent} (no compile)")
        return
    if not (shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")):
        say("no C compiler (cc): the hot path runs as plain Python, slower")
        return
    say(f"compiling the hot path with mypyc {mypy} ({len(sources)} modules, about 4 minutes)")
    modules = [str(path.relative_to(ROOT)) for path in sources]
    command = [python, "-c", SETUP.format(group=GROUP, jobs=os.cpu_count() or 1), *modules]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        for partial in built_files():
            partial.unlink()
        say(f"mypyc failed (exit {done.returncode}): the hot path runs as plain Python")
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", file=sys.stderr)
        return
    library = next(PACKAGE.glob(GROUP.rpartition(".")[2] + "__mypyc.*"))
    _write_manifest(mypy, library.relative_to(PACKAGE).as_posix(), entries)
    _keep(kept, library)


def _build_key(mypy: str, entries: dict[str, str]) -> str:
    """What a build depends on: the compiler, the interpreter, the build script, the sources."""
    parts = [mypy, sys.version, sys.platform, SETUP, json.dumps(entries, sort_keys=True)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def _write_manifest(mypy: str, library: str, entries: dict[str, str]) -> None:
    stats = {relative: (PACKAGE / relative).stat() for relative in entries}
    manifest = {
        "mypy": mypy,
        "library": library,
        "sources": {
            relative: {
                "size": stats[relative].st_size,
                "mtime_ns": stats[relative].st_mtime_ns,
                "sha256": sha,
            }
            for relative, sha in entries.items()
        },
    }
    MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def _keep(kept: Path, library: Path) -> None:
    """Copies the build into the venv's cache (written aside, then renamed: all or nothing);
    only the newest few builds stay."""
    partial = kept.with_name(kept.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    for built in built_files():
        copy = partial / "files" / built.relative_to(PACKAGE)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, copy)
    (partial / "library").write_text(library.relative_to(PACKAGE).as_posix() + "\n")
    shutil.rmtree(kept, ignore_errors=True)
    partial.rename(kept)
    builds = sorted(
        (path for path in NATIVE_CACHE.iterdir() if path.is_dir()),
        key=lambda path: path.stat().st_mtime,
    )
    for old in builds[:-KEPT_BUILDS]:
        shutil.rmtree(old, ignore_errors=True)


def _restore(kept: Path) -> bool:
    files = kept / "files"
    if not (kept / "library").is_file() or not files.is_dir():
        return False
    for copy in files.rglob("*"):
        if copy.is_file():
            shutil.copy2(copy, PACKAGE / copy.relative_to(files))
    os.utime(kept)  # the newest use is the last one removed
    return True


def run(command: list[str]) -> int:
    return subprocess.run(command, cwd=ROOT).returncode


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("start", "test", "lint", "build"):
        print(__doc__)
        return 2
    action, rest = argv[0], argv[1:]
    # Bytecode cached: otherwise every xdist worker rewrites and compiles each test module again
    # (10.6 CPU s a worker to collect the suite against 3.7 s) and every broker, host and CLI
    # the tests start compiles the package again.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        python = str(ensure_environment())
    except subprocess.CalledProcessError as exc:
        say(f"installation failed (exit {exc.returncode}); see pip's output above")
        return 1
    if action == "lint":
        return lint(python, capture=False)[0]
    checks = None
    if action == "test":  # mypy (one core) and the compile (mostly mypyc on one core) overlap
        checks = ThreadPoolExecutor(1).submit(lint, python, True)
    build(python)
    ask = [python, "-c", "import replication.native as n; print(n.STATE)"]
    say("hot path: " + subprocess.run(ask, capture_output=True, text=True).stdout.strip())
    if action == "build":
        return 0
    if action == "start":  # no arguments: the demo (sample pipelines fed and shown)
        return run([python, "-m", "replication", "start", *(rest or ["--demo"])])
    assert checks is not None
    code, output = checks.result()
    print(output, end="", flush=True)
    if code != 0:
        return code
    say("running the test suite")
    return run([python, "-m", "pytest", *_parallel(rest), *rest])


LINT = (
    ("ruff", "check", "."),
    ("ruff", "format", "--check", "."),  # formatting is not a matter of taste: ruff decides
    ("mypy",),  # the package's types ([tool.mypy] in pyproject.toml)
)


def lint(python: str, capture: bool) -> tuple[int, str]:
    """ruff, then the formatter's check, then mypy; the first failure ends it. mypy's cache
    lives in the venv, so a fresh clone checks against it (mypy compares digests)."""
    os.environ.setdefault("MYPY_CACHE_DIR", str(VENV / "mypy-cache"))
    output = []
    for tool in LINT:
        done = subprocess.run([python, "-m", *tool], cwd=ROOT, capture_output=capture, text=True)
        output.append(f"{done.stdout or ''}{done.stderr or ''}")
        if done.returncode != 0:
            return done.returncode, "".join(output)
    return 0, "".join(output)


def _parallel(args: list[str]) -> list[str]:
    """pytest-xdist with more workers than cores: the suite waits far more than it works (the
    --quick tests spend 6% of their wall time on the CPU: SDK receive waits, lock and TTL
    expiries; the others wait on brokers, hosts, JVMs and browsers starting, kills, restarts;
    ``python -m pytest --cpu-report FILE`` shows it per file). The whole suite: 6 workers
    (2: 1,354 s, 4: 802 s, 6: 735 s on 2 cores), each test file on one (its tests share module
    fixtures). Handing the longest files (the JVMs) out first ran them all at once and they
    timed out on 2 cores. --quick: 16 workers, idle ones steal tests of a busy one (2,672
    tests in 86 s and 102 CPU s; 12 workers 104 s; 20 workers 81 s but 118 CPU s: each
    worker first spends 2 CPU s collecting the suite). Nothing when the caller chose."""
    if any(a.startswith(("-n", "--numprocesses", "--dist")) or a == "no:xdist" for a in args):
        return []
    if "--quick" in args:
        return ["-n", "16", "--dist", "worksteal"]
    return ["-n", "6", "--dist", "loadfile", "--no-loadscope-reorder"]  # conftest's order


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
