"""An in-memory AMQP peer: one FIFO per address, for the demo and interop tests.

Messages sent to an address wait there until a receiving link on that address has credit;
a released or modified delivery goes back to the front. It is the smallest server that
exercises every part of the engine (SASL, sessions, credit, drain, settlement) with real
clients, and it is deliberately not a broker: no durability, no locks, no auth decisions.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from . import events as ev
from .connection import Connection
from .link import Delivery, Link
from .outcomes import Accepted, Modified, Released
from .performatives import Error
from .sasl import ANONYMOUS, PLAIN, SaslServer
from .transport import ConnectionDriver, serve


def _address(terminus: object) -> str | None:
    address = getattr(terminus, "address", None)
    return str(address) if address is not None else None


class MemoryNode:
    """Queues by address, shared by every connection of one server."""

    def __init__(self) -> None:
        self.queues: dict[str, deque[tuple[bytes, int]]] = {}
        self._receivers: dict[str, list[tuple[ConnectionDriver, Link]]] = {}
        self._in_flight: dict[int, tuple[str, bytes, int]] = {}
        self.received = 0

    def queue(self, address: str) -> deque[tuple[bytes, int]]:
        return self.queues.setdefault(address, deque())

    def handle(self, driver: ConnectionDriver, event: ev.Event) -> None:
        if isinstance(event, ev.LinkAttachRequested):
            self._attach(driver, event.link)
        elif isinstance(event, ev.DeliveryReceived):
            self._accept_message(event.link, event.delivery)
        elif isinstance(event, ev.LinkFlow):
            self._deliver(_address(event.link.source) or "")
        elif isinstance(event, ev.DeliveryUpdated):
            self._on_outcome(event.delivery)
        elif isinstance(event, ev.LinkDetached):
            address = _address(event.link.source)
            if address is not None:
                receivers = self._receivers.get(address, [])
                self._receivers[address] = [r for r in receivers if r[1] is not event.link]

    def _attach(self, driver: ConnectionDriver, link: Link) -> None:
        if link.is_sender:  # the peer receives from this address
            address = _address(link.remote_source)
            if not address:
                link.refuse(Error(condition="amqp:not-found", description="source address needed"))
                return
            link.accept()
            self._receivers.setdefault(address, []).append((driver, link))
        else:
            address = _address(link.remote_target)
            if not address:
                link.refuse(Error(condition="amqp:not-found", description="target address needed"))
                return
            link.accept()
            link.flow(1000)

    def _accept_message(self, link: Link, delivery: Delivery) -> None:
        address = _address(link.target) or ""
        self.queue(address).append((delivery.payload, delivery.message_format))
        self.received += 1
        if not delivery.settled:
            delivery.update(Accepted())
        if link.link_credit < 500:
            link.flow(1000)
        self._deliver(address)

    def _deliver(self, address: str) -> None:
        queue = self.queues.get(address)
        for driver, link in self._receivers.get(address, []):
            while queue and link.link_credit - link.queued > 0 and link.is_open:
                payload, message_format = queue.popleft()
                delivery = link.send(payload, message_format=message_format)
                if not delivery.settled:
                    self._in_flight[id(delivery)] = (address, payload, message_format)
            driver.wake()

    def _on_outcome(self, delivery: Delivery) -> None:
        entry = self._in_flight.pop(id(delivery), None)
        if entry is None:
            return
        address, payload, message_format = entry
        if isinstance(delivery.remote_state, Released | Modified):
            self.queue(address).appendleft((payload, message_format))
            self._deliver(address)
        if not delivery.settled:
            delivery.settle()


async def start_memory_server(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    node: MemoryNode | None = None,
    users: dict[str, str] | None = None,
    on_connection: Callable[[Connection], None] | None = None,
) -> tuple[asyncio.Server, MemoryNode]:
    """Serves a ``MemoryNode``; with ``users`` SASL PLAIN checks passwords, else ANONYMOUS too."""
    node = node or MemoryNode()

    def authenticate(credentials: object) -> bool:
        if users is None:
            return True
        return users.get(getattr(credentials, "username", None) or "") == getattr(
            credentials, "password", None
        )

    mechanisms = (PLAIN,) if users is not None else (PLAIN, ANONYMOUS)

    def make_connection() -> Connection:
        connection = Connection(
            server=True,
            container_id="memory-node",
            sasl=SaslServer(mechanisms, authenticate),
            require_sasl=users is not None,
        )
        if on_connection is not None:
            on_connection(connection)
        return connection

    server = await serve(make_connection, node.handle, host, port)
    return server, node
