"""Reading YAML or JSON configuration text with the position of every property and item.

YAML goes through PyYAML's composer (``SafeLoader``): the node tree has the line and column
of each key and item, and is then constructed into plain data in the same pass. JSON is
parsed with the standard library and a small walk over the (already valid) text recovers the
positions. Both report duplicate property names, which the parsers would silently collapse.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..jsonlocations import json_locations, line_column
from .errors import Loc, PipelineConfigError, PipelineProblem, format_loc


@dataclass(slots=True)
class Positions:
    """Line and column (1-based) of each location in a document."""

    source: str
    marks: dict[Loc, tuple[int, int]] = field(default_factory=dict)

    def find(self, loc: Loc) -> tuple[int | None, int | None]:
        """Where ``loc`` is, or its nearest located ancestor."""
        for end in range(len(loc), -1, -1):
            mark = self.marks.get(loc[:end])
            if mark is not None:
                return mark
        return None, None

    def problem(self, loc: Loc, reason: str) -> PipelineProblem:
        line, column = self.find(loc)
        return PipelineProblem(self.source, line, column, format_loc(loc), reason)

    def error(self, problems: list[tuple[Loc, str]]) -> PipelineConfigError:
        """One error for all ``problems``, ordered by where they are in the file."""
        located = [self.problem(loc, reason) for loc, reason in problems]
        located.sort(key=lambda p: (p.line is None, p.line or 0, p.column or 0))
        return PipelineConfigError(located)


@dataclass(slots=True)
class Document:
    data: object
    positions: Positions
    duplicates: list[Loc] = field(default_factory=list)


def read_text(path: str | Path) -> str:
    """A file's text (UTF-8, a BOM tolerated); unreadable files are configuration errors."""
    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        reason = f"cannot read the file: {exc.strerror or exc}"
        raise PipelineConfigError([PipelineProblem(source, None, None, "", reason)]) from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        reason = f"not UTF-8 text ({exc.reason} at byte {exc.start})"
        raise PipelineConfigError([PipelineProblem(source, None, None, "", reason)]) from None


def is_json(source: str) -> bool:
    return source.lower().endswith(".json")


def parse_document(text: str, source: str) -> Document:
    """YAML (which also reads most JSON), or JSON when ``source`` ends in ``.json``."""
    document = _parse_json(text, source) if is_json(source) else _parse_yaml(text, source)
    if document.duplicates:
        raise document.positions.error([
            (loc, f"property {loc[-1]!r} appears more than once") for loc in document.duplicates
        ])  # fmt: skip
    return document


# ---------------------------------------------------------------------- YAML


def _parse_yaml(text: str, source: str) -> Document:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = None if node is None else loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = exc.problem or exc.context or "not YAML"
        line = None if mark is None else mark.line + 1
        column = None if mark is None else mark.column + 1
        problem = PipelineProblem(source, line, column, "", f"invalid YAML: {what}")
        raise PipelineConfigError([problem]) from None
    except yaml.YAMLError as exc:
        problem = PipelineProblem(source, None, None, "", f"invalid YAML: {exc}")
        raise PipelineConfigError([problem]) from None
    finally:
        loader.dispose()
    document = Document(data, Positions(source))
    if node is not None:
        _walk_yaml(node, (), document, set())
    return document


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _walk_yaml(node: yaml.Node, loc: Loc, document: Document, active: set[int]) -> None:
    if id(node) in active:  # a recursive alias
        return
    marks = document.positions.marks
    marks.setdefault(loc, _mark(node))
    active.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue
            name = key.value
            member = (*loc, name)
            if name in seen:
                document.duplicates.append(member)
                marks[member] = _mark(key)
                continue
            seen.add(name)
            marks[member] = _mark(key)
            _walk_yaml(value, member, document, active)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk_yaml(item, (*loc, index), document, active)
    active.discard(id(node))


# ---------------------------------------------------------------------- JSON


def _parse_json(text: str, source: str) -> Document:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        problem = PipelineProblem(source, exc.lineno, exc.colno, "", f"invalid JSON: {exc.msg}")
        raise PipelineConfigError([problem]) from None
    document = Document(data, Positions(source))
    try:
        _walk_json(text, document)
    except Exception:  # positions are a nicety; never fail a load over them
        document.positions.marks.clear()
        document.duplicates.clear()
    return document


def _walk_json(text: str, document: Document) -> None:
    found = json_locations(text)
    marks = document.positions.marks
    for loc, offset in found.offsets.items():
        marks[loc] = line_column(text, offset)
    for loc, offset in found.duplicates:
        document.duplicates.append(loc)
        marks[loc] = line_column(text, offset)  # the later one: what json kept
