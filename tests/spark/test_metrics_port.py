"""The Spark runner's ``--metrics-port`` answers loopback Hosts only, as every other HTTP
port of the app does (DNS rebinding, issue 38), over real HTTP requests."""

from __future__ import annotations

from collections.abc import Iterator
from wsgiref.simple_server import WSGIServer

import pytest

from replication.spark.metrics_server import serve_metrics
from tests.loopback_http import LOOPBACK, REBOUND, request


@pytest.fixture
def metrics_server() -> Iterator[WSGIServer]:
    server = serve_metrics(0)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("host", LOOPBACK)
def test_the_counters_are_served_to_a_loopback_host(metrics_server: WSGIServer, host: str) -> None:
    status, body = request(metrics_server.server_port, "GET", "/metrics", f"{host}:9")
    assert status == 200
    assert b"# TYPE " in body


@pytest.mark.parametrize("host", REBOUND)
def test_a_rebound_name_is_refused(metrics_server: WSGIServer, host: str) -> None:
    status, body = request(metrics_server.server_port, "GET", "/metrics", host)
    assert status == 421
    assert b"listens on loopback" in body
    assert b"# TYPE " not in body
