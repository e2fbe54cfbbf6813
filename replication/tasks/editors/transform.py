"""Reshaping JSON bodies, the editor pattern's "transform".

Downstream consumers often want a simpler shape than the producer wrote: nested structures
flattened, extra elements removed, fields named as their schema expects. ``transform`` does
the common reshapes declaratively, and a Python callable covers the rest.

Operations run in this fixed order (chain several ``transform`` steps for another order):
``project`` (keep only the listed fields, in the listed order) -> ``drop`` -> ``rename`` ->
``flatten`` -> ``callable``. Field paths are dotted (``order.customer.id``) and walk through
JSON objects; a key that itself contains a dot cannot be addressed. A missing field is
skipped, or fails the message with ``missing: fail``. The body must be a JSON object for the
declarative operations; the result is written back as compact UTF-8 JSON (key order kept, a
renamed key keeps its place when it stays in the same object).

``callable: "package.module:function"`` (``callable_takes: body``, the default) is called with
the JSON value of the body (after the other operations) and returns the new JSON value; with
``callable_takes: message`` it is called with the ``Message`` and returns a list of messages
(``[]`` filters the message out; a single ``Message`` is accepted too), so it can change
properties or split. Returning ``None`` is an error (usually a forgotten ``return``). An
exception in the callable fails the message with reason ``callable failed``.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ...messages import Message
from ..steps import Step, StepConfigError, StepContext, StepFailed, StepOptions, step
from .transcode import dump_json, parse_json

MISSING: Any = object()
"""What ``get_path``/``pop_path`` return for a field that is not there."""


# ---------------------------------------------------------------------- dotted paths


def split_path(path: str) -> list[str]:
    parts = path.split(".")
    if not path or any(p == "" for p in parts):
        raise ValueError(f"bad field path {path!r}")
    return parts


def get_path(value: Any, path: str | list[str]) -> Any:
    """The value at a dotted path (a numeric part indexes an array); ``MISSING`` if absent."""
    for part in split_path(path) if isinstance(path, str) else path:
        if isinstance(value, dict):
            if part not in value:
                return MISSING
            value = value[part]
        elif isinstance(value, list) and part.lstrip("-").isdigit():
            index = int(part)
            if not -len(value) <= index < len(value):
                return MISSING
            value = value[index]
        else:
            return MISSING
    return value


def set_path(obj: dict[str, Any], path: str | list[str], value: Any) -> None:
    """Sets a dotted path, creating objects on the way; ``StepFailed`` if something on the
    way is not an object."""
    parts = split_path(path) if isinstance(path, str) else path
    for depth, part in enumerate(parts[:-1]):
        nested = obj.setdefault(part, {})
        if not isinstance(nested, dict):
            where = ".".join(parts[: depth + 1])
            raise StepFailed("field is not an object", f"cannot set {'.'.join(parts)}: {where}")
        obj = nested
    obj[parts[-1]] = value


def pop_path(obj: Any, path: str | list[str]) -> Any:
    """Removes and returns the value at a dotted path (objects only); ``MISSING`` if absent."""
    parts = split_path(path) if isinstance(path, str) else path
    parent = get_path(obj, parts[:-1]) if len(parts) > 1 else obj
    if not isinstance(parent, dict) or parts[-1] not in parent:
        return MISSING
    return parent.pop(parts[-1])


def json_object(message: Message) -> dict[str, Any]:
    """The body as a JSON object, or ``StepFailed``."""
    value = parse_json(message.body)
    if not isinstance(value, dict):
        raise StepFailed("JSON body is not an object", f"the body is a {_json_type(value)}")
    return value


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


# ---------------------------------------------------------------------- operations


def project(obj: dict[str, Any], paths: list[str], missing: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in paths:
        value = get_path(obj, path)
        if value is MISSING:
            _missing(path, missing)
            continue
        set_path(out, path, copy.deepcopy(value))
    return out


def drop(obj: dict[str, Any], paths: list[str], missing: str) -> None:
    for path in paths:
        if pop_path(obj, path) is MISSING:
            _missing(path, missing)


def rename(obj: dict[str, Any], renames: dict[str, str], missing: str) -> None:
    for old, new in renames.items():
        old_parts, new_parts = split_path(old), split_path(new)
        parent = get_path(obj, old_parts[:-1]) if len(old_parts) > 1 else obj
        if not isinstance(parent, dict) or old_parts[-1] not in parent:
            _missing(old, missing)
            continue
        if old_parts[:-1] == new_parts[:-1]:  # same object: keep the key's place
            old_key, new_key = old_parts[-1], new_parts[-1]
            if old_key != new_key:
                items = list(parent.items())
                parent.clear()
                for key, value in items:
                    if key == old_key:
                        parent[new_key] = value
                    elif key != new_key:  # a field already named new_key is replaced
                        parent[key] = value
        else:
            set_path(obj, new_parts, parent.pop(old_parts[-1]))


def flatten(obj: dict[str, Any], separator: str = ".", lists: bool = False) -> dict[str, Any]:
    """Nested objects (and arrays, with ``lists``) become keys joined by ``separator``;
    empty objects and arrays stay as values. ``StepFailed`` if two keys collide."""
    out: dict[str, Any] = {}

    def walk(value: Any, prefix: str) -> None:
        if isinstance(value, dict) and value:
            items: Any = value.items()
        elif lists and isinstance(value, list) and value:
            items = ((str(i), v) for i, v in enumerate(value))
        else:
            if prefix in out:
                raise StepFailed("flattened keys collide", f"key {prefix!r} appears twice")
            out[prefix] = value
            return
        for key, nested in items:
            walk(nested, f"{prefix}{separator}{key}" if prefix else str(key))

    for key, value in obj.items():
        walk(value, str(key))
    return out


def _missing(path: str, missing: str) -> None:
    if missing == "fail":
        raise StepFailed("missing field", f"field {path!r} is not in the body")


def load_callable(reference: str) -> Callable[..., Any]:
    """``package.module:function`` (the function part may be dotted: ``Class.method``)."""
    module_name, _, attribute = reference.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise StepConfigError(f"cannot load callable {reference!r}: {exc}") from None
    if not callable(target):
        raise StepConfigError(f"{reference!r} is not callable")
    return target


# ---------------------------------------------------------------------- the step


class TransformOptions(StepOptions):
    """Declarative reshapes of a JSON object body, plus a callable escape hatch."""

    project: list[str] | None = None
    """Keep only these fields (dotted paths), in this order."""
    drop: list[str] = Field(default_factory=list)
    rename: dict[str, str] = Field(default_factory=dict)
    """Old path -> new path."""
    flatten: bool = False
    separator: str = Field(".", min_length=1)
    """Joins the keys of flattened objects."""
    flatten_lists: bool = False
    """Flatten arrays too (``items.0.id``); otherwise arrays stay values."""
    missing: Literal["ignore", "fail"] = "ignore"
    """A field named by ``project``/``drop``/``rename`` that is not in the body."""
    callable: str | None = None
    """``package.module:function``, run last."""
    callable_takes: Literal["body", "message"] = "body"

    @field_validator("project", "drop")
    @classmethod
    def _paths(cls, paths: list[str] | None) -> list[str] | None:
        for path in paths or []:
            split_path(path)
        return paths

    @field_validator("rename")
    @classmethod
    def _rename_paths(cls, renames: dict[str, str]) -> dict[str, str]:
        for old, new in renames.items():
            split_path(old)
            split_path(new)
        return renames

    @field_validator("callable")
    @classmethod
    def _reference(cls, reference: str | None) -> str | None:
        if reference is not None:
            module, sep, attribute = reference.partition(":")
            if not (module and sep and attribute):
                raise ValueError("callable must look like 'package.module:function'")
        return reference

    @model_validator(mode="after")
    def _something(self) -> TransformOptions:
        if not self.declarative and self.callable is None:
            raise ValueError("nothing to do: give project, drop, rename, flatten or callable")
        return self

    @property
    def declarative(self) -> bool:
        return bool(self.project is not None or self.drop or self.rename or self.flatten)


@step("transform", TransformOptions)
def build_transform(options: TransformOptions, context: StepContext) -> Step:
    """Reshapes JSON bodies (project, drop, rename, flatten, or a Python callable) so
    downstream consumers get the structure they expect."""
    function = load_callable(options.callable) if options.callable else None
    body_callable = function if options.callable_takes == "body" else None
    message_callable = function if options.callable_takes == "message" else None

    def reshape(value: Any) -> Any:
        if options.declarative:
            if not isinstance(value, dict):
                raise StepFailed("JSON body is not an object", f"the body is a {_json_type(value)}")
            if options.project is not None:
                value = project(value, options.project, options.missing)
            drop(value, options.drop, options.missing)
            rename(value, options.rename, options.missing)
            if options.flatten:
                value = flatten(value, options.separator, options.flatten_lists)
        if body_callable is not None:
            value = _call(body_callable, value)
        return value

    def run(message: Message) -> list[Message]:
        if options.declarative or body_callable is not None:
            message = message.copy(body=dump_json(reshape(parse_json(message.body))))
        if message_callable is None:
            return [message]
        result = _call(message_callable, message)
        if isinstance(result, Message):
            return [result]
        if not isinstance(result, list) or not all(isinstance(m, Message) for m in result):
            raise StepFailed("callable failed", f"{options.callable} must return list[Message]")
        return result

    def _call(function: Callable[..., Any], argument: Any) -> Any:
        try:
            result = function(argument)
        except StepFailed:
            raise
        except Exception as exc:
            raise StepFailed(
                "callable failed", f"{options.callable}: {type(exc).__name__}: {exc}"
            ) from None
        if result is None:
            raise StepFailed("callable failed", f"{options.callable} returned None")
        return result

    return run
