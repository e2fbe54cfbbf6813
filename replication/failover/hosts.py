"""What a namespace host looks like, wherever it was read (a file line, a URL, config)."""

from __future__ import annotations

import re
from urllib.parse import urlparse

_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
_PORT = re.compile(r"[0-9]{1,5}")


def normalise_host(text: str) -> str:
    """``sb1.servicebus.windows.net``, ``SB1.example.com.``, ``host:5671`` or
    ``sb://host[:port]/`` -> the lower-case host (with ``:port`` when one was given);
    ``ValueError`` for anything else."""
    value = text.strip()
    if "://" in value:
        parsed = urlparse(value)
        if parsed.scheme.lower() not in ("sb", "amqps", "amqp") or not parsed.netloc:
            raise ValueError(f"{text.strip()!r} is not a namespace (expected host or sb://host/)")
        value = parsed.netloc
    host, sep, port = value.rpartition(":") if ":" in value else (value, "", "")
    if sep and (not _PORT.fullmatch(port) or not 0 < int(port) < 65536):
        raise ValueError(f"{text.strip()!r} has an invalid port")
    name = host.rstrip(".").lower()
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValueError(f"{text.strip()!r} is not a host name")
    return f"{name}:{port}" if sep else name
