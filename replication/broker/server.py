"""The embedded Service Bus broker: AMQP connections in, queues and the store underneath.

One asyncio loop runs every connection (``ConnectionDriver``s from the AMQP layer); this
module turns their events into queue operations. Changes made while handling events are
group-committed once per loop turn (``_commit_soon``); only after that commit do the
dependent dispositions go out (a send's ``accepted``, a complete's echo) and newly ready
messages get delivered. So a peer never hears of a state the disk does not have.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ..amqp import events as ev
from ..amqp.connection import Connection
from ..amqp.errors import AMQPError
from ..amqp.link import Delivery, Link, LinkState
from ..amqp.message import BodyType, Message, Properties, decode_message, encode_message
from ..amqp.outcomes import Accepted, Coordinator, Modified, Rejected, Released, TransactionalState
from ..amqp.performatives import SND_SETTLED
from ..amqp.sasl import ANONYMOUS, MSSBCBS, PLAIN, SaslCredentials, SaslServer
from ..amqp.transport import ConnectionDriver
from ..amqp.types import symbol
from ..servicebus.symbols import (
    CBS_NODE,
    ENTITY_DISABLED,
    LOCKED_UNTIL_UTC,
    MANAGEMENT_SUFFIX,
    MESSAGE_LOCK_LOST,
    SESSION_CANNOT_BE_LOCKED,
    SESSION_FILTER,
    SESSION_LOCK_LOST,
    TIMEOUT,
)
from . import tls, wire
from .auth import AuthorizationError, Authorizer, Grant
from .clock import SYSTEM, Clock, now_ms
from .errors import QuotaExceededError, SendRefusedError, error, tracked
from .httpapi import HttpApp
from .listener import AMQP_PORT, HTTP_PORT, TLS_PORT, Listener
from .queue import (
    DEAD_LETTER_SUFFIX,
    DEFAULT_MAX_SIZE_MB,
    LockLostError,
    Queue,
    QueueSettings,
    SessionCannotBeLockedError,
    SessionLock,
    SessionLockLostError,
)
from .rules import DEFAULT_RULE, RuleSet, RuleSpec, dump_rules, load_rules
from .store import ManagedEntity, MessageStore, StoredMessage
from .topic import SUBSCRIPTIONS, SessionRequiredError, Subscription, Topic, TopicSettings
from .transactions import TRANSFER_DESTINATION, TransactionCoordinator

log = logging.getLogger("replication.broker")

LINK_CREDIT = 10_000
"""Credit for a sending peer; the SDK ignores credit and counts from 10,000 itself."""
RECEIVE_LIMIT = 4 * 1024 * 1024
"""Deliveries up to this size are read and refused with a rejected disposition when over the
entity's limit (what the SDK expects: it does not check single messages); larger ones cost the
peer its link."""
MAX_LINKS_PER_CONNECTION = 1000
PUMP_BATCH = 100
"""Most deliveries one pump hands a consumer's link; the next batch follows once this one is
written, so a huge credit never pulls a whole queue into memory and a reader that stops
reading is held back (``driver.paused``) after one batch."""
PUMP_BYTES = 1024 * 1024
"""...and at most about this many message bytes (at least one message), so a batch of
256 KiB messages does not hold 25 MB at once."""
SWEEP_INTERVAL = 0.1
TOKEN_GRACE_SECONDS = 20.0
"""A connection must put a token within this time (WIRE.md: Service Bus waits 20 s)."""
DEFAULT_SESSION_WAIT_MS = 60_000
"""How long a next-available session receiver waits when it names no timeout."""
NET_TICKS_AT_EPOCH = 621_355_968_000_000_000
QUEUE, TOPIC, SUBSCRIPTION = "queue", "topic", "subscription"
"""Kinds of entity the management API creates (``ManagedEntity.kind``)."""
DEDUPE_CLEANUP_SECONDS = 60.0

Entity = Queue | Topic


def net_ticks(ms: int) -> int:
    """A time as .NET ticks (100 ns since 0001-01-01), as Service Bus sends lock expiries."""
    return NET_TICKS_AT_EPOCH + ms * 10_000


def dump_settings(settings: QueueSettings | TopicSettings) -> str:
    """Entity settings as JSON (durations in seconds), to store and to compare definitions."""
    values = {
        name: {"seconds": value.total_seconds()} if isinstance(value, timedelta) else value
        for name, value in dataclasses.asdict(settings).items()
        if name not in _LATER_SETTINGS or value != _LATER_SETTINGS[name]
    }
    return json.dumps(values, sort_keys=True)


_LATER_SETTINGS: dict[str, Any] = {"max_size_mb": DEFAULT_MAX_SIZE_MB, "auto_delete_on_idle": None}
"""Settings added after records were first stored: left out at their defaults, so an
unchanged Config.json entity still matches its record (and keeps its API-made changes)."""


def load_settings(kind: str, text: str) -> QueueSettings | TopicSettings:
    """``dump_settings`` reversed; ``kind`` is queue, topic or subscription."""
    values: dict[str, Any] = {
        name: timedelta(seconds=value["seconds"]) if isinstance(value, dict) else value
        for name, value in json.loads(text).items()
    }
    return TopicSettings(**values) if kind == TOPIC else QueueSettings(**values)


def entity_path(address: Any) -> str:
    """``amqps://host:port/a/b`` or ``a/b`` -> ``a/b`` (entities match by path, never by host)."""
    text = str(address or "")
    if "://" in text:
        text = urlparse(text).path
    return text.strip("/")


_STOPS = {"Send": ("Disabled", "SendDisabled"), "Listen": ("Disabled", "ReceiveDisabled")}


def disabled(entity: Any, right: str) -> str | None:
    """Why the entity's ``Status`` refuses sends (``right`` Send) or receives (Listen), if
    it does (the SDKs raise ``MessagingEntityDisabledError`` for ``entity-disabled``)."""
    status = getattr(entity.settings, "status", "Active")
    if status not in _STOPS[right]:
        return None
    what = "sending to" if right == "Send" else "receiving from"
    return f"Messaging entity '{entity.name}' is {status}: {what} it is not allowed."


def _queues_of(entity: Entity) -> list[Queue]:
    """The queues that belong to an entity: a queue (or subscription) and its dead-letter
    queue; every subscription of a topic with theirs."""
    queues = [sub.queue for sub in entity.subscriptions.values()] if isinstance(
        entity, Topic) else [entity]  # fmt: skip
    return queues + [queue.dead_letter for queue in queues if queue.dead_letter is not None]


@dataclass(slots=True, eq=False)
class Consumer:
    """Our sending link to a peer that receives from a queue."""

    link: Link
    queue: Queue
    peer: Peer
    receive_and_delete: bool
    locks: dict[int, Any] = field(default_factory=dict)  # id(delivery) -> Lock
    in_flight: int = 0
    """Receive-and-delete messages taken and waiting for their delete to commit."""
    session: SessionLock | None = None
    """A session receiver's lock: it gets that session's messages only."""


@dataclass(slots=True, eq=False)
class SessionWaiter:
    """A next-available session receiver whose attach waits for a free session."""

    consumer: Consumer
    deadline: float


@dataclass(slots=True)
class TopicSpec:
    """A topic and its subscriptions as the broker is given them (from Config.json)."""

    settings: TopicSettings = field(default_factory=TopicSettings)
    subscriptions: dict[str, tuple[QueueSettings, list[RuleSpec]]] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class Peer:
    """Per-connection state: its grants, request/reply links and consumers."""

    driver: ConnectionDriver
    opened_at: float
    grants: dict[str, Grant] = field(default_factory=dict)
    plain_grant: Grant | None = None
    reply_links: dict[str, Link] = field(default_factory=dict)
    """Node -> the last link the peer attached to receive that node's replies."""
    reply_targets: dict[str, Link] = field(default_factory=dict)
    """The same links by their target address: the ``reply-to`` a request names."""
    consumers: dict[int, Consumer] = field(default_factory=dict)  # id(link) -> Consumer
    entity_links: dict[int, tuple[Link, str]] = field(default_factory=dict)
    links: set[int] = field(default_factory=set)
    """id() of every link answered (accepted or refused) and not yet detached, in any session:
    what ``MAX_LINKS_PER_CONNECTION`` counts."""


class Broker:
    """A Service Bus-compatible broker over a directory of durable state."""

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
    ) -> None:
        from .admin.api import AdminApi  # it imports this module

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
        self.http_app: HttpApp = AdminApi(self, namespace=namespace).handle
        """Answers HTTP(S) requests on the broker's ports: the management REST API."""
        self.authorizer = authorizer
        self.idle_timeout = idle_timeout
        """None by default: the sync SDK sends heartbeats only while inside a call, so an idle
        (but healthy) client would be dropped; dead peers show up as closed sockets."""
        self.data_dir = Path(data_dir)
        self.store = MessageStore(self.data_dir / "messages.db", synchronous=synchronous)
        self.entities: dict[str, Entity] = {}
        """Every addressable entity by lower-case path: queues, topics, subscriptions, DLQs."""
        self.queues: dict[str, Queue] = {}
        """Every entity that holds messages (queues, subscriptions and their DLQs)."""
        self.topics: dict[str, Topic] = {}
        self.sendable: set[str] = set()
        """Paths a client may send to: queues and topics."""
        self.subscriptions: dict[str, Subscription] = {}
        self._configured_rules: dict[str, str] = {}
        for name, settings in queues.items():
            self._add_queue(name, settings)
            self.sendable.add(name.lower())
        for name, spec in (topics or {}).items():
            topic = Topic(name, self.store, spec.settings, clock=self.clock)
            self.entities[name.lower()] = self.topics[name.lower()] = topic
            self.sendable.add(name.lower())
            for sub_name, (sub_settings, rules) in spec.subscriptions.items():
                queue = self._add_queue(topic.subscription_path(sub_name), sub_settings)
                subscription = Subscription(queue, RuleSet(self._initial_rules(queue, rules)))
                topic.subscriptions[sub_name.lower()] = subscription
                self.subscriptions[queue.name.lower()] = subscription
        self._restore_managed(queues, topics or {})  # API-made changes (runtime management)
        self._resolve_forwarding()
        self._by_entity_id: dict[int, Entity] = {e.entity: e for e in self.entities.values()}
        self.store.commit()
        self.peers: dict[int, Peer] = {}
        self._consumers_by_queue: dict[str, list[Consumer]] = {}
        self._session_waiters: list[SessionWaiter] = []
        self._after_commit: list[Callable[[], None]] = []
        self._commit_handle: asyncio.Handle | None = None
        self._touched: set[ConnectionDriver] = set()
        self._listener: Listener | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._last_ttl_sweep = 0.0
        self._last_dedupe_cleanup = self.clock.monotonic()
        self.transactions = TransactionCoordinator(self, LINK_CREDIT)

    def _add_queue(self, name: str, settings: QueueSettings) -> Queue:
        dlq_settings = QueueSettings(
            lock_duration=settings.lock_duration, max_delivery_count=2**31 - 1,
            max_message_size=settings.max_message_size,
        )  # fmt: skip
        dlq = Queue(name + DEAD_LETTER_SUFFIX, self.store, dlq_settings, clock=self.clock)
        queue = Queue(name, self.store, settings, dead_letter=dlq, clock=self.clock)
        for q in (queue, dlq):
            q.on_ready = self._deliver
            self.queues[q.name.lower()] = q
            self.entities[q.name.lower()] = q
        return queue

    def _initial_rules(self, queue: Queue, configured: list[RuleSpec]) -> list[RuleSpec]:
        """The rules a subscription had when the broker stopped (changed through
        ``$management``), unless Config.json changed them since: then the file wins."""
        configured_json = dump_rules(configured)
        self._configured_rules[queue.name.lower()] = configured_json
        saved = self.store.rule_set(queue.entity)
        if saved is not None and saved[0] == configured_json:
            return load_rules(saved[1])
        self.store.save_rule_set(queue.entity, configured_json, configured_json)
        return configured

    def save_rules(self, subscription: Subscription) -> None:
        name = subscription.queue.name.lower()
        self.store.save_rule_set(
            subscription.queue.entity, self._configured_rules[name],
            dump_rules(subscription.rules.specs),
        )  # fmt: skip

    def _resolve_forwarding(self) -> None:
        for queue in self.queues.values():
            for attribute, target_name in (
                ("forward_to", queue.settings.forward_to),
                ("forward_dead_letters_to", queue.settings.forward_dead_lettered_messages_to),
            ):
                if target_name is None:
                    continue
                target = self.entities.get(target_name.lower())
                if target is None or target.name.lower() not in self.sendable:
                    raise ValueError(f"{queue.name}: no queue or topic {target_name!r}")
                setattr(queue, attribute, target)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        context, self.tls_files = tls.broker_tls(self.data_dir, self.tls_cert, self.tls_key)
        listener = self._listener = Listener(
            lambda: ConnectionDriver(self._new_connection(), self._on_event),
            lambda request: self.http_app(request), context,
        )  # fmt: skip
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
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())
        for queue in self.queues.values():
            queue.publish()
        topics = [
            f"{t.name} ({', '.join(n for n in t.subscriptions) or 'no subscriptions'})"
            for t in self.topics.values()
        ]
        log.info(
            "broker listening on %s:%d, data in %s, queues: %s, topics: %s", self.host,
            self.port, self.data_dir,
            ", ".join(
                e.name for k, e in self.entities.items()
                if k in self.sendable and isinstance(e, Queue)
            ) or "none",
            ", ".join(topics) or "none",
        )  # fmt: skip
        log.info(
            "TLS (AMQPS, HTTPS, WSS) on port %d%s with %s%s%s", self.port,
            f" and {self.tls_port}" if self.tls_port is not None else "", self.tls_files.cert,
            f", issued by the local CA {self.tls_files.ca} (clients trust this file)"
            if self.tls_files.ca is not None else "",
            f"; HTTP on port {self.http_port}" if self.http_port is not None else "",
        )  # fmt: skip

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self._listener is not None:
            self._listener.close()  # HTTP and silent connections go now, AMQP politely
            for peer in list(self.peers.values()):
                await peer.driver.close(error("amqp:connection:forced", "broker stopping"), 2.0)
            await self._listener.wait_closed()
        self._commit()
        self.store.close()

    def _new_connection(self) -> Connection:
        return Connection(
            server=True, container_id="replication-broker", idle_timeout=self.idle_timeout,
            sasl=SaslServer((MSSBCBS, PLAIN, ANONYMOUS), self._authenticate_sasl),
            require_sasl=False, properties={symbol("product"): "replication-broker"},
        )  # fmt: skip

    def _authenticate_sasl(self, credentials: SaslCredentials) -> bool:
        if credentials.mechanism != PLAIN:
            return True  # ANONYMOUS / MSSBCBS authorise later through CBS
        return self.authorizer.authenticate_plain(
            credentials.username or "", credentials.password or ""
        )

    # ------------------------------------------------------------------ commit

    def _commit_soon(self, then: Callable[[], None] | None = None) -> None:
        if then is not None:
            self._after_commit.append(then)
        if self._commit_handle is None:
            self._commit_handle = asyncio.get_running_loop().call_soon(self._commit)

    def _commit(self) -> None:
        self._commit_handle = None
        self.store.commit()
        callbacks, self._after_commit = self._after_commit, []
        for callback in callbacks:
            callback()
        for queue in self.queues.values():
            if queue.pending_ready:
                queue.publish()
        if self._session_waiters:
            self._serve_session_waiters()
        self.transactions.time_out(self.clock.monotonic())
        touched, self._touched = self._touched, set()
        for driver in touched:
            driver.wake()

    # ------------------------------------------------------------------ events

    def _peer(self, driver: ConnectionDriver) -> Peer:
        peer = self.peers.get(id(driver))
        if peer is None:
            peer = Peer(driver, self.clock.monotonic())
            self.peers[id(driver)] = peer
            driver.on_resume = lambda: self._resume(peer)
        return peer

    def _on_event(self, driver: ConnectionDriver, event: ev.Event) -> None:
        peer = self._peer(driver)
        try:
            if isinstance(event, ev.SaslCompleted):
                credentials = event.credentials
                if credentials is not None and credentials.mechanism == PLAIN:
                    peer.plain_grant = self.authorizer.grant_for_rule(credentials.username)
            elif isinstance(event, ev.LinkAttachRequested):
                self._on_attach(peer, event.link)
            elif isinstance(event, ev.DeliveryReceived):
                self._on_transfer(peer, event.link, event.delivery)
            elif isinstance(event, ev.LinkFlow):
                consumer = peer.consumers.get(id(event.link))
                if consumer is not None:
                    self._pump(consumer)
            elif isinstance(event, ev.DeliveryUpdated):
                consumer = peer.consumers.get(id(event.link))
                if consumer is not None:
                    self._on_settle(consumer, event.delivery)
            elif isinstance(event, ev.LinkDetached):
                self._forget_link(peer, event.link)
            elif isinstance(event, ev.ConnectionClosed):
                self._forget_peer(peer)
        finally:
            self._touched.add(driver)

    # ------------------------------------------------------------------ attach

    def _on_attach(self, peer: Peer, link: Link) -> None:
        if link.state is not LinkState.ATTACH_RECEIVED:
            return  # detached (or its session ended) in the same read, before we could answer
        if len(peer.links) >= 2 * MAX_LINKS_PER_CONNECTION:
            # refusals the peer never detaches would pile up without end: stop the connection
            peer.driver.connection.close(error(
                "amqp:resource-limit-exceeded",
                f"too many links: at most {MAX_LINKS_PER_CONNECTION} per connection, and "
                "refused links were not detached",
            ))  # fmt: skip
            return
        if len(peer.links) >= MAX_LINKS_PER_CONNECTION:
            peer.links.add(id(link))  # a refused link holds its handle until the peer detaches
            link.refuse(error(
                "amqp:resource-limit-exceeded",
                f"too many links: at most {MAX_LINKS_PER_CONNECTION} per connection",
            ))  # fmt: skip
            return
        peer.links.add(id(link))
        if link.is_receiver and isinstance(link.remote_target, Coordinator):  # transactions.py
            self.transactions.attach_controller(peer, link)
            return
        if link.is_receiver:  # the peer sends: requests or messages
            path = entity_path(getattr(link.remote_target, "address", None))
        else:
            path = entity_path(getattr(link.remote_source, "address", None))
        if path.lower() == CBS_NODE or path.lower().endswith(MANAGEMENT_SUFFIX):
            link.accept()
            if link.is_receiver:
                link.flow(LINK_CREDIT)
            else:
                peer.reply_links[path.lower()] = link
                target = getattr(link.remote_target, "address", None)
                if target:
                    peer.reply_targets[str(target)] = link
            return
        entity = self.entities.get(path.lower())
        if entity is None:
            link.refuse(
                error("amqp:not-found", f"The messaging entity '{path}' could not be found.")
            )
            return
        if link.is_receiver and entity.name.lower() not in self.sendable:
            link.refuse(error("amqp:not-allowed", (
                f"cannot send to '{path}': send to its queue or topic instead"
            )))  # fmt: skip
            return
        if not link.is_receiver and isinstance(entity, Topic):
            link.refuse(error("amqp:not-allowed", (
                f"cannot receive from topic '{path}': receive from one of its subscriptions "
                f"('{path}/Subscriptions/<name>')"
            )))  # fmt: skip
            return
        right = "Send" if link.is_receiver else "Listen"
        problem = self._authorization_problem(peer, entity.name, right)
        if problem is not None:
            link.refuse(error("amqp:unauthorized-access", problem))
            return
        stopped = disabled(entity, right)
        if stopped is not None:
            link.refuse(error(ENTITY_DISABLED, stopped))
            return
        if link.is_receiver and TRANSFER_DESTINATION in (link.remote_properties or {}):
            self.transactions.attach_send_via(peer, link)  # send-via (transactions.py)
            return
        if link.is_receiver:
            peer.entity_links[id(link)] = (link, entity.name)
            link.accept(max_message_size=entity.settings.max_message_size)
            link.receive_limit = max(RECEIVE_LIMIT, entity.settings.max_message_size)
            link.flow(LINK_CREDIT)
            return
        assert isinstance(entity, Queue)
        self._attach_consumer(peer, link, entity)

    def _attach_consumer(self, peer: Peer, link: Link, queue: Queue) -> None:
        remote = link.remote
        assert remote is not None
        filters = getattr(link.remote_source, "filter", None) or {}
        wants_session = SESSION_FILTER in filters
        if wants_session != queue.sessions_enabled:
            link.refuse(error("amqp:not-allowed", (
                f"'{queue.name}' requires sessions: accept a session to receive from it"
                if queue.sessions_enabled else
                f"'{queue.name}' does not require sessions: use a plain receiver"
            )))  # fmt: skip
            return
        consumer = Consumer(link, queue, peer, remote.snd_settle_mode == SND_SETTLED)
        peer.entity_links[id(link)] = (link, queue.name)
        if not wants_session:
            link.accept(properties={LOCKED_UNTIL_UTC: NET_TICKS_AT_EPOCH})
            self._add_consumer(consumer)
            return
        requested = filters[SESSION_FILTER]
        try:
            session = queue.lock_session(
                None if requested is None else str(requested), consumer, self.now_ms()
            )
        except SessionCannotBeLockedError as exc:
            peer.entity_links.pop(id(link), None)
            link.refuse(error(SESSION_CANNOT_BE_LOCKED, str(exc)))
            return
        if session is not None:
            self._start_session(consumer, session)
            return
        wait_ms = (remote.properties or {}).get(TIMEOUT, DEFAULT_SESSION_WAIT_MS)
        deadline = self.clock.monotonic() + max(0, int(wait_ms)) / 1000
        self._session_waiters.append(SessionWaiter(consumer, deadline))

    def _start_session(self, consumer: Consumer, session: SessionLock) -> None:
        """Answers a session receiver's attach: the session it got, and until when."""
        link = consumer.link
        source = link.remote_source
        filters = dict(getattr(source, "filter", None) or {})
        filters[SESSION_FILTER] = session.session_id
        consumer.session = session
        link.accept(
            source=dataclasses.replace(source, filter=filters),
            properties={LOCKED_UNTIL_UTC: net_ticks(session.until_ms)},
        )
        self._add_consumer(consumer)
        self._pump(consumer)

    def _add_consumer(self, consumer: Consumer) -> None:
        consumer.peer.consumers[id(consumer.link)] = consumer
        self._consumers_by_queue.setdefault(consumer.queue.name.lower(), []).append(consumer)

    def _serve_session_waiters(self) -> None:
        """Next-available session receivers: a session for each that can get one now; a
        ``com.microsoft:timeout`` detach for those that waited long enough."""
        now, clock = self.now_ms(), self.clock.monotonic()
        waiting: list[SessionWaiter] = []
        for waiter in self._session_waiters:
            consumer = waiter.consumer
            link = consumer.link
            if link.state is not LinkState.ATTACH_RECEIVED:
                continue  # the peer gave up (detached or closed) first
            session = consumer.queue.lock_session(None, consumer, now)
            if session is not None:
                self._start_session(consumer, session)
            elif clock >= waiter.deadline:
                consumer.peer.entity_links.pop(id(link), None)
                link.refuse(error(
                    "com.microsoft:timeout",
                    f"no session of '{consumer.queue.name}' became available in time",
                ))  # fmt: skip
            else:
                waiting.append(waiter)
                continue
            self._touched.add(consumer.peer.driver)
            self._commit_soon()  # sends the answer (and wakes the driver)
        self._session_waiters = waiting

    def _authorization_problem(self, peer: Peer, entity: str, right: str) -> str | None:
        grants = list(peer.grants.values())
        if peer.plain_grant is not None:
            grants.append(peer.plain_grant)
        if not grants:
            return (
                f"Unauthorized access. '{right}' claim(s) are required to perform this operation."
            )
        now = self.clock.time()
        last = "no token covers this entity"
        for grant in grants:
            if not grant.covers(entity) or grant.expired(now):
                continue
            try:
                self.authorizer.check(grant, right, entity)
                return None
            except AuthorizationError as exc:
                last = exc.description
        return last

    def _forget_link(self, peer: Peer, link: Link) -> None:
        self.transactions.forget_link(link)  # a controller's transactions roll back
        peer.links.discard(id(link))
        peer.entity_links.pop(id(link), None)
        for links in (peer.reply_links, peer.reply_targets):
            for name, reply in list(links.items()):
                if reply is link:
                    del links[name]
        consumer = peer.consumers.pop(id(link), None)
        if consumer is not None:
            consumers = self._consumers_by_queue.get(consumer.queue.name.lower(), [])
            if consumer in consumers:
                consumers.remove(consumer)
            consumer.queue.release_owner(consumer)
            self._commit_soon()

    def _forget_peer(self, peer: Peer) -> None:
        self.transactions.forget_peer(peer)  # open transactions roll back
        for consumer in list(peer.consumers.values()):
            self._forget_link(peer, consumer.link)
        self._session_waiters = [w for w in self._session_waiters if w.consumer.peer is not peer]
        self.peers.pop(id(peer.driver), None)

    # ------------------------------------------------------------------ transfers in

    def _on_transfer(self, peer: Peer, link: Link, delivery: Delivery) -> None:
        if link.link_credit < LINK_CREDIT // 2:
            link.flow(LINK_CREDIT)
        if self.transactions.is_controller(link):  # declare / discharge (transactions.py)
            self.transactions.on_control(peer, link, delivery)
            return
        path = entity_path(getattr(link.target, "address", None)).lower()
        if path == CBS_NODE:
            self._on_cbs_request(peer, delivery)
            return
        if path.endswith(MANAGEMENT_SUFFIX):
            from .management import handle_request

            handle_request(self, peer, path[: -len(MANAGEMENT_SUFFIX)], delivery)
            return
        entity = self.entities[self.transactions.destination(link, path)]  # send-via: its target
        problem = self._authorization_problem(peer, entity.name, "Send")
        if problem is not None:
            delivery.update(Rejected(error=error("amqp:unauthorized-access", problem)))
            return
        stopped = disabled(entity, "Send")
        if stopped is not None:
            delivery.update(Rejected(error=error(ENTITY_DISABLED, stopped)))
            return
        if len(delivery.payload) > entity.settings.max_message_size:
            delivery.update(Rejected(error=error(
                "amqp:link:message-size-exceeded",
                f"The received message (size {len(delivery.payload)}) exceeds the limit "
                f"({entity.settings.max_message_size}) of entity '{entity.name}'.",
            )))  # fmt: skip
            return
        try:
            messages = wire.parse_transfer(delivery.payload, delivery.message_format)
        except AMQPError as exc:
            delivery.update(Rejected(error=error("amqp:decode-error", exc.description)))
            return
        if isinstance(delivery.state, TransactionalState):  # stored at commit (transactions.py)
            self.transactions.enlist_send(peer, delivery, entity, messages)
            return
        try:
            self.send_messages(entity, messages)
        except SendRefusedError as exc:
            delivery.update(Rejected(error=error(exc.condition, str(exc))))
            return
        if delivery.settled:
            self._commit_soon()
        else:
            self._commit_soon(lambda: delivery.update(Accepted()))

    def send_messages(self, entity: Entity, messages: list[wire.IncomingMessage]) -> list[int]:
        """The one way messages enter the broker (sends, scheduling, transactions): all are
        checked first, so a batch is taken whole or refused whole. Returns the sequence
        numbers assigned at ``entity`` (scheduled messages of a topic, queue messages)."""
        now = self.now_ms()
        for message in messages:
            wire.ensure_message_id(message)  # Service Bus: every message has one
        self.admit(entity, messages, now)
        seqs = []
        for message in messages:
            seq = entity.enqueue(message, now)
            if seq is not None:
                seqs.append(seq)
        return seqs

    def admit(self, entity: Entity, messages: list[wire.IncomingMessage], now: int) -> None:
        """Raises ``SendRefusedError`` when the entity would refuse the messages (it takes
        all of them or none)."""
        self.touch(entity, now)
        self._check_quota(entity)
        for message in messages:
            if isinstance(entity, Topic):
                entity.admit(message, now)
            elif entity.sessions_enabled and message.session_id is None:
                raise SessionRequiredError(
                    "The SessionId was not set on a message, and it cannot be sent to the "
                    f"entity '{entity.name}'. Entities that have session support enabled can "
                    "only receive messages that have the SessionId set to a valid value."
                )

    def _check_quota(self, entity: Entity) -> None:
        limit = entity.settings.max_size_mb * 1024 * 1024
        size = self.entity_size(entity)
        if size >= limit:
            kind = "Topic" if isinstance(entity, Topic) else "Queue"
            raise QuotaExceededError(
                f"The maximum entity size has been reached or exceeded for {kind}: "
                f"'{self.namespace.upper()}:{kind.upper()}:{entity.name.upper()}'. Size of "
                f"entity in bytes:{size}, Max entity size in bytes: {limit}. For more "
                "information please see https://aka.ms/ServiceBusExceptions ."
            )

    def entity_size(self, entity: Entity) -> int:
        """Bytes counted against an entity's quota (``MaxSizeInMegabytes``): a queue's with
        its dead-letter queue's, a topic's with all its subscriptions'. Auto-forwarding
        into an entity is not held back by it."""
        if isinstance(entity, Queue):  # the common case, without building a list
            dead = entity.dead_letter
            return self.store.size(entity.entity) + (
                self.store.size(dead.entity) if dead is not None else 0
            )
        size = self.store.size(entity.entity)
        return size + sum(self.store.size(queue.entity) for queue in _queues_of(entity))

    # ------------------------------------------------------------------ CBS

    def _on_cbs_request(self, peer: Peer, delivery: Delivery) -> None:
        request = decode_message(delivery.payload)
        props = request.application_properties or {}
        audience = str(props.get("name", ""))
        status, description = 202, "Accepted"
        if props.get("operation") != "put-token":
            status, description = 400, f"unsupported CBS operation {props.get('operation')!r}"
        else:
            try:
                grant = self.authorizer.validate(str(request.body), audience, self.clock.time())
                peer.grants[audience.lower()] = grant
            except AuthorizationError as exc:
                status, description = 401, exc.description
        if not delivery.settled:
            delivery.update(Accepted())
        if status >= 300:
            description = tracked(description)
        self._reply(
            peer, CBS_NODE, request, {"status-code": status, "status-description": description}
        )

    def _reply(
        self, peer: Peer, node: str, request: Message, properties: dict[str, Any], body: Any = None
    ) -> None:
        reply_to = request.properties.reply_to if request.properties else None
        link = peer.reply_targets.get(str(reply_to)) if reply_to else None
        if link is None:  # no reply-to, or none of the peer's links: the node's last link
            link = peer.reply_links.get(node.lower())
        if link is None or not link.is_open:
            log.warning("no reply link for %s; response dropped", node)
            return
        correlation = request.properties.message_id if request.properties else None
        response = Message(
            body=body, body_type=BodyType.VALUE, properties=Properties(correlation_id=correlation),
            application_properties=properties,
        )  # fmt: skip
        link.send(encode_message(response), settled=True)

    # ------------------------------------------------------------------ deliveries out

    def _deliver(self, queue: Queue) -> None:
        for consumer in list(self._consumers_by_queue.get(queue.name.lower(), [])):
            self._pump(consumer)
            if not queue.ready:
                break

    def _resume(self, peer: Peer) -> None:
        """The peer's socket drained: deliver what its full buffer held back."""
        for consumer in list(peer.consumers.values()):
            self._pump(consumer)

    def _pump(self, consumer: Consumer) -> None:
        link = consumer.link
        want = link.link_credit - link.queued - consumer.in_flight
        if want <= 0 or not link.is_open or consumer.peer.driver.paused:
            return  # a slow reader holds back only its own deliveries
        queue = consumer.queue
        session = consumer.session
        if session is not None and queue.session_locks.get(session.session_id) is not session:
            return  # the session lock was lost: nothing more for this receiver
        now = self.now_ms()
        rows = queue.take(min(want, PUMP_BATCH), now, session.session_id if session else None)
        if rows:
            self.touch(queue, now)
        size = 0
        for index, row in enumerate(rows):
            if size >= PUMP_BYTES:  # big messages: the rest waits for the next batch
                queue.untake(rows[index:])
                rows = rows[:index]
                break
            size += len(row.bare)
        if consumer.receive_and_delete:
            self._send_deleted(consumer, rows)
        else:
            for row in rows:
                lock = queue.lock(row, now, owner=consumer, session=session)
                delivery = link.send(queue.payload(row, lock), tag=lock.token.bytes_le)
                consumer.locks[id(delivery)] = lock
        if rows:
            self._touched.add(consumer.peer.driver)
            self._commit_soon()
            if want > len(rows) and queue.ready:  # the next batch once this one is written
                consumer.peer.driver.wake()
                asyncio.get_running_loop().call_soon(self._pump_more, consumer)

    def _send_deleted(self, consumer: Consumer, rows: list[StoredMessage]) -> None:
        """Receive-and-delete: the delete commits first, then the settled transfers go out.

        So a broker crash after the commit loses these messages (at-most-once, as Service
        Bus defines the mode) but never delivers one twice; a link that detaches before the
        commit lands gets nothing, and its messages are put back.
        """
        queue = consumer.queue
        for row in rows:
            queue.store.delete(queue.entity, row.seq, row.size)
        consumer.in_flight += len(rows)

        def send() -> None:
            consumer.in_flight -= len(rows)
            if consumer.link.is_open:
                for row in rows:
                    consumer.link.send(queue.payload(row, None), settled=True)
            else:
                queue.restore(rows)
                self._commit_soon()

        self._commit_soon(send)

    def _pump_more(self, consumer: Consumer) -> None:
        if consumer.peer.consumers.get(id(consumer.link)) is consumer:  # still attached
            self._pump(consumer)

    def _on_settle(self, consumer: Consumer, delivery: Delivery) -> None:
        if isinstance(delivery.remote_state, TransactionalState):  # applied at commit
            self.transactions.enlist_settle(consumer, delivery)  # (transactions.py)
            return
        lock = consumer.locks.pop(id(delivery), None)
        state = delivery.remote_state
        if lock is None:
            return
        queue = consumer.queue
        now = self.now_ms()
        try:
            if isinstance(state, Accepted):
                queue.complete(lock.token, now)
                reply: Any = Accepted()
            elif isinstance(state, Rejected):
                info = (state.error.info or {}) if state.error else {}
                queue.dead_letter_locked(
                    lock.token, now, wire.optional_text(info.get("DeadLetterReason")),
                    wire.optional_text(info.get("DeadLetterErrorDescription")),
                )  # fmt: skip
                reply = Rejected()
            elif isinstance(state, Modified) and state.undeliverable_here:
                queue.defer(lock.token, now)
                reply = state
            elif isinstance(state, Modified):
                queue.abandon(lock.token, now)  # an abandon counts, delivery-failed or not
                reply = state
            elif isinstance(state, Released):
                queue.abandon(lock.token, now, count=False)
                reply = state
            else:
                return
        except LockLostError as exc:
            session = isinstance(exc, SessionLockLostError)
            condition = SESSION_LOCK_LOST if session else MESSAGE_LOCK_LOST
            delivery.update(Rejected(error=error(condition, str(exc))))
            self._touched.add(consumer.peer.driver)
            return
        self._commit_soon(lambda: delivery.update(reply))

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
        and transactions timed out; once a second TTL, token grace and idle entities, and
        once a minute the duplicate-detection history (``everything``: all of them now).
        Runs every ``SWEEP_INTERVAL`` on the loop; a test with a ``ManualClock`` calls it
        after ``advance`` to see the effects at once."""
        now = self.now_ms()
        changed = False
        for queue in self.queues.values():
            if queue.locks or queue.session_locks:
                before = len(queue.locks)
                for session in queue.expire_locks(now):
                    self._session_lost(session)
                changed |= len(queue.locks) != before
        for entity_id, seq in self.store.due_scheduled(now):
            entity = self._by_entity_id.get(entity_id)
            if entity is not None:
                entity.activate_scheduled(seq)
                changed = True
        if self._session_waiters:
            self._serve_session_waiters()
        self.transactions.time_out(self.clock.monotonic())
        if everything or self.clock.monotonic() - self._last_ttl_sweep > 1.0:
            self._last_ttl_sweep = self.clock.monotonic()
            for entity_id, seq in self.store.expired(now):
                entity = self._by_entity_id.get(entity_id)
                if isinstance(entity, Topic):
                    entity.cancel_scheduled([seq])  # expired before its scheduled time
                    changed = True
                elif entity is not None and not entity.is_locked(seq):
                    entity.expire(seq)
                    changed = True
            self._check_tokens()
            changed |= bool(self.delete_idle(now))
        monotonic = self.clock.monotonic()
        if everything or monotonic - self._last_dedupe_cleanup > DEDUPE_CLEANUP_SECONDS:
            self._last_dedupe_cleanup = monotonic
            for entity in self.entities.values():
                settings = entity.settings
                if getattr(settings, "requires_duplicate_detection", False):
                    window = settings.duplicate_detection_window.total_seconds() * 1000
                    self.store.forget_message_ids(entity.entity, now - int(window))
                    changed = True
        if changed or self._touched:
            self._commit_soon()  # commits, then delivers and wakes the connections touched

    def _session_lost(self, session: SessionLock) -> None:
        """A session lock expired: its receiver's link ends with session-lock-lost."""
        consumer = session.owner
        if not isinstance(consumer, Consumer) or not consumer.link.is_open:
            return
        consumer.link.detach(error(SESSION_LOCK_LOST, (
            f"the lock on session '{session.session_id}' of '{consumer.queue.name}' expired"
        )))  # fmt: skip
        self._forget_link(consumer.peer, consumer.link)
        self._touched.add(consumer.peer.driver)
        self._commit_soon()

    def _check_tokens(self) -> None:
        for peer in list(self.peers.values()):
            for link, entity in list(peer.entity_links.values()):
                right = "Send" if link.is_receiver else "Listen"
                problem = self._authorization_problem(peer, entity, right)
                if problem is not None and link.is_open:
                    link.detach(error("amqp:unauthorized-access", f"token expired: {problem}"))
                    self._touched.add(peer.driver)
            if (  # seed 000: a valid token within 20 s of connecting, or the connection goes
                not peer.grants and peer.plain_grant is None
                and self.clock.monotonic() - peer.opened_at > TOKEN_GRACE_SECONDS
            ):  # fmt: skip
                peer.driver.connection.close(
                    error("amqp:unauthorized-access", "no token within the grace period")
                )
                self._touched.add(peer.driver)

    # ------------------------------------------------------------------ idle entities

    @staticmethod
    def touch(entity: Entity, now: int) -> None:
        """The entity was used (on every send and delivery: one assignment)."""
        entity.accessed_ms = now

    @staticmethod
    def last_use(entity: Entity) -> int:
        """When an entity was last used: a dead-letter queue's use is its queue's, and a
        topic is used while its subscriptions are (Service Bus: "no operations on the
        topic's subscriptions")."""
        return max([entity.accessed_ms, *(queue.accessed_ms for queue in _queues_of(entity))])

    def delete_idle(self, now: int) -> list[str]:
        """Deletes the entities unused for their ``AutoDeleteOnIdle``; returns their names.
        Linked to (a receiver waiting counts as receiving) or holding scheduled messages,
        an entity is in use, as in Service Bus. Idle time counts from the broker's start at
        the earliest: when an entity was last used before a restart is not kept."""
        for peer in self.peers.values():
            for link, name in peer.entity_links.values():
                entity = self.entities.get(name.lower())
                if entity is not None and link.is_open:
                    self.touch(entity, now)
        deleted = []
        for key, entity in list(self.entities.items()):
            idle = getattr(entity.settings, "auto_delete_on_idle", None)
            if idle is None or key not in self.entities:
                continue
            if now - self.last_use(entity) < idle.total_seconds() * 1000:
                continue
            if self.store.has_scheduled(entity.entity):  # a query: only for the idle ones
                continue
            log.info("%s: deleted after %s idle (AutoDeleteOnIdle)", entity.name, idle)
            self.delete_entity(entity.name)
            deleted.append(entity.name)
        return deleted

    # ------------------------------------------------------------------ runtime entity management
    #
    # The management REST API (admin/) creates, changes and deletes entities while the broker
    # runs. Each change is one ``managed_entity`` row, committed before the API answers.
    # Config.json stays the starting point: at start its entities are built first, then the
    # rows are replayed over them. A row remembers the Config.json definition it started from
    # (``configured``); when the file has changed that entity since, the file wins and the
    # row is dropped (as for subscription rules). API-made entities whose name the file now
    # defines give way to the file's definition too. A Config.json entity deleted through
    # the API stays deleted while the file's definition of it is unchanged.

    def _restore_managed(
        self, queues: dict[str, QueueSettings], topics: dict[str, TopicSpec]
    ) -> None:
        configured: dict[str, tuple[str, str, str]] = {}  # lower path -> (kind, spelling, json)
        for name, settings in queues.items():
            configured[name.lower()] = (QUEUE, name, dump_settings(settings))
        for name, spec in topics.items():
            configured[name.lower()] = (TOPIC, name, dump_settings(spec.settings))
            for sub, (settings, _) in spec.subscriptions.items():
                path = f"{name}{SUBSCRIPTIONS}{sub}"
                configured[path.lower()] = (SUBSCRIPTION, path, dump_settings(settings))
        self.managed: dict[str, ManagedEntity] = {}
        """Every entity's record (created and updated times, management-only properties)."""
        now = self.now_ms()
        order = {TOPIC: 0, QUEUE: 1, SUBSCRIPTION: 2}
        for record in sorted(self.store.managed_entities(), key=lambda r: order[r.kind]):
            file = configured.get(record.name.lower())
            if file is not None and (record.configured != file[2] or record.kind != file[0]):
                record = ManagedEntity(  # the file changed it (or now defines it): file wins
                    file[1], file[0], file[2], None, None, False, record.created_ms, now
                )
                self.store.save_managed_entity(record)
            elif file is None and record.configured is not None:
                self.store.forget_managed_entity(record.name)  # gone from the file
                continue
            if not self._replay(record):
                self.store.forget_managed_entity(record.name)
                continue
            self.managed[record.name.lower()] = record
        for key, (kind, name, text) in configured.items():
            if key not in self.managed:
                record = ManagedEntity(name, kind, text, None, None, False, now, now)
                self.store.save_managed_entity(record)
                self.managed[key] = record
        for queue in self.queues.values():  # targets deleted through the API
            for attribute in ("forward_to", "forward_dead_lettered_messages_to"):
                target = getattr(queue.settings, attribute)
                if target is not None and target.lower() not in self.sendable:
                    log.warning("%s: %s %r no longer exists; not forwarding", queue.name,
                                attribute, target)  # fmt: skip
                    cleared: dict[str, Any] = {attribute: None}
                    queue.settings = dataclasses.replace(queue.settings, **cleared)

    def _replay(self, record: ManagedEntity) -> bool:
        """Applies one stored record at start; False when it no longer applies."""
        key = record.name.lower()
        if record.deleted:
            if key in self.entities:
                self._remove(key)
            return True
        if record.settings is None:
            return key in self.entities
        settings = load_settings(record.kind, record.settings)
        if key in self.entities:
            self._apply_settings(key, settings)
        elif record.kind == SUBSCRIPTION:
            topic_name, _, sub_name = record.name.partition(SUBSCRIPTIONS)
            topic = self.topics.get(topic_name.lower())
            if topic is None:
                return False
            saved = self.store.rule_set(self.store.entity_id(record.name))
            rules = load_rules(saved[1]) if saved else [DEFAULT_RULE]
            assert isinstance(settings, QueueSettings)
            self._new_subscription(topic, sub_name, settings, rules)
        elif isinstance(settings, TopicSettings):
            self._new_topic(record.name, settings)
        else:
            self._new_queue(record.name, settings)
        return True

    def _new_queue(self, name: str, settings: QueueSettings) -> Queue:
        queue = self._add_queue(name, settings)
        self.sendable.add(name.lower())
        return queue

    def _new_topic(self, name: str, settings: TopicSettings) -> Topic:
        topic = Topic(name, self.store, settings, clock=self.clock)
        self.entities[name.lower()] = self.topics[name.lower()] = topic
        self.sendable.add(name.lower())
        return topic

    def _new_subscription(
        self, topic: Topic, name: str, settings: QueueSettings, rules: list[RuleSpec]
    ) -> Subscription:
        queue = self._add_queue(topic.subscription_path(name), settings)
        subscription = Subscription(queue, RuleSet(rules))
        topic.subscriptions[name.lower()] = subscription
        self.subscriptions[queue.name.lower()] = subscription
        self._configured_rules.setdefault(queue.name.lower(), "[]")
        return subscription

    def _apply_settings(self, key: str, settings: QueueSettings | TopicSettings) -> None:
        entity = self.entities[key]
        if isinstance(entity, Topic):
            assert isinstance(settings, TopicSettings)
            entity.settings = settings
            return
        assert isinstance(settings, QueueSettings)
        entity.settings = settings
        if entity.dead_letter is not None:
            entity.dead_letter.settings = dataclasses.replace(
                entity.dead_letter.settings, lock_duration=settings.lock_duration,
                max_message_size=settings.max_message_size,
            )  # fmt: skip

    def _resolve_forwarding_of(self, queue: Queue) -> None:
        for attribute, target_name in (
            ("forward_to", queue.settings.forward_to),
            ("forward_dead_letters_to", queue.settings.forward_dead_lettered_messages_to),
        ):
            target = self.entities.get(target_name.lower()) if target_name else None
            setattr(queue, attribute, target)

    def _remove(self, key: str) -> list[Entity]:
        """Takes an entity (a topic with its subscriptions, a queue with its dead-letter
        queue) out of every index; returns what was removed."""
        entity = self.entities[key]
        removed: list[Entity] = [entity]
        if isinstance(entity, Topic):
            for sub in list(entity.subscriptions.values()):
                removed += self._remove(sub.queue.name.lower())
            self.topics.pop(key, None)
        else:
            if entity.dead_letter is not None:
                removed.append(entity.dead_letter)
            subscription = self.subscriptions.pop(key, None)
            if subscription is not None:
                topic_name, _, sub_name = entity.name.partition(SUBSCRIPTIONS)
                self.topics[topic_name.lower()].subscriptions.pop(sub_name.lower(), None)
                self._configured_rules.pop(key, None)
        for item in removed:
            self.entities.pop(item.name.lower(), None)
            self.queues.pop(item.name.lower(), None)
            self.sendable.discard(item.name.lower())
            if hasattr(self, "_by_entity_id"):
                self._by_entity_id.pop(item.entity, None)
        return removed

    def entity_record(self, path: str) -> ManagedEntity | None:
        """The record of a live entity: when it was made and changed, and how."""
        record = self.managed.get(path.lower())
        return None if record is None or record.deleted else record

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
        now = self.now_ms()
        if kind == TOPIC:
            assert isinstance(settings, TopicSettings)
            entity: Entity = self._new_topic(path, settings)
        elif kind == QUEUE:
            assert isinstance(settings, QueueSettings)
            entity = self._new_queue(path, settings)
        else:
            assert isinstance(settings, QueueSettings)
            topic_name, _, sub_name = path.partition(SUBSCRIPTIONS)
            subscription = self._new_subscription(
                self.topics[topic_name.lower()], sub_name, settings, rules or [DEFAULT_RULE]
            )
            entity = subscription.queue
            self._configured_rules[path.lower()] = "[]"
            self.save_rules(subscription)
        if isinstance(entity, Queue):
            self._resolve_forwarding_of(entity)
            if entity.dead_letter is not None:
                self._by_entity_id[entity.dead_letter.entity] = entity.dead_letter
        self._by_entity_id[entity.entity] = entity
        previous = self.managed.get(path.lower())
        record = ManagedEntity(
            entity.name, kind, previous.configured if previous else None, dump_settings(settings),
            description, False, now, now,
        )  # fmt: skip
        self.store.save_managed_entity(record)
        self.managed[path.lower()] = record
        self._commit()
        return entity

    def update_entity(
        self, path: str, settings: QueueSettings | TopicSettings, description: str
    ) -> None:
        """New settings for a live entity; they apply to the next message, lock or delivery."""
        key = path.lower()
        self._apply_settings(key, settings)
        entity = self.entities[key]
        if isinstance(entity, Queue):
            self._resolve_forwarding_of(entity)
        record = dataclasses.replace(
            self.managed[key], settings=dump_settings(settings), description=description,
            updated_ms=self.now_ms(),
        )  # fmt: skip
        self.store.save_managed_entity(record)
        self.managed[key] = record
        self.touch(entity, self.now_ms())
        self._commit()
        self._detach_disabled(entity)

    def _detach_disabled(self, entity: Entity) -> None:
        """Links the entity's new ``Status`` refuses are detached, as Service Bus does."""
        for peer in list(self.peers.values()):
            for link, name in list(peer.entity_links.values()):
                stopped = disabled(entity, "Send" if link.is_receiver else "Listen")
                if name.lower() == entity.name.lower() and stopped and link.is_open:
                    link.detach(error(ENTITY_DISABLED, stopped))
                    self._forget_link(peer, link)
                    self._touched.add(peer.driver)

    def delete_entity(self, path: str) -> None:
        """Deletes an entity with its messages (a topic with its subscriptions); links to it
        are detached with ``amqp:not-found``, forwarding into it stops."""
        key = path.lower()
        removed = self._remove(key)
        doomed = {item.name.lower() for item in removed}
        for peer in list(self.peers.values()):
            for link, name in list(peer.entity_links.values()):
                if name.lower() in doomed:
                    if link.is_open:
                        link.detach(error(
                            "amqp:not-found", f"The messaging entity '{name}' has been deleted."
                        ))  # fmt: skip
                    elif link.state is LinkState.ATTACH_RECEIVED:
                        link.refuse(error(
                            "amqp:not-found", f"The messaging entity '{name}' has been deleted."
                        ))  # fmt: skip
                    self._forget_link(peer, link)
                    self._touched.add(peer.driver)
        self._session_waiters = [
            w for w in self._session_waiters if w.consumer.queue.name.lower() not in doomed
        ]
        for item in removed:
            self._consumers_by_queue.pop(item.name.lower(), None)
            self.store.purge(item.entity)
        for queue in self.queues.values():
            for attribute, setting in (
                ("forward_to", "forward_to"),
                ("forward_dead_letters_to", "forward_dead_lettered_messages_to"),
            ):
                if getattr(queue, attribute) in removed:
                    setattr(queue, attribute, None)
                    cleared: dict[str, Any] = {setting: None}
                    queue.settings = dataclasses.replace(queue.settings, **cleared)
        for name in doomed:
            record = self.managed.pop(name, None)
            if record is None:
                continue
            if record.configured is not None:  # stays deleted while Config.json is unchanged
                record = dataclasses.replace(record, deleted=True, updated_ms=self.now_ms())
                self.store.save_managed_entity(record)
                self.managed[name] = record
            else:
                self.store.forget_managed_entity(record.name)
        self._commit()
