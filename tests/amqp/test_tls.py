"""AMQP over TLS: our server (``transport.serve`` with an ``ssl_context``) and our client
(``Client.connect(..., ssl_context=...)``), each also against python-qpid-proton.

A self-signed certificate for ``localhost`` and ``127.0.0.1`` is made at test time with
``cryptography``; clients that trust it must get through, clients that do not must fail with a
TLS error (not hang, not talk AMQP in clear).
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from replication.amqp.client import Client
from replication.amqp.connection import Connection
from replication.amqp.errors import ConnectionClosedError
from replication.amqp.memory_node import MemoryNode
from replication.amqp.message import Message, Properties
from replication.amqp.outcomes import Accepted
from replication.amqp.sasl import ANONYMOUS, PLAIN, SaslClient, SaslServer
from replication.amqp.transport import serve

from .conftest import HOST, ServerHandle, running_server

x509 = pytest.importorskip("cryptography.x509", reason="cryptography makes the test certificate")

from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

TIMEOUT = 10


@dataclass(frozen=True)
class CertFiles:
    cert: Path
    key: Path


def _make_cert(directory: Path, common_name: str) -> CertFiles:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path = directory / f"{common_name}.crt"
    key_path = directory / f"{common_name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return CertFiles(cert_path, key_path)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return _make_cert(tmp_path_factory.mktemp("tls"), "localhost")


@pytest.fixture(scope="module")
def other_certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    """A second, unrelated self-signed certificate (a CA the server's cert does not chain to)."""
    return _make_cert(tmp_path_factory.mktemp("tls-other"), "localhost")


def _server_context(certs: CertFiles) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.cert, certs.key)
    return context


def _client_context(ca: Path | None) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca) if ca else None)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    return context


@pytest.fixture
def tls_server(certs: CertFiles) -> Iterator[ServerHandle]:
    """Our memory node behind TLS (SASL PLAIN u/p or ANONYMOUS both accepted)."""
    server_context = _server_context(certs)

    async def start(connections: list[Connection]) -> tuple[asyncio.Server, MemoryNode]:
        node = MemoryNode()

        def make_connection() -> Connection:
            connection = Connection(
                server=True, container_id="memory-node-tls",
                sasl=SaslServer((PLAIN, ANONYMOUS)), require_sasl=True,
            )  # fmt: skip
            connections.append(connection)
            return connection

        server = await serve(make_connection, node.handle, HOST, 0, ssl_context=server_context)
        return server, node

    with running_server(start=start) as handle:
        yield handle


# --------------------------------------------------------------------------------------------
# our client, our server


@pytest.mark.timeout(60)
@pytest.mark.parametrize("hostname", [None, "localhost"], ids=["ip-san", "dns-san"])
async def test_our_client_over_tls(tls_server: ServerHandle, certs: CertFiles, hostname):
    client = await Client.connect(
        HOST, tls_server.port, sasl=SaslClient("PLAIN", username="u", password="p"),
        ssl_context=_client_context(certs.cert), hostname=hostname, timeout=TIMEOUT,
    )  # fmt: skip
    try:
        ssl_object = client.driver.writer.get_extra_info("ssl_object")
        assert ssl_object is not None and ssl_object.version().startswith("TLS")
        peer_cert = client.driver.writer.get_extra_info("peercert")
        assert ("DNS", "localhost") in peer_cert["subjectAltName"]
        sender = await client.sender("secure")
        receiver = await client.receiver("secure", credit=5)
        big = bytes(range(256)) * 4096 + b"!"  # 1 MiB: many TLS records and AMQP frames
        payloads = [b"small", big, b"after"]
        for n, payload in enumerate(payloads):
            outcome = await sender.send(
                Message.from_bytes(payload, properties=Properties(message_id=n))
            )
            assert isinstance(outcome, Accepted)
        for n, payload in enumerate(payloads):
            item = await receiver.receive(TIMEOUT)
            item.accept()
            assert item.message.properties is not None
            assert item.message.properties.message_id == n
            assert item.message.data == payload
    finally:
        await client.close()
    assert client.driver.closed.is_set()


@pytest.mark.timeout(60)
async def test_untrusted_certificate_is_refused(tls_server: ServerHandle, other_certs):
    for context in (_client_context(None), _client_context(other_certs.cert)):
        with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
            await Client.connect(
                HOST, tls_server.port, sasl=SaslClient(), ssl_context=context, timeout=TIMEOUT
            )
    assert tls_server.received() == 0


@pytest.mark.timeout(60)
async def test_wrong_hostname_is_refused(tls_server: ServerHandle, certs: CertFiles):
    with pytest.raises(ssl.SSLCertVerificationError, match=r"[Hh]ostname"):
        await Client.connect(
            HOST, tls_server.port, sasl=SaslClient(), ssl_context=_client_context(certs.cert),
            hostname="not-the-server.example", timeout=TIMEOUT,
        )  # fmt: skip


@pytest.mark.timeout(60)
async def test_plain_tcp_client_cannot_talk_to_tls_server(tls_server: ServerHandle):
    # the server drops the connection: a clean close, or a reset (it had unread bytes)
    with pytest.raises(
        (ConnectionClosedError, ConnectionError), match=r"socket closed|reset by peer|Broken pipe"
    ):
        await Client.connect(HOST, tls_server.port, sasl=SaslClient(), timeout=TIMEOUT)
    assert tls_server.received() == 0


# --------------------------------------------------------------------------------------------
# proton against our TLS server, our client against proton's TLS listener

proton = pytest.importorskip("proton")

from proton import ConnectionException, SSLDomain  # noqa: E402
from proton import Message as PMessage  # noqa: E402
from proton.reactor import Container  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

needs_proton_ssl = pytest.mark.skipif(
    not proton.SSL.present(), reason="this python-qpid-proton build has no SSL support"
)


def _proton_client_domain(ca: Path | None) -> SSLDomain:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    if ca is not None:
        domain.set_trusted_ca_db(str(ca))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    return domain


@needs_proton_ssl
@pytest.mark.timeout(60)
def test_proton_client_over_amqps(tls_server: ServerHandle, certs: CertFiles) -> None:
    conn = BlockingConnection(
        f"amqps://u:p@{HOST}:{tls_server.port}", timeout=TIMEOUT, allowed_mechs="PLAIN",
        ssl_domain=_proton_client_domain(certs.cert), virtual_host="localhost",
    )  # fmt: skip
    try:
        sender = conn.create_sender("proton-tls")
        big = b"\x5a" * (1 << 20)
        for n, body in enumerate([b"hello", big]):
            sender.send(PMessage(body=body, id=n, properties={"n": n}, inferred=True))
        receiver = conn.create_receiver("proton-tls", credit=2)
        for n, body in enumerate([b"hello", big]):
            got = receiver.receive(timeout=TIMEOUT)
            receiver.accept()
            assert got.id == n and got.properties == {"n": n}
            assert bytes(got.body) == body
    finally:
        conn.close()


@needs_proton_ssl
@pytest.mark.timeout(60)
def test_proton_client_refuses_untrusted_server(tls_server: ServerHandle, other_certs) -> None:
    with pytest.raises(ConnectionException, match="certificate verify failed"):
        BlockingConnection(
            f"amqps://{HOST}:{tls_server.port}", timeout=TIMEOUT, allowed_mechs="ANONYMOUS",
            ssl_domain=_proton_client_domain(other_certs.cert), virtual_host="localhost",
        )  # fmt: skip
    assert tls_server.received() == 0


@needs_proton_ssl
@pytest.mark.timeout(60)
async def test_our_client_against_proton_tls_listener(certs: CertFiles) -> None:
    from .test_interop_proton_peer import ProtonBroker

    server_domain = SSLDomain(SSLDomain.MODE_SERVER)
    server_domain.set_credentials(str(certs.cert), str(certs.key), None)
    server_domain.set_peer_authentication(SSLDomain.ANONYMOUS_PEER)
    broker = ProtonBroker()
    container = Container(broker)
    broker.container = container
    broker.acceptor = container.listen(f"amqps://{HOST}:0", ssl_domain=server_domain)
    broker.port = broker.acceptor._selectable.getsockname()[1]
    thread = threading.Thread(target=container.run, name="proton-tls-broker", daemon=True)
    thread.start()
    try:
        client = await Client.connect(
            HOST, broker.port, sasl=SaslClient(), ssl_context=_client_context(certs.cert),
            hostname="localhost", timeout=TIMEOUT,
        )  # fmt: skip
        try:
            assert client.driver.writer.get_extra_info("ssl_object") is not None
            sender = await client.sender("tls-peer")
            big = b"\xc3" * (1 << 20)
            for payload in (b"one", big):
                assert isinstance(await sender.send(payload), Accepted)
            receiver = await client.receiver("tls-peer", credit=2)
            for payload in (b"one", big):
                item = await receiver.receive(TIMEOUT)
                item.accept()
                assert item.message.data == payload
        finally:
            await client.close()
        with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
            await Client.connect(
                HOST, broker.port, sasl=SaslClient(), ssl_context=_client_context(None),
                timeout=TIMEOUT,
            )  # fmt: skip
    finally:
        broker.trigger("stop_broker")
        thread.join(10)
    assert not thread.is_alive()
