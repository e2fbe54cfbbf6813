"""How our connections prove who they are: SASL only announces that CBS follows, and a token
provider gives CBS a token per audience.

A ``TokenProvider`` is called with an audience (``sb://host[:port]/<entity>``) whenever CBS
puts or renews a token, so it can mint a fresh one each time (a key), hand back the one it
was given (a ready signature), or ask a credential (named key, SAS credential, Entra ID).
The expiry it returns decides when ``AmqpConnection`` renews.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from ..amqp.performatives import SaslInit
from ..amqp.sasl import ANONYMOUS, MSSBCBS, SaslClient
from ..clock import SYSTEM, Clock
from . import sas

if TYPE_CHECKING:
    from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential, TokenCredential
    from azure.core.credentials_async import AsyncTokenCredential

AAD_SCOPE = "https://servicebus.azure.net/.default"
"""The scope an Entra ID (AAD) token for Service Bus is requested for."""

TokenProvider = Callable[[str], Awaitable[tuple[str, float]]]
"""audience -> (token, expiry in Unix seconds)."""


def key_token(
    key_name: str, key: str, lifetime: float = sas.DEFAULT_LIFETIME, clock: Clock = SYSTEM
) -> TokenProvider:
    """A SAS token signed with a shared access key, minted afresh for every put (renewals
    then extend access for as long as the key is valid); its lifetime runs on ``clock``."""

    async def provide(audience: str) -> tuple[str, float]:
        return sas.mint(audience, key_name, key, lifetime, clock.time())

    return provide


def fixed_token(token: str, expiry: float | None = None) -> TokenProvider:
    """A ready SharedAccessSignature (a connection string's): the same token every time, so
    access ends when it does (its ``se=``, or never when it has none)."""
    if expiry is None:
        expiry = sas.token_expiry(token) or time.time() * 2  # no se=: it never ends

    async def provide(audience: str) -> tuple[str, float]:
        return token, float(expiry)

    return provide


def named_key_token(credential: AzureNamedKeyCredential) -> TokenProvider:
    """An ``AzureNamedKeyCredential``: its name and key are read on every put, so an
    ``update()`` of the credential takes effect at the next renewal."""

    async def provide(audience: str) -> tuple[str, float]:
        name, key = credential.named_key
        return sas.mint(audience, name, key)

    return provide


def sas_credential_token(credential: AzureSasCredential) -> TokenProvider:
    """An ``AzureSasCredential``: its signature is read on every put (it may be updated)."""

    async def provide(audience: str) -> tuple[str, float]:
        token = credential.signature
        return token, float(sas.token_expiry(token) or time.time() * 2)

    return provide


def aad_token(credential: TokenCredential | AsyncTokenCredential) -> TokenProvider:
    """A Microsoft Entra ID credential (``get_token``, sync or async): a JWT for
    ``AAD_SCOPE``, whatever the audience (put with ``JWT_TOKEN_TYPE``)."""

    async def provide(audience: str) -> tuple[str, float]:
        access = credential.get_token(AAD_SCOPE)
        if inspect.isawaitable(access):  # an AsyncTokenCredential
            access = await access
        return access.token, float(access.expires_on)

    return provide


class ServiceBusSasl(SaslClient):
    """ANONYMOUS when offered (what the SDKs use), else MSSBCBS: both mean "CBS follows"."""

    def init(self, offered: Iterable[str]) -> SaslInit:
        offered = tuple(str(m) for m in offered)
        self.mechanism = ANONYMOUS if ANONYMOUS in offered or MSSBCBS not in offered else MSSBCBS
        return super().init(offered)
