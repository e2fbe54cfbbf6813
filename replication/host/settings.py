"""``local.settings.json`` the way ``func start`` reads it: ``Values`` become app settings,
environment variables win, and ``%Name%`` in binding properties resolves against them."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path

SAMPLE = "local.settings.sample.json"
_SETTING = re.compile(r"%([^%]+)%")


class SettingsError(ValueError):
    pass


def load_settings(directory: Path, file: Path | None = None) -> tuple[dict[str, str], Path]:
    """The app settings and the file they came from (``local.settings.json``, else the sample)."""
    candidates = [file] if file else [directory / "local.settings.json", directory / SAMPLE]
    for path in candidates:
        if path is not None and path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8-sig"))
            except json.JSONDecodeError as exc:
                raise SettingsError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from exc
            values = data.get("Values", {}) if isinstance(data, dict) else {}
            if not isinstance(values, dict):
                raise SettingsError(f"{path}: 'Values' must be an object")
            settings = {str(k): str(v) for k, v in values.items()}
            settings.update({k: v for k, v in os.environ.items() if k in settings})
            return settings, path
    raise SettingsError(
        f"no local.settings.json or {SAMPLE} in {directory} (copy the sample to start)"
    )


def resolve(value: str, settings: Mapping[str, str]) -> str:
    """``%Name%`` -> the app setting's value (binding expressions, as the host resolves them)."""

    def lookup(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in settings:
            raise SettingsError(f"app setting {name!r} (used as %{name}%) is not defined")
        return settings[name]

    return _SETTING.sub(lookup, value)


_LOG_LEVELS = {
    "trace": logging.DEBUG,
    "debug": logging.DEBUG,
    "information": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "none": logging.CRITICAL + 10,
}


def function_log_level(app_folder: Path) -> int:
    """The level the functions' own logs show at: host.json ``logging.logLevel``, its
    ``Function`` category or else ``default`` (Functions' names: Information, Warning...),
    Information when neither is set, as in Functions."""
    host_json = app_folder / "host.json"
    try:
        data = json.loads(host_json.read_text()) if host_json.is_file() else {}
        levels = {str(k).lower(): str(v) for k, v in data["logging"]["logLevel"].items()}
    except (KeyError, TypeError, AttributeError, ValueError):
        levels = {}
    name = levels.get("function", levels.get("default", "Information"))
    return _LOG_LEVELS.get(name.lower(), logging.INFO)
