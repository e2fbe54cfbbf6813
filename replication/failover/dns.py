"""DNS-based failover: a CNAME alias operators flip, SRV records naming each namespace.

The seeds' scheme: each namespace has a zone (``sb1.test.example.com``) holding SRV records
at ``_azure_servicebus._amqp.sb1.test.example.com``, one for AMQP over TLS on port 5671 and
one for WebSockets on 443, both naming the namespace host. The application's alias
(``servicebus.test.example.com``) is a CNAME to the zone of the current primary; failing over
is editing that CNAME. Resolving is: CNAME of the alias, then SRV of the prefix + canonical
name, keep port 5671, choose as RFC 2782 says (lowest priority, then weighted random), and
the target without its trailing dot is the namespace.
"""

from __future__ import annotations

import ipaddress
import random
import socket
from dataclasses import dataclass

import dns.exception
import dns.name
import dns.rdatatype
import dns.resolver

from ..clock import SYSTEM, Clock
from .base import FailoverError, Resolution

SRV_PREFIX = "_azure_servicebus._amqp."
AMQPS_PORT = 5671
DEFAULT_DNS_PORT = 53


def parse_nameserver(text: str) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]:port`` or a bare IPv6 address -> (address, port)."""
    value = text.strip()
    if not value:
        raise ValueError("the DNS server address is empty")
    if value.startswith("["):
        address, _, rest = value[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise ValueError(f"{text!r} is not host[:port]")
    elif value.count(":") == 1:
        address, _, port_text = value.partition(":")
        if not port_text:
            raise ValueError(f"{text!r} has an empty port")
    else:
        address, port_text = value, ""  # a name, an IPv4 address or a bare IPv6 address
    if not address:
        raise ValueError(f"{text!r} has no host")
    if not port_text:
        return address, DEFAULT_DNS_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{text!r} has an invalid port {port_text!r}")
    return address, int(port_text)


@dataclass(frozen=True, slots=True)
class SrvRecord:
    priority: int
    weight: int
    port: int
    target: str
    """As published: may carry a trailing dot and capitals; ``.`` means "not available"."""

    def __str__(self) -> str:
        target = self.target.rstrip(".") or "."
        return f"{self.priority} {self.weight} {self.port} {target}"


def usable(record: SrvRecord) -> bool:
    return record.port == AMQPS_PORT and record.target.strip(".") != ""


def choose_srv(records: list[SrvRecord], rng: random.Random | None = None) -> SrvRecord | None:
    """RFC 2782 among the usable (port 5671, target not ``.``) records: the lowest priority
    value, then a weighted random pick (weight-0 records first, running sums, a uniform
    number in [0, total], the first record whose running sum reaches it)."""
    candidates = [r for r in records if usable(r)]
    if not candidates:
        return None
    best = min(r.priority for r in candidates)
    group = sorted((r for r in candidates if r.priority == best), key=lambda r: r.weight != 0)
    total = sum(r.weight for r in group)
    pick = (rng or random).randint(0, total)  # an integer in [0, total], as the RFC says
    running = 0
    for record in group:
        running += record.weight
        if running >= pick:
            return record
    return group[-1]


class DnsResolver:
    def __init__(
        self,
        alias: str,
        nameserver: str | None = None,
        *,
        timeout: float = 2.0,
        attempts: int = 3,
        backoff: float = 0.2,
        rng: random.Random | None = None,
        min_ttl: float = 0.0,
        clock: Clock = SYSTEM,
    ) -> None:
        self.alias = alias.strip().rstrip(".").lower()
        if not self.alias:
            raise ValueError("the alias is empty")
        try:
            dns.name.from_text(self.alias)
        except dns.exception.DNSException as exc:
            raise ValueError(f"{alias!r} is not a DNS name: {exc}") from None
        self.nameserver = parse_nameserver(nameserver) if nameserver else None
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self.rng = rng or random.Random()
        self.min_ttl = min_ttl
        self.clock = clock
        """Measures how long an answer is cached (its TTL) and the pauses between attempts."""
        self._cached: tuple[Resolution, float] | None = None
        self._resolver: dns.resolver.Resolver | None = None

    @property
    def server(self) -> str:
        """``127.0.0.1:5353``, ``[::1]:53`` or ``system resolver``: for messages."""
        if self.nameserver is None:
            return "system resolver"
        host, port = self.nameserver
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def describe(self) -> str:
        return f"dns {self.alias} via {self.server}"

    def invalidate(self) -> None:
        self._cached = None

    def resolve(self) -> Resolution:
        if self._cached is not None and self.clock.monotonic() < self._cached[1]:
            return self._cached[0]
        resolution = self._resolve()
        ttl = max(resolution.ttl or 0.0, self.min_ttl)
        self._cached = (resolution, self.clock.monotonic() + ttl)
        return resolution

    # ------------------------------------------------------------------ the lookup

    def _client(self) -> dns.resolver.Resolver:
        """Made on first use (not in ``__init__``) so a missing system configuration or an
        unknown server name is a ``FailoverError`` from ``resolve``, like any DNS trouble."""
        if self._resolver is None:
            if self.nameserver is None:
                try:
                    resolver = dns.resolver.Resolver()
                except dns.exception.DNSException as exc:
                    raise FailoverError(f"the system resolver is not configured: {exc}") from None
            else:
                resolver = dns.resolver.Resolver(configure=False)
                resolver.port = self.nameserver[1]
            resolver.timeout = resolver.lifetime = self.timeout
            resolver.cache = None  # our cache is per resolution, by the smallest TTL
            self._resolver = resolver
        if self.nameserver is not None:
            self._resolver.nameservers = _addresses(*self.nameserver)
        return self._resolver

    def _resolve(self) -> Resolution:
        client = self._client()
        chain = [f"alias {self.alias}"]
        try:
            cname = self._query(client, self.alias, "CNAME")
        except _Missing as missing:
            if missing.nxdomain:
                raise FailoverError(
                    f"{self.alias} does not exist (NXDOMAIN): check the alias"
                ) from None
            raise FailoverError(
                f"{self.alias} has no CNAME record: the alias must be a CNAME to the zone of "
                "the primary namespace"
            ) from None
        canonical = str(cname[0].target).rstrip(".").lower()
        chain.append(f"CNAME {canonical} (ttl {_ttl(cname)})")
        srv_name = SRV_PREFIX + canonical
        try:
            answer = self._query(client, srv_name, "SRV")
        except _Missing as missing:
            found = (
                "the name does not exist (NXDOMAIN)"
                if missing.nxdomain
                else ("the name has other records only")
            )
            raise FailoverError(
                f"no SRV records at {srv_name}: {found}; {canonical} is the CNAME of {self.alias}"
            ) from None
        records = [SrvRecord(r.priority, r.weight, r.port, str(r.target)) for r in answer]
        chosen = choose_srv(records, self.rng)
        chain.append(f"SRV {srv_name} (ttl {_ttl(answer)}):")
        best = min((r.priority for r in records if usable(r)), default=None)
        chain.extend(
            f"  {record}  {_verdict(record, chosen, best)}"
            for record in sorted(records, key=lambda r: (r.priority, -r.weight))
        )
        if chosen is None:
            ports = sorted({r.port for r in records})
            if any(r.port == AMQPS_PORT for r in records):
                reason = "its port-5671 records have the target '.' (service not available)"
            else:
                reason = f"none is on port 5671 (ports: {', '.join(map(str, ports))})"
            raise FailoverError(f"SRV records at {srv_name}: {reason}")
        host = chosen.target.rstrip(".").lower()
        return Resolution(host, tuple(chain), float(min(_ttl(cname), _ttl(answer))))

    def _query(self, client: dns.resolver.Resolver, name: str, kind: str) -> dns.resolver.Answer:
        """One question, retried with backoff while the server does not answer; raises
        ``_Missing`` for an answer without the record and ``FailoverError`` for the rest."""
        try:
            qname = dns.name.from_text(name)
        except dns.exception.DNSException as exc:
            raise FailoverError(f"{name} is not a DNS name: {exc}") from None
        last = ""
        delay = self.backoff
        for attempt in range(1, self.attempts + 1):
            try:
                return client.resolve(qname, kind, search=False)
            except dns.resolver.NXDOMAIN:
                raise _Missing(nxdomain=True) from None
            except dns.resolver.NoAnswer:
                raise _Missing(nxdomain=False) from None
            except (dns.resolver.NoNameservers, dns.exception.Timeout) as exc:
                last = _reason(exc)
            except (dns.exception.DNSException, OSError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if attempt < self.attempts:
                self.clock.blocking_sleep(delay)
                delay *= 2
        server = "the system resolver" if self.nameserver is None else f"DNS server {self.server}"
        raise FailoverError(
            f"no answer from {server} for {kind} {name} after {self.attempts} attempts: {last}"
        )


class _Missing(Exception):
    """The server answered: no such name (NXDOMAIN), or the name without that record type."""

    def __init__(self, nxdomain: bool) -> None:
        self.nxdomain = nxdomain


def _addresses(host: str, port: int) -> list[str]:
    """The server's IP addresses: as given, or its name looked up (``dns:53`` in a compose
    network) each time, so a moved server is found again."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise FailoverError(f"cannot find DNS server {host}:{port}: {reason}") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _reason(exc: Exception) -> str:
    if isinstance(exc, dns.exception.Timeout):
        return "timed out"
    text = str(exc)
    return text.split(": ", 1)[-1] if text else type(exc).__name__


def _verdict(record: SrvRecord, chosen: SrvRecord | None, best: int | None) -> str:
    if record is chosen:
        return "<- chosen"
    if record.port != AMQPS_PORT:
        return f"(port {record.port}, not {AMQPS_PORT})"
    if record.target.strip(".") == "":
        return "(target '.': not available)"
    if best is not None and record.priority > best:
        return f"(priority {record.priority} > {best})"
    return "(same priority, not picked by weight)"


def _ttl(answer: dns.resolver.Answer) -> int:
    """The TTL of an answer ``_query`` returned (it has records: ``_Missing`` otherwise)."""
    assert answer.rrset is not None
    return int(answer.rrset.ttl)
