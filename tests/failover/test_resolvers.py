"""The resolvers against real servers: an in-process DNS server (dnspython on the wire, UDP on
127.0.0.1), real files, a real HTTP server. Records that try to trick the SRV choice, every
missing piece named, dead servers retried and reported, caches that expire as they should."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from replication.clock import ManualClock
from replication.failover import FailoverError
from replication.failover.dns import DnsResolver, SrvRecord, choose_srv, parse_nameserver
from replication.failover.file import FileResolver
from replication.failover.hosts import normalise_host
from replication.failover.static import StaticResolver
from tests.ports import unused_port

from .dns_server import ALIAS, DnsServer

SB1 = "sb1-test-example-com.servicebus.windows.net"
SB2 = "sb2-test-example-com.servicebus.windows.net"
SRV1 = "_azure_servicebus._amqp.sb1.test.example.com"


def resolver(server: DnsServer, alias: str = ALIAS, **options: object) -> DnsResolver:
    return DnsResolver(alias, server.address, timeout=1.0, **options)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- DNS


def test_the_guidance_zone_resolves_to_sb1_and_follows_a_flip(dns_server: DnsServer) -> None:
    dns = resolver(dns_server)
    first = dns.resolve()
    assert first.host == SB1
    assert first.ttl == 60
    assert first.chain == (
        f"alias {ALIAS}",
        "CNAME sb1.test.example.com (ttl 60)",
        f"SRV {SRV1} (ttl 60):",
        f"  1 1 5671 {SB1}  <- chosen",
        f"  2 2 443 {SB1}  (port 443, not 5671)",
    )
    assert dns.describe() == f"dns {ALIAS} via {dns_server.address}"
    dns_server.set_cname(ALIAS, "sb2.test.example.com")
    assert dns.resolve().host == SB1  # cached for the TTL
    dns.invalidate()
    assert dns.resolve().host == SB2


def test_answers_are_cached_for_their_ttl(dns_server: DnsServer) -> None:
    dns_server.set_cname(ALIAS, "sb1.test.example.com", ttl=1)
    clock = ManualClock()
    dns = resolver(dns_server, clock=clock)
    floor = resolver(dns_server, min_ttl=60, clock=clock)  # a TTL below the floor: the floor
    assert dns.resolve().ttl == floor.resolve().ttl == 1
    dns_server.set_cname(ALIAS, "sb2.test.example.com", ttl=1)
    assert dns.resolve().host == floor.resolve().host == SB1
    assert dns_server.asked(ALIAS, "CNAME") == 2  # once per resolver
    clock.advance(0.999)
    assert dns.resolve().host == SB1
    clock.advance(0.001)
    assert dns.resolve().host == SB2
    assert floor.resolve().host == SB1
    assert dns_server.asked(ALIAS, "CNAME") == 3
    assert dns_server.asked(SRV1, "SRV") == 2


def test_records_that_try_to_trick_the_choice(dns_server: DnsServer) -> None:
    dns_server.set_srv(SRV1, [
        (0, 100, 443, "websockets.example.net"),   # better priority, wrong port
        (1, 50, 5671, "."),                         # "decidedly not available"
        (5, 100, 5671, "worse.example.net"),        # right port, worse priority
        (2, 10, 5671, "SB1-Real.Example.NET."),     # the one: capitals and trailing dot
    ])  # fmt: skip
    dns_server.set_srv(f"_azure_servicebus._amqp.{ALIAS}", [(0, 1, 5671, "alias.example.net")])
    resolution = resolver(dns_server).resolve()
    assert resolution.host == "sb1-real.example.net"
    verdicts = "\n".join(resolution.chain)
    assert verdicts.endswith(
        "  0 100 443 websockets.example.net  (port 443, not 5671)\n"
        "  1 50 5671 .  (target '.': not available)\n"
        "  2 10 5671 SB1-Real.Example.NET  <- chosen\n"
        "  5 100 5671 worse.example.net  (priority 5 > 2)"
    )
    assert dns_server.asked(f"_azure_servicebus._amqp.{ALIAS}", "SRV") == 0


def test_weights_share_the_lowest_priority_as_rfc_2782_says() -> None:
    records = [
        SrvRecord(1, 0, 5671, "zero."),
        SrvRecord(1, 30, 5671, "thirty."),
        SrvRecord(1, 70, 5671, "seventy."),
        SrvRecord(2, 1000, 5671, "backup."),
        SrvRecord(0, 1000, 443, "ws."),
    ]
    rng = random.Random(7)
    picks = Counter(choose_srv(records, rng).target for _ in range(5000))  # type: ignore[union-attr]
    assert set(picks) == {"zero.", "thirty.", "seventy."}
    assert 0.25 < picks["thirty."] / 5000 < 0.35
    assert 0.65 < picks["seventy."] / 5000 < 0.75
    assert 0 < picks["zero."] < 120  # weight 0: a small chance (1 in 101), as the RFC says
    # all weights zero: still a choice; nothing usable: none
    assert choose_srv([SrvRecord(1, 0, 5671, "a."), SrvRecord(1, 0, 5671, "b.")], rng)
    assert choose_srv([SrvRecord(1, 1, 443, "a."), SrvRecord(1, 1, 5671, ".")], rng) is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.remove(ALIAS), f"{ALIAS} does not exist (NXDOMAIN): check the alias"),
        (
            lambda s: (s.remove(ALIAS), s.set_a(ALIAS, "10.0.0.1")),
            f"{ALIAS} has no CNAME record: the alias must be a CNAME to the zone",
        ),
        (
            lambda s: s.remove(SRV1),
            f"no SRV records at {SRV1}: the name does not exist (NXDOMAIN); "
            f"sb1.test.example.com is the CNAME of {ALIAS}",
        ),
        (
            lambda s: (s.remove(SRV1), s.set_a(SRV1, "10.0.0.1")),
            f"no SRV records at {SRV1}: the name has other records only",
        ),
        (
            lambda s: s.set_srv(SRV1, [(1, 1, 443, SB1), (2, 1, 5672, SB1)]),
            f"SRV records at {SRV1}: none is on port 5671 (ports: 443, 5672)",
        ),
        (
            lambda s: s.set_srv(SRV1, [(1, 1, 5671, ".")]),
            f"SRV records at {SRV1}: its port-5671 records have the target '.'",
        ),
    ],
)
def test_each_missing_piece_is_named(dns_server: DnsServer, change, message: str) -> None:  # type: ignore[no-untyped-def]
    change(dns_server)
    with pytest.raises(FailoverError, match="^" + _escape(message)):
        resolver(dns_server).resolve()


@pytest.fixture
def silent_server() -> Iterator[tuple[str, list[bytes]]]:
    """A UDP socket that reads queries and never answers."""
    seen: list[bytes] = []
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.05)
    running = True

    def read() -> None:
        while running:
            try:
                seen.append(sock.recvfrom(4096)[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    yield f"127.0.0.1:{sock.getsockname()[1]}", seen
    running = False
    thread.join(2)
    sock.close()


def test_a_silent_dns_server_is_retried_then_reported(
    silent_server: tuple[str, list[bytes]],
) -> None:
    """The real-time smoke test of the retries (the exact pauses are tested on a
    ``ManualClock`` below): a server that never answers costs each attempt its timeout
    (0.2 s of the socket's real time) plus 0.05 s and 0.1 s of pauses, about 0.75 s; 3 s
    is the bound that says the resolver did not hang on it."""
    address, seen = silent_server
    dns = DnsResolver(ALIAS, address, timeout=0.2, attempts=3, backoff=0.05)
    message = f"no answer from DNS server {address} for CNAME {ALIAS} after 3 attempts: timed out"
    started = time.monotonic()
    with pytest.raises(FailoverError, match="^" + _escape(message) + "$"):
        dns.resolve()
    assert time.monotonic() - started < 3.0
    assert len(seen) >= 3


def resolve_stepping(dns: DnsResolver, clock: ManualClock, server: DnsServer) -> tuple[
    list[tuple[float, int]], Future[object]
]:  # fmt: skip
    """Resolves in a thread, stepping ``clock`` over each pause the resolver takes; returns
    each pause with the CNAME questions the server had had by then, and the outcome."""
    taken: list[tuple[float, int]] = []
    with ThreadPoolExecutor(1) as pool:
        outcome: Future[object] = pool.submit(dns.resolve)
        deadline = time.monotonic() + 30
        while not outcome.done():
            wake = clock.next_wake()
            if wake is not None:
                taken.append((wake, server.asked(ALIAS, "CNAME")))
                clock.advance(wake)
            assert time.monotonic() < deadline, f"no end after pauses {taken}"
            time.sleep(0.005)  # the question is real I/O
    return taken, outcome


def test_a_failing_dns_server_is_asked_again_after_doubling_pauses(
    dns_server: DnsServer,
) -> None:
    """The server fails the first two questions (SERVFAIL): the resolver asks again after
    0.5 s, then 1 s, on its clock, and not before; the third answer is the resolution."""
    clock = ManualClock()
    dns = resolver(dns_server, attempts=4, backoff=0.5, clock=clock)
    dns_server.fail_next(2)
    taken, outcome = resolve_stepping(dns, clock, dns_server)
    assert taken == [(0.5, 1), (1.0, 2)]
    assert outcome.result().host == SB1  # type: ignore[attr-defined]
    assert dns_server.asked(ALIAS, "CNAME") == 3
    assert dns_server.asked(SRV1, "SRV") == 1


def test_a_dns_server_failing_for_good_is_reported_after_its_attempts(
    dns_server: DnsServer,
) -> None:
    """Three attempts, backoff 0.5 s: pauses of 0.5 and 1 s, then the failure names the
    server, the question and the last reason."""
    clock = ManualClock()
    dns = resolver(dns_server, attempts=3, backoff=0.5, clock=clock)
    dns_server.fail_next(1_000)
    taken, outcome = resolve_stepping(dns, clock, dns_server)
    assert taken == [(0.5, 1), (1.0, 2)]
    host, port = dns_server.address.split(":")
    message = (
        f"no answer from DNS server {dns_server.address} for CNAME {ALIAS} after 3 attempts: "
        f"Server Do53:{host}@{port} answered SERVFAIL"
    )
    with pytest.raises(FailoverError, match="^" + _escape(message) + "$"):
        outcome.result()
    assert dns_server.asked(ALIAS, "CNAME") == 3


def test_a_closed_dns_port_is_reported_not_raised_otherwise() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dns = DnsResolver(ALIAS, f"127.0.0.1:{port}", timeout=0.2, attempts=2, backoff=0.01)
    with pytest.raises(FailoverError, match=r"no answer from DNS server .* after 2 attempts"):
        dns.resolve()


def test_a_nameserver_by_name_is_looked_up(dns_server: DnsServer) -> None:
    port = dns_server.address.rsplit(":", 1)[1]
    by_name = DnsResolver(ALIAS, f"localhost:{port}", timeout=1.0)
    assert by_name.resolve().host == SB1
    assert by_name.describe() == f"dns {ALIAS} via localhost:{port}"
    nowhere = DnsResolver(ALIAS, "no-such-dns-server.invalid", timeout=0.2, attempts=1)
    with pytest.raises(
        FailoverError, match=r"cannot find DNS server no-such-dns-server\.invalid:53"
    ):
        nowhere.resolve()


def test_an_alias_that_is_not_a_dns_name_is_refused_at_once() -> None:
    for bad in ("", "a..b.example", "x" * 64 + ".example"):
        with pytest.raises(ValueError, match=r"alias is empty|is not a DNS name"):
            DnsResolver(bad, "127.0.0.1:9")
    assert DnsResolver("ServiceBus.Example.COM.").describe() == (
        "dns servicebus.example.com via system resolver"
    )
    assert DnsResolver("a.example", "[::1]:5353").describe() == "dns a.example via [::1]:5353"


def test_nameserver_addresses() -> None:
    assert parse_nameserver("10.0.0.2") == ("10.0.0.2", 53)
    assert parse_nameserver("127.0.0.1:5353") == ("127.0.0.1", 5353)
    assert parse_nameserver("[::1]:5353") == ("::1", 5353)
    assert parse_nameserver("::1") == ("::1", 53)
    for bad, message in [
        ("", "the DNS server address is empty"),
        ("host:", "'host:' has an empty port"),
        ("host:dns", "'host:dns' has an invalid port 'dns'"),
        ("host:70000", "'host:70000' has an invalid port '70000'"),
        ("[::1]x", "'[::1]x' is not host[:port]"),
    ]:
        with pytest.raises(ValueError, match="^" + _escape(message)):
            parse_nameserver(bad)


# ---------------------------------------------------------------------- files and URLs


def test_a_file_gives_its_first_host_line_and_is_re_read_when_it_changes(
    tmp_path: Path,
) -> None:
    share = tmp_path / "primary.txt"
    share.write_text(f"# primary namespace, edited by the on-call\n\n  {SB1.upper()}.  \n{SB2}\n")
    files = FileResolver(str(share))
    resolution = files.resolve()
    assert resolution.host == SB1
    assert resolution.chain == (f"file {share} (line 3)",)
    share.write_text(f"sb://{SB2}/\n")
    assert files.resolve().host == SB2
    share.write_text("# nothing but a comment\n")
    with pytest.raises(FailoverError, match="names no namespace"):
        files.resolve()
    share.write_text("\nnot a host name!\n")
    with pytest.raises(FailoverError, match=r"primary.txt line 2: 'not a host name!' is not a"):
        files.resolve()
    with pytest.raises(FailoverError, match=r"cannot read .*missing\.txt: No such file"):
        FileResolver(str(tmp_path / "missing.txt")).resolve()
    share.write_bytes(b"\xff\xfe" + SB1.encode())
    with pytest.raises(FailoverError, match=r"primary.txt: not UTF-8 text \(byte 0\)"):
        files.resolve()
    share.write_text("")
    with pytest.raises(FailoverError, match="names no namespace"):
        files.resolve()
    assert files.describe() == f"file {share}"


def test_an_unchanged_file_is_not_read_again(tmp_path: Path) -> None:
    share = tmp_path / "primary.txt"
    share.write_text(SB1)
    files = FileResolver(str(share))
    first = files.resolve()
    assert files.resolve() is first  # same mtime and size: the cached answer


class _Share(BaseHTTPRequestHandler):
    body = b""
    etag = '"1"'
    conditional: list[str] = []
    status = 200

    def do_GET(self) -> None:
        handler = type(self)
        if handler.status != 200:
            self.send_error(handler.status)
            return
        if self.headers.get("If-None-Match") == handler.etag:
            handler.conditional.append(handler.etag)
            self.send_response(304)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("ETag", handler.etag)
        self.send_header("Content-Length", str(len(handler.body)))
        self.end_headers()
        self.wfile.write(handler.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def share_url() -> Iterator[type[_Share]]:
    handler = type("Share", (_Share,), {"conditional": [], "body": b"", "status": 200})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}/primary.txt"  # type: ignore[attr-defined]
    yield handler
    server.shutdown()
    server.server_close()


def test_a_url_is_asked_with_a_conditional_get(share_url: type[_Share]) -> None:
    url = share_url.url  # type: ignore[attr-defined]
    share_url.body = f"# primary\n{SB1}\n".encode()
    files = FileResolver(url, timeout=2)
    assert files.resolve().host == SB1
    assert files.resolve().host == SB1
    assert share_url.conditional == ['"1"']  # the second GET was answered 304
    share_url.body, share_url.etag = f"{SB2}\n".encode(), '"2"'
    resolution = files.resolve()
    assert resolution.host == SB2
    assert resolution.chain == (f'url {url} (etag "2", HTTP 200, line 1)',)
    share_url.status = 404
    with pytest.raises(FailoverError, match=r"primary.txt: HTTP 404"):
        files.resolve()


def test_an_unreachable_or_malformed_url_is_reported() -> None:
    port = unused_port()
    with pytest.raises(FailoverError, match=r"cannot fetch http://127\.0\.0\.1.*refused"):
        FileResolver(f"http://127.0.0.1:{port}/primary.txt", timeout=1).resolve()
    with pytest.raises(FailoverError, match=r"cannot fetch .*nonnumeric port"):
        FileResolver("http://127.0.0.1:http/primary.txt").resolve()
    with pytest.raises(FailoverError, match=r"cannot fetch .*Invalid IPv6 URL"):
        FileResolver("https://[::1/primary.txt").resolve()
    assert (
        FileResolver("https://share.example/p.txt").describe() == "url https://share.example/p.txt"
    )


def test_static_and_host_names() -> None:
    assert StaticResolver("SB1.servicebus.windows.net.").resolve().host == (
        "sb1.servicebus.windows.net"
    )
    assert normalise_host("sb://sb2.example.net:5671/") == "sb2.example.net:5671"
    for bad, message in [
        ("", "'' is not a host name"),
        ("has space.example", "'has space.example' is not a host name"),
        ("http://x.example/", "'http://x.example/' is not a namespace (expected host or sb://"),
        ("-x.example", "'-x.example' is not a host name"),
        ("a..b", "'a..b' is not a host name"),
        ("x:0", "'x:0' has an invalid port"),
    ]:
        with pytest.raises(ValueError, match="^" + _escape(message)):
            normalise_host(bad)


def _escape(text: str) -> str:
    import re

    return re.escape(text)
