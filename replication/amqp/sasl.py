"""SASL mechanisms (spec 5.3, RFC 4422/4616): ANONYMOUS, PLAIN and Service Bus's MSSBCBS.

Pure objects: the connection hands them the frames it reads and sends the frames they return.
A server decides who may connect through an ``authenticate`` callback, so the broker keeps its
key store and this module keeps no secrets. MSSBCBS means "I will authorise through CBS later",
so it succeeds here and the broker checks tokens on ``$cbs``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar

from mypy_extensions import mypyc_attr

from .errors import AMQPError
from .performatives import (
    SASL_AUTH,
    SASL_OK,
    SASL_SYS_PERM,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
)

ANONYMOUS = "ANONYMOUS"
PLAIN = "PLAIN"
MSSBCBS = "MSSBCBS"
EXTERNAL = "EXTERNAL"


class AuthenticationError(AMQPError):
    default_condition: ClassVar[str] = "amqp:unauthorized-access"


@dataclass(frozen=True, slots=True)
class SaslCredentials:
    """What a client presented: PLAIN gives a username and password, others only a mechanism."""

    mechanism: str
    username: str | None = None
    password: str | None = None
    hostname: str | None = None
    authzid: str | None = None


@mypyc_attr(allow_interpreted_subclasses=True)  # servicebus.tokens.ServiceBusSasl
class SaslClient:
    """Picks our mechanism from the server's list and writes its init frame."""

    def __init__(
        self,
        mechanism: str = ANONYMOUS,
        *,
        username: str | None = None,
        password: str | None = None,
        hostname: str | None = None,
    ) -> None:
        if mechanism == PLAIN and (username is None or password is None):
            raise ValueError("SASL PLAIN needs a username and a password")
        self.mechanism = mechanism
        self.username = username
        self.password = password
        self.hostname = hostname

    def init(self, offered: Iterable[str]) -> SaslInit:
        offered = tuple(offered)
        if self.mechanism not in offered:
            raise AuthenticationError(
                f"server offers SASL {', '.join(offered) or 'nothing'}, not {self.mechanism}"
            )
        response: bytes | None = None
        if self.mechanism == PLAIN:
            response = b"\0" + self.username.encode() + b"\0" + self.password.encode()  # type: ignore[union-attr]  # __init__ checked
        elif self.mechanism == ANONYMOUS:
            response = b""
        return SaslInit(mechanism=self.mechanism, initial_response=response, hostname=self.hostname)

    def challenge(self, data: bytes) -> bytes:
        raise AuthenticationError(f"SASL {self.mechanism} does not expect a challenge")


Authenticator = Callable[[SaslCredentials], bool]


def _accept_everyone(credentials: SaslCredentials) -> bool:
    return True


class SaslServer:
    """Offers mechanisms and judges a client's init with ``authenticate``."""

    def __init__(
        self,
        mechanisms: Iterable[str] = (MSSBCBS, PLAIN, ANONYMOUS),
        authenticate: Authenticator = _accept_everyone,
    ) -> None:
        self.mechanisms = tuple(mechanisms)
        self.authenticate = authenticate

    def mechanisms_frame(self) -> SaslMechanisms:
        return SaslMechanisms(sasl_server_mechanisms=self.mechanisms)

    def handle_init(self, init: SaslInit) -> tuple[SaslOutcome, SaslCredentials | None]:
        """The outcome to send, and the credentials when they were accepted."""
        mechanism = str(init.mechanism)
        if mechanism not in self.mechanisms:
            return SaslOutcome(code=SASL_AUTH), None
        credentials = SaslCredentials(mechanism=mechanism, hostname=init.hostname)
        if mechanism == PLAIN:
            parsed = _parse_plain(init.initial_response or b"")
            if parsed is None:
                return SaslOutcome(code=SASL_AUTH), None
            authzid, username, password = parsed
            credentials = SaslCredentials(mechanism, username, password, init.hostname, authzid)
        try:
            accepted = self.authenticate(credentials)
        except Exception:  # the judge failed; refuse without guessing
            return SaslOutcome(code=SASL_SYS_PERM), None
        if not accepted:
            return SaslOutcome(code=SASL_AUTH), None
        return SaslOutcome(code=SASL_OK), credentials


def _parse_plain(response: bytes) -> tuple[str | None, str, str] | None:
    """RFC 4616: ``[authzid] NUL authcid NUL passwd``; None when malformed."""
    parts = bytes(response).split(b"\0")
    if len(parts) != 3:
        return None
    try:
        authzid, username, password = (p.decode("utf-8") for p in parts)
    except UnicodeDecodeError:
        return None
    if not username:
        return None
    return authzid or None, username, password
