"""The broker's TLS identity: a local CA made once per data dir, and the server context.

Clients verify the broker like any Service Bus namespace, so it needs a certificate they can
trust. Without ``--tls-cert`` the broker makes its own CA under ``<data-dir>/tls`` on first
start and signs a server certificate for the loopback names with it; users trust ``ca.pem``
once (``connection_verify=``, ``NODE_EXTRA_CA_CERTS``, the system store) and it stays valid
across restarts. Only the short-lived server certificate is issued again when it expires or
the names it must carry change. EC P-256 keys: quick to make, accepted by every client.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import ssl
import uuid
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

log = logging.getLogger("replication.broker.tls")

SERVER_NAMES = ("localhost", "127.0.0.1", "::1")
"""What the server certificate is valid for: the names a local client connects to."""
CA_DAYS = 3650
SERVER_DAYS = 397
"""The longest validity browsers and Apple platforms accept for a server certificate."""
RENEW_BEFORE = datetime.timedelta(days=7)
"""A server certificate this close to expiry is issued again at start."""
CA_NAME = "Replication broker local CA"


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files the server loads; ``ca`` is None for a user's own certificate."""

    cert: Path
    key: Path
    ca: Path | None = None


def local_ca(directory: Path, names: tuple[str, ...] = SERVER_NAMES) -> TlsFiles:
    """The CA and server certificate under ``directory``, made or renewed as needed."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca_pem, ca_key_pem = directory / "ca.pem", directory / "ca.key"
    cert_pem, key_pem = directory / "server.pem", directory / "server.key"
    now = datetime.datetime.now(datetime.UTC)
    ca = _load(ca_pem, ca_key_pem)
    if ca is None or ca[0].not_valid_after_utc <= now + RENEW_BEFORE:
        ca = _issue_ca(now)
        _write(ca_key_pem, _key_bytes(ca[1]), private=True)
        _write(ca_pem, ca[0].public_bytes(serialization.Encoding.PEM))
        log.info("created a local CA for TLS: %s", ca_pem)
    server = _load(cert_pem, key_pem)
    if server is None or not _fits(server[0], ca[0], names, now):
        cert, key = _issue_server(ca[0], ca[1], names, now)
        _write(key_pem, _key_bytes(key), private=True)
        _write(cert_pem, cert.public_bytes(serialization.Encoding.PEM))
        log.info("issued a server certificate for %s", ", ".join(names))
    return TlsFiles(cert_pem, key_pem, ca_pem)


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """A server-side context: TLS 1.2 at least, no renegotiation, no client certificates."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_RENEGOTIATION
    context.load_cert_chain(files.cert, files.key)
    return context


def broker_tls(
    data_dir: Path, cert: Path | None = None, key: Path | None = None
) -> tuple[ssl.SSLContext, TlsFiles]:
    """The broker's TLS setup: the user's certificate when given, else the local CA's."""
    if cert is not None:
        files = TlsFiles(Path(cert), Path(key if key is not None else cert))
    else:
        files = local_ca(Path(data_dir) / "tls")
    return server_context(files), files


# ---------------------------------------------------------------------------- certificates


def _issue_ca(
    now: datetime.datetime,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    # a unique name per CA: two data dirs' CAs never mistake each other's certificates
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, str(uuid.uuid4())),
        ]
    )
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _issue_server(
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    names: tuple[str, ...],
    now: datetime.datetime,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    ca_ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(min(now + datetime.timedelta(days=SERVER_DAYS), ca.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName(_general_names(names)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def _fits(
    cert: x509.Certificate, ca: x509.Certificate, names: tuple[str, ...], now: datetime.datetime
) -> bool:
    """Still usable: signed by this CA, valid a while longer, for exactly these names."""
    if cert.issuer != ca.subject or cert.not_valid_after_utc <= now + RENEW_BEFORE:
        return False
    try:
        cert.verify_directly_issued_by(ca)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, InvalidSignature, x509.ExtensionNotFound):
        return False
    return set(san) == set(_general_names(names))


def _general_names(names: tuple[str, ...]) -> list[x509.GeneralName]:
    result: list[x509.GeneralName] = []
    for name in names:
        try:
            result.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            result.append(x509.DNSName(name))
    return result


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


# ---------------------------------------------------------------------------- files


def _load(
    cert_path: Path, key_path: Path
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    """A certificate and its EC key from PEM files; None when missing, unreadable or unmatched."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        return None
    return cert, key


def _key_bytes(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    """Writes through a temporary file (a crash never leaves half a PEM); keys owner-only."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    tmp.replace(path)
