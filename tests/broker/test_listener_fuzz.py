"""The sniffing listener against junk: every connection is answered or closed in time, the
broker logs no failure, and the clients that speak properly never notice.

Timeouts are shortened (the module constants are read per connection) so a silent or
stalled connection is dropped within about a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import ssl
import time
from typing import NamedTuple

import pytest
from azure.core.credentials import AzureNamedKeyCredential
from azure.servicebus import ServiceBusMessage, TransportType
from hypothesis import given
from hypothesis import strategies as st

from replication.broker import httpserver, listener
from replication.broker.auth import EMULATOR_KEY, EMULATOR_RULE_NAME
from replication.broker.listener import SASL_HEADER, Kind, sniff

from .conftest import HOST, BrokerHandle, QuickCloseClient, body_bytes, wait_for

TIMEOUT = 1.0
"""The listener's sniff and HTTP header/body timeouts in these tests."""
ANSWER_WITHIN = TIMEOUT + 29.0
"""How long a junk connection may wait for its answer or its close: a guard against a
connection left hanging, not a speed check (answers come within the timeout). The 400
clients and the broker share one process: 4 s of slack ran out in a CI run beside two CPU
burners."""
PREFIXES = [
    b"", b"A", b"AMQP", b"AMQP\x00\x01\x00\x00", b"AMQP\x03\x01\x00\x00", b"AMQP\x00\x01\x00",
    b"\x16", b"\x16\x03", b"\x16\x03\x01\x00\x05", b"\x16\x03\x03\x02\x00\x01",
    b"GET / HTTP/1.1\r\n", b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", b"POST ",
    b"PUT /q HTTP/1.1\r\nContent-Length: 5\r\n\r\n", b"DELETE /x HTTP/1.0\r\n\r\n",
    b"GET /$servicebus/websocket HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n",
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", b"\x00", b"\xff\xfe",
]  # fmt: skip


@pytest.fixture(autouse=True)
def short_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listener, "SNIFF_TIMEOUT", TIMEOUT)
    monkeypatch.setattr(httpserver, "HEADER_TIMEOUT", TIMEOUT)
    monkeypatch.setattr(httpserver, "BODY_TIMEOUT", TIMEOUT)
    monkeypatch.setattr(httpserver, "LINGER", TIMEOUT / 2)


# ---------------------------------------------------------------------------- sniff (sans-IO)


def test_sniff_examples() -> None:
    assert sniff(b"AMQP\x00\x01\x00\x00") is Kind.AMQP
    assert sniff(b"AMQP\x03\x01\x00\x00") is Kind.AMQP  # the AMQP layer answers bad versions
    assert sniff(b"") is None and sniff(b"AM") is None and sniff(b"AMQP\x00\x01") is None
    assert sniff(b"\x16") is None
    assert sniff(b"\x16\x03\x01\x02\x00") is Kind.TLS
    assert sniff(b"\x16\x02") is Kind.JUNK
    assert sniff(b"GET") is None and sniff(b"GET ") is Kind.HTTP
    assert sniff(b"M-SEARCH * HTTP/1.1") is Kind.JUNK
    assert sniff(b"get / HTTP/1.1") is Kind.JUNK
    assert sniff(b"DEL") is None and sniff(b"DELETE /q") is Kind.HTTP
    assert sniff(b"AMQX") is Kind.JUNK  # no method starts so: junk at once, no waiting
    assert sniff(b"ABCDEFGHIJKLMNOP") is Kind.JUNK
    assert sniff(b"\x00AMQP") is Kind.JUNK


@given(st.binary(max_size=40))
def test_sniff_decides_once_and_soon(data: bytes) -> None:
    """More bytes never change a decision, and 17 bytes always make one."""
    kind = sniff(data)
    if kind is None:
        assert len(data) < 17
        assert sniff(data + b"\x00" * 17) is not None
    else:
        assert sniff(data + b"more bytes") is kind


# ---------------------------------------------------------------------------- real sockets


class Probe(NamedTuple):
    answer: bytes
    seconds: float
    """From connected to the first answer bytes or the close."""
    port: int
    """The client's port: the broker's logs name the connection by it."""
    sent_after: float
    """From starting to connect to the first bytes sent (the broker's sniff timeout starts
    later, when it accepts the connection)."""


async def probe(port: int, data: bytes, pause: float = 0.0) -> Probe:
    """Sends ``data`` (``pause`` seconds after connecting), then waits for the first answer
    bytes or the close."""
    connecting = time.monotonic()
    reader, writer = await asyncio.open_connection(HOST, port)
    started = time.monotonic()
    local = writer.get_extra_info("sockname")[1]
    try:
        await asyncio.sleep(pause)
        if data:
            writer.write(data)
        sent_after = time.monotonic() - connecting
        try:
            answer = await asyncio.wait_for(reader.read(65536), ANSWER_WITHIN)
        except ConnectionResetError:
            answer = b""
        except TimeoutError:
            return Probe(b"", ANSWER_WITHIN, local, sent_after)
        return Probe(answer, time.monotonic() - started, local, sent_after)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def samples(seed: int, count: int) -> list[bytes]:
    rng = random.Random(seed)
    return [
        rng.choice(PREFIXES) + rng.randbytes(rng.choice([0, 1, 3, 8, 64, 600]))
        for _ in range(count)
    ]


def round_trip(broker: BrokerHandle, transport: TransportType | None, text: str) -> None:
    """A message sent and received with the SDK: plain AMQP (None), AMQPS or WSS."""
    if transport is None:
        client = broker.client()
    else:
        client = QuickCloseClient(
            "localhost", AzureNamedKeyCredential(EMULATOR_RULE_NAME, EMULATOR_KEY),
            custom_endpoint_address=f"sb://localhost:{broker.port}",
            connection_verify=str(broker.data_dir / "tls" / "ca.pem"), transport_type=transport,
        )  # fmt: skip
    with client, client.get_queue_sender("q") as sender:
        sender.send_messages(ServiceBusMessage(text))
        with client.get_queue_receiver("q") as receiver:
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=10)
            assert body_bytes(message) == text.encode()
            receiver.complete_message(message)


def open_connections(broker: BrokerHandle) -> int:
    def count() -> int:
        assert broker.broker is not None and broker.broker.listener is not None
        return len(broker.broker.listener.connections)

    return broker.call(count)


def dropped_unheard(records: list[logging.LogRecord]) -> set[int]:
    """The client ports of the connections the broker dropped because their first bytes had
    not come within the sniff timeout (from its debug log)."""
    silent = "%s sent nothing in %s s"
    found = [r.args for r in records if r.name == listener.log.name and r.msg == silent]
    return {args[0][1] for args in found if isinstance(args, tuple)}


def test_random_first_bytes(broker: BrokerHandle, caplog: pytest.LogCaptureFixture) -> None:
    """400 connections with random first bytes, all at once: each is answered or closed
    within the timeouts; then the SDK works on every transport and nothing is left open.

    Junk gets the SASL header unless its bytes came after the sniff timeout: then the
    broker has dropped the connection as silent, unanswered. With 400 clients on a busy
    machine that happens by chance too (the client's loop shares the broker's process), and
    a few junk clients here wait the timeout out on purpose."""
    caplog.set_level(logging.WARNING)
    caplog.set_level(logging.DEBUG, logger=listener.log.name)
    data = samples(12, 400)
    late = set([i for i, d in enumerate(data) if sniff(d) is Kind.JUNK][:5])
    pauses = [TIMEOUT + 0.5 if i in late else 0.0 for i in range(len(data))]

    async def run_all() -> list[Probe]:
        return await asyncio.gather(*map(probe, [broker.port] * len(data), data, pauses))

    results = asyncio.run(run_all())
    slow = [
        (d[:20], p.seconds)
        for d, p in zip(data, results, strict=True)
        if p.seconds >= ANSWER_WITHIN
    ]
    assert not slow, slow[:5]
    dropped = dropped_unheard(caplog.records)
    for sent, result in zip(data, results, strict=True):
        kind = sniff(sent)
        if kind is Kind.JUNK and result.port in dropped:
            # sent once the timeout had run out (0.01: the broker's loop looks at its
            # timers a moment after its sockets)
            assert result.answer == b"" and result.sent_after > TIMEOUT - 0.01, (sent[:20], result)
        elif kind is Kind.JUNK:
            assert result.answer == SASL_HEADER, (sent[:20], result)
        elif kind is Kind.HTTP and result.answer:
            assert result.answer.startswith(b"HTTP/1."), (sent[:40], result.answer[:40])
    for transport in (None, TransportType.Amqp, TransportType.AmqpOverWebsocket):
        round_trip(broker, transport, f"after the junk: {transport}")
    wait_for(lambda: open_connections(broker) == 0, timeout=ANSWER_WITHIN)
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not failures, failures[:3]


def _client_hello(context: ssl.SSLContext) -> bytes:
    """The first flight of a TLS client made with ``context``."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_stalled_and_bad_clients_do_not_hold_up_others(broker: BrokerHandle) -> None:
    """Silent sockets, a TLS handshake that stops halfway, a refused TLS version and a
    slowloris HTTP request are all open while SDK clients come and go; each of them is then
    closed by its timeout (or at once), never the broker's other clients."""
    good = ssl.create_default_context(cafile=str(broker.data_dir / "tls" / "ca.pem"))
    openers = [b""] * 20 + [_client_hello(good)] * 5 + [b"GET / HTTP/1.1\r\nHost: x\r\n"] * 5
    sockets = []
    for first in openers:
        sock = socket.create_connection((HOST, broker.port), timeout=10)
        if first:
            sock.sendall(first)
        sockets.append(sock)
    refused = socket.create_connection((HOST, broker.port), timeout=10)
    refused.sendall(b"\x16\x03\x01\x00\x10" + bytes(range(16)))  # a ClientHello of junk
    started = time.monotonic()
    for transport in (None, TransportType.Amqp, TransportType.AmqpOverWebsocket):
        round_trip(broker, transport, f"beside stalled sockets: {transport}")
    try:
        alert = _read_to_close(refused)
        assert alert[:1] in (b"", b"\x15")  # a TLS alert (or just the close)
        for sock in sockets:  # all dropped by the broker by now, or very soon
            sock.settimeout(max(0.1, started + ANSWER_WITHIN - time.monotonic()))
            with contextlib.suppress(OSError):
                while sock.recv(65536):
                    pass
        assert time.monotonic() - started < ANSWER_WITHIN + 1
    finally:
        for sock in sockets:
            sock.close()
        refused.close()
    wait_for(lambda: open_connections(broker) == 0, timeout=ANSWER_WITHIN)


def _read_to_close(sock: socket.socket) -> bytes:
    received = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            received += chunk
    return received


def test_garbage_inside_tls(broker: BrokerHandle) -> None:
    """Inside TLS the same rules hold: junk gets the SASL header, then the close."""
    context = ssl.create_default_context(cafile=str(broker.data_dir / "tls" / "ca.pem"))
    for junk, answer in ((b"\x00\x01\x02\x03", SASL_HEADER),
                         (b"GET /\x00 HTTP/1.1\r\n\r\n", b"HTTP/1.1 400 ")):  # fmt: skip
        with (
            socket.create_connection((HOST, broker.port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="localhost") as sock,
        ):
            sock.sendall(junk)
            assert _read_to_close(sock).startswith(answer)
    with (
        socket.create_connection((HOST, broker.port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as sock,
    ):
        started = time.monotonic()  # silent inside TLS: closed after the sniff timeout
        with contextlib.suppress(OSError):
            assert sock.recv(65536) == b""
        assert time.monotonic() - started < ANSWER_WITHIN
