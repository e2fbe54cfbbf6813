"""The compiled hot path and its fallback: which code runs, and that an edited source is never
shadowed by the extension module built from its older self."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from replication import native

ROOT = Path(__file__).resolve().parents[1]


def loaded_from(module: str, **env: str) -> str:
    """The file ``module`` is loaded from in a fresh interpreter."""
    code = f"import {module} as m, replication.native as n; print(m.__file__); print(n.STATE)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, check=True, cwd=ROOT, env={**os.environ, **env},
    )  # fmt: skip
    return done.stdout


def entry(path: Path) -> dict[str, object]:
    stat = path.stat()
    return {
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


def test_pure_python_on_request_loads_every_compiled_module_from_its_source() -> None:
    out = loaded_from("replication.broker.queue", REPLICATION_PURE_PYTHON="1")
    assert out.splitlines()[0].endswith("replication/broker/queue.py")
    assert "pure Python" in out.splitlines()[1]


@pytest.mark.skipif(
    not native.STATE.startswith("compiled"), reason=f"hot path not compiled: {native.STATE}"
)
def test_the_built_hot_path_is_what_runs() -> None:
    out = loaded_from("replication.broker.queue", REPLICATION_PURE_PYTHON="")
    assert out.splitlines()[0].endswith(".so")
    manifest = json.loads(native.MANIFEST.read_text())
    assert "broker/queue.py" in manifest["sources"]
    assert "native.py" not in manifest["sources"]  # the chooser itself is never compiled


def test_a_source_is_stale_once_its_bytes_change_not_when_only_touched(tmp_path: Path) -> None:
    source = tmp_path / "codec.py"
    source.write_text("X = 1\n")
    sources = {"codec.py": entry(source)}
    assert native.stale_source(tmp_path, sources) is None
    os.utime(source, ns=(1, 1))  # a checkout rewrites the same bytes: still current
    assert native.stale_source(tmp_path, sources) is None
    source.write_text("X = 2\n")
    assert native.stale_source(tmp_path, sources) == "codec.py"
    source.unlink()
    assert native.stale_source(tmp_path, sources) == "codec.py"


def test_the_source_first_finder_loads_the_py_file(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text("WHERE = __file__\n")
    finder = native.SourceFirst({"replication._native_probe": source})
    spec = finder.find_spec("replication._native_probe", None)
    assert spec is not None and spec.origin == str(source)
    assert finder.find_spec("replication.other", None) is None


def test_no_compiled_function_binds_one_except_name_to_two_exception_types() -> None:
    """mypyc gives a name one type per function: ``except A as exc`` then ``except B as exc``
    turns a B into a TypeError ("A object expected") at run time, compiled only."""
    from dev import native_sources

    clashes = []
    for path in native_sources():
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            bound: dict[str, set[str]] = {}
            for node in ast.walk(function):
                if isinstance(node, ast.ExceptHandler) and node.name and node.type:
                    bound.setdefault(node.name, set()).add(ast.unparse(node.type))
            clashes += [
                f"{path.name}:{function.lineno} {name}: {sorted(types)}"
                for name, types in bound.items()
                if len(types) > 1
            ]
    assert clashes == []
