"""What a function that ``register_pipelines`` generated tells the local host and the dashboard.

The Functions host reads a function's name, bindings and annotations only; our host also
needs the pipeline behind it (its batch size, concurrency and receive backend, its sources'
failover) and the dashboard its runtime (where its targets send now). One typed record rides
on the function under one attribute, read back through ``generated``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .pipeline.model import Pipeline


class PipelineRuntime(Protocol):
    """What a generated function's built pipeline shows the host and the dashboard
    (``functions.PipelineRuntime``, which imports this module: a protocol keeps it one-way)."""

    @property
    def targets(self) -> Mapping[str | None, Any]: ...


ATTRIBUTE = "__replication__"


@dataclass(frozen=True)
class GeneratedFunction:
    pipeline: Pipeline
    source_index: int
    """Which of the pipeline's sources the function's trigger reads."""
    runtime: Sequence[PipelineRuntime]
    """The pipeline's runtime once the first batch built it (empty before)."""


def mark(function: object, info: GeneratedFunction) -> None:
    setattr(function, ATTRIBUTE, info)


def generated(function: object) -> GeneratedFunction | None:
    """The record of a function ``register_pipelines`` made (None for any other function)."""
    info = getattr(function, ATTRIBUTE, None)
    return info if isinstance(info, GeneratedFunction) else None


def pipeline_of(function: object) -> Pipeline | None:
    """The pipeline behind ``function``: a generated function's, or ``function`` itself when
    it is a ``Pipeline`` the host pumps."""
    if isinstance(function, Pipeline):
        return function
    info = generated(function)
    return info.pipeline if info is not None else None


def pipeline_name(function: object, default: str) -> str:
    """The name of the pipeline behind ``function`` (metrics label), else ``default``."""
    pipeline = pipeline_of(function)
    return pipeline.name if pipeline is not None else default
