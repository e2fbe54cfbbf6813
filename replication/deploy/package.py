"""``python -m replication package``: the zip a Functions deployment sends.

The same files ``func azure functionapp publish`` uploads: everything under the app folder
that ``.funcignore`` (gitignore syntax, read with ``pathspec``) does not leave out, so the
zip and the publish never disagree. Before writing it, the pipeline file the app will load
(``REPLICATION_PIPELINES``, default ``pipelines.yaml``) is loaded, and every file it names
(schemas, keys, a failover file inside the app) must be in the zip: a package that would
fail at start-up in Azure is refused here instead; so is a ``transactional`` pipeline, which
a function cannot run (``replication.functions.register_pipelines`` would refuse it there).
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pathspec

from ..pipeline import load_pipelines

REQUIRED = ("function_app.py", "host.json", "requirements.txt", "replication/__init__.py")
FIXED_TIME = (2020, 1, 1, 0, 0, 0)
"""Every entry's timestamp: the same sources give the same zip, byte for byte."""


class PackageError(Exception):
    """The app folder cannot be packaged as it is (the message says why)."""


def app_files(root: Path) -> list[str]:
    """The app's files (relative POSIX paths, sorted) that .funcignore keeps."""
    ignore = root / ".funcignore"
    lines = ignore.read_text(encoding="utf-8").splitlines() if ignore.exists() else []
    spec = pathspec.GitIgnoreSpec.from_lines(lines)
    return sorted(p for p in _walk(root, spec) if not spec.match_file(p))


def _walk(root: Path, spec: pathspec.PathSpec) -> Iterator[str]:
    for folder, dirs, files in os.walk(root):
        relative = Path(folder).relative_to(root).as_posix()
        prefix = "" if relative == "." else relative + "/"
        dirs[:] = sorted(d for d in dirs if not spec.match_file(prefix + d + "/"))
        for name in files:
            yield prefix + name


def referenced_files(root: Path, pipeline_file: str) -> list[Path]:
    """Files the pipeline file names (step ``*_file`` options, a failover ``file.path``).
    Raises ``PipelineConfigError`` for a pipeline Azure Functions cannot run."""
    pipelines = load_pipelines(root / pipeline_file)
    found: list[Path] = []
    for pipeline in pipelines.pipelines:
        pipeline.refuse_transactional("functions")
        for _name, options in pipeline.steps:
            for key, value in (options or {}).items():
                if key.endswith("_file") and isinstance(value, str):
                    found.append(Path(value))
        for endpoint in (*pipeline.sources, *pipeline.target_endpoints().values()):
            failover_file = endpoint.failover.file if endpoint.failover else None
            if failover_file is not None and failover_file.path:
                found.append(Path(failover_file.path))
    return found


def build_package(root: Path, out_dir: Path, *, pipeline_file: str | None = None) -> Path:
    """Writes ``out_dir/functionapp.zip`` from the app folder ``root``; returns its path."""
    root = root.resolve()
    pipeline_file = pipeline_file or os.environ.get("REPLICATION_PIPELINES") or "pipelines.yaml"
    files = app_files(root)
    kept = set(files)
    missing = [name for name in (*REQUIRED, pipeline_file) if name not in kept]
    if missing:
        raise PackageError(
            f"{root}: not in the package: {', '.join(missing)} "
            "(missing, or left out by .funcignore)"
        )
    for path in referenced_files(root, pipeline_file):
        absolute = (root / pipeline_file).parent / path if not path.is_absolute() else path
        try:
            relative = absolute.resolve().relative_to(root).as_posix()
        except ValueError:
            continue  # outside the app (a mounted share): not the package's business
        if relative not in kept:
            raise PackageError(
                f"{pipeline_file} names {relative}, which is not in the "
                "package (missing, or left out by .funcignore)"
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "functionapp.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in files:
            info = zipfile.ZipInfo(name, FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, (root / name).read_bytes())
    return target
