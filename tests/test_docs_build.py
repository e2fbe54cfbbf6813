"""``mkdocs build --strict`` (mkdocs.yml): the test command builds the documentation."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mkdocs_builds_strict(tmp_path: Path) -> None:
    """What ``mkdocs build --strict`` checks: links to pages and anchors, pages left out of the
    nav, the included files; and nothing in the built site loads from another host."""
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert (site / "cli" / "index.html").is_file()
    remote = re.compile(r'<(?:link|script)\b[^>]*\b(?:href|src)="(?:https?:)?//')
    for page in site.rglob("*.html"):
        assert not remote.search(page.read_text(encoding="utf-8")), page
