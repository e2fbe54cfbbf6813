"""A real DNS server in-process: UDP on 127.0.0.1 (a port from the OS), zone data in memory,
built on dnspython's wire format.

The drill serves its failover alias with it (the CNAME it flips, the SRV records of each
namespace's zone), so the DNS path of ``failover.dns`` is exercised exactly as against a
real zone; the tests change records with it while clients query, as an operator would.
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
        values = [f"{p} {w} {port} {_absolute(t)}" for p, w, port, t in records]
        self.set(name, "SRV", values, ttl)

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
            rdatas: list[Any] = [
                dns.rdata.from_text(dns.rdataclass.IN, question.rdtype, v) for v in values
            ]
            response.answer.append(dns.rrset.from_rdata_list(question.name, ttl, rdatas))
        elif not known:
            response.set_rcode(dns.rcode.NXDOMAIN)
        return response


def _key(name: str) -> str:
    return name.rstrip(".").lower()


def _absolute(name: str) -> str:
    return name if name.endswith(".") else name + "."
