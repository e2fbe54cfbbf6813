"""The loopback rules (issue 38) as values: which Host, Origin and listen address count as
this machine, and what a loopback-only server answers to a request (``broker/loopback.py``)."""

from __future__ import annotations

import pytest

from replication.broker.loopback import (
    Refusal,
    is_loopback_bind,
    is_loopback_host,
    is_loopback_origin,
    refusal,
)

LOOPBACK_HOSTS = [
    "localhost",
    "LocalHost",
    "localhost:5300",
    "localhost:",
    "127.0.0.1",
    "127.0.0.1:9464",
    "127.255.255.254:1",
    "127.0.0.2",
    "[::1]",
    "[::1]:5672",
    "[0:0:0:0:0:0:0:1]:80",
]
OTHER_HOSTS = [
    "127.0.0.1.example.com",
    "127.0.0.1.example.com:9464",
    "localhost.example.com",
    "localhost.example.com:5300",
    "localhost.",
    "app.localhost",
    "127.1",
    "127.0.1",
    "0x7f.0.0.1",
    "2130706433",
    "127.000.000.001",
    "0.0.0.0",
    "10.0.0.1",
    "[::]",
    "[::ffff:127.0.0.1]",
    "[::1%25lo]",
    "::1",
    "[::1",
    "::1]:80",
    "localhost:http",
    "localhost:80:80",
    "user@localhost",
    "evil.example",
    "",
    ":5300",
    "localhost, evil.example",
]


@pytest.mark.parametrize("value", LOOPBACK_HOSTS)
def test_loopback_hosts(value: str) -> None:
    assert is_loopback_host(value)


@pytest.mark.parametrize("value", OTHER_HOSTS)
def test_names_a_page_could_rebind_and_bad_hosts_are_not_loopback(value: str) -> None:
    assert not is_loopback_host(value)


@pytest.mark.parametrize(
    ("origin", "loopback"),
    [
        ("http://localhost:9464", True),
        ("https://localhost", True),
        ("http://127.0.0.1:5300", True),
        ("http://[::1]:5300", True),
        ("http://evil.example", False),
        ("http://127.0.0.1.example.com:9464", False),
        ("http://localhost.example.com", False),
        ("null", False),
        ("file://", False),
        ("chrome-extension://abcdef", False),
        ("http://localhost:9464/path", False),
        ("http://user@localhost", False),
        ("http://localhost, http://evil.example", False),
        ("http://[::1", False),
        ("", False),
    ],
)
def test_origins(origin: str, loopback: bool) -> None:
    assert is_loopback_origin(origin) is loopback


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.53", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("192.168.1.20", False),
        ("broker.example", False),
    ],
)
def test_listen_addresses(address: str, loopback: bool) -> None:
    assert is_loopback_bind(address) is loopback


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "POST", "PUT", "DELETE", "PATCH"])
def test_a_foreign_host_is_misdirected_whatever_the_method(method: str) -> None:
    refused = refusal(method, "127.0.0.1.example.com:9464", None)
    assert refused is not None and refused.status == 421
    assert "'127.0.0.1.example.com:9464'" in refused.message and "loopback" in refused.message


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "post"])
def test_changes_from_a_foreign_origin_are_forbidden(method: str) -> None:
    refused = refusal(method, "localhost:9464", "http://evil.example")
    assert refused is not None and refused.status == 403
    assert "'http://evil.example'" in refused.message


def test_what_a_loopback_server_serves() -> None:
    assert refusal("GET", "localhost:9464", "http://evil.example") is None  # it cannot read
    assert refusal("POST", "localhost:9464", None) is None  # curl, the SDKs: no Origin
    assert refusal("POST", "localhost:9464", "http://localhost:9464") is None
    assert refusal("PUT", "[::1]:5300", "http://127.0.0.1:3000") is None
    assert refusal("GET", None, None) is None  # HTTP/1.0 without Host: not a browser
    assert refusal("GET", "localhost:5672", "http://evil.example", upgrade=True) == Refusal(
        403,
        "this server listens on loopback and takes WebSocket requests only from pages on "
        "localhost, 127.0.0.0/8 or [::1], not Origin 'http://evil.example'",
    )
    assert refusal("GET", "localhost:5672", "https://localhost:5672", upgrade=True) is None
