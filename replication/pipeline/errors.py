"""Configuration problems: where (file, line, column, field path) and what is wrong.

Every mistake in a pipeline file (or a config test file) becomes a ``PipelineProblem``; all
problems found in one pass are raised together as one ``PipelineConfigError`` whose ``str()``
is one line per problem::

    pipelines.yaml:12: pipelines[0].steps[1].transcode.from: 'avro' is not one of ...

pydantic's validation errors are translated here into such problems (reasons in plain words,
"did you mean" for misspelt names and choices).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

Loc = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class PipelineProblem:
    """One thing wrong with a configuration file, located as precisely as we could."""

    file: str
    line: int | None
    column: int | None
    path: str
    """``pipelines[0].steps[1].transcode.from``; empty for the document itself."""
    reason: str

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where}: {self.path}: {self.reason}" if self.path else f"{where}: {self.reason}"


class PipelineConfigError(ValueError):
    """A pipeline (or config test) file that cannot be used; ``problems`` lists them all."""

    def __init__(self, problems: Sequence[PipelineProblem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(problem) for problem in self.problems))


def format_loc(loc: Loc) -> str:
    """``("pipelines", 0, "steps", 1, "transcode", "from")`` -> ``pipelines[0].steps[1]...``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def did_you_mean(word: object, choices: Iterable[str], cutoff: float = 0.6) -> str:
    """`` (did you mean 'X'?)`` for a near miss, else ``""``."""
    if not isinstance(word, str):
        return ""
    folded: dict[str, str] = {}
    for choice in choices:
        folded.setdefault(choice.lower(), choice)
    if word.lower() in folded and folded[word.lower()] != word:
        return f" (did you mean {folded[word.lower()]!r}?)"
    close = difflib.get_close_matches(word.lower(), list(folded), n=1, cutoff=cutoff)
    return f" (did you mean {folded[close[0]]!r}?)" if close else ""


def show(value: object) -> str:
    """A value as a reason quotes it: short, JSON-like."""
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, str):
        text = repr(value)
        return text if len(text) <= 60 else text[:56] + "...'"
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------------- pydantic errors

_TYPE_WORDS = {
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "list_type": "a list",
    "tuple_type": "a list",
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


def _fields(model: type[BaseModel]) -> list[str]:
    return [str(f.alias or name) for name, f in model.model_fields.items()]


def _model_in(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
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
        model = _model_in(info.annotation) if info is not None else None
    return _fields(model) if model is not None else []


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


def reason_for(error: Mapping[str, Any], loc: Loc, model: type[BaseModel] | None) -> str:
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
            f"{show(value)} is not one of {', '.join(map(repr, choices))}"
            f"{did_you_mean(value, choices)}"
        )
    if kind in ("too_short", "too_long"):
        count = ctx.get("min_length" if kind == "too_short" else "max_length")
        if kind == "too_short" and count == 1:
            return "must not be empty"
        limit = "at least" if kind == "too_short" else "at most"
        return f"must have {limit} {count} item{'s' if count != 1 else ''}"
    bounds = {
        "greater_than_equal": ("at least", "ge"),
        "greater_than": ("greater than", "gt"),
        "less_than_equal": ("at most", "le"),
        "less_than": ("less than", "lt"),
    }
    if kind in bounds:
        words, key = bounds[kind]
        return f"must be {words} {ctx.get(key)}, got {show(value)}"
    if kind in _TYPE_WORDS:
        return f"expected {_TYPE_WORDS[kind]}, got {show(value)}"
    message = str(error["msg"])
    return f"{message[0].lower()}{message[1:]}, got {show(value)}"


def validation_problems(
    exc: ValidationError, prefix: Loc, data: object, model: type[BaseModel] | None
) -> list[tuple[Loc, str]]:
    """``(location, reason)`` per error; a union's failed members become one reason."""
    merged: dict[Loc, list[tuple[str, Mapping[str, Any]]]] = {}
    for error in exc.errors(include_url=False):
        loc = _clean_loc(tuple(error["loc"]), data)
        merged.setdefault(loc, []).append((reason_for(error, loc, model), error))
    problems: list[tuple[Loc, str]] = []
    for loc, items in merged.items():
        kinds = [error["type"] for _, error in items]
        if len(items) > 1 and all(k in _TYPE_WORDS for k in kinds):
            words = list(dict.fromkeys(_TYPE_WORDS[k] for k in kinds))
            expected = ", ".join(words[:-1]) + f" or {words[-1]}"
            problems.append(
                ((*prefix, *loc), f"expected {expected}, got {show(items[0][1].get('input'))}")
            )
            continue
        seen: set[str] = set()
        for reason, _ in items:
            if reason not in seen:
                seen.add(reason)
                problems.append(((*prefix, *loc), reason))
    return problems
