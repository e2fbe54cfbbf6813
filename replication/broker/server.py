"""The embedded Service Bus broker: AMQP connections in, queues and the store underneath.

One asyncio loop runs every connection (``ConnectionDriver``s from the AMQP layer); this
module owns the broker's lifecycle and routes their events: each link attaches to a node
(``nodes.py``: entities, ``$cbs`` / ``$management``, the transaction coordinator) that gets
its events from then on. Changes made while handling events are group-committed once per
loop turn (``commit.py``); only after that commit do the dependent dispositions go out (a
send's ``accepted``, a complete's echo) and newly ready messages get delivered
(``dispatch.py``). So a peer never hears of a state the disk does not have.

The parts: ``registry.py`` (the entities, their CRUD and forwarding), ``dispatch.py``
(deliveries to receivers), ``entitynode.py`` (links to entities), ``cbs.py`` (claims),
``limits.py`` (limits and the one way messages come in), ``transactions.py``,
``management.py`` (``$management`` operations).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from pathlib import Path

from ..amqp import events as ev
from ..amqp.connection import Connection
from ..amqp.link import Delivery, Link, LinkState
from ..amqp.sasl import ANONYMOUS, MSSBCBS, PLAIN, SaslServer
from ..amqp.transport import ConnectionDriver
from ..amqp.types import symbol
from ..symbols import ENTITY_DISABLED, SESSION_LOCK_LOST
from . import tls
from .auth import Authorizer
from .cbs import Cbs
from .clock import SYSTEM, Clock, now_ms
from .commit import GroupCommit
from .dispatch import Consumer, Dispatcher
from .entitynode import EntityNode
from .errors import error
from .eventhubs.face import EventHubsNode
from .eventhubs.hub import EventHubSpec
from .httpapi import HttpApp, not_found
from .limits import LINK_CREDIT, MAX_LINKS_PER_CONNECTION, Intake
from .listener import AMQP_PORT, HTTP_PORT, TLS_PORT, Listener
from .loopback import is_loopback_bind
from .management import handle_request
from .nodes import Nodes, RequestNode
from .peer import Peer
from .queue import Queue, QueueSettings, SessionLock
from .registry import Entity, Registry, TopicSpec, disabled, entity_path, touch
from .rules import RuleSpec
from .store import MessageStore
from .topic import Topic, TopicSettings
from .transactions import TransactionCoordinator

log = logging.getLogger("replication.broker")

SWEEP_INTERVAL = 0.1
DEDUPE_CLEANUP_SECONDS = 60.0


class Broker:
    """A Service Bus-compatible broker over a directory of durable state.

    ``Broker(...)`` only takes its settings; ``open()`` opens the store and builds the
    entities, ``start()`` (which opens it first) listens, ``stop()`` closes everything."""

    def __init__(
        self,
        queues: dict[str, QueueSettings],
        data_dir: Path | str,
        authorizer: Authorizer,
        *,
        topics: dict[str, TopicSpec] | None = None,
        host: str = "127.0.0.1",
        port: int = 5672,
        synchronous: str = "NORMAL",
        idle_timeout: float | None = None,
        tls_port: int | None = None,
        http_port: int | None = None,
        tls_cert: Path | str | None = None,
        tls_key: Path | str | None = None,
        namespace: str = "sbemulatorns",
        clock: Clock = SYSTEM,
        http_optional: bool = False,
        event_hubs: list[EventHubSpec] | None = None,
    ) -> None:
        self.clock = clock
        """Every time the broker reads (``clock.py``); tests give a ``ManualClock``."""

        self.host = host
        self.port = port
        """AMQP, and AMQPS / HTTPS / WSS on the same port (the listener tells them apart)."""
        self.tls_port = tls_port
        """A TLS-only port too (5671 by convention); None: none."""
        self.http_port = http_port
        """Plain HTTP (``http_app`` and ``/health``); None: none."""
        self.http_optional = http_optional
        """The HTTP port is a default nobody asked for: taken meanwhile, the broker goes on
        without it (two brokers started at once both saw it free)."""
        self.tls_cert = Path(tls_cert) if tls_cert is not None else None
        self.tls_key = Path(tls_key) if tls_key is not None else None
        """The user's certificate and key (PEM); None: a local CA under the data dir."""
        self.tls_files: tls.TlsFiles | None = None
        self.namespace = namespace
        """The namespace's name (Config.json ``Namespaces[0].Name``), as $namespaceinfo says."""
        self.http_app: HttpApp = not_found
        """Answers HTTP(S) requests on the broker's ports; whoever builds the broker gives it
        the management REST API (``main.build_broker``: ``AdminApi(broker).handle``)."""
        self.authorizer = authorizer
        self.idle_timeout = idle_timeout
        """None by default: the sync SDK sends heartbeats only while inside a call, so an idle
        (but healthy) client would be dropped; dead peers show up as closed sockets."""
        self.data_dir = Path(data_dir)
        self.synchronous = synchronous
        self.configured_queues = queues
        self.configured_topics = topics or {}
        """The entities Config.json defines (``open`` builds them, then replays API changes)."""
        self.configured_event_hubs = event_hubs or []
        """The event hubs the config file defines (``NamespaceConfig``: the Event Hubs face)."""
        self.peers: dict[ConnectionDriver, Peer] = {}
        self.listener: Listener | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._last_ttl_sweep = 0.0
        self._last_dedupe_cleanup = self.clock.monotonic()
        self._opened = False
        # made by open(), over the store:
        self.store: MessageStore
        self.commits: GroupCommit
        self.dispatcher: Dispatcher
        self.registry: Registry
        self.cbs: Cbs
        self.intake: Intake
        self.transactions: TransactionCoordinator
        self.nodes: Nodes
        """Where links attach (``nodes.py``); a new kind of node is added with ``add``."""
        self.event_hubs: EventHubsNode
        """The Event Hubs face: event hubs' links and the namespace's ``$management``."""

    def open(self) -> None:
        """Opens the store and builds the entities from it (``start`` calls it first)."""
        if self._opened:
            return
        self.store = MessageStore(self.data_dir / "messages.db", synchronous=self.synchronous)
        try:
            self.commits = GroupCommit(self.store, self._after_commit)
            self.dispatcher = Dispatcher(self.clock, self.commits)
            self.registry = Registry(self.store, self.clock, self.dispatcher.deliver)
            self.cbs = Cbs(self.authorizer, self.clock, self.commits)
            self.intake = Intake(self.store, self.namespace, self.clock)
            self.transactions = TransactionCoordinator(
                self.registry, self.cbs, self.intake, self.commits, self.clock
            )
            entities = EntityNode(
                self.registry,
                self.cbs,
                self.intake,
                self.dispatcher,
                self.transactions,
                self.commits,
            )
            requests = RequestNode(self.cbs, functools.partial(handle_request, self))
            self.nodes = Nodes(self.transactions, requests, fallback=entities)
            self.registry.load(self.configured_queues, self.configured_topics)
            self.event_hubs = EventHubsNode.open(
                self.configured_event_hubs, self.store, self.cbs, self.commits, self.clock
            )
            self.nodes.add(self.event_hubs)
            self.store.commit()
        except BaseException:
            self.store.close()
            raise
        self._opened = True

    @property
    def entities(self) -> dict[str, Entity]:
        """Every entity by lower-case path (``Registry.entities``), to look at."""
        return self.registry.entities

    @property
    def queues(self) -> dict[str, Queue]:
        """Every entity that holds messages by lower-case path (``Registry.queues``)."""
        return self.registry.queues

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.open()
        try:
            await self._listen()
        except BaseException:
            self.store.close()
            self._opened = False
            raise
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())
        for queue in self.registry.queues.values():
            queue.publish()
        topics = [
            f"{t.name} ({', '.join(n for n in t.subscriptions) or 'no subscriptions'})"
            for t in self.registry.topics.values()
        ]
        log.info(
            "broker listening on %s:%d, data in %s, queues: %s, topics: %s",
            self.host,
            self.port,
            self.data_dir,
            ", ".join(
                e.name
                for k, e in self.registry.entities.items()
                if k in self.registry.sendable and isinstance(e, Queue)
            )
            or "none",
            ", ".join(topics) or "none",
        )
        if self.event_hubs.hubs:
            log.info(
                "event hubs: %s",
                ", ".join(
                    f"{hub.name} ({len(hub.partitions)} partitions, consumer groups "
                    f"{', '.join(hub.consumer_groups.values())})"
                    for hub in self.event_hubs.hubs.values()
                ),
            )
        assert self.tls_files is not None
        log.info(
            "TLS (AMQPS, HTTPS, WSS) on port %d%s with %s%s%s",
            self.port,
            f" and {self.tls_port}" if self.tls_port is not None else "",
            self.tls_files.cert,
            f", issued by the local CA {self.tls_files.ca} (clients trust this file)"
            if self.tls_files.ca is not None
            else "",
            f"; HTTP on port {self.http_port}" if self.http_port is not None else "",
        )

    async def _listen(self) -> None:
        context, self.tls_files = tls.broker_tls(self.data_dir, self.tls_cert, self.tls_key)
        listener = self.listener = Listener(
            lambda: ConnectionDriver(self._new_connection(), self._on_event),
            lambda request: self.http_app(request),
            context,
            is_loopback_bind(self.host),
        )
        try:
            self.port = await listener.listen(self.host, self.port, AMQP_PORT)
            if self.tls_port is not None:
                self.tls_port = await listener.listen(self.host, self.tls_port, TLS_PORT)
            if self.http_port is not None:
                try:
                    self.http_port = await listener.listen(self.host, self.http_port, HTTP_PORT)
                except OSError as exc:
                    if not self.http_optional:
                        raise
                    log.warning("no plain HTTP port: %s (--http-port picks one)", exc)
                    self.http_port = None
        except BaseException:
            await listener.wait_closed()
            raise

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self.listener is not None:
            self.listener.close()  # HTTP and silent connections go now, AMQP politely
            for peer in list(self.peers.values()):
                await peer.driver.close(error("amqp:connection:forced", "broker stopping"), 2.0)
            await self.listener.wait_closed()
        if self._opened:
            self.commits.commit()
            self.store.close()
            self._opened = False

    def _new_connection(self) -> Connection:
        return Connection(
            server=True,
            container_id="replication-broker",
            idle_timeout=self.idle_timeout,
            sasl=SaslServer((MSSBCBS, PLAIN, ANONYMOUS), self.cbs.authenticate_sasl),
            require_sasl=False,
            properties={symbol("product"): "replication-broker"},
        )

    def _after_commit(self) -> None:
        """After each group commit: what it made ready is delivered, waiting session
        receivers get a session, transactions past their time roll back."""
        for queue in self.registry.queues.values():
            if queue.pending_ready:
                queue.publish()
        self.dispatcher.serve_session_waiters()
        self.transactions.time_out(self.clock.monotonic())

    # ------------------------------------------------------------------ events

    def _peer(self, driver: ConnectionDriver) -> Peer:
        peer = self.peers.get(driver)
        if peer is None:
            peer = Peer(driver, self.clock.monotonic())
            self.peers[driver] = peer
            driver.on_resume = lambda: self._resume(peer)
        return peer

    def _resume(self, peer: Peer) -> None:
        """The peer's socket drained: its links send what its full buffer held back."""
        for link, node in list(peer.nodes.items()):
            node.flow(peer, link)

    def _on_event(self, driver: ConnectionDriver, event: ev.Event) -> None:
        peer = self._peer(driver)
        try:
            if isinstance(event, ev.DeliveryReceived):  # the per-message events first
                self._on_transfer(peer, event.link, event.delivery)
            elif isinstance(event, ev.DeliveryUpdated):
                node = peer.nodes.get(event.link)
                if node is not None:
                    node.settle(peer, event.link, event.delivery)
            elif isinstance(event, ev.LinkFlow):
                node = peer.nodes.get(event.link)
                if node is not None:
                    node.flow(peer, event.link)
            elif isinstance(event, ev.SaslCompleted):
                self.cbs.logged_in(peer, event.credentials)
            elif isinstance(event, ev.LinkAttachRequested):
                self._on_attach(peer, event.link)
            elif isinstance(event, ev.LinkDetached):
                self._forget_link(peer, event.link)
            elif isinstance(event, ev.ConnectionClosed):
                self._forget_peer(peer)
        finally:
            self.commits.wake(driver)

    def _on_attach(self, peer: Peer, link: Link) -> None:
        if link.state is not LinkState.ATTACH_RECEIVED:
            return  # detached (or its session ended) in the same read, before we could answer
        if len(peer.links) >= 2 * MAX_LINKS_PER_CONNECTION:
            # refusals the peer never detaches would pile up without end: stop the connection
            peer.driver.connection.close(
                error(
                    "amqp:resource-limit-exceeded",
                    f"too many links: at most {MAX_LINKS_PER_CONNECTION} per connection, and "
                    "refused links were not detached",
                )
            )
            return
        peer.links.add(link)  # a refused link holds its handle until the peer detaches
        if len(peer.links) > MAX_LINKS_PER_CONNECTION:
            link.refuse(
                error(
                    "amqp:resource-limit-exceeded",
                    f"too many links: at most {MAX_LINKS_PER_CONNECTION} per connection",
                )
            )
            return
        terminus = link.remote_target if link.is_receiver else link.remote_source
        path = entity_path(getattr(terminus, "address", None))
        node = self.nodes.resolve(link, path)
        peer.nodes[link] = node
        node.attach(peer, link, path)

    def _on_transfer(self, peer: Peer, link: Link, delivery: Delivery) -> None:
        if link.link_credit < LINK_CREDIT // 2:
            link.flow(LINK_CREDIT)
        node = peer.nodes.get(link)
        if node is not None:
            node.transfer(peer, link, delivery)

    def _forget_link(self, peer: Peer, link: Link) -> None:
        peer.links.discard(link)
        peer.entity_links.pop(link, None)
        node = peer.nodes.pop(link, None)
        if node is not None:
            node.detach(peer, link)

    def _forget_peer(self, peer: Peer) -> None:
        self.transactions.forget_peer(peer)  # open transactions roll back
        for link in list(peer.nodes):
            self._forget_link(peer, link)
        self.dispatcher.forget_peer(peer)
        self.peers.pop(peer.driver, None)

    # ------------------------------------------------------------------ timers

    def now_ms(self) -> int:
        """The broker's clock in milliseconds (message times, locks, TTL, schedules)."""
        return now_ms(self.clock)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            try:
                self.sweep()
            except Exception:
                log.exception("broker sweep failed")

    def sweep(self, *, everything: bool = False) -> None:
        """What time did: expired locks and session locks, scheduled messages due, waits
        and transactions timed out; once a second TTL, event hub retention, token grace and
        idle entities, and once a minute the duplicate-detection history (``everything``: all
        of them now).
        Runs every ``SWEEP_INTERVAL`` on the loop; a test with a ``ManualClock`` calls it
        after ``advance`` to see the effects at once."""
        now = self.now_ms()
        changed = False
        registry = self.registry
        for queue in registry.queues.values():
            if queue.locks or queue.session_locks or queue.orphaned_locks:
                before = len(queue.locks) + len(queue.orphaned_locks)
                for session in queue.expire_locks(now):
                    self._session_lost(session)
                changed |= len(queue.locks) + len(queue.orphaned_locks) != before
        for entity_id, seq in self.store.due_scheduled(now):
            entity = registry.by_entity_id.get(entity_id)
            if entity is not None:
                entity.activate_scheduled(seq)
                changed = True
        self.dispatcher.serve_session_waiters()
        self.transactions.time_out(self.clock.monotonic())
        if everything or self.clock.monotonic() - self._last_ttl_sweep > 1.0:
            self._last_ttl_sweep = self.clock.monotonic()
            for entity_id, seq in self.store.expired(now):
                entity = registry.by_entity_id.get(entity_id)
                if isinstance(entity, Topic):
                    entity.cancel_scheduled([seq])  # expired before its scheduled time
                    changed = True
                elif entity is not None and not entity.is_locked(seq):
                    entity.expire(seq)
                    changed = True
            self.cbs.check_tokens(list(self.peers.values()))
            changed |= self.event_hubs.sweep(now)  # retention
            changed |= bool(self.delete_idle(now))
        monotonic = self.clock.monotonic()
        if everything or monotonic - self._last_dedupe_cleanup > DEDUPE_CLEANUP_SECONDS:
            self._last_dedupe_cleanup = monotonic
            for entity in registry.entities.values():
                settings = entity.settings
                if getattr(settings, "requires_duplicate_detection", False):
                    window = settings.duplicate_detection_window.total_seconds() * 1000
                    self.store.forget_message_ids(entity.entity, now - int(window))
                    changed = True
        if changed or self.commits.waking:
            self.commits.soon()  # commits, then delivers and wakes the connections touched

    def _session_lost(self, session: SessionLock) -> None:
        """A session lock expired: its receiver's link ends with session-lock-lost."""
        consumer = session.owner
        if not isinstance(consumer, Consumer) or not consumer.link.is_open:
            return
        consumer.link.detach(
            error(
                SESSION_LOCK_LOST,
                (f"the lock on session '{session.session_id}' of '{consumer.queue.name}' expired"),
            )
        )
        self._forget_link(consumer.peer, consumer.link)
        self.commits.wake(consumer.peer.driver)
        self.commits.soon()

    def delete_idle(self, now: int) -> list[str]:
        """Deletes the entities unused for their ``AutoDeleteOnIdle``; returns their names.
        Linked to (a receiver waiting counts as receiving), an entity is in use, as in
        Service Bus. Idle time counts from the broker's start at the earliest: when an
        entity was last used before a restart is not kept."""
        for peer in self.peers.values():
            for link, name in peer.entity_links.items():
                entity = self.registry.entities.get(name.lower())
                if entity is not None and link.is_open:
                    touch(entity, now)
        return self.registry.delete_idle(now, self.delete_entity)

    # ------------------------------------------------------------------ runtime entity management
    #
    # The management REST API (admin/) creates, changes and deletes entities while the broker
    # runs (``registry.py`` keeps them and their records); each change is committed before
    # the API answers, and links the change refuses are detached.

    def create_entity(
        self,
        kind: str,
        path: str,
        settings: QueueSettings | TopicSettings,
        description: str,
        rules: list[RuleSpec] | None = None,
    ) -> Entity:
        """A new queue, topic or subscription, durable and open to AMQP links at once. The
        caller has checked the name is free and the settings (forward targets) valid."""
        entity = self.registry.create(kind, path, settings, description, rules)
        self.commits.commit()
        return entity

    def update_entity(
        self, path: str, settings: QueueSettings | TopicSettings, description: str
    ) -> None:
        """New settings for a live entity; they apply to the next message, lock or delivery.
        Links its new ``Status`` refuses are detached, as Service Bus does."""
        entity = self.registry.update(path, settings, description)
        self.commits.commit()
        for peer in list(self.peers.values()):
            for link, name in list(peer.entity_links.items()):
                stopped = disabled(entity, "Send" if link.is_receiver else "Listen")
                if name.lower() == entity.name.lower() and stopped and link.is_open:
                    link.detach(error(ENTITY_DISABLED, stopped))
                    self._forget_link(peer, link)
                    self.commits.wake(peer.driver)

    def delete_entity(self, path: str) -> None:
        """Deletes an entity with its messages (a topic with its subscriptions); links to it
        are detached with ``amqp:not-found``, forwarding into it stops."""
        removed = self.registry.remove(path.lower())
        doomed = {item.name.lower() for item in removed}
        for peer in list(self.peers.values()):
            for link, name in list(peer.entity_links.items()):
                if name.lower() not in doomed:
                    continue
                gone = error("amqp:not-found", f"The messaging entity '{name}' has been deleted.")
                if link.is_open:
                    link.detach(gone)
                elif link.state is LinkState.ATTACH_RECEIVED:
                    link.refuse(gone)
                self._forget_link(peer, link)
                self.commits.wake(peer.driver)
        self.dispatcher.forget_entities(removed)
        self.registry.forget(removed)
        self.commits.commit()
