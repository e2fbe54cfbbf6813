"""TLS, HTTPS and AMQP over WebSockets on the broker's port, with the real SDK and plain sockets.

The broker makes a local CA under its data dir on first start; clients trust ``ca.pem``
(the SDK: ``connection_verify=``) and reach the broker as they would a namespace: AMQPS on
the AMQP port (or ``--tls-port``), ``wss://host:port/$servicebus/websocket``, HTTPS. Plain
AMQP clients on the same port are covered by every other broker test.
"""

from __future__ import annotations

import datetime
import http.client
import json
import os
import re
import socket
import ssl
import stat
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from azure.core.credentials import AzureNamedKeyCredential
from azure.servicebus import ServiceBusClient, ServiceBusMessage, TransportType
from cryptography import x509

from replication.broker import main, tls
from replication.broker.auth import EMULATOR_KEY, EMULATOR_RULE_NAME
from replication.broker.httpapi import Request, Response
from tests.processes import Processes

from . import conftest
from .conftest import (
    HOST,
    REPO_ROOT,
    BrokerHandle,
    QuickCloseAsyncClient,
    QuickCloseClient,
    body_bytes,
    make_config,
    send,
    write_config,
)

CREDENTIAL = AzureNamedKeyCredential(EMULATOR_RULE_NAME, EMULATOR_KEY)
TRANSPORTS = [TransportType.Amqp, TransportType.AmqpOverWebsocket]


def ca_path(broker: BrokerHandle) -> Path:
    return broker.data_dir / "tls" / "ca.pem"


def sdk_options(broker: BrokerHandle, transport: TransportType, port: int | None = None) -> dict:
    """What a client passes to reach the broker over TLS, as it would a namespace."""
    return {
        "fully_qualified_namespace": "localhost",
        "credential": CREDENTIAL,
        "custom_endpoint_address": f"sb://localhost:{port or broker.port}",
        "connection_verify": str(ca_path(broker)),
        "transport_type": transport,
    }


def client_context(ca: Path | None) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca) if ca else None)


def https(port: int, ca: Path) -> http.client.HTTPSConnection:
    return http.client.HTTPSConnection("localhost", port, timeout=10, context=client_context(ca))


def recording_app(requests: list[Request]) -> Callable[[Request], Any]:
    async def app(request: Request) -> Response:
        requests.append(request)
        body = json.dumps({"path": request.path, "size": len(request.body)}).encode()
        return Response(200, {"content-type": "application/json"}, body)

    return app


def round_trip(client: ServiceBusClient, text: str, queue: str = "q") -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage(text, message_id=text))
    with client.get_queue_receiver(queue) as receiver:
        messages = receiver.receive_messages(max_message_count=1, max_wait_time=10)
        assert [body_bytes(m) for m in messages] == [text.encode()]
        receiver.complete_message(messages[0])


# ---------------------------------------------------------------------------- the SDK


@pytest.mark.parametrize("transport", TRANSPORTS, ids=lambda t: t.name)
def test_sdk_over_tls_and_websockets(broker: BrokerHandle, transport: TransportType) -> None:
    with QuickCloseClient(**sdk_options(broker, transport)) as client:
        round_trip(client, f"over {transport.name}")
    assert broker.count("q") == 0


@pytest.mark.parametrize("transport", TRANSPORTS, ids=lambda t: t.name)
async def test_async_sdk_over_tls_and_websockets(
    broker: BrokerHandle, transport: TransportType
) -> None:
    async with QuickCloseAsyncClient(**sdk_options(broker, transport)) as client:
        async with client.get_queue_sender("q") as sender:
            await sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(20)])
        async with client.get_queue_receiver("q") as receiver:
            received: list[Any] = []
            deadline = time.monotonic() + 10
            while len(received) < 20 and time.monotonic() < deadline:
                batch = await receiver.receive_messages(max_message_count=20, max_wait_time=2)
                for message in batch:
                    await receiver.complete_message(message)
                received += batch
    assert sorted(body_bytes(m) for m in received) == sorted(f"m{i}".encode() for i in range(20))


def test_large_message_over_websockets(broker: BrokerHandle) -> None:
    """A message larger than one TLS record and many WebSocket frames arrives whole."""
    payload = os.urandom(200 * 1024)
    with QuickCloseClient(**sdk_options(broker, TransportType.AmqpOverWebsocket)) as client:
        with client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage(payload))
        with client.get_queue_receiver("q") as receiver:
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=10)
            assert body_bytes(message) == payload
            receiver.complete_message(message)


@pytest.fixture
def broker_with(
    monkeypatch: pytest.MonkeyPatch, broker_factory: Callable[..., BrokerHandle]
) -> Callable[..., BrokerHandle]:
    """``broker_with(**options)``: a broker given more ``Broker`` keywords (ports, TLS files)."""

    def start(**options: Any) -> BrokerHandle:
        monkeypatch.setattr(conftest, "build_broker", partial(main.build_broker, **options))
        return broker_factory()

    return start


def test_tls_port(broker_with: Callable[..., BrokerHandle]) -> None:
    """``tls_port``: TLS only; a plain AMQP client hears the AMQP TLS header and is closed."""
    broker = broker_with(tls_port=0)
    assert broker.broker is not None and broker.broker.tls_port
    tls_port = broker.broker.tls_port
    for transport in TRANSPORTS:
        with QuickCloseClient(**sdk_options(broker, transport, tls_port)) as client:
            round_trip(client, f"on the TLS port over {transport.name}")
    with socket.create_connection((HOST, tls_port), timeout=5) as sock:
        sock.sendall(b"AMQP\x00\x01\x00\x00")
        assert _read_all(sock) == b"AMQP\x02\x01\x00\x00"
    broker.restart()  # the TLS port comes back with the broker
    assert broker.broker is not None and broker.broker.tls_port


def _read_all(sock: socket.socket, timeout: float = 5.0) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


# ---------------------------------------------------------------------------- TLS itself


def test_tls_verifies_with_the_ca_only(broker: BrokerHandle) -> None:
    """The certificate chains to ca.pem for localhost, 127.0.0.1 and ::1, TLS 1.2 at least;
    a client without the CA refuses it, and the broker drops that socket alone."""
    for name in ("localhost", "127.0.0.1"):
        with (
            socket.create_connection((HOST, broker.port), timeout=5) as raw,
            client_context(ca_path(broker)).wrap_socket(raw, server_hostname=name) as sock,
        ):
            assert sock.version() in ("TLSv1.2", "TLSv1.3")
    cert = x509.load_pem_x509_certificate((broker.data_dir / "tls" / "server.pem").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(n.value) for n in san} == {"localhost", "127.0.0.1", "::1"}
    with (
        socket.create_connection((HOST, broker.port), timeout=5) as raw,
        pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"),
    ):
        client_context(None).wrap_socket(raw, server_hostname="localhost")
    old = client_context(ca_path(broker))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TLS 1.1: deprecated indeed
        old.minimum_version = old.maximum_version = ssl.TLSVersion.TLSv1_1
    old.set_ciphers("DEFAULT:@SECLEVEL=0")  # else OpenSSL 3 has no TLS 1.1 cipher to offer
    with (
        socket.create_connection((HOST, broker.port), timeout=5) as raw,
        pytest.raises(ssl.SSLError, match="alert protocol version"),  # the broker's refusal
    ):
        old.wrap_socket(raw, server_hostname="localhost")
    with QuickCloseClient(**sdk_options(broker, TransportType.Amqp)) as client:
        round_trip(client, "still fine")


def test_ca_made_once_and_reused(broker_factory: Callable[..., BrokerHandle]) -> None:
    broker = broker_factory()
    files = {name: (broker.data_dir / "tls" / name).read_bytes() for name in
             ("ca.pem", "ca.key", "server.pem", "server.key")}  # fmt: skip
    for key in ("ca.key", "server.key"):
        assert stat.S_IMODE((broker.data_dir / "tls" / key).stat().st_mode) == 0o600
    broker.restart()
    assert files == {name: (broker.data_dir / "tls" / name).read_bytes() for name in files}
    with QuickCloseClient(**sdk_options(broker, TransportType.Amqp)) as client:
        round_trip(client, "after a restart")


def test_server_certificate_renewed_ca_kept(tmp_path: Path, monkeypatch: Any) -> None:
    first = tls.local_ca(tmp_path)
    ca, server = first.ca.read_bytes(), first.cert.read_bytes()  # type: ignore[union-attr]
    assert tls.local_ca(tmp_path) == first and first.cert.read_bytes() == server
    tls.local_ca(tmp_path, ("localhost", "127.0.0.1", "::1", "broker.test"))  # names changed
    renamed = first.cert.read_bytes()
    assert renamed != server and first.ca.read_bytes() == ca  # type: ignore[union-attr]
    monkeypatch.setattr(tls, "RENEW_BEFORE", datetime.timedelta(days=tls.SERVER_DAYS + 1))
    tls.local_ca(tmp_path, ("localhost", "127.0.0.1", "::1", "broker.test"))  # "expiring"
    assert first.cert.read_bytes() != renamed and first.ca.read_bytes() == ca  # type: ignore[union-attr]
    monkeypatch.undo()
    first.cert.write_text("not a certificate")  # damaged: issued again
    tls.local_ca(tmp_path)
    cert = x509.load_pem_x509_certificate(first.cert.read_bytes())
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca))


def test_a_ca_with_the_same_name_and_another_key_gets_a_new_server_certificate(
    tmp_path: Path,
) -> None:
    """The CA's files were replaced by a CA of the same name and another key: the server
    certificate names that issuer, but the signature does not verify, so it is issued again
    (that check once raised AttributeError: ``x509.InvalidSignature`` does not exist)."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    first = tls.local_ca(tmp_path)
    assert first.ca is not None
    old_ca = x509.load_pem_x509_certificate(first.ca.read_bytes())
    old_server = first.cert.read_bytes()
    key = ec.generate_private_key(ec.SECP256R1())
    forged = (
        x509.CertificateBuilder()
        .subject_name(old_ca.subject)
        .issuer_name(old_ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(old_ca.not_valid_before_utc)
        .not_valid_after(old_ca.not_valid_after_utc)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    first.ca.write_bytes(forged.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "ca.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    again = tls.local_ca(tmp_path)
    assert again.cert.read_bytes() != old_server
    x509.load_pem_x509_certificate(again.cert.read_bytes()).verify_directly_issued_by(forged)


def test_users_own_certificate(tmp_path: Path, broker_with: Callable[..., BrokerHandle]) -> None:
    """``tls_cert``/``tls_key``: the broker presents them and makes no CA of its own."""
    own = tls.local_ca(tmp_path / "own")
    broker = broker_with(tls_cert=own.cert, tls_key=own.key)
    assert not (broker.data_dir / "tls").exists()
    options = sdk_options(broker, TransportType.Amqp)
    options["connection_verify"] = str(own.ca)
    with QuickCloseClient(**options) as client:
        round_trip(client, "own certificate")


# ---------------------------------------------------------------------------- HTTP


def test_https_answered_by_the_management_api(broker: BrokerHandle) -> None:
    conn = https(broker.port, ca_path(broker))
    try:
        conn.request("GET", "/orders?api-version=2021-05")  # no SAS token
        response = conn.getresponse()
        assert response.status == 401 and response.read()
        conn.request("GET", "/health")  # the same connection: keep-alive
        response = conn.getresponse()
        assert response.status == 200 and json.loads(response.read()) == {"status": "ok"}
    finally:
        conn.close()


def test_https_requests_reach_the_app(broker: BrokerHandle) -> None:
    requests: list[Request] = []
    broker.call(lambda: setattr(broker.broker, "http_app", recording_app(requests)))
    conn = https(broker.port, ca_path(broker))
    try:
        conn.request("PUT", "/q1?api-version=2021-05", body=b"<entry/>" * 1000,
                     headers={"Content-Type": "application/atom+xml", "X-Two": "a"})  # fmt: skip
        response = conn.getresponse()
        assert response.status == 200 and json.loads(response.read())["size"] == 8000
        conn.putrequest("POST", "/chunked")  # a chunked body
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        conn.send(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
        response = conn.getresponse()
        assert json.loads(response.read())["size"] == 11
        conn.request("POST", "/big", body=b"x" * (1024 * 1024 + 1))
        response = conn.getresponse()
        assert response.status == 413
        response.read()
    finally:
        conn.close()
    put, chunked = requests
    assert (put.method, put.path, put.query, put.scheme) == (
        "PUT",
        "/q1",
        {"api-version": "2021-05"},
        "https",
    )
    assert put.headers["content-type"] == "application/atom+xml" and put.headers["x-two"] == "a"
    assert put.body == b"<entry/>" * 1000 and chunked.body == b"hello world"


def test_http_port(broker_with: Callable[..., BrokerHandle]) -> None:
    """The plain HTTP port: ``/health``, the app with ``scheme="http"``, junk gets a 400."""
    broker = broker_with(http_port=0)
    assert broker.broker is not None and broker.broker.http_port
    port = broker.broker.http_port
    requests: list[Request] = []
    broker.call(lambda: setattr(broker.broker, "http_app", recording_app(requests)))
    conn = http.client.HTTPConnection(HOST, port, timeout=10)
    conn.request("GET", "/health")
    response = conn.getresponse()
    assert response.status == 200 and json.loads(response.read()) == {"status": "ok"}
    assert response.getheader("content-type") == "application/json"
    conn.request("DELETE", "/q1")
    assert conn.getresponse().status == 200
    conn.close()
    assert [(r.method, r.scheme) for r in requests] == [("DELETE", "http")]
    for junk in (b"\x00\x01junk", b"AMQP\x00\x01\x00\x00", b"GET /\x01 HTTP/1.1\r\n\r\n"):
        with socket.create_connection((HOST, port), timeout=5) as sock:
            sock.sendall(junk)
            assert _read_all(sock).startswith(b"HTTP/1.1 400 "), junk


def test_websocket_handshake_refusals(broker: BrokerHandle) -> None:
    key = "dGhlIHNhbXBsZSBub25jZQ=="
    base = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Key": key,
            "Sec-WebSocket-Version": "13"}  # fmt: skip
    cases = [
        ("/$servicebus/websocket", {}, 400),  # no subprotocol
        ("/$servicebus/websocket", {"Sec-WebSocket-Protocol": "mqtt"}, 400),
        ("/elsewhere", {"Sec-WebSocket-Protocol": "AMQPWSB10"}, 404),
        (
            "/$servicebus/websocket",
            {"Sec-WebSocket-Protocol": "AMQPWSB10", "Sec-WebSocket-Version": "8"},
            426,
        ),
    ]
    for path, extra, status in cases:
        conn = https(broker.port, ca_path(broker))
        conn.request("GET", path, headers={**base, **extra})
        response = conn.getresponse()
        assert response.status == status, (path, extra)
        conn.close()
    conn = https(broker.port, ca_path(broker))  # accepted: 101 with the token and subprotocol
    conn.request("GET", "/$servicebus/websocket",
                 headers={**base, "Sec-WebSocket-Protocol": "chat, AMQPWSB10"})  # fmt: skip
    response = conn.getresponse()
    assert response.status == 101
    assert response.getheader("sec-websocket-accept") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    assert response.getheader("sec-websocket-protocol") == "AMQPWSB10"
    conn.close()


# ---------------------------------------------------------------------------- the CLI


def _cli(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run(
        [sys.executable, "-m", "replication", "broker", *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip


def test_print_ca(tmp_path: Path) -> None:
    first = _cli("--print-ca", "--data-dir", str(tmp_path))
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("-----BEGIN CERTIFICATE-----")
    assert first.stdout == (tmp_path / "tls" / "ca.pem").read_text()
    again = _cli("--print-ca", "--data-dir", str(tmp_path))
    assert again.stdout == first.stdout


def test_cli_ports(tmp_path: Path, processes: Processes) -> None:
    """``--tls-port`` and ``--http-port`` on a broker process (0: ports from the OS, read
    from its log); bad certificate flags fail."""
    config = write_config(tmp_path / "Config.json", make_config())
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    process = processes.start(
        [sys.executable, "-m", "replication", "broker", "--config", str(config), "--port",
         "0", "--tls-port", "0", "--http-port", "0", "--data-dir", str(tmp_path / "data")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    assert process.stderr is not None
    logged = b""
    while b"HTTP on port" not in logged:
        line = process.stderr.readline()
        assert line, f"the broker ended: {logged.decode()}"
        logged += line
    bound = re.search(rb"on port (\d+) and (\d+) with .*HTTP on port (\d+)", logged)
    assert bound is not None, logged.decode()
    port, tls_port, http_port = (int(n) for n in bound.groups())
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                conn = http.client.HTTPConnection(HOST, http_port, timeout=2)
                conn.request("GET", "/health")
                assert conn.getresponse().status == 200
                conn.close()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        ca = tmp_path / "data" / "tls" / "ca.pem"
        for p in (port, tls_port):
            conn = https(p, ca)
            conn.request("GET", "/health")
            assert conn.getresponse().status == 200
            conn.close()
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=15)
    assert process.returncode == 0, stderr
    assert str(ca) in logged.decode()  # the CA's path is logged
    bad = _cli("--config", str(config), "--port", "0", "--no-http", "--tls-cert",
               str(tmp_path / "missing.pem"), "--data-dir", str(tmp_path / "d2"))  # fmt: skip
    assert bad.returncode == 2 and "missing.pem" in bad.stderr
    (tmp_path / "junk.pem").write_text("junk")
    bad = _cli("--config", str(config), "--port", "0", "--no-http", "--tls-cert",
               str(tmp_path / "junk.pem"), "--data-dir", str(tmp_path / "d3"))  # fmt: skip
    assert bad.returncode == 2 and "TLS certificate" in bad.stderr


def test_the_management_api_on_the_plain_http_port(
    broker_with: Callable[..., BrokerHandle],
) -> None:
    """The HTTP port serves the same management API (as the official emulator does for .NET
    clients): no token or a bad one is a 401, a Manage token reads and creates entities."""
    from replication.broker.auth import EMULATOR_KEY, EMULATOR_RULE_NAME
    from replication.servicebus.sas import generate_sas_token

    broker = broker_with(http_port=0)
    assert broker.broker is not None and broker.broker.http_port
    port = broker.broker.http_port

    def sas(key: str) -> str:
        return generate_sas_token(f"http://localhost:{port}", EMULATOR_RULE_NAME, key,
                                  int(time.time()) + 600)  # fmt: skip

    conn = http.client.HTTPConnection(HOST, port, timeout=10)
    conn.request("GET", "/$namespaceinfo?api-version=2021-05")
    response = conn.getresponse()
    assert response.status == 401 and b"MissingToken" in response.read()
    conn.request("GET", "/$namespaceinfo?api-version=2021-05",
                 headers={"Authorization": sas("d3Jvbmcta2V5")})  # fmt: skip
    response = conn.getresponse()
    assert response.status == 401 and response.read()
    body = (
        '<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml">'
        '<QueueDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/'
        'servicebus/connect"><MaxDeliveryCount>3</MaxDeliveryCount></QueueDescription>'
        "</content></entry>"
    )
    conn.request("PUT", "/plain-http-q?api-version=2021-05", body=body,
                 headers={"Authorization": sas(EMULATOR_KEY),
                          "Content-Type": "application/atom+xml"})  # fmt: skip
    response = conn.getresponse()
    created = response.read()
    assert response.status == 201, created
    assert b"<MaxDeliveryCount>3</MaxDeliveryCount>" in created
    conn.close()
    send(broker, "plain-http-q", ServiceBusMessage(b"x", message_id="h1"))
    assert broker.count("plain-http-q") == 1  # AMQP sees the queue the API made
