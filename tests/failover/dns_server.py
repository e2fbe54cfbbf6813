"""A real DNS server in-process: UDP on 127.0.0.1 (random port), zone data in memory, built on
dnspython's wire format. Tests change records while clients query it, as an operator would.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field
from typing import Any

import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.rrset

SB_ZONES = {
    "sb1": "sb1-test-example-com.servicebus.windows.net",
    "sb2": "sb2-test-example-com.servicebus.windows.net",
}
ALIAS = "servicebus.test.example.com"


@dataclass
class DnsServer:
    """``set_cname``, ``set_srv``, ``set_a``, ``remove`` change the zone at any time;
    ``fail_next`` makes the next questions fail (SERVFAIL, as a server whose upstream is
    down); ``queries`` counts the questions received, by (name, type)."""

    records: dict[tuple[str, str], tuple[int, list[str]]] = field(default_factory=dict)
    queries: dict[tuple[str, str], int] = field(default_factory=dict)
    address: str = ""
    failing: int = 0
    """Questions still to answer with SERVFAIL."""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ zone data

    def set(self, name: str, kind: str, values: list[str], ttl: int = 60) -> None:
        with self._lock:
            self.records[(_key(name), kind.upper())] = (ttl, values)

    def set_cname(self, name: str, target: str, ttl: int = 60) -> None:
        self.set(name, "CNAME", [_absolute(target)], ttl)

    def set_srv(self, name: str, records: list[tuple[int, int, int, str]], ttl: int = 60) -> None:
        self.set(name, "SRV", [f"{p} {w} {port} {_absolute(t)}" for p, w, port, t in records],
                 ttl)  # fmt: skip

    def set_a(self, name: str, address: str, ttl: int = 60) -> None:
        self.set(name, "A", [address], ttl)

    def remove(self, name: str, kind: str | None = None) -> None:
        with self._lock:
            for key in [k for k in self.records if k[0] == _key(name)]:
                if kind is None or key[1] == kind.upper():
                    del self.records[key]

    def fail_next(self, count: int) -> None:
        with self._lock:
            self.failing = count

    def asked(self, name: str, kind: str) -> int:
        with self._lock:
            return self.queries.get((_key(name), kind.upper()), 0)

    # ------------------------------------------------------------------ serving

    def start(self) -> DnsServer:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.settimeout(0.1)  # so ``stop`` is noticed: close() does not wake recvfrom
        self.address = f"127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, name="dns-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._sock is not None:
            sock, self._sock = self._sock, None
            sock.close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> DnsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _serve(self) -> None:
        while (sock := self._sock) is not None:
            try:
                data, peer = sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                reply = self.answer(dns.message.from_wire(data))
            except Exception:  # not DNS: ignore it, as a server would
                continue
            try:
                sock.sendto(reply.to_wire(), peer)
            except OSError:
                return

    def answer(self, query: dns.message.Message) -> dns.message.Message:
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        question = query.question[0]
        name, kind = _key(question.name.to_text()), dns.rdatatype.to_text(question.rdtype)
        with self._lock:
            self.queries[(name, kind)] = self.queries.get((name, kind), 0) + 1
            if self.failing > 0:
                self.failing -= 1
                response.set_rcode(dns.rcode.SERVFAIL)
                return response
            found = self.records.get((name, kind))
            known = any(key[0] == name for key in self.records)
        if found is not None:
            ttl, values = found
            rdatas: list[Any] = [dns.rdata.from_text(dns.rdataclass.IN, question.rdtype, v)
                                 for v in values]  # fmt: skip
            response.answer.append(dns.rrset.from_rdata_list(question.name, ttl, rdatas))
        elif not known:
            response.set_rcode(dns.rcode.NXDOMAIN)
        return response


def seed_zone(server: DnsServer, ttl: int = 60) -> DnsServer:
    """The zones of the Service Bus federation guidance: sb1 and sb2 with SRV records for
    5671 (AMQP over TLS) and 443 (WebSockets), and the alias pointing at sb1."""
    for zone, host in SB_ZONES.items():
        server.set_srv(f"_azure_servicebus._amqp.{zone}.test.example.com",
                       [(1, 1, 5671, host), (2, 2, 443, host)], ttl)  # fmt: skip
    server.set_cname(ALIAS, "sb1.test.example.com", ttl)
    return server


def _key(name: str) -> str:
    return name.rstrip(".").lower()


def _absolute(name: str) -> str:
    return name if name.endswith(".") else name + "."
