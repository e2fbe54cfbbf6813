"""Runs a task against a live source: receive, process, settle, repeat.

This is the loop of the local host's transactional pipelines (``host/pumped.py``), and of
tests and benchmarks: what the Functions Service Bus trigger does for a function, minus the
function. Both backends run the receive loop the host's triggers run too
(``receiving.ReceiveLoop``), with the pump's hooks (``_PumpHooks``). Plain sources are read by one
peek-lock receiver with prefetch; session sources by ``session_workers`` receivers that each
take the next available session and keep it until it runs dry, so a session's messages are
processed by one worker, in order. Settlement follows ``process_batch``'s decisions: complete
only after the target accepted, abandon on failure, dead-letter when a step says so.

Two receive backends, the same semantics: ``"amqp"`` reads over our own AMQP stack
(``servicebus.client``: a message decoded once, a batch's completes in one ranged disposition),
``"sdk"`` with the asyncio azure-servicebus receiver behind the same interface
(``servicebus.sdk_source.SdkSource``, as the host's ``backend: sdk``). ``"auto"`` (the
default) takes ``"amqp"`` whenever the client's endpoint and credential allow it (plain AMQP
or TLS, a SAS key or token, or an Entra ID credential), else the SDK. Sending is the
``sender_for``'s (``SenderPool``: our AMQP sender by default, or the SDK's).

Locks: a batch in flight keeps its peek-locks however long it takes (a slow step, a target
that is down), so it is not delivered again and costs no delivery attempt. The loop runs a
``LockKeeper`` per receiver: it renews the batch being processed and what waits in the
prefetch buffer (a session receiver renews its session lock). The SDK does not show what
waits in its prefetch buffer, so with ``"sdk"`` a plain receiver's prefetched messages are
not renewed: a batch that outlives the lock duration costs the prefetched messages behind
it one delivery (they come again, nothing is lost).
``max_lock_renewal`` bounds how long a batch's locks are renewed (host.json
``maxAutoLockRenewalDuration``); None renews as long as the pump holds the batch.

Outages: sends go through a per-target breaker (``breaker.Breakers``). A target that stays
unreachable holds the batches in flight (locks kept) until it answers again, and the
receive loop takes nothing new meanwhile. A plain source read with our stack has up to
``batches_in_flight`` (2) batches in flight: the next is received and planned while the
one before waits for its target; a batch with messages of a session or partition key
sends only after the batches before it were sent (``turns.SendTurns``), so a slow step or
send never lets a later batch overtake it. Session sources: one batch at a time per
session. When ``stop`` is set the
breakers let their waiting sends go and their source messages are given back without a
delivery counted (it is a shutdown): released by the AMQP backend, left to go back with
the session by an SDK session receiver; an SDK plain receiver cannot release, it abandons.
Messages of a session held back behind a failed one (``Decision.RELEASE``) go back the
same way, and the worker gives the session back so the failed one comes first again.

Transactional (``transaction_targets``, a pipeline's ``transactional: true``; AMQP backend,
a queue source, every target in the source's namespace): each batch runs in one Service
Bus transaction on the source's connection (``servicebus.transactions``). The copies are
sent via the source queue (``targets.ViaSenders``), the completes and dead-letters are
settled in the transaction, and the commit makes them visible together: a crash (or a lost
connection) before the commit leaves neither, so a target never gets a copy of a message
that comes again. A batch in which a target refused a copy is rolled back whole: the
failed message is abandoned (a delivery counted), the others released. A commit the
service refuses (e.g. a lock ran out) rolls everything back; the batch comes again once
its locks expire. No breakers: the targets live in the source's namespace, so an outage
there is the source's too. With an ``error_target`` among the targets, the batch's
dead-letter decisions go there instead (``error_target.divert_to_error_target``, in the same
transaction), as a generated function sends them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from azure.servicebus.aio import ServiceBusClient

from ..clock import SYSTEM, Clock, wait_event
from ..messages import Message
from ..servicebus.client import AmqpReceiver, AmqpSource, SourceError
from ..servicebus.endpoint import Endpoint
from ..servicebus.sdk_source import SdkSource, SourceReceiver
from ..servicebus.transactions import Transaction, TransactionError, declare
from .breaker import Breakers, TargetUnavailable
from .error_target import ERROR_TARGET, divert_to_error_target
from .receiving import ReceiveLoop
from .recovery_point import DEFAULT_PEEK_LIMIT, RecoveryPointProbe
from .sender import SenderFor
from .targets import ViaSenders
from .task import Decision, ReplicationTask, Settlement, process_batch
from .turns import SendTurns, Turn

if TYPE_CHECKING:
    from ..failover import Failover
    from ..ncrontab import Schedule

log = logging.getLogger("replication.tasks.pump")

Backend = Literal["auto", "amqp", "sdk"]
RETRY_PAUSE = 1.0
"""Seconds before a source that failed (connection lost, no session) is tried again."""


@dataclass(slots=True, frozen=True)
class Source:
    """A queue (``subscription`` None) or a topic subscription to read from."""

    entity: str
    subscription: str | None = None
    sessions: bool = False

    def __str__(self) -> str:
        if self.subscription is None:
            return self.entity
        return f"{self.entity}/Subscriptions/{self.subscription}"


@dataclass(slots=True)
class PumpStats:
    received: int = 0
    completed: int = 0
    filtered: int = 0
    """Of ``completed``: those the steps left nothing to send for."""
    to_error_target: int = 0
    """Of ``completed``: dead-letter decisions the error target took instead."""
    abandoned: int = 0
    dead_lettered: int = 0
    released: int = 0
    """Given back without counting a delivery: held back behind a failed message of their
    session, or still waiting for an unreachable target when the pump stopped."""


def _let_go(item: Settlement) -> bool:
    """Given back without counting a delivery: held back behind a failed message of its
    session, or still waiting for an unreachable target when the pump stopped."""
    return item.decision is Decision.RELEASE or (
        item.decision is Decision.ABANDON and isinstance(item.error, TargetUnavailable)
    )


async def pump(
    task: ReplicationTask,
    client: ServiceBusClient | str | Failover,
    source: Source,
    sender_for: SenderFor,
    stop: asyncio.Event,
    *,
    max_batch: int = 100,
    max_wait: float = 1.0,
    session_workers: int = 4,
    stats: PumpStats | None = None,
    on_batch: Callable[[PumpStats], None] | None = None,
    backend: Backend = "auto",
    prefetch: int | None = None,
    max_lock_renewal: float | None = None,
    breakers: Breakers | None = None,
    transaction_targets: Mapping[str | None, str] | None = None,
    clock: Clock = SYSTEM,
    batches_in_flight: int = 2,
    rpo_schedule: Schedule | None = None,
    rpo_peek_limit: int = DEFAULT_PEEK_LIMIT,
) -> PumpStats:
    """Moves messages until ``stop`` is set; returns the counts.

    ``client`` is the source namespace: an asyncio ``ServiceBusClient``, a connection
    string, or a ``Failover`` (read wherever it resolves now; on a switch the batch in
    flight is finished and settled on its namespace, then reading goes on at the new one).
    ``prefetch`` (default ``2 * max_batch`` for ``"amqp"``, ``max_batch`` for the SDK) is how
    many messages may wait, locked, ahead of the batch being processed.

    ``max_lock_renewal``: seconds a batch's locks are renewed at most (host.json
    ``maxAutoLockRenewalDuration``); None (the default) renews them as long as the pump
    holds the batch. ``breakers``: the targets' breakers (default: the pump's own); they
    are stopped when ``stop`` is set, so sends waiting for an unreachable target end.

    ``transaction_targets`` (target name -> entity of the source's namespace;
    ``BuiltPipeline.transaction_targets()``): each batch is one transaction (see the
    module); ``sender_for`` is then not used. Needs the AMQP backend and a queue source.

    ``clock``: what retry pauses, lock renewals and the default breakers' probes wait on
    (tests pass a ``ManualClock``).

    ``batches_in_flight``: how many batches of a plain source (read with our AMQP stack, not
    transactional) are worked on at once: the next one is received and its steps run while
    the one before waits for its target. Their sends keep the order the batches were
    received in (``turns.SendTurns``). 1: one batch at a time.

    ``rpo_schedule``: also probe the source's recovery point on this schedule, on ``clock``
    (``recovery_point.RecoveryPointProbe``, through the same ``client``, counting by peeking
    up to ``rpo_peek_limit`` without the Manage right), labelled with the task's pipeline.
    """
    if breakers is None:
        breakers = Breakers(clock=clock.monotonic, sleep=clock.sleep)
    if transaction_targets is not None:
        if backend == "sdk":
            raise ValueError("a transactional pump needs the amqp backend, not 'sdk'")
        if source.subscription is not None:
            raise ValueError(
                f"a transactional pump needs a queue source ({source} is a subscription: "
                "the copies are sent via the source, and a subscription cannot be sent through)"
            )
    loop = _Loop(
        task,
        source,
        sender_for,
        stop,
        max_batch,
        max_wait,
        session_workers,
        stats or PumpStats(),
        on_batch,
        prefetch,
        max_lock_renewal=max_lock_renewal,
        breakers=breakers,
        transaction_targets=transaction_targets,
        clock=clock,
        batches_in_flight=batches_in_flight,
    )
    watcher = asyncio.create_task(_stop_breakers(stop, breakers), name="pump breakers")
    prober = None
    if rpo_schedule is not None:
        probe = _probe(task, client, source, clock, rpo_peek_limit)
        if probe is not None:
            prober = asyncio.create_task(probe.run(stop, rpo_schedule), name="pump rpo")
    try:
        if isinstance(client, ServiceBusClient | str):
            await loop.on(client, backend)
            return loop.stats
        from ..failover import run_switching

        loop.failover = client

        async def run(connection_string: str, inner: asyncio.Event) -> None:
            await replace(loop, stop=inner).on(connection_string, backend)

        await run_switching(client, stop, run)
        return loop.stats
    finally:
        watcher.cancel()  # not awaited: that could swallow a cancel of the pump itself
        if prober is not None:  # its connection closes as it ends
            prober.cancel()
            await asyncio.wait({prober}, timeout=5.0)


def _probe(
    task: ReplicationTask,
    client: ServiceBusClient | str | Failover,
    source: Source,
    clock: Clock,
    peek_limit: int,
) -> RecoveryPointProbe | None:
    """The recovery point probe of the pump's source, on the pump's client (an SDK client
    through its endpoint; None when only the SDK can use it: web sockets, a proxy)."""
    target: str | Failover | Endpoint
    if isinstance(client, ServiceBusClient):
        try:
            target = Endpoint.from_client(client)
        except ValueError as exc:
            log.warning("%s: its recovery point is not probed: %s", source, exc)
            return None
    else:
        target = client
    return RecoveryPointProbe(
        task.pipeline or task.name,
        source.entity,
        source.subscription,
        target,
        clock=clock,
        peek_limit=peek_limit,
    )


async def _stop_breakers(stop: asyncio.Event, breakers: Breakers) -> None:
    """Sends held by an unreachable target end when the pump stops (not on a source
    failover switch: the batch in flight is finished on its namespace first)."""
    await stop.wait()
    if breakers.open():
        log.warning(
            "stopping: releasing the messages held for %s",
            ", ".join(b.name for b in breakers.open()),
        )
    breakers.stop()


def _amqp_endpoint(client: ServiceBusClient | str, backend: Backend) -> Endpoint | None:
    """The endpoint to read with our AMQP stack, or None for the SDK."""
    if backend == "sdk":
        return None
    if backend not in ("auto", "amqp"):
        raise ValueError(f"unknown backend {backend!r}: 'auto', 'amqp' or 'sdk'")
    try:
        if isinstance(client, str):
            return Endpoint.from_connection_string(client)
        return Endpoint.from_client(client)
    except ValueError as exc:
        if backend == "amqp":
            raise
        log.info("receiving with the SDK: %s", exc)
        return None


@dataclass(slots=True)
class _Loop:
    """One pump's settings and counters, shared by its receive paths and workers."""

    task: ReplicationTask
    source: Source
    sender_for: SenderFor
    stop: asyncio.Event
    max_batch: int
    max_wait: float
    session_workers: int
    stats: PumpStats
    on_batch: Callable[[PumpStats], None] | None
    prefetch: int | None
    failover: Failover | None = None
    max_lock_renewal: float | None = None
    breakers: Breakers | None = None
    transaction_targets: Mapping[str | None, str] | None = None
    clock: Clock = SYSTEM
    batches_in_flight: int = 2

    async def on(self, client: ServiceBusClient | str, backend: Backend) -> None:
        """Runs on one namespace until ``stop`` (or, with failover, a switch)."""
        endpoint = _amqp_endpoint(client, backend)
        if endpoint is None and self.transaction_targets is not None:
            raise ValueError(
                "a transactional pump needs our AMQP client, and this source's endpoint or "
                "credential is one only the SDK can use"
            )
        if endpoint is not None:
            await self.amqp(endpoint)
        elif isinstance(client, str):
            async with SdkSource.from_connection_string(client) as own:
                await self.receive(own, self.prefetch or self.max_batch)
        else:  # the caller's client: theirs to close
            await self.receive(SdkSource(client), self.prefetch or self.max_batch)

    async def switched(self, error: BaseException) -> bool:
        """Reports a failure to the failover; True when it moved to another namespace."""
        return self.failover is not None and await self.failover.report_failure(error)

    def received_fine(self) -> None:
        if self.failover is not None:
            self.failover.report_success()

    async def processed(self, batch: list[Message], turn: Turn | None = None) -> list[Settlement]:
        self.stats.received += len(batch)
        return await process_batch(
            self.task, batch, self.sender_for, self.breakers, self.clock, turn
        )

    def batch_done(self, settlements: list[Settlement], until_empty: bool) -> bool:
        """After settling: True when a session worker should give its session back (an
        abandoned head comes first again, for whoever takes the session next)."""
        if self.on_batch is not None:
            self.on_batch(self.stats)
        return until_empty and any(
            s.decision in (Decision.ABANDON, Decision.RELEASE) for s in settlements
        )

    # ------------------------------------------------------------------ the AMQP backend

    async def amqp(self, endpoint: Endpoint) -> None:
        """One connection for the pump (session workers share it), read by the receive loop
        (``receiving.ReceiveLoop``); a lost connection or link is reopened after a pause; a
        source that cannot work (wrong key, no such entity) raises. With failover every
        failure is reported, and a switch ends this."""
        prefetch = self.prefetch or 2 * self.max_batch
        async with AmqpSource(endpoint) as namespace:
            via = None
            if self.transaction_targets is not None:
                via = ViaSenders(namespace, str(self.source), self.transaction_targets)
            try:
                await self.receive(namespace, prefetch, via)
            finally:
                if via is not None:
                    await via.close()

    async def receive(
        self, namespace: AmqpSource | SdkSource, prefetch: int, via: ViaSenders | None = None
    ) -> None:
        """The receive loop on ``namespace`` (either backend), with the pump's hooks."""
        sessions = self.source.sessions
        # side by side only where settling and receiving may overlap on one receiver (ours)
        # and each batch is not a transaction of its own
        overlap = isinstance(namespace, AmqpSource) and via is None
        await ReceiveLoop(
            namespace,
            str(self.source),
            _PumpHooks(self, via),
            self.stop,
            sessions=sessions,
            workers=self.session_workers if sessions else 1,
            prefetch=prefetch,
            max_batch=self.max_batch,
            max_wait=self.max_wait,
            max_lock_renewal=self.max_lock_renewal,
            clock=self.clock,
            batches_in_flight=self.batches_in_flight if overlap else 1,
        ).run()

    async def transactional(
        self, receiver: AmqpReceiver, via: ViaSenders, batch: list[Message]
    ) -> list[Settlement]:
        """One batch in one transaction (see the module): sent and settled together, or
        given back whole."""
        self.stats.received += len(batch)
        txn = await declare(via.namespace)
        failure: BaseException | None = None
        try:
            sender = via.within(txn)
            settlements = await process_batch(self.task, batch, sender, clock=self.clock)
            dead = [s for s in settlements if s.decision is Decision.DEAD_LETTER]
            if dead and ERROR_TARGET in via.targets:
                await divert_to_error_target(dead, self.task, sender, clock=self.clock)
            if any(s.decision in (Decision.ABANDON, Decision.RELEASE) for s in settlements):
                await txn.rollback()  # the copies that went out go with it
                give_back_amqp(receiver, settlements, self.stats)
                return settlements
            counts = PumpStats()
            settle_amqp(receiver, settlements, counts, transaction=txn)
            await txn.commit()
        except TransactionError as exc:  # rolled back: the batch comes again
            log.warning(
                "a transaction of %d message(s) of %s was rolled back (they come "
                "again once their locks expire): %s",
                len(batch),
                self.source,
                exc,
            )
            self.stats.abandoned += len(batch)
            return [
                Settlement(m, Decision.ABANDON, "TransactionFailed", str(exc), error=exc)
                for m in batch
            ]
        except BaseException as error:  # rolled back below: no await inside a handler,
            failure = error  # where compiled code loses the exception (a crash, issue 42)
        if failure is not None:
            await _rolled_back(txn)
            raise failure
        self.stats.completed += counts.completed
        self.stats.filtered += counts.filtered
        self.stats.to_error_target += counts.to_error_target
        self.stats.dead_lettered += counts.dead_lettered
        return settlements


@dataclass(slots=True)
class _PumpHooks:
    """What the pump does with what the receive loop hands it (``receiving.Hooks``)."""

    loop: _Loop
    via: ViaSenders | None
    turns: SendTurns = field(default_factory=SendTurns)

    def opened(self, receiver: SourceReceiver) -> contextlib.AbstractAsyncContextManager[None]:
        self.loop.received_fine()
        return contextlib.nullcontext()

    async def handle(self, receiver: SourceReceiver, batch: list[Message]) -> bool:
        loop = self.loop
        if self.via is not None:
            assert isinstance(receiver, AmqpReceiver)  # a transactional pump reads with ours
            settlements = await loop.transactional(receiver, self.via, batch)
        else:  # the turn is taken before any await: batches side by side send in order
            turn = self.turns.take() if receiver.session_id is None else None
            try:
                settlements = await loop.processed(batch, turn)
            finally:
                if turn is not None:
                    turn.end()  # however it went: a turn left open would hold every later one
            settle_amqp(receiver, settlements, loop.stats)
        return loop.batch_done(settlements, until_empty=receiver.session_id is not None)

    async def failed(self, error: SourceError, draining: bool) -> bool:
        """A session that failed in use (e.g. its lock was lost) is left for another worker
        at once; otherwise: a source that cannot work raises, a failover switch ends the
        worker, anything else is retried after ``RETRY_PAUSE``."""
        loop = self.loop
        if draining and loop.source.sessions:
            log.warning("a session of %s failed: %s", loop.source, error)
            return False
        if not error.retryable:
            raise error
        if await loop.switched(error):
            return True
        log.warning("receiver on %s failed (reconnecting): %s", loop.source, error)
        await wait_event(loop.stop, RETRY_PAUSE, loop.clock)
        return False


def settle_amqp(
    receiver: SourceReceiver,
    settlements: list[Settlement],
    stats: PumpStats,
    *,
    transaction: Transaction | None = None,
) -> None:
    """All completes of the batch at once (ranged dispositions), then each other outcome.
    Sent settled, without waiting: a lost complete means a redelivery (at-least-once).
    Released (given back without counting a delivery): messages held back behind a failed
    one of their session, and those whose sends still waited for an unreachable target when
    the pump stopped (a shutdown is not their fault); an SDK plain receiver cannot release,
    it abandons (counted as abandoned). With ``transaction`` (our receiver only) the
    completes and dead-letters are part of it (applied at its commit)."""
    done: list[Message] = []
    others: list[Settlement] = []
    filtered = diverted = 0
    for item in settlements:  # one pass: this runs for every message
        if item.decision is Decision.COMPLETE:
            done.append(item.message)
            if item.outputs == 0:
                filtered += 1
            if item.reason:  # a diverted dead-letter
                diverted += 1
        else:
            others.append(item)
    if transaction is None:
        stats.completed += receiver.complete(done)
    else:
        assert isinstance(receiver, AmqpReceiver)
        stats.completed += receiver.complete(done, transaction=transaction)
    stats.filtered += filtered
    stats.to_error_target += diverted
    releases = isinstance(receiver, AmqpReceiver) or receiver.session_id is not None
    for item in others:
        if item.decision is Decision.DEAD_LETTER:
            if transaction is None:
                stats.dead_lettered += receiver.dead_letter(
                    item.message, item.reason, item.description
                )
            else:
                assert isinstance(receiver, AmqpReceiver)
                stats.dead_lettered += receiver.dead_letter(
                    item.message, item.reason, item.description, transaction=transaction
                )
        elif _let_go(item) and releases:
            stats.released += receiver.release([item.message])
        else:  # abandon, or a plain SDK receiver's let-go
            stats.abandoned += receiver.abandon([item.message])


def give_back_amqp(receiver: AmqpReceiver, settlements: list[Settlement], stats: PumpStats) -> None:
    """A rolled-back batch: what failed is abandoned (a delivery counted, so a message no
    target takes ends in the dead-letter queue), the rest released to be done again."""
    for item in settlements:
        if item.decision is Decision.ABANDON and not _let_go(item):
            stats.abandoned += receiver.abandon([item.message])
        else:
            stats.released += receiver.release([item.message])


async def _rolled_back(txn: Transaction) -> None:
    """Rolls back after an error in the batch (the error goes on; a rollback that fails
    is only logged: the service rolls back what a lost connection left open)."""
    if not txn.active:
        return
    try:
        await txn.rollback()
    except (SourceError, asyncio.CancelledError) as exc:
        log.warning("rolling back transaction %s failed: %s", txn.txn_id.hex(), exc)
