"""Service Bus connection strings, read the way the SDKs read them (the one parser here).

``Endpoint=sb://<host>[:port]/;SharedAccessKeyName=<rule>;SharedAccessKey=<key>`` (or
``SharedAccessSignature=<token>``), optionally ``EntityPath=<entity>`` and
``UseDevelopmentEmulator=true``. The rules, checked against ``azure-servicebus``'s
``_parse_conn_str`` and ``@azure/core-amqp``'s ``parseConnectionString``:

- parts split on ``;`` (empty ones skipped), each at its first ``=``; a part without one
  makes the string malformed; an Endpoint without a scheme is taken as ``sb://``; keys are
  matched without regard to case (the Python SDK; the JS SDK wants the canonical spelling,
  which is a subset); ``HostName`` stands for ``Endpoint``;
- ``UseDevelopmentEmulator`` counts only as exactly ``true`` (both SDKs compare the text):
  ``True`` means TLS on 5671, like any real namespace;
- a key needs its rule name and the other way round, and a key and a signature exclude each
  other.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlparse

TLS_PORT = 5671
PLAIN_PORT = 5672
"""The emulator's plain AMQP port (``UseDevelopmentEmulator=true`` without a port)."""


class ConnectionStringError(ValueError):
    """A connection string the SDKs would refuse too; the message says why."""


@dataclass(frozen=True, slots=True)
class ConnectionString:
    endpoint: str
    """The Endpoint as written (``sb://host:port/``)."""
    key_name: str | None = None
    key: str | None = None
    signature: str | None = None
    """A ready ``SharedAccessSignature sr=...`` token instead of a key."""
    entity_path: str | None = None
    use_development_emulator: bool = False

    @classmethod
    def parse(cls, text: str) -> ConnectionString:
        settings: dict[str, str] = {}
        for part in text.strip().split(";"):
            if not part.strip():
                continue  # as the JS SDK does (the Python SDK refuses ";;")
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise ConnectionStringError(
                    "Connection string is either blank or malformed: every part is key=value."
                )
            settings[key.strip().lower()] = value.strip()
        endpoint = settings.get("endpoint") or settings.get("hostname")
        if not endpoint:
            raise ConnectionStringError("Connection string has no Endpoint.")
        parsed = cls(
            endpoint=endpoint,
            key_name=settings.get("sharedaccesskeyname") or None,
            key=settings.get("sharedaccesskey") or None,
            signature=settings.get("sharedaccesssignature") or None,
            entity_path=settings.get("entitypath") or None,
            use_development_emulator=settings.get("usedevelopmentemulator") == "true",
        )
        parsed._check()
        return parsed

    def _check(self) -> None:
        if not self.netloc:
            raise ConnectionStringError(
                f"Invalid Endpoint on the connection string: {self.endpoint!r}."
            )
        if bool(self.key) != bool(self.key_name):
            raise ConnectionStringError(
                "Connection string must have both SharedAccessKeyName and SharedAccessKey."
            )
        if self.key and self.signature:
            raise ConnectionStringError(
                "Only one of the SharedAccessKey or SharedAccessSignature must be present."
            )
        if not self.key and not self.signature:
            raise ConnectionStringError(
                "At least one of the SharedAccessKey or SharedAccessSignature must be present."
            )

    @property
    def netloc(self) -> str:
        """``host[:port]`` as the Endpoint spells it."""
        text = self.endpoint if "://" in self.endpoint else f"sb://{self.endpoint}"
        return urlparse(text).netloc

    @property
    def namespace(self) -> str:
        """``host[:port]`` in lower case: a namespace's identity (audiences, loop detection)."""
        return self.netloc.lower()

    @property
    def host(self) -> str:
        return urlparse(f"sb://{self.netloc}").hostname or self.netloc

    @property
    def port(self) -> int:
        """The Endpoint's port, else 5672 for the emulator and 5671 (AMQPS) otherwise."""
        explicit = urlparse(f"sb://{self.netloc}").port
        return explicit or (PLAIN_PORT if self.use_development_emulator else TLS_PORT)

    @property
    def use_tls(self) -> bool:
        return not self.use_development_emulator


def namespace_of(text: str) -> str:
    """The namespace a connection string points at (``host[:port]``, lower case)."""
    return ConnectionString.parse(text).namespace


def with_endpoint(text: str, netloc: str, *, emulator: bool = False) -> str:
    """The connection string with another Endpoint (keys, rules and options kept as written);
    ``emulator`` also sets ``UseDevelopmentEmulator=true``."""
    ConnectionString.parse(text)  # refuse what the SDKs refuse before rewriting it
    parts: list[str] = []
    seen_emulator = False
    for part in text.strip().split(";"):
        if not part.strip():
            continue
        name = part.partition("=")[0].strip().lower()
        if name in ("endpoint", "hostname"):
            parts.append(f"Endpoint=sb://{netloc}/")
        elif name == "usedevelopmentemulator" and emulator:
            parts.append("UseDevelopmentEmulator=true")
            seen_emulator = True
        else:
            parts.append(part.strip())
    if emulator and not seen_emulator:
        parts.append("UseDevelopmentEmulator=true")
    return ";".join(parts)
