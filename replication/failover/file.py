"""The primary namespace written in a text file: on a mounted share, or served over http(s).

The seeds' simplest alternative to DNS: the name of the primary namespace in a plain text file
kept on infrastructure that survives a regional outage; failing over is rewriting it. The
first line that is neither empty nor a ``#`` comment is the namespace host (``sb://host/``
is accepted too). A file is re-read only when its modification time or size changed; a URL
is asked with a conditional GET (ETag / Last-Modified), so an unchanged file costs a 304.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .base import FailoverError, Resolution
from .hosts import normalise_host


@dataclass(slots=True)
class _Cached:
    resolution: Resolution
    stamp: tuple[int, int] | None = None
    """(st_mtime_ns, st_size) of the file it was read from."""
    etag: str | None = None
    modified: str | None = None


class FileResolver:
    def __init__(self, location: str, *, timeout: float = 5.0) -> None:
        self.location = location
        self.is_url = location.lower().startswith(("http://", "https://"))
        self.timeout = timeout
        self._cached: _Cached | None = None

    def describe(self) -> str:
        return f"{'url' if self.is_url else 'file'} {self.location}"

    def invalidate(self) -> None:
        self._cached = None

    def resolve(self) -> Resolution:
        return self._from_url() if self.is_url else self._from_file()

    # ------------------------------------------------------------------ a file

    def _from_file(self) -> Resolution:
        try:
            info = Path(self.location).stat()
            stamp = (info.st_mtime_ns, info.st_size)
            cached = self._cached
            if cached is not None and cached.stamp == stamp:
                return cached.resolution
            with Path(self.location).open(encoding="utf-8-sig") as handle:
                text = handle.read()
        except OSError as exc:
            raise FailoverError(f"cannot read {self.location}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise FailoverError(
                f"cannot read {self.location}: not UTF-8 text (byte {exc.start})"
            ) from None
        host, line = self._host(text)
        resolution = Resolution(host, (f"file {self.location} (line {line})",))
        self._cached = _Cached(resolution, stamp)
        return resolution

    # ------------------------------------------------------------------ a URL

    def _from_url(self) -> Resolution:
        cached = self._cached
        try:
            request = urllib.request.Request(self.location, headers={"Accept": "text/plain"})
            if cached is not None and cached.etag:
                request.add_header("If-None-Match", cached.etag)
            if cached is not None and cached.modified:
                request.add_header("If-Modified-Since", cached.modified)
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                status = response.status
                body = response.read(64 * 1024).decode("utf-8-sig", errors="replace")
                etag = response.headers.get("ETag")
                modified = response.headers.get("Last-Modified")
        except urllib.error.HTTPError as exc:
            if exc.code == 304 and cached is not None:
                return cached.resolution
            raise FailoverError(f"{self.location}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise FailoverError(f"cannot fetch {self.location}: {reason}") from None
        host, line = self._host(body)
        detail = f"etag {etag}, " if etag else ""
        chain = (f"url {self.location} ({detail}HTTP {status}, line {line})",)
        resolution = Resolution(host, chain)
        self._cached = _Cached(resolution, etag=etag, modified=modified)
        return resolution

    # ------------------------------------------------------------------ the line

    def _host(self, text: str) -> tuple[str, int]:
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            try:
                return normalise_host(line), number
            except ValueError as exc:
                raise FailoverError(f"{self.location} line {number}: {exc}") from None
        raise FailoverError(f"{self.location} names no namespace (it is empty, or only comments)")
