"""``python -m replication broker --ui``: the dashboard on the broker's own HTTP port, next to
the management API, as a real process; listening beyond loopback, every call needs a token."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from replication.servicebus.sas import mint
from tests.broker.conftest import connection_string
from tests.processes import Processes

from .support import start_broker

pytestmark = pytest.mark.timeout(90)


def _get(port: int, path: str, token: str | None = None) -> tuple[int, str, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path, headers={"authorization": token} if token else {})
        response = connection.getresponse()
        return response.status, response.getheader("content-type") or "", response.read()
    finally:
        connection.close()


def test_broker_ui_serves_page_api_and_events_beside_the_management_api(
    tmp_path: Path, processes: Processes
) -> None:
    amqp, port, log = start_broker(processes, tmp_path, "--ui", "--host", "0.0.0.0")
    assert f"dashboard on http://localhost:{port}/" in log
    token = mint(f"sb://localhost:{amqp}", "RootManageSharedAccessKey", "SAS_KEY_VALUE")[0]
    status, kind, page = _get(port, "/")
    assert status == 200 and kind.startswith("text/html") and b"app.js" in page
    status, kind, script = _get(port, "/$dashboard/static/app.js")
    assert status == 200 and kind.startswith("text/javascript") and b"follow" in script
    # bound to 0.0.0.0: the API wants a token
    status, _, body = _get(port, "/$dashboard/api/overview")
    assert status == 401 and b"SAS token is required" in body
    client = ServiceBusClient.from_connection_string(connection_string(amqp))
    with client, client.get_queue_sender("work") as sender:
        sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
    status, _, body = _get(port, "/$dashboard/api/overview", token)
    assert status == 200
    (queue,) = json.loads(body)["namespaces"][0]["queues"]
    assert (queue["name"], queue["counts"]["active"]) == ("work", 2)
    # the management API still answers on the same port
    status, kind, body = _get(port, "/$namespaceinfo?api-version=2021-05", token)
    assert status == 200 and b"NamespaceInfo" in body
    # live updates: a server-sent event with the same state, then the next one
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/$dashboard/api/events", headers={"authorization": token})
        response = connection.getresponse()
        assert response.status == 200
        assert response.getheader("content-type") == "text/event-stream"
        events = []
        while len(events) < 2:
            line = response.readline().decode()
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
        assert all(e["namespaces"][0]["queues"][0]["counts"]["active"] == 2 for e in events)
        assert events[1]["time"] > events[0]["time"]
    finally:
        connection.close()


def test_broker_without_ui_serves_no_page(tmp_path: Path, processes: Processes) -> None:
    _, port, log = start_broker(processes, tmp_path)
    assert "dashboard" not in log
    assert _get(port, "/$dashboard/api/overview")[0] == 401  # the management API's answer
