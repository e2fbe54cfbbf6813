"""``--ui-token``: the SAS token a dashboard served off loopback opens with.

Service Bus users hold a connection string (the portal's "Shared access policies") or a
token minted from one, so the value is either: a ``SharedAccessSignature sr=...`` token,
used as it is, or a connection string with ``SharedAccessKeyName`` and ``SharedAccessKey``
(or ``SharedAccessSignature``), from which a token for the namespace is minted. The page
gets it in the URL the broker prints (``/#sas=<token>``): a fragment is never sent to the
server, and the page moves it to ``sessionStorage`` and out of the address bar at once.
Nobody who reaches the page without that URL gets the token; the API checks it as any other.
"""

from __future__ import annotations

from urllib.parse import quote

from ..broker.auth import (
    LISTEN,
    AuthorizationError,
    Authorizer,
    normalize_resource,
    parse_sas_token,
)
from ..servicebus.connection_string import ConnectionString
from ..servicebus.sas import TOKEN_TYPE, mint

LIFETIME = 24 * 3600
"""Seconds a token minted from a key lasts (the printed URL is good for a day)."""


def parse(value: str) -> ConnectionString | str:
    """A token (checked for shape) or a connection string; ``ValueError`` says what is wrong."""
    value = value.strip()
    if value.startswith(TOKEN_TYPE + " "):
        try:
            parse_sas_token(value)
        except AuthorizationError as exc:
            raise ValueError(f"--ui-token: {exc.description}") from None
        return value
    try:
        return ConnectionString.parse(value)
    except ValueError as exc:
        raise ValueError(
            f"--ui-token: a SharedAccessSignature token or a connection string ({exc})"
        ) from None


def token_for(value: str, host: str, now: float) -> str:
    """The token ``value`` gives for the namespace at ``host`` (``host:port``)."""
    parsed = parse(value)
    if isinstance(parsed, str):
        return parsed
    if parsed.signature:
        return parsed.signature
    assert parsed.key_name is not None and parsed.key is not None
    return mint(f"sb://{host}", parsed.key_name, parsed.key, LIFETIME, now)[0]


def problem(token: str, authorizer: Authorizer, now: float) -> str | None:
    """Why the broker would refuse ``token`` for the dashboard (Listen over the namespace,
    as its overview asks), or None."""
    try:
        host = normalize_resource(parse_sas_token(token).resource).partition("/")[0]
        grant = authorizer.validate(token, host, now)
        authorizer.check(grant, LISTEN, "")
    except AuthorizationError as exc:
        return exc.description
    return None


def fragment(token: str) -> str:
    """The part of the page's URL that carries the token."""
    return "#sas=" + quote(token, safe="")
