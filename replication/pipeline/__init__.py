"""Declarative pipelines: the ``pipelines.yaml`` model, loading and validation, JSON Schema
export, and config tests run in-process (``python -m replication validate|schema|test``).

Runner-independent like ``replication.tasks``: function_app.py, the local host and Spark all
read the same file through ``load_pipelines``. See ``README.md`` next to this file.

Modules: ``spec`` (the file's models), ``check`` (loading: every problem located),
``model`` (a checked ``Pipeline``), ``settings`` (what connection names hold), ``build`` (what
runs), ``schema``/``reference`` (JSON Schema, Markdown), ``testing`` (config tests).
"""

from __future__ import annotations

from ..configproblems import ConfigError as PipelineConfigError
from ..configproblems import Problem as PipelineProblem
from .build import BuiltPipeline
from .check import load_pipelines, parse_pipelines
from .model import Pipeline, PipelineFile, Route
from .schema import json_schema
from .spec import DEFAULT_KEY, ERROR_TARGET_KEY, Endpoint

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
