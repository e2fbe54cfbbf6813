"""Deploying to Azure: infra/main.bicep's parameters and app settings from a pipeline file.

``bicep_parameters`` says which entities and access the pipelines need on which namespace,
``required_app_settings`` which app settings the deployed app reads; ``python -m
replication infra-parameters pipelines.yaml`` writes an ARM parameters file for the template.
"""

from __future__ import annotations

from .parameters import (
    APP_SETTINGS,
    DEFAULT_NAMESPACES,
    HOST_SETTINGS,
    NAMESPACES,
    DeployConfigError,
    app_secret_names,
    bicep_parameters,
    parameters_file,
    required_app_settings,
)

__all__ = [
    "APP_SETTINGS",
    "DEFAULT_NAMESPACES",
    "HOST_SETTINGS",
    "NAMESPACES",
    "DeployConfigError",
    "app_secret_names",
    "bicep_parameters",
    "parameters_file",
    "required_app_settings",
]
