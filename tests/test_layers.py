"""Layers import one way: no cycle between the top-level parts of ``replication/``.

A part is a top-level folder (``broker/``, ``tasks/``, ...) or module (``metrics.py``). Every
import counts, ``TYPE_CHECKING`` ones and those inside functions too: a lower layer that
knows a higher one's types or starts it from inside still depends on it. Composition (the
broker with its dashboard, the host with its brokers and dashboard) happens above them all,
in ``cli.py`` and ``compose.py``.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "replication"

Edges = dict[str, dict[str, list[str]]]
"""part -> part it imports -> where (``file:line``)."""


def import_edges(package: Path) -> Edges:
    edges: Edges = defaultdict(lambda: defaultdict(list))
    name = package.name
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        part = relative.parts[0].removesuffix(".py")
        module = [name, *relative.with_suffix("").parts]
        if path.name == "__init__.py":
            module = module[:-1]
        here = module if path.name == "__init__.py" else module[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = here[: len(here) - node.level + 1] if node.level else []
                target = [*base, *(node.module or "").split(".")] if node.module else base
                targets = [target] if node.module else [[*target, a.name] for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name.split(".") for alias in node.names]
            else:
                continue
            for found in targets:
                if len(found) > 1 and found[0] == name and found[1] != part:
                    edges[part][found[1]].append(f"{relative.as_posix()}:{node.lineno}")
    return edges


def cycles(edges: Edges) -> list[list[str]]:
    """The groups of parts that import each other (Tarjan's strongly connected components
    with more than one member), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(part: str) -> None:
        index[part] = low[part] = len(index)
        stack.append(part)
        for other in edges.get(part, {}):
            if other not in index:
                visit(other)
                low[part] = min(low[part], low[other])
            elif other in stack:
                low[part] = min(low[part], index[other])
        if low[part] == index[part]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == part:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for part in list(edges):
        if part not in index:
            visit(part)
    return sorted(found)


def describe(edges: Edges, group: list[str]) -> str:
    return "\n".join(
        f"  {a} -> {b}: {', '.join(edges[a][b][:3])}"
        for a in group
        for b in sorted(edges[a])
        if b in group
    )


def test_no_part_of_the_package_imports_one_that_imports_it() -> None:
    edges = import_edges(PACKAGE)
    found = cycles(edges)
    assert not found, "import cycles between parts of replication/:\n" + "\n".join(
        f"{' <-> '.join(group)}\n{describe(edges, group)}" for group in found
    )


@pytest.mark.parametrize("guarded", [False, True])
def test_a_planted_cycle_is_found(tmp_path: Path, guarded: bool) -> None:
    package = tmp_path / "replication"
    for folder in ("low", "high"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "high" / "app.py").write_text("from ..low.core import thing\n")
    upward = "from ..high.app import App\n"
    if guarded:  # a type-only import is a dependency all the same
        upward = f"from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    {upward}"
    (package / "low" / "core.py").write_text(upward + "thing = 1\n")
    edges = import_edges(package)
    assert cycles(edges) == [["high", "low"]]
    assert edges["low"]["high"] == [f"low/core.py:{3 if guarded else 1}"]
