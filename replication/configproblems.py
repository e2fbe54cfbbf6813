"""Configuration problems: where (file, line, column, property path) and what is wrong.

One way to report a mistake in any file the project reads: the broker's Config.json
(``replication.broker.config``) and the pipeline and config-test files
(``replication.pipeline``). Each mistake becomes a ``Problem``; all problems found in one pass
are raised together as one ``ConfigError`` whose ``str()`` is one line per problem, in file
order, in the ``file:line:column:`` form editors and terminals link to::

    pipelines.yaml:12:11: pipelines[0].steps[1].transcode.from: 'avro' is not one of ...
    Config.json:11:15: UserConfig.Namespaces[0].Queues[1].Properties.LockDuration: must be
    between PT5S and PT5M, got PT10M (in queue 'slow')

pydantic's validation errors are translated here into such problems (reasons in plain words,
"did you mean" for misspelt names and choices). This module imports neither the broker nor
the pipeline: both import it.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import get_args

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

from .jsonlocations import json_locations, line_column

Loc = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a configuration file, located as precisely as we could."""

    file: str
    path: str
    """The property path, e.g. ``pipelines[0].steps[1].transcode.from``; empty for problems
    with the document itself (unreadable, not JSON or YAML, not a mapping)."""
    reason: str
    line: int | None = None
    column: int | None = None
    context: str = ""
    """What the path is in words where indices alone are hard to map back to the file, e.g.
    ``topic 'orders' / subscription 'audit'``."""

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}" if self.column is None else f":{self.line}:{self.column}"
        text = f"{where}: {self.path}: {self.reason}" if self.path else f"{where}: {self.reason}"
        return f"{text} (in {self.context})" if self.context else text


def render(problems: Iterable[Problem]) -> str:
    """One line per problem (each names its file, so lines from several files can mix)."""
    return "\n".join(str(problem) for problem in problems)


class ConfigError(ValueError):
    """A configuration file that cannot be used; ``problems`` lists every problem found."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        super().__init__(render(self.problems))


def format_loc(loc: Loc) -> str:
    """``("pipelines", 0, "steps", 1, "transcode")`` -> ``pipelines[0].steps[1].transcode``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def did_you_mean(word: object, choices: Iterable[str], cutoff: float = 0.6) -> str:
    """`` (did you mean 'X'?)`` for a near miss, else ``""``; says so when only case differs
    (every name this is used for is case-sensitive where it is looked up)."""
    if not isinstance(word, str):
        return ""
    folded: dict[str, str] = {}
    for choice in choices:
        folded.setdefault(choice.lower(), choice)
    same = folded.get(word.lower())
    if same is not None and same != word:
        return f" (did you mean {same!r}? case matters)"
    close = difflib.get_close_matches(word.lower(), list(folded), n=1, cutoff=cutoff)
    return f" (did you mean {folded[close[0]]!r}?)" if close else ""


# ---------------------------------------------------------------------- locating


@dataclass(slots=True)
class Positions:
    """Line and column (1-based) of each location in one document, for its problems."""

    source: str
    marks: dict[Loc, tuple[int, int]] = field(default_factory=dict)

    def find(self, loc: Loc) -> tuple[int | None, int | None]:
        """Where ``loc`` is, or its nearest located ancestor (a missing property: its parent)."""
        for end in range(len(loc), -1, -1):
            mark = self.marks.get(loc[:end])
            if mark is not None:
                return mark
        return None, None

    def problem(self, loc: Loc, reason: str, context: str = "") -> Problem:
        line, column = self.find(loc)
        return Problem(self.source, format_loc(loc), reason, line, column, context)

    def error(
        self, problems: Iterable[tuple[Loc, str]], context: Callable[[Loc], str] | None = None
    ) -> ConfigError:
        """One error for all ``problems``, ordered by where they are in the file."""
        located = [
            self.problem(loc, reason, context(loc) if context else "") for loc, reason in problems
        ]
        located.sort(key=lambda p: (p.line is None, p.line or 0, p.column or 0))
        return ConfigError(located)


def json_positions(source: str, text: str) -> tuple[Positions, list[Loc]]:
    """Positions of every property and item of JSON ``text`` (already parsed cleanly), and the
    properties given twice (``json`` keeps the later one silently; so do these marks)."""
    found = json_locations(text)
    positions = Positions(source)
    for loc, offset in found.offsets.items():
        positions.marks[loc] = line_column(text, offset)
    duplicates = []
    for loc, offset in found.duplicates:
        duplicates.append(loc)
        positions.marks[loc] = line_column(text, offset)
    return positions, duplicates


def parse_json(source: str, text: str) -> tuple[object, Positions, list[Loc]]:
    """JSON ``text`` parsed, with its positions and the properties given twice
    (``json_positions``); invalid JSON is a ``ConfigError`` where the parser stopped."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        problem = Problem(source, "", f"invalid JSON: {exc.msg}", exc.lineno, exc.colno)
        raise ConfigError([problem]) from None
    try:
        positions, duplicates = json_positions(source, text)
    except Exception:  # positions are a nicety; never fail a load over them
        positions, duplicates = Positions(source), []
    return data, positions, duplicates


def read_text(path: str | Path) -> str:
    """A file's text (UTF-8, a BOM tolerated: editors on Windows add one); an unreadable file
    is a ``ConfigError`` like any other problem with it."""
    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        reason = f"cannot read the file: {exc.strerror or exc}"
        raise ConfigError([Problem(source, "", reason)]) from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        reason = f"not UTF-8 text ({exc.reason} at byte {exc.start})"
        raise ConfigError([Problem(source, "", reason)]) from None


# ---------------------------------------------------------------------- values in reasons


@dataclass(frozen=True, slots=True)
class Dialect:
    """The words a file's readers use: JSON says object and array, YAML mapping and list."""

    mapping: str
    sequence: str
    quote: Callable[[str], str]


JSON = Dialect("an object", "an array", json.dumps)
YAML = Dialect("a mapping", "a list", repr)


def show(value: object, dialect: Dialect = YAML) -> str:
    """A value as a reason quotes it: short, in the file's own notation."""
    if isinstance(value, Mapping):
        return dialect.mapping
    if isinstance(value, list | tuple):
        return dialect.sequence
    if isinstance(value, str):
        text = dialect.quote(value)
        return text if len(text) <= 60 else text[:56] + "..." + text[-1]
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------------- pydantic errors

LOCATED = "located_problems"
"""The error type of ``located_problems``: checks of a whole model that found problems at
locations below it."""


def located_problems(problems: Sequence[tuple[Loc, str]]) -> PydanticCustomError:
    """What a model validator raises for problems it located itself (relative to the model):
    ``validation_problems`` reports each at its own place, not at the model."""
    summary = "; ".join(f"{format_loc(loc) or '(here)'}: {reason}" for loc, reason in problems)
    return PydanticCustomError(LOCATED, "{summary}", {"summary": summary, "problems": problems})


_TYPE_WORDS = {
    "dict_type": "mapping",
    "model_type": "mapping",
    "model_attributes_type": "mapping",
    "list_type": "sequence",
    "tuple_type": "sequence",
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "a boolean",
    "bool_parsing": "a boolean",
    "none_required": "null",
}


def _type_word(kind: str, dialect: Dialect) -> str:
    word = _TYPE_WORDS[kind]
    return {"mapping": dialect.mapping, "sequence": dialect.sequence}.get(word, word)


def model_in(annotation: object) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (``list[Queue] | None`` -> ``Queue``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = model_in(arg)
        if found is not None:
            return found
    return None


def fields_at(model: type[BaseModel] | None, loc: Loc) -> list[str]:
    """The property names the model at ``loc`` (relative to ``model``) accepts."""
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        info = next(
            (f for name, f in model.model_fields.items() if (f.alias or name) == part), None
        )
        model = model_in(info.annotation) if info is not None else None
    if model is None:
        return []
    return [str(f.alias or name) for name, f in model.model_fields.items()]


def _clean_loc(loc: Loc, data: object) -> Loc:
    """Drops what pydantic adds to a location that is not in the data (union member tags
    such as ``'dict[str,any]'``), walking the data along the location."""
    kept: list[str | int] = []
    node = data
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(node, Mapping):
            if part in node:
                kept.append(part)
                node = node[part]
            elif last and isinstance(part, str):
                kept.append(part)  # a missing property
            # else: a tag; stay on this node
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            kept.append(part)
            node = node[part]
        elif isinstance(part, int) and not isinstance(node, Mapping | list):
            break
        # a scalar: the rest are tags
    return tuple(kept)


_BOUNDS = {
    "greater_than_equal": ("at least", "ge"),
    "greater_than": ("greater than", "gt"),
    "less_than_equal": ("at most", "le"),
    "less_than": ("less than", "lt"),
}


def reason_for(
    error: ErrorDetails, loc: Loc, model: type[BaseModel] | None, dialect: Dialect = YAML
) -> str:
    """A pydantic error in plain words (``loc`` relative to ``model``)."""
    kind = error["type"]
    ctx = error.get("ctx") or {}
    value = error.get("input")
    if kind == "extra_forbidden":
        name = str(loc[-1]) if loc else "?"
        allowed = fields_at(model, loc[:-1])
        hint = did_you_mean(name, allowed)
        if not hint and allowed:
            hint = f"; expected one of: {', '.join(allowed)}"
        return f"unknown property {name!r}{hint}"
    if kind == "missing":
        return f"required property {loc[-1]!r} is missing" if loc else "a value is required"
    if kind in ("value_error", "assertion_error"):
        return str(ctx.get("error", error["msg"]))
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        return (
            f"{show(value, dialect)} is not one of {', '.join(map(repr, choices))}"
            f"{did_you_mean(value, choices)}"
        )
    if kind in ("too_short", "too_long"):
        count = ctx.get("min_length" if kind == "too_short" else "max_length")
        if kind == "too_short" and count == 1:
            return "must not be empty"
        limit = "at least" if kind == "too_short" else "at most"
        return f"must have {limit} {count} item{'s' if count != 1 else ''}"
    if kind in _BOUNDS:
        words, key = _BOUNDS[kind]
        return f"must be {words} {ctx.get(key)}, got {show(value, dialect)}"
    if kind in _TYPE_WORDS:
        return f"expected {_type_word(kind, dialect)}, got {show(value, dialect)}"
    message = str(error["msg"])
    return f"{message[0].lower()}{message[1:]}, got {show(value, dialect)}"


def validation_problems(
    exc: ValidationError,
    prefix: Loc,
    data: object,
    model: type[BaseModel] | None,
    dialect: Dialect = YAML,
) -> list[tuple[Loc, str]]:
    """``(location, reason)`` per error of ``model`` validating ``data`` (found at ``prefix``
    in the file); a union's failed members become one reason, ``located_problems`` each their
    own."""
    merged: dict[Loc, list[tuple[str, ErrorDetails]]] = {}
    problems: list[tuple[Loc, str]] = []
    for error in exc.errors(include_url=False):
        loc = _clean_loc(tuple(error["loc"]), data)
        if error["type"] == LOCATED:
            problems += [((*prefix, *loc, *rel), why) for rel, why in error["ctx"]["problems"]]
            continue
        merged.setdefault(loc, []).append((reason_for(error, loc, model, dialect), error))
    for loc, items in merged.items():
        kinds = [error["type"] for _, error in items]
        if len(items) > 1 and all(k in _TYPE_WORDS for k in kinds):
            words = list(dict.fromkeys(_type_word(k, dialect) for k in kinds))
            expected = ", ".join(words[:-1]) + f" or {words[-1]}"
            got = show(items[0][1].get("input"), dialect)
            problems.append(((*prefix, *loc), f"expected {expected}, got {got}"))
            continue
        seen: set[str] = set()
        for reason, _ in items:
            if reason not in seen:
                seen.add(reason)
                problems.append(((*prefix, *loc), reason))
    return problems
