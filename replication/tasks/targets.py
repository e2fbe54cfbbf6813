"""Senders for a task's targets, opened once and reused (one connection per namespace).

A target is a named (connection string, entity) pair; ``None`` names the task's default
target. The pool is what ``send_ordered`` asks for a sender. Two backends: ``"amqp"`` (the
default) sends over our own AMQP engine (``servicebus.sender``: one connection per
namespace, one link per entity, shared by every group), ``"sdk"`` through
``azure-servicebus`` (each SDK sender lent to one group at a time). A target with a ``failover``
is sent to wherever its failover resolves now: each send asks for the current namespace,
reports the outcome (persistent errors make the failover resolve again), and after a switch
the old namespace's senders are closed once their in-flight sends are done.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from azure.servicebus.aio import ServiceBusClient, ServiceBusSender

from ..adapters.sdk import to_sdk
from ..messages import Message
from ..servicebus.client import AmqpSource
from ..servicebus.sender import AmqpSender
from .eventhubs import EventHubSender
from .sender import send_batch

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..failover import Failover
    from ..servicebus.transactions import Transaction
    from .sender import SenderFor

DEFAULT_TARGET_NAME = "target"
"""What names a task's default target (key ``None``) where a name is needed: its lag
metrics, its failover's logs, the targets a pipeline test's expected message may say (the
pipeline field it comes from)."""
SendBackend = Literal["amqp", "sdk"]
BACKENDS: tuple[SendBackend, ...] = ("amqp", "sdk")
FAILOVER_CLIENT_OPTIONS = {"retry_total": 1}
"""The SDK's own retries (3, with backoff: 11 s against a refused connection) would hide a
dead namespace from the failover; ``send_ordered`` retries, re-resolving in between."""


@dataclass(slots=True, frozen=True)
class Target:
    connection_string: str
    entity: str
    failover: Failover | None = None
    """When set, ``connection_string`` is the configured one; sends go where this resolves."""
    event_hub: bool = False
    """``entity`` is an event hub: sent to with ``azure-eventhub`` (``tasks.eventhubs``)."""


class SenderPool:
    """``links_per_target`` senders per target, each lent to one coroutine at a time (an SDK
    sender is not safe to share between concurrent coroutines). One is the default: with
    azure-servicebus 7.15 a send on a link that sat idle waits on its connection first, so
    four links taking turns measured 2.6x slower than one link kept busy
    (1,257 vs 3,325 msgs/s, 100-message batches); groups then take turns on the one link,
    each keeping its order."""

    def __init__(
        self,
        targets: dict[str | None, Target],
        *,
        backend: SendBackend = "amqp",
        links_per_target: int = 1,
        **client_options: Any,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown send backend {backend!r}: 'amqp' or 'sdk'")
        self.targets = targets
        self.backend = backend
        self.links_per_target = links_per_target
        self._namespaces: dict[str, AmqpSource] = {}
        self._amqp_senders: dict[tuple[str, str], AmqpSender] = {}
        self._client_options = client_options
        self._clients: dict[str, ServiceBusClient] = {}
        self._idle: dict[tuple[str, str], asyncio.Queue[ServiceBusSender]] = {}
        self._lent: dict[str, int] = {}
        self._retired: set[str] = set()
        self._all: list[ServiceBusSender] = []
        self._event_hubs: dict[tuple[str, str], EventHubSender] = {}
        self._lock = asyncio.Lock()
        for target in targets.values():
            if target.failover is not None:
                target.failover.on_switch(self._retire)

    @contextlib.asynccontextmanager
    async def __call__(self, name: str | None) -> AsyncIterator[Any]:
        target = self.targets.get(name)
        if target is None:
            known = ", ".join(repr(n) for n in self.targets if n is not None) or "none"
            raise KeyError(f"no target named {name!r} (targets: {known})")
        if target.event_hub:
            yield self._event_hub_sender(target)
            return
        if target.failover is not None:
            yield _FailoverSender(self, target, target.failover)
            return
        async with self.lend(target.connection_string, target.entity) as sender:
            yield sender

    @contextlib.asynccontextmanager
    async def lend(
        self, connection_string: str, entity: str, **client_options: Any
    ) -> AsyncIterator[Any]:
        if self.backend == "amqp":
            self._lent[connection_string] = self._lent.get(connection_string, 0) + 1
            try:
                yield self._amqp_sender(connection_string, entity)
            finally:
                self._lent[connection_string] -= 1
                if connection_string in self._retired and not self._lent[connection_string]:
                    await self._close_namespace(connection_string)
            return
        async with self._lend_sdk(connection_string, entity, **client_options) as sender:
            yield SdkSender(sender)

    def _event_hub_sender(self, target: Target) -> EventHubSender:
        """One sender per event hub, over the pool's backend (``amqp``: our client, ``sdk``:
        ``azure-eventhub``'s producer)."""
        key = (target.connection_string, target.entity.lower())
        sender = self._event_hubs.get(key)
        if sender is None:
            sender = self._event_hubs[key] = EventHubSender(
                target.connection_string, target.entity, backend=self.backend
            )
        return sender

    def _amqp_sender(self, connection_string: str, entity: str) -> AmqpSender:
        key = (connection_string, entity.lower())
        sender = self._amqp_senders.get(key)
        if sender is None:
            namespace = self._namespaces.get(connection_string)
            if namespace is None:
                namespace = AmqpSource.from_connection_string(connection_string)
                self._namespaces[connection_string] = namespace
            sender = self._amqp_senders[key] = AmqpSender(namespace, entity)
        return sender

    @contextlib.asynccontextmanager
    async def _lend_sdk(
        self, connection_string: str, entity: str, **client_options: Any
    ) -> AsyncIterator[ServiceBusSender]:
        key = (connection_string, entity.lower())
        async with self._lock:
            idle = self._idle.get(key)
            if idle is None:
                idle = self._idle[key] = asyncio.Queue()
                client = self._clients.get(connection_string)
                if client is None:
                    client = ServiceBusClient.from_connection_string(
                        connection_string, **{**self._client_options, **client_options}
                    )
                    self._clients[connection_string] = client
                for _ in range(self.links_per_target):
                    sender = client.get_queue_sender(entity)
                    self._all.append(sender)
                    idle.put_nowait(sender)
        # lent counts holders and waiters: a retired namespace closes only when it is 0
        self._lent[connection_string] = self._lent.get(connection_string, 0) + 1
        try:
            sender = await idle.get()
            try:
                yield sender
            finally:
                idle.put_nowait(sender)
        finally:
            self._lent[connection_string] -= 1
            if connection_string in self._retired and not self._lent[connection_string]:
                await self._close_namespace(connection_string)

    def _retire(self, old: str, new: str) -> None:
        """A failover moved off ``old``: close its client once nothing is lent from it
        (a static target on the same connection string keeps it)."""
        if any(t.failover is None and t.connection_string == old for t in self.targets.values()):
            return
        self._retired.add(old)
        self._retired.discard(new)
        if not self._lent.get(old):
            asyncio.get_running_loop().create_task(self._close_namespace(old))

    async def _close_namespace(self, connection_string: str) -> None:
        async with self._lock:
            if connection_string not in self._retired or self._lent.get(connection_string):
                return
            self._retired.discard(connection_string)
            for key in [k for k in self._amqp_senders if k[0] == connection_string]:
                await self._amqp_senders.pop(key).close()
            namespace = self._namespaces.pop(connection_string, None)
            if namespace is not None:
                await namespace.close()
            for key in [k for k in self._idle if k[0] == connection_string]:
                idle = self._idle.pop(key)
                while not idle.empty():
                    sender = idle.get_nowait()
                    self._all.remove(sender)
                    with contextlib.suppress(Exception):
                        await sender.close()
            client = self._clients.pop(connection_string, None)
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()

    async def close(self) -> None:
        for hub in self._event_hubs.values():
            with contextlib.suppress(Exception):
                await hub.close()
        self._event_hubs.clear()
        for amqp_sender in self._amqp_senders.values():
            await amqp_sender.close()
        for namespace in self._namespaces.values():
            await namespace.close()
        self._amqp_senders.clear()
        self._namespaces.clear()
        for sender in self._all:
            await sender.close()
        for client in self._clients.values():
            await client.close()
        self._all.clear()
        self._idle.clear()
        self._clients.clear()


class SdkSender:
    """An SDK sender that takes our messages (``to_sdk`` each, then one ``send_messages``)."""

    def __init__(self, sender: ServiceBusSender) -> None:
        self.sender = sender

    async def send_messages(self, messages: list[Message]) -> None:
        await self.sender.send_messages([to_sdk(message) for message in messages])


class _FailoverSender:
    """Lent for one group's sends: every send goes to the namespace resolved now."""

    def __init__(self, pool: SenderPool, target: Target, failover: Failover) -> None:
        self.pool = pool
        self.target = target
        self.failover = failover
        self.accepted_by: str | None = None
        """The namespace host that accepted the last send (for callers that count by it)."""

    reports_queued = True
    """Passes the lent sender's "on the wire" on (``sender.send_batch``)."""

    async def send_messages(
        self, messages: list[Message], queued: Callable[[], None] | None = None
    ) -> None:
        from ..failover import FailoverError, FailoverSwitched, NamespaceUnresolved

        try:
            connection_string = await self.failover.connection_string()
        except FailoverError as exc:
            raise NamespaceUnresolved(f"{self.failover.name}: {exc}") from exc
        version, host = self.failover.version, self.failover.host
        async with self.pool.lend(
            connection_string, self.target.entity, **FAILOVER_CLIENT_OPTIONS
        ) as sender:
            if self.failover.version != version:  # switched while waiting for the sender
                raise FailoverSwitched(f"{self.failover.name}: moved to {self.failover.host}")
            try:
                await send_batch(sender, messages, queued)
            except Exception as exc:
                switched = await self.failover.report_failure(exc)
                if switched or self.failover.version != version:
                    raise FailoverSwitched(
                        f"{self.failover.name}: moved to {self.failover.host} after: {exc}"
                    ) from exc
                raise
        self.failover.report_success()
        self.accepted_by = host


class ViaSenders:
    """Senders for a transactional pipeline: every target is an entity of the source's
    namespace, sent to over the source's connection via the source entity (send-via), so
    that the sends and the source's completes can be one transaction. One link per target,
    kept across batches; ``within(txn)`` lends them to one batch's transaction (several
    session workers may each run their own at once)."""

    def __init__(self, namespace: AmqpSource, via: str, targets: Mapping[str | None, str]) -> None:
        self.namespace = namespace
        self.via = via
        self.targets = dict(targets)
        self._senders: dict[str | None, AmqpSender] = {}

    def within(self, transaction: Transaction) -> SenderFor:
        """A ``SenderFor`` whose sends are enlisted in ``transaction``."""

        @contextlib.asynccontextmanager
        async def lend(name: str | None) -> AsyncIterator[Any]:
            yield _Enlisted(self._sender(name), transaction)

        return lend

    def _sender(self, name: str | None) -> AmqpSender:
        sender = self._senders.get(name)
        if sender is None:
            entity = self.targets.get(name)
            if entity is None:
                known = ", ".join(repr(n) for n in self.targets if n is not None) or "none"
                raise KeyError(f"no target named {name!r} (targets: {known})")
            sender = self._senders[name] = AmqpSender(self.namespace, entity, via=self.via)
        return sender

    async def close(self) -> None:
        senders, self._senders = self._senders, {}
        for sender in senders.values():
            await sender.close()


class _Enlisted:
    def __init__(self, sender: AmqpSender, transaction: Transaction) -> None:
        self.sender = sender
        self.transaction = transaction

    async def send_messages(self, messages: list[Message]) -> None:
        await self.sender.send_messages(messages, transaction=self.transaction)
