"""Declarative pipelines: the ``pipelines.yaml`` model, loading and validation, JSON Schema
export, and config tests run in-process (``python -m replication validate|schema|test``).

Runner-independent like ``replication.tasks``: function_app.py, the local host and Spark all
read the same file through ``load_pipelines``. See ``README.md`` next to this file.
"""

from __future__ import annotations

from ..configproblems import ConfigError as PipelineConfigError
from ..configproblems import Problem as PipelineProblem
from .model import (
    DEFAULT_KEY,
    ERROR_TARGET_KEY,
    BuiltPipeline,
    Endpoint,
    Pipeline,
    PipelineFile,
    Route,
    load_pipelines,
    parse_pipelines,
)
from .schema import json_schema

__all__ = [
    "DEFAULT_KEY",
    "ERROR_TARGET_KEY",
    "BuiltPipeline",
    "Endpoint",
    "Pipeline",
    "PipelineConfigError",
    "PipelineFile",
    "PipelineProblem",
    "Route",
    "json_schema",
    "load_pipelines",
    "parse_pipelines",
]
