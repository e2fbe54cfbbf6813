"""The step registry: every step a pipeline can name, built in or the app's own.

A step is registered with the ``@step(name, Options)`` decorator of ``replication.tasks.steps``
(the built-in ones in ``replication.tasks.editors`` and ``replication.tasks.router``; an app
registers its own the same way before loading its pipelines). This module is where steps are
looked up, listed and built: importing it imports the built-in steps first, so a lookup never
misses one because nothing happened to import its module yet. The built-in step modules
import only ``steps`` (the step API), never this module, so there is no import cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from . import editors, router  # noqa: F401  (importing them registers every built-in step)
from .steps import STEPS, BoundStep, StepConfigError, StepContext, StepSpec, step

__all__ = ["build_step", "lookup", "names", "specs", "step", "unregister"]


def lookup(name: str) -> StepSpec | None:
    """The step registered as ``name`` (names are case-sensitive), or None."""
    return STEPS.get(name)


def names() -> list[str]:
    """Every registered step name, sorted."""
    return sorted(STEPS)


def specs() -> list[StepSpec]:
    """Every registered step, sorted by name."""
    return [STEPS[name] for name in sorted(STEPS)]


def unregister(name: str) -> None:
    """Forgets a step an app (or a test) registered; unknown names are ignored."""
    STEPS.pop(name, None)


def build_step(
    name: str, options: Mapping[str, Any] | None = None, context: StepContext | None = None
) -> BoundStep:
    """The step ``name`` with its ``options`` validated, ready to run; a ``StepConfigError``
    says what is wrong with the name or the options."""
    spec = lookup(name)
    if spec is None:
        raise StepConfigError(f"unknown step {name!r}; known steps: {', '.join(names())}")
    try:
        parsed = spec.options.model_validate(dict(options or {}))
    except ValidationError as exc:
        problems = "; ".join(_option_problem(error) for error in exc.errors(include_url=False))
        raise StepConfigError(f"step {name!r}: {problems}") from exc
    return BoundStep(name, parsed, spec.build(parsed, context or StepContext()))


def _option_problem(error: ErrorDetails) -> str:
    """One of pydantic's errors as ``option: reason``, or just the reason when a check of the
    options together failed (without pydantic's "Value error, " in front of the reason)."""
    where = ".".join(str(part) for part in error["loc"])
    cause = error.get("ctx", {}).get("error") if error["type"] == "value_error" else None
    reason = str(cause) if cause is not None else str(error["msg"])
    return f"{where}: {reason}" if where else reason
