"""Where a drill runs, and how it fails over there.

``EmbeddedNamespaces``: two broker processes (``brokers.py``) standing for the namespaces
``primary.drill.invalid`` and ``secondary.drill.invalid`` (``.invalid``: never a real
name), mapped onto them as ``REPLICATION_FAILOVER_HOSTS`` maps namespaces onto local
brokers. The producer finds the current one through the alias ``servicebus.drill.invalid``
(a CNAME to ``sb1.drill.invalid`` or ``sb2.drill.invalid``, each zone with its SRV record
for port 5671, served by an in-process DNS server), or through a file in the drill's
folder. The flip points the alias (or the file) at the secondary; a kill ends the primary's
process first.

``GivenNamespaces``: two namespaces by connection string. The flip rewrites the failover
file (the drill writes the primary's host into it at the start), or runs the operator's
command (``--flip-command``), the only way to flip a real alias.

Both check at the start that the failover source names the primary: a drill that starts
on the secondary would measure nothing.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from pathlib import Path
from typing import Protocol

from ..clock import Clock
from ..failover.base import FailoverError, Resolver
from ..failover.dns import AMQPS_PORT, SRV_PREFIX, DnsResolver
from ..failover.file import FileResolver
from ..failover.runtime import Failover
from ..servicebus.connection_string import ConnectionString
from .brokers import BrokerProcess
from .dns_server import DnsServer
from .options import DrillError, DrillOptions

log = logging.getLogger("replication.drill")

PRIMARY_HOST = "primary.drill.invalid"
SECONDARY_HOST = "secondary.drill.invalid"
ALIAS = "servicebus.drill.invalid"
ZONES = {PRIMARY_HOST: "sb1.drill.invalid", SECONDARY_HOST: "sb2.drill.invalid"}
"""The zone of each namespace: the alias's CNAME names one, its SRV record the namespace."""


class Namespaces(Protocol):
    @property
    def primary_connection(self) -> str: ...

    @property
    def secondary_connection(self) -> str: ...

    @property
    def primary_host(self) -> str:
        """The host the failover source names for the primary (what the producer's accepts
        say)."""
        ...

    @property
    def secondary_host(self) -> str: ...

    def failover(self, options: DrillOptions, clock: Clock) -> Failover:
        """The producer's failover endpoint (base connection: the primary's keys)."""
        ...

    def describe(self) -> str:
        """The failover source, for the report: ``dns servicebus.drill.invalid via ...``."""
        ...

    async def kill_primary(self) -> None:
        """Ends the primary's process (SIGKILL); ``DrillError`` where the drill runs none."""
        ...

    async def flip(self) -> None:
        """Points the failover source at the secondary."""
        ...

    async def close(self) -> None: ...


class EmbeddedNamespaces:
    def __init__(self, folder: Path, config: dict[str, object], via: str, dns_ttl: int) -> None:
        self.folder = folder
        self.via = via
        self.dns_ttl = dns_ttl
        self.primary = BrokerProcess("primary", folder / "primary", config)
        self.secondary = BrokerProcess("secondary", folder / "secondary", config)
        self.primary_host, self.secondary_host = PRIMARY_HOST, SECONDARY_HOST
        self.file = folder / "failover.txt"
        self.dns: DnsServer | None = None
        self._resolver: Resolver | None = None

    async def start(self) -> EmbeddedNamespaces:
        try:
            await asyncio.gather(self.primary.start(), self.secondary.start())
            if self.via == "dns":
                self.dns = DnsServer().start()
                for host, zone in ZONES.items():
                    self.dns.set_srv(SRV_PREFIX + zone, [(1, 1, AMQPS_PORT, host)], self.dns_ttl)
            self._point_at(PRIMARY_HOST)
        except BaseException:
            await self.close()
            raise
        return self

    @property
    def primary_connection(self) -> str:
        return self.primary.connection_string

    @property
    def secondary_connection(self) -> str:
        return self.secondary.connection_string

    @property
    def host_map(self) -> dict[str, str]:
        return {
            PRIMARY_HOST: f"127.0.0.1:{self.primary.port}",
            SECONDARY_HOST: f"127.0.0.1:{self.secondary.port}",
        }

    def resolver(self, clock: Clock) -> Resolver:
        if self.dns is not None:
            return DnsResolver(ALIAS, self.dns.address, timeout=1.0, clock=clock)
        return FileResolver(str(self.file))

    def failover(self, options: DrillOptions, clock: Clock) -> Failover:
        return Failover(
            "drill/producer",
            self.resolver(clock),
            self.primary_connection,
            host_map=self.host_map,
            failures=options.failures,
            recheck_interval=options.recheck_interval,
            clock=clock,
        )

    def describe(self) -> str:
        if self.dns is not None:
            return f"dns {ALIAS} via {self.dns.address} (ttl {self.dns_ttl} s)"
        return f"file {self.file}"

    def _point_at(self, host: str) -> None:
        if self.dns is not None:
            self.dns.set_cname(ALIAS, ZONES[host], self.dns_ttl)
        else:
            self.file.write_text(f"# the drill's current namespace\n{host}\n", encoding="utf-8")

    async def kill_primary(self) -> None:
        await asyncio.to_thread(self.primary.kill)

    async def flip(self) -> None:
        self._point_at(SECONDARY_HOST)

    async def close(self) -> None:
        if self.dns is not None:
            self.dns.stop()
            self.dns = None
        await asyncio.gather(
            asyncio.to_thread(self.primary.stop), asyncio.to_thread(self.secondary.stop)
        )


class GivenNamespaces:
    def __init__(self, options: DrillOptions) -> None:
        assert options.primary is not None and options.secondary is not None
        self.options = options
        self.primary_connection = options.primary
        self.secondary_connection = options.secondary
        self.primary_host = _host(options.primary, "--primary")
        self.secondary_host = _host(options.secondary, "--secondary")
        if self.primary_host == self.secondary_host:
            raise DrillError(f"--primary and --secondary are one namespace ({self.primary_host})")

    def resolver(self, clock: Clock) -> Resolver:
        if self.options.alias is not None:
            alias, nameserver = self.options.alias, self.options.nameserver
            return DnsResolver(alias, nameserver, clock=clock)
        assert self.options.file is not None
        return FileResolver(self.options.file)

    async def start(self, clock: Clock) -> GivenNamespaces:
        """Writes the primary into the file (unless a command flips it); then checks that
        the failover source names the primary."""
        if self.options.file is not None and self.options.flip_command is None:
            self._write(self.primary_host)
        resolver = self.resolver(clock)
        try:
            found = (await asyncio.to_thread(resolver.resolve)).host
        except FailoverError as exc:
            raise DrillError(f"{resolver.describe()}: {exc}") from exc
        if found != self.primary_host:
            raise DrillError(
                f"{resolver.describe()} names {found}, not the primary {self.primary_host}: "
                "point it at the primary before the drill"
            )
        return self

    def failover(self, options: DrillOptions, clock: Clock) -> Failover:
        return Failover(
            "drill/producer",
            self.resolver(clock),
            self.primary_connection,
            failures=options.failures,
            recheck_interval=options.recheck_interval,
            clock=clock,
        )

    def describe(self) -> str:
        if self.options.alias is not None:
            return f"dns {self.options.alias}"
        return f"file {self.options.file}"

    def _write(self, host: str) -> None:
        assert self.options.file is not None
        Path(self.options.file).write_text(f"{host}\n", encoding="utf-8")

    async def kill_primary(self) -> None:
        raise DrillError("cannot kill a namespace the drill does not run")

    async def flip(self) -> None:
        command = self.options.flip_command
        if command is None:
            self._write(self.secondary_host)
            return
        process = await asyncio.create_subprocess_shell(command)
        if await process.wait() != 0:
            code = process.returncode
            log.error("drill: the flip command failed (exit %s): %s", code, shlex.quote(command))

    async def close(self) -> None:
        return None


def _host(connection_string: str, option: str) -> str:
    try:
        return ConnectionString.parse(connection_string).netloc.lower()
    except ValueError as exc:
        raise DrillError(f"{option}: {exc}") from exc
