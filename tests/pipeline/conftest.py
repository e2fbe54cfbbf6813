"""Helpers for the pipeline tests."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping
from pathlib import Path

import pytest

from replication.pipeline import PipelineConfigError, parse_pipelines

REPO_ROOT = Path(__file__).resolve().parents[2]
PRIMARY = "Endpoint=sb://primary.example/;SharedAccessKeyName=k;SharedAccessKey=s"
SECONDARY = "Endpoint=sb://secondary.example:5673/;SharedAccessKeyName=k;SharedAccessKey=s"
SETTINGS = {
    "PrimaryServiceBus": PRIMARY, "SecondaryServiceBus": SECONDARY, "SecondaryEventHubs": SECONDARY,
}  # fmt: skip


def problems(
    text: str, source: str = "pipelines.yaml", settings: Mapping[str, str] | None = None
) -> list[str]:
    """The problem lines a pipeline text gives (fails the test if it loads)."""
    with pytest.raises(PipelineConfigError, match=f"^{re.escape(source)}") as caught:
        parse_pipelines(textwrap.dedent(text), source, settings=settings)
    lines = str(caught.value).splitlines()
    assert len(lines) == len(caught.value.problems)
    return lines
