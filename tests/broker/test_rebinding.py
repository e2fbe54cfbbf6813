"""DNS rebinding (issue 38): a broker bound to loopback answers HTTP only for a loopback
``Host`` and takes state-changing requests only from a loopback ``Origin``, on every path it
serves: the dashboard (``--ui``), the management API, ``/health``, WebSocket upgrades.

To a browser, a page on ``127.0.0.1.example.com`` whose name an attacker's DNS then points
at 127.0.0.1 is the same origin as the broker: it may read what it fetches there. The Host
it sends is still that name, which is what the broker refuses. Real sockets, ports from the
OS, the unmodified SDK to look into the queue; the well-known emulator key makes the token
any page could mint.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from replication import compose
from replication.broker import main
from replication.broker.auth import EMULATOR_KEY, EMULATOR_RULE_NAME
from replication.broker.config import BrokerConfig
from replication.broker.server import Broker
from replication.servicebus.sas import mint
from tests.loopback_http import LOOPBACK, REBOUND, peek_ids, request

from . import conftest
from .conftest import BrokerHandle, make_config

pytestmark = pytest.mark.timeout(90)

CONFIG = make_config({"work": {}})
JSON = {"content-type": "application/json"}
UPGRADE = {
    "Upgrade": "websocket",
    "Connection": "Upgrade",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    "Sec-WebSocket-Protocol": "AMQPWSB10",
}
INFO = "/$namespaceinfo?api-version=2021-05"


def _token(handle: BrokerHandle) -> dict[str, str]:
    """A Manage token as a page could mint it: the emulator's key is public."""
    token = mint(f"sb://localhost:{handle.port}", EMULATOR_RULE_NAME, EMULATOR_KEY)[0]
    return {"Authorization": token}


def _http_port(handle: BrokerHandle) -> int:
    assert handle.broker is not None and handle.broker.http_port is not None
    return handle.broker.http_port


@pytest.fixture
def ui_broker(
    monkeypatch: pytest.MonkeyPatch, broker_factory: Callable[..., BrokerHandle]
) -> Iterator[BrokerHandle]:
    """``broker --ui`` on 127.0.0.1: an HTTP port (from the OS) with the dashboard."""
    monkeypatch.setattr(conftest, "build_broker", partial(main.build_broker, http_port=0))
    handle = broker_factory(CONFIG)
    assert handle.broker is not None
    broker = handle.broker
    dashboard = handle.call(lambda: compose.serve_dashboard(broker))
    yield handle
    handle.run(dashboard.stop())


def test_the_dashboard_answers_only_for_loopback_hosts(ui_broker: BrokerHandle) -> None:
    port = _http_port(ui_broker)
    for name in REBOUND:
        status, body = request(port, "GET", "/$dashboard/api/overview", f"{name}:{port}")
        assert status == 421, (name, body)
        assert b"loopback" in body and name.encode() in body
        assert b"work" not in body
    for name in LOOPBACK:
        status, body = request(port, "GET", "/$dashboard/api/overview", f"{name}:{port}")
        assert status == 200, (name, body)
        (queue,) = json.loads(body)["namespaces"][0]["queues"]
        assert queue["name"] == "work"
    assert request(port, "GET", "/", f"localhost.example.com:{port}")[0] == 421
    assert request(port, "GET", "/", f"localhost:{port}")[0] == 200


def test_the_management_api_answers_only_for_loopback_hosts(ui_broker: BrokerHandle) -> None:
    """On the plain HTTP port and on the AMQP port (which speaks HTTP too), with a token:
    the emulator's key is public, so a token proves nothing about who asks."""
    token = _token(ui_broker)
    for port in (_http_port(ui_broker), ui_broker.port):
        for host in [f"{name}:{port}" for name in REBOUND]:
            status, body = request(port, "GET", INFO, host, token)
            assert status == 421 and b"NamespaceInfo" not in body, (host, body)
        for host in [*(f"{name}:{port}" for name in LOOPBACK), "localhost"]:
            status, body = request(port, "GET", INFO, host, token)
            assert status == 200 and b"NamespaceInfo" in body, (host, body)


def test_health_answers_only_for_loopback_hosts(ui_broker: BrokerHandle) -> None:
    for port in (_http_port(ui_broker), ui_broker.port):
        for host in [f"{name}:{port}" for name in REBOUND]:
            status, body = request(port, "GET", "/health", host)
            assert status == 421 and b"ok" not in body, (host, body)
        for host in [*(f"{name}:{port}" for name in LOOPBACK), "localhost"]:
            assert request(port, "GET", "/health", host) == (200, b'{"status": "ok"}')


def test_a_send_from_another_origin_is_refused_and_sends_nothing(
    ui_broker: BrokerHandle,
) -> None:
    port = _http_port(ui_broker)
    host = f"localhost:{port}"
    send = f"/$dashboard/api/send?namespace=127.0.0.1:{ui_broker.port}&entity=work"
    for origin in ("http://evil.example", "http://127.0.0.1.example.com", "null"):
        body = json.dumps({"body": "x", "message_id": f"from {origin}"}).encode()
        status, answer = request(port, "POST", send, host, {**JSON, "Origin": origin}, body)
        assert status == 403 and b"Origin" in answer, (origin, answer)
    assert peek_ids(ui_broker.connection_string, "work") == []
    body = json.dumps({"body": "x", "message_id": "from the page"}).encode()
    page = {**JSON, "Origin": f"http://localhost:{port}"}
    status, answer = request(port, "POST", send, host, page, body)
    assert status == 200, answer
    status, answer = request(port, "POST", send, host, JSON, body)  # curl, SDKs: no Origin
    assert status == 200, answer
    assert peek_ids(ui_broker.connection_string, "work") == ["from the page", "from the page"]


def test_management_writes_and_websockets_from_another_origin_are_refused(
    ui_broker: BrokerHandle,
) -> None:
    port = ui_broker.port
    host = f"localhost:{port}"
    evil = {**_token(ui_broker), "Origin": "http://evil.example"}
    status, answer = request(port, "PUT", "/made?api-version=2021-05", host, evil, b"<entry/>")
    assert status == 403 and b"Origin" in answer, answer
    status, answer = request(port, "DELETE", "/work?api-version=2021-05", host, evil)
    assert status == 403, answer
    broker = ui_broker.broker
    assert broker is not None
    kept = ui_broker.call(lambda: ("work" in broker.queues, "made" in broker.queues))
    assert kept == (True, False)  # neither deleted nor made
    socket = "/$servicebus/websocket"
    foreign = {**UPGRADE, "Origin": "http://evil.example"}
    status, answer = request(port, "GET", socket, host, foreign)
    assert status == 403 and b"Origin" in answer, answer
    page = {**UPGRADE, "Origin": f"https://localhost:{port}"}  # what websocket-client sends
    assert request(port, "GET", socket, host, page)[0] == 101


def test_off_loopback_names_are_served_and_tokens_checked(
    monkeypatch: pytest.MonkeyPatch, broker_factory: Callable[..., BrokerHandle]
) -> None:
    """Bound to every interface (``--host 0.0.0.0``), clients use the machine's names: no
    Host check; the management API and the dashboard want a token instead."""

    def everywhere(
        config: BrokerConfig, data_dir: Path, host: str, port: int, **options: Any
    ) -> Broker:
        return main.build_broker(config, data_dir, "0.0.0.0", port, http_port=0, **options)

    monkeypatch.setattr(conftest, "build_broker", everywhere)
    handle = broker_factory(CONFIG)
    assert handle.broker is not None
    broker = handle.broker
    dashboard = handle.call(lambda: compose.serve_dashboard(broker))
    try:
        port = _http_port(handle)
        host = f"broker.example:{port}"
        assert request(port, "GET", "/health", host)[0] == 200
        assert request(port, "GET", INFO, host)[0] == 401
        assert request(port, "GET", INFO, host, _token(handle))[0] == 200
        assert request(port, "GET", "/$dashboard/api/overview", host)[0] == 401
    finally:
        handle.run(dashboard.stop())
