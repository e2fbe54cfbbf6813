"""Which ``Host`` and ``Origin`` an HTTP server bound to loopback answers (DNS rebinding).

Any page a developer opens can reach 127.0.0.1 by name: an attacker's DNS points
``127.0.0.1.example.com`` at it, and to the browser the server is then that page's own
origin, free to read and post. The browser still sends that name as ``Host``, and the page's
origin as ``Origin``. So a server bound to loopback serves only requests whose Host is the
name ``localhost`` or a literal loopback address (names are compared whole, never by prefix:
DNS can put any name anywhere), and changes state only for requests whose Origin, when they
carry one, is such a host too (curl and the SDKs send none). The broker's listener and the
local host's HTTP server both ask ``refusal``; a server bound elsewhere asks tokens instead.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

LOCALHOST = "localhost"
"""The one name accepted: whole, any case, without a trailing dot (``localhost.`` is a
spelling no client needs; one exact rule is easier to trust than a list of them)."""
STATE_CHANGING = frozenset({"POST", "PUT", "DELETE", "PATCH"})
_HOST = re.compile(r"(?:\[(?P<ipv6>[^\]]*)\]|(?P<name>[^:\[\]]*))(?::[0-9]*)?")
"""RFC 9110 ``Host``: a bracketed IPv6 literal or a name / IPv4 literal, then ``:port``."""
_IPV6_LOOPBACK = ipaddress.IPv6Address("::1")


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    message: str


def is_loopback_host(value: str) -> bool:
    """A ``Host`` value (optional ``:port``, IPv6 in brackets) that can only mean this
    machine: ``localhost`` or a literal in 127.0.0.0/8 or ``[::1]``. ``127.1`` and other
    shorthand are names to the parser, so they are refused."""
    match = _HOST.fullmatch(value)
    if match is None:
        return False
    if match["ipv6"] is not None:
        return _address(match["ipv6"]) == _IPV6_LOOPBACK
    name = match["name"]
    if name.lower() == LOCALHOST:
        return True
    address = _address(name)
    return isinstance(address, ipaddress.IPv4Address) and address.is_loopback


def is_loopback_origin(value: str) -> bool:
    """An ``Origin`` (``scheme://host[:port]``) on a loopback host; ``null`` (sandboxed
    frames, files, redirects) is not."""
    try:
        origin = urlsplit(value)
    except ValueError:
        return False
    return (
        origin.scheme in ("http", "https")
        and not (origin.path or origin.query or origin.fragment or "@" in origin.netloc)
        and is_loopback_host(origin.netloc)
    )


def is_loopback_bind(address: str) -> bool:
    """Whether a listen address reaches this machine only (``localhost``, 127.0.0.0/8,
    ``::1``); ``0.0.0.0``, ``::`` and ``""`` listen on every interface."""
    if address.lower() == LOCALHOST:
        return True
    ip = _address(address.removeprefix("[").removesuffix("]"))
    return ip is not None and (ip == _IPV6_LOOPBACK or (ip.version == 4 and ip.is_loopback))


def refusal(
    method: str, host: str | None, origin: str | None, upgrade: bool = False
) -> Refusal | None:
    """Why a loopback-bound server must not answer this request; None: it may.

    ``host`` / ``origin``: the headers, None when absent (only HTTP/1.0 clients send no
    Host; no browser does). ``upgrade``: a WebSocket handshake, which a browser sends from
    any page without asking first; it carries AMQP sends, so it changes state too.
    421 Misdirected Request for the Host (RFC 9110: the server will not answer for that
    name), 403 for the Origin (the name is right, the page asking is not)."""
    if host is not None and not is_loopback_host(host):
        why = f"only for Host localhost, 127.0.0.0/8 or [::1] (any port), not {host!r}"
        return Refusal(421, f"this server listens on loopback and answers {why}")
    changes_state = upgrade or method.upper() in STATE_CHANGING
    if changes_state and origin is not None and not is_loopback_origin(origin):
        what = "WebSocket" if upgrade else method
        why = f"only from pages on localhost, 127.0.0.0/8 or [::1], not Origin {origin!r}"
        return Refusal(403, f"this server listens on loopback and takes {what} requests {why}")
    return None


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None
