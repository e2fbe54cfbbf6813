"""Reading YAML or JSON configuration text with the position of every property and item.

YAML goes through PyYAML's composer (``SafeLoader``): the node tree has the line and column
of each key and item, and is then constructed into plain data in the same pass. JSON is
parsed with the standard library and a small walk over the (already valid) text recovers the
positions. Both report duplicate property names, which the parsers would silently collapse.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from ..configproblems import ConfigError, Loc, Positions, Problem, parse_json


@dataclass(slots=True)
class Document:
    data: object
    positions: Positions
    duplicates: list[Loc] = field(default_factory=list)


def is_json(source: str) -> bool:
    return source.lower().endswith(".json")


def parse_document(text: str, source: str) -> Document:
    """YAML (which also reads most JSON), or JSON when ``source`` ends in ``.json``."""
    document = _parse_json(text, source) if is_json(source) else _parse_yaml(text, source)
    if document.duplicates:
        raise document.positions.error(
            [(loc, f"property {loc[-1]!r} appears more than once") for loc in document.duplicates]
        )
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
        problem = Problem(source, "", f"invalid YAML: {what}", line, column)
        raise ConfigError([problem]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([Problem(source, "", f"invalid YAML: {exc}")]) from None
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
    return Document(*parse_json(source, text))
