"""The ``failover:`` block of a pipeline endpoint, and building a ``Failover`` from it.

::

    target:
      connection: SecondaryServiceBus
      queue: orders
      failover:
        dns: {alias: servicebus.test.example.com}      # or file: {path: ...} / {url: ...}
        failures: 3                                    # or static: sb1.servicebus.windows.net
        recheck_interval: 30

Two app settings belong to the environment, not the pipeline file, so the same file runs in
Azure and on a laptop: ``REPLICATION_DNS_NAMESERVER`` (``host[:port]``, the DNS server when a
``dns`` block names none) and ``REPLICATION_FAILOVER_HOSTS`` (``host=127.0.0.1:port;...``:
resolved namespaces served by local brokers).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from ..clock import SYSTEM, Clock
from .base import Resolver
from .runtime import DEFAULT_FAILURES, DEFAULT_RECHECK_INTERVAL, Failover, parse_host_map

NAMESERVER_SETTING = "REPLICATION_DNS_NAMESERVER"
HOST_MAP_SETTING = "REPLICATION_FAILOVER_HOSTS"


def _nameserver(text: str) -> str:
    from .dns import parse_nameserver

    parse_nameserver(text)
    return text


def _host(text: str) -> str:
    from .static import normalise_host

    return normalise_host(text)


def _alias(text: str) -> str:
    name = text.strip().rstrip(".")
    labels = name.split(".")
    if len(labels) < 2 or any(not label or len(label) > 63 for label in labels):
        raise ValueError(f"{text!r} is not a DNS name (e.g. servicebus.example.com)")
    return name.lower()


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DnsFailover(_Block):
    alias: Annotated[str, AfterValidator(_alias)] = Field(
        description="The CNAME alias operators flip (e.g. servicebus.test.example.com)."
    )
    nameserver: Annotated[str, AfterValidator(_nameserver)] | None = Field(
        None,
        description="DNS server host[:port]; default: REPLICATION_DNS_NAMESERVER, "
        "else the system's resolver.",
    )
    timeout: float = Field(2.0, gt=0, description="Seconds per DNS query attempt.")


class FileFailover(_Block):
    model_config = ConfigDict(
        json_schema_extra={"oneOf": [{"required": ["path"]}, {"required": ["url"]}]}
    )

    path: str | None = Field(None, description="A text file (e.g. on a mounted share).")
    url: str | None = Field(None, description="An http(s) URL serving the text file.")

    @model_validator(mode="after")
    def _one(self) -> FileFailover:
        if (self.path is None) == (self.url is None):
            raise ValueError("give 'path' or 'url' (one of them)")
        if self.url is not None and not self.url.lower().startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r} must start with http:// or https://")
        return self

    @property
    def location(self) -> str:
        return self.path or self.url or ""


class FailoverSpec(_Block):
    """Where an endpoint's current namespace is looked up, and when to look again."""

    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [{"required": ["dns"]}, {"required": ["file"]}, {"required": ["static"]}]
        }
    )

    dns: DnsFailover | None = Field(None, description="CNAME alias -> SRV (port 5671) lookup.")
    file: FileFailover | None = Field(None, description="First line of a file or URL.")
    static: Annotated[str, AfterValidator(_host)] | None = Field(
        None, description="A fixed namespace host (tests, simple setups)."
    )
    failures: int = Field(
        DEFAULT_FAILURES,
        ge=1,
        description="Consecutive failures that trigger a re-check "
        "(connection refused, unauthorized, disabled or missing entity trigger one at once).",
    )
    recheck_interval: float = Field(
        DEFAULT_RECHECK_INTERVAL, gt=0, description="Seconds between re-checks without errors."
    )

    @model_validator(mode="after")
    def _one(self) -> FailoverSpec:
        given = [name for name in ("dns", "file", "static") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of 'dns', 'file' or 'static'"
                + (f" (got {', '.join(given)})" if given else "")
            )
        return self

    def describe(self) -> str:
        if self.dns is not None:
            return f"dns {self.dns.alias}"
        if self.file is not None:
            return f"file {self.file.location}"
        return f"static {self.static}"

    def resolver(
        self,
        settings: Mapping[str, str] | None = None,
        base_dir: Path | None = None,
        clock: Clock = SYSTEM,
    ) -> Resolver:
        """``base_dir``: where a relative ``file.path`` is (the pipeline file's folder);
        ``clock``: what a DNS resolver's cache and retry pauses run on."""
        settings = settings or {}
        if self.dns is not None:
            from .dns import DnsResolver

            nameserver = self.dns.nameserver or settings.get(NAMESERVER_SETTING) or None
            return DnsResolver(self.dns.alias, nameserver, timeout=self.dns.timeout, clock=clock)
        if self.file is not None:
            from .file import FileResolver

            location = self.file.location
            if self.file.path is not None and base_dir is not None:
                location = str(base_dir / Path(self.file.path).expanduser())
            return FileResolver(location)
        from .static import StaticResolver

        return StaticResolver(str(self.static))

    def build(
        self,
        name: str,
        base_connection: str,
        settings: Mapping[str, str] | None = None,
        base_dir: Path | None = None,
        clock: Clock = SYSTEM,
    ) -> Failover:
        """A ``Failover`` for an endpoint whose configured connection string is
        ``base_connection`` (its keys are used on every namespace of the set); ``clock``:
        what its re-checks, retry pauses and resolver run on."""
        settings = settings or {}
        return Failover(
            name,
            self.resolver(settings, base_dir, clock),
            base_connection,
            host_map=parse_host_map(settings.get(HOST_MAP_SETTING)),
            failures=self.failures,
            recheck_interval=self.recheck_interval,
            clock=clock,
        )
