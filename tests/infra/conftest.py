"""Fixtures of the infra/ tests (helpers in support.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .support import checkov_venv, ensure_checkov


@pytest.fixture(scope="session")
def checkov() -> Path:
    """checkov's executable in its own venv (made on first use; see support.py)."""
    return ensure_checkov(checkov_venv())
