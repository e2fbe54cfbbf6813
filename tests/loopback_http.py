"""HTTP requests that name their own ``Host`` and ``Origin``, as a browser on another name
would send them, and the SDK's peek: shared by the DNS rebinding tests (issue 38) of the
broker's and the local host's HTTP ports."""

from __future__ import annotations

import http.client

from azure.servicebus import ServiceBusClient

from tests.ports import HOST

REBOUND = ("127.0.0.1.example.com", "localhost.example.com", "127.1", "evil.example")
"""Names a page can come from while an attacker's DNS points them at 127.0.0.1 (``127.1``:
no literal address, so a name as far as the server can tell)."""
LOOPBACK = ("127.0.0.1", "127.0.0.2", "[::1]", "localhost", "LOCALHOST")
"""What a client of the local server sends: the loopback name or a loopback literal."""


def request(
    port: int,
    method: str,
    path: str,
    host: str,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> tuple[int, bytes]:
    """``method path`` to 127.0.0.1:``port`` with ``Host: host``: (status, body)."""
    connection = http.client.HTTPConnection(HOST, port, timeout=10)
    try:
        connection.request(method, path, body=body, headers={"Host": host, **(headers or {})})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def peek_ids(connection_string: str, queue: str) -> list[str | None]:
    """The message ids in ``queue``, peeked with the unmodified SDK (locks nothing)."""
    client = ServiceBusClient.from_connection_string(connection_string)
    with client, client.get_queue_receiver(queue) as receiver:
        return [m.message_id for m in receiver.peek_messages(max_message_count=10)]
