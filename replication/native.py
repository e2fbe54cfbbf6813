"""Which code runs: the hot path compiled by mypyc, or the same modules as plain Python.

``python3.11 dev.py build`` (run by ``dev.py start`` and ``dev.py test``) compiles the modules
listed under ``[tool.replication.native]`` in pyproject.toml into extension modules beside their
sources and writes ``replication/.native-build.json``: each compiled source's digest. Python
loads an extension module before a ``.py`` of the same name, so a source edited after the build
would silently not run; this module is imported first by the package and, when any compiled
source changed since (or ``REPLICATION_PURE_PYTHON=1`` is set, or the build is missing), loads
every one of them from its source instead: all or none, since compiled modules call each other
directly. ``STATE`` says which, for ``dev.py`` and the benchmarks' headers.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from pathlib import Path
from types import ModuleType

PACKAGE_DIR = Path(__file__).resolve().parent
MANIFEST = PACKAGE_DIR / ".native-build.json"
PURE_ENV = "REPLICATION_PURE_PYTHON"


class SourceFirst(MetaPathFinder):
    """Finds the compiled modules' ``.py`` files, ahead of the extension modules beside them."""

    def __init__(self, sources: dict[str, Path]) -> None:
        self.sources = sources

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        source = self.sources.get(fullname)
        if source is None:
            return None
        return importlib.util.spec_from_file_location(fullname, source)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stale_source(package_dir: Path, sources: dict[str, dict[str, object]]) -> str | None:
    """The first compiled source (package-relative path) that changed since the build, if any.
    Size and mtime equal to the build's means unchanged; otherwise the digest decides (a
    checkout touches files without changing them)."""
    for relative, seen in sources.items():
        path = package_dir / relative
        try:
            stat = path.stat()
            if stat.st_size == seen["size"] and stat.st_mtime_ns == seen["mtime_ns"]:
                continue
            if digest(path) == seen["sha256"]:
                continue
        except OSError:
            pass
        return relative
    return None


def module_name(relative: str) -> str:
    return f"{__package__}." + relative.removesuffix(".py").replace("/", ".")


def choose() -> str:
    """Installs the source-first finder unless the compiled build is present and current;
    returns what runs."""
    try:
        manifest = json.loads(MANIFEST.read_text())
        sources: dict[str, dict[str, object]] = manifest["sources"]
        if not (PACKAGE_DIR / manifest["library"]).is_file():
            raise FileNotFoundError(manifest["library"])  # the build's files were removed
    except (OSError, ValueError, KeyError, TypeError):
        return "pure Python (not compiled: python3.11 dev.py build)"
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        why = f"pure Python ({PURE_ENV} is set)"
    else:
        changed = stale_source(PACKAGE_DIR, sources)
        if changed is None:
            return f"compiled (mypyc {manifest.get('mypy', '?')}, {len(sources)} modules)"
        why = f"pure Python ({changed} changed since the build: python3.11 dev.py build)"
    finder = SourceFirst({module_name(rel): PACKAGE_DIR / rel for rel in sources})
    sys.meta_path.insert(0, finder)
    return why


STATE = choose()
