"""An entity's message counts, read from the namespace's management API.

``ServiceBusAdministrationClient.get_queue_runtime_properties`` (and its subscription twin)
is a ``GET https://<namespace>/<entity path>?api-version=...`` whose ATOM entry carries the
entity's ``CountDetails``: ``ActiveMessageCount`` (what waits, the locked and the deferred
among it), ``DeadLetterMessageCount``, ``ScheduledMessageCount``, ... This asks the same,
over HTTPS (plain HTTP for a local emulator, which our broker serves on its AMQP port),
with a token from the endpoint's provider in ``Authorization``. Service Bus answers it only
for a token with the **Manage** claim over the entity; without it the answer is 401, raised
as ``CountsRefused`` so a caller can count another way. Azure keeps these counts a few
seconds behind the entity (they are not transactional with sends and receives).
"""

from __future__ import annotations

import asyncio
import http.client
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote
from xml.etree.ElementTree import Element

from defusedxml import ElementTree

from ..symbols import JWT_TOKEN_TYPE
from .connection_string import TLS_PORT
from .endpoint import Endpoint

API_VERSION = "2021-05"
"""The management API version the SDK asks for."""
HTTPS_PORT = 443
MAX_ANSWER = 1024 * 1024
"""Bytes of an answer read at most (an entity's entry is a few kB)."""

COUNTS: Mapping[str, str] = {
    "ActiveMessageCount": "active",
    "DeadLetterMessageCount": "dead_lettered",
    "ScheduledMessageCount": "scheduled",
    "TransferMessageCount": "transfer",
    "TransferDeadLetterMessageCount": "transfer_dead_lettered",
    "DeferredMessageCount": "deferred",  # the embedded broker's own (of the active ones)
}
"""``CountDetails`` element -> the name it is given here."""


class CountsRefused(Exception):
    """The management API would not give the counts: ``status`` 401 or 403 means the
    connection has no Manage right (count another way); anything else says what failed."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"management API answered {status}: {detail}")
        self.status = status

    @property
    def no_manage_right(self) -> bool:
        return self.status in (401, 403)


@dataclass(frozen=True, slots=True)
class EntityCounts:
    active: int = 0
    """Messages that wait to be received: locked and deferred ones included, scheduled and
    dead-lettered ones not (Service Bus's ``ActiveMessageCount``)."""
    dead_lettered: int = 0
    scheduled: int = 0
    transfer: int = 0
    transfer_dead_lettered: int = 0
    deferred: int = 0
    """Of ``active`` (only the embedded broker says: 0 from Service Bus)."""


def count_details(element: Element | None) -> dict[str, int]:
    """A ``CountDetails`` element's counts by ``COUNTS`` name (0 for one it lacks)."""
    found = dict.fromkeys(COUNTS.values(), 0)
    for child in element if element is not None else ():
        name = COUNTS.get(child.tag.rpartition("}")[2])
        if name is not None:
            found[name] = int(child.text or 0)
    return found


async def entity_counts(endpoint: Endpoint, path: str, *, timeout: float = 30.0) -> EntityCounts:
    """The counts of the queue or subscription ``path`` (``topic/Subscriptions/name``);
    ``CountsRefused`` when the API says no (or has no such entity)."""
    audience = f"https://{endpoint.namespace}/{path}"
    token, _ = await endpoint.token_provider(audience)
    if endpoint.token_type == JWT_TOKEN_TYPE:
        token = f"Bearer {token}"
    target = "/" + "/".join(quote(part, safe="") for part in path.split("/"))
    status, body = await asyncio.to_thread(
        _get, endpoint, f"{target}?api-version={API_VERSION}", token, timeout
    )
    if status != 200:
        raise CountsRefused(status, _detail(body))
    root = ElementTree.fromstring(body)
    details = root.find(".//{*}CountDetails")
    if details is None:  # Service Bus answers an empty feed for an entity it does not have
        raise CountsRefused(404, f"no entity {path!r} in the namespace")
    return EntityCounts(**count_details(details))


def _get(endpoint: Endpoint, target: str, token: str, timeout: float) -> tuple[int, bytes]:
    """One blocking request (run in a thread); a fresh connection each time: the counts are
    read every few seconds at most."""
    port = _port(endpoint)
    connection: http.client.HTTPConnection
    if endpoint.use_tls:
        connection = http.client.HTTPSConnection(
            endpoint.host, port, timeout=timeout, context=endpoint.tls_context()
        )
    else:
        connection = http.client.HTTPConnection(endpoint.host, port, timeout=timeout)
    try:
        connection.request(
            "GET",
            target,
            headers={
                "Authorization": token,
                "Accept": "application/atom+xml",
            },
        )
        answer = connection.getresponse()
        return answer.status, answer.read(MAX_ANSWER)
    finally:
        connection.close()


def _port(endpoint: Endpoint) -> int:
    """Where the management API is: HTTPS on 443 for a namespace whose AMQP is on the usual
    5671; otherwise the port the endpoint names (our broker serves HTTP and HTTPS on its
    AMQP port)."""
    if endpoint.use_tls and endpoint.port == TLS_PORT:
        return HTTPS_PORT
    return endpoint.port


def _detail(body: bytes) -> str:
    """The ``Detail`` of an error answer, else its text (shortened)."""
    text = body.decode("utf-8", "replace")
    try:
        found = ElementTree.fromstring(body).find(".//{*}Detail")
    except Exception:  # not XML: the text says it
        found = None
    detail = found.text if found is not None and found.text else text
    return " ".join(detail.split())[:300] or "(no detail)"
