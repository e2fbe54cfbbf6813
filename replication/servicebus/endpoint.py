"""Where a namespace is and how to authorise against it: one ``Endpoint`` for every
connection we open (receivers, senders, management, CBS).

It comes from a connection string (``Endpoint=sb://host[:port]``: TLS on 5671 with SNI = host,
or with ``UseDevelopmentEmulator=true`` plain AMQP on the given port, default 5672), or from an
``azure.servicebus.aio.ServiceBusClient`` (its namespace, credential and TLS settings), so the
code that was handed an SDK client can talk over our engine to the same place.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from ..clock import SYSTEM, Clock
from ..symbols import JWT_TOKEN_TYPE, SAS_TOKEN_TYPE
from . import sas
from .connection_string import PLAIN_PORT, TLS_PORT, ConnectionString
from .tokens import (
    TokenProvider,
    aad_token,
    fixed_token,
    key_token,
    named_key_token,
    sas_credential_token,
)

if TYPE_CHECKING:
    from azure.servicebus.aio import ServiceBusClient


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a namespace is and how to authorise against it."""

    host: str
    """The host name (TLS server name and SASL/open hostname), without port."""
    port: int
    namespace: str
    """``host[:port]`` as the Endpoint spelled it: the prefix of audiences and addresses."""
    use_tls: bool
    token_provider: TokenProvider = field(repr=False)
    token_type: str = SAS_TOKEN_TYPE
    entity: str | None = None
    """``EntityPath`` of an entity-level connection string, if any."""
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False)
    clock: Clock = field(default=SYSTEM, repr=False, compare=False)
    """What tokens are minted and renewed on (tests pass the broker's ``ManualClock``)."""

    @classmethod
    def from_connection_string(
        cls,
        connection_string: str,
        *,
        token_lifetime: float = sas.DEFAULT_LIFETIME,
        ssl_context: ssl.SSLContext | None = None,
        clock: Clock = SYSTEM,
    ) -> Endpoint:
        """An endpoint from a connection string (``servicebus.connection_string`` reads it)."""
        parsed = ConnectionString.parse(connection_string)
        if parsed.signature:
            provider = fixed_token(parsed.signature)
        else:
            assert parsed.key_name and parsed.key  # the parser requires one or the other
            provider = key_token(parsed.key_name, parsed.key, token_lifetime, clock)
        return cls._make(
            parsed.netloc,
            parsed.use_tls,
            provider,
            SAS_TOKEN_TYPE,
            parsed.entity_path,
            ssl_context,
            clock,
        )

    @classmethod
    def from_client(cls, client: ServiceBusClient) -> Endpoint:
        """The endpoint of an ``azure.servicebus.aio.ServiceBusClient``; ``ValueError`` when it
        uses something our engine does not do (web sockets, a proxy, a custom endpoint)."""
        from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
        from azure.servicebus import TransportType

        config = getattr(client, "_config", None)
        namespace = getattr(client, "fully_qualified_namespace", None)
        if config is None or not namespace:
            raise ValueError(f"not a ServiceBusClient: {client!r}")
        if (
            config.transport_type is not TransportType.Amqp
            or config.http_proxy
            or getattr(client, "_custom_endpoint_address", None)
        ):
            raise ValueError("web sockets, proxies and custom endpoints need the SDK")
        credential = client._credential
        token_type = SAS_TOKEN_TYPE
        provider: TokenProvider
        if isinstance(credential, AzureNamedKeyCredential):
            provider = named_key_token(credential)
        elif isinstance(credential, AzureSasCredential):
            provider = sas_credential_token(credential)
        elif hasattr(credential, "policy") and hasattr(credential, "key"):
            # ServiceBusSharedKeyCredential (what from_connection_string makes of a key)
            provider = key_token(credential.policy, credential.key, sas.DEFAULT_LIFETIME)
        elif hasattr(credential, "token") and hasattr(credential, "expiry"):
            # ServiceBusSASTokenCredential (a connection string's SharedAccessSignature)
            provider = fixed_token(credential.token, credential.expiry)
        elif hasattr(credential, "get_token"):  # Microsoft Entra ID
            provider = aad_token(credential)
            token_type = JWT_TOKEN_TYPE
        else:
            raise ValueError(f"unsupported credential {type(credential).__name__}")
        context = getattr(client, "_ssl_context", None)
        verify = getattr(client, "_connection_verify", None)
        if context is None and verify:
            context = ssl.create_default_context(cafile=verify)
        netloc = urlparse(f"sb://{namespace}").netloc
        return cls._make(
            netloc,
            bool(config.use_tls),
            provider,
            token_type,
            getattr(client, "_entity_name", None),
            context,
        )

    @classmethod
    def _make(
        cls,
        netloc: str,
        use_tls: bool,
        provider: TokenProvider,
        token_type: str,
        entity: str | None,
        ssl_context: ssl.SSLContext | None,
        clock: Clock = SYSTEM,
    ) -> Endpoint:
        parsed = urlparse(f"sb://{netloc}")
        host = parsed.hostname or netloc
        port = parsed.port or (TLS_PORT if use_tls else PLAIN_PORT)
        return cls(
            host, port, netloc.lower(), use_tls, provider, token_type, entity, ssl_context, clock
        )

    def audience(self, path: str) -> str:
        """The CBS audience (and SAS ``sr``) for an entity path, as the SDKs write it."""
        return f"sb://{self.namespace}/{path}"

    def address(self, path: str) -> str:
        """The link address for an entity path (what the SDK attaches to)."""
        return f"amqps://{self.namespace}/{path}"

    def tls_context(self) -> ssl.SSLContext | None:
        """The context to connect with: the one given, else certifi's trust store (what the
        SDK verifies against), so both accept the same servers."""
        if not self.use_tls:
            return None
        if self.ssl_context is not None:
            return self.ssl_context
        try:
            import certifi  # the SDK's own trust store, installed with it

            return ssl.create_default_context(cafile=certifi.where())
        except ImportError:  # pragma: no cover - certifi comes with azure-core
            return ssl.create_default_context()
