"""Runs one Service Bus trigger with the Functions host's semantics.

What the host does for a Python function with a Service Bus trigger, and so what we do:
receive with peek-lock (prefetch), hand the function a batch (``cardinality=many``, at most
``maxMessageBatchSize``) or one message, renew the locks of what it holds (and of what
waits in the prefetch buffer) for up to ``maxAutoLockRenewalDuration``, and settle:

- a function with the SDK-type bindings settles each message itself through
  ``ServiceBusMessageActions`` (the ``Settlement`` service of ``settlement.py``); messages it
  left unsettled are completed after it returned when ``autoCompleteMessages`` is on, and
  abandoned when it raised;
- a function with ``azure.functions.ServiceBusMessage`` gets the same messages, and
  ``autoCompleteMessages`` settles the batch: complete when it returned, abandon when it
  raised.

Session triggers take the next available session per worker, at most
``maxConcurrentSessions`` sessions at a time, and keep a session until it has been idle
(``sessionIdleTimeout``), the function released it, or one of its messages was abandoned
(its successors must not overtake it: the session is given back and whoever takes it next
starts at that message). The batch goes to the worker as one invocation (``invocation.py``:
binding data the worker decodes), in a worker process (``process.py``) or on a worker
thread (``worker.py``). Stopping lets every batch in flight finish and settle; one that is
cancelled instead (the host gave up waiting) has its unsettled messages released, which
costs them no delivery; so does one whose worker process died under it, unless its
messages were in such a batch before (``CrashedBefore``: then they are abandoned).

Receiving is the receive loop the task pump runs too (``tasks.receiving.ReceiveLoop``:
workers, sessions, lock renewal, retries, stop); what is the trigger's own is its hooks
(``_TriggerHooks``): the function called with the batch, settlement as the Functions host
settles, a session held for the settlement service. Retry pauses and lock renewals wait on
the runner's ``clock``.

Two receive backends, one loop: a pipeline's ``backend`` (``HostOptions.backend``) picks
``servicebus.client.AmqpSource`` (``amqp``, the default) or ``servicebus.sdk_source.SdkSource``
(``sdk``: azure-servicebus), which has the same interface. Both settle the same way and keep
locks with the same ``LockKeeper``; where the SDK cannot do what ours does (release, ranged
settlement, properties changed on abandon) ``sdk_source`` says what it does instead: a
session's messages still go back with the session without a delivery counted, but a
plain receiver's released messages are abandoned, which counts one. With
``sdk`` the function gets a copy of the SDK's own ``ServiceBusReceivedMessage``, detached
from its receiver as the SDK pickles it (settling goes through the actions, and the SDK's
settled state does not reach the function's object), not one decoded from binding data:
the SDK keeps no transfer bytes to build that from, and re-encoding its decoded message
would lose types (strings and binaries both come back as bytes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from ..clock import SYSTEM, Clock, wait_event
from ..generated import pipeline_of
from ..messages import Message
from ..servicebus import sdk_source
from ..servicebus.client import AmqpSource, SourceError
from ..servicebus.endpoint import Endpoint
from ..servicebus.management import lock_token
from ..servicebus.sdk_source import SdkReceiver, SdkSource, SourceReceiver
from ..tasks.receiving import ReceiveLoop
from ..tasks.targets import BACKENDS, FAILOVER_CLIENT_OPTIONS
from . import bindings
from .discovery import ServiceBusTrigger
from .invocation import Invocation, Invoker
from .process import WorkerCrashed, WorkerUnavailable
from .settlement import Held, HeldSession, SettlementService
from .worker import Worker

if TYPE_CHECKING:
    from ..failover import Failover

log = logging.getLogger("replication.host")

Backend = Literal["amqp", "sdk"]
Outcome = Literal["ok", "failed", "crashed", "not-run"]
RETRY_PAUSE = 1.0
BROKEN_PAUSE = 10.0
"""Seconds before a trigger whose source cannot work (wrong key, no entity) tries again."""


@dataclass(slots=True, frozen=True)
class HostOptions:
    """host.json ``extensions.serviceBus`` (the ones that matter for a local run)."""

    prefetch_count: int = 100
    max_message_batch_size: int = 100
    max_concurrent_calls: int = 1
    """Concurrent batches for a non-session trigger (one receiver each)."""
    max_concurrent_sessions: int = 8
    session_idle_timeout: float = 1.0
    auto_complete_messages: bool = True
    max_auto_lock_renewal_duration: float = 300.0
    """Seconds a message handed to a function has its lock renewed (0: never)."""
    backend: Backend = "amqp"
    """How the trigger receives: ``amqp`` (our AMQP client) or ``sdk`` (azure-servicebus)."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown receive backend {self.backend!r}: 'amqp' or 'sdk'")

    def for_function(self, function: object) -> HostOptions:
        """These options with a pipeline's own batch size, concurrency and backend: the
        pipeline of a function ``replication.functions`` generated, or a ``Pipeline`` the
        host pumps (other functions keep host.json's)."""
        pipeline = pipeline_of(function)
        if pipeline is None:
            return self
        changes: dict[str, Any] = {}
        if pipeline.batch_size:
            changes["max_message_batch_size"] = pipeline.batch_size
            changes["prefetch_count"] = max(self.prefetch_count, pipeline.batch_size)
        if pipeline.concurrency:
            changes["max_concurrent_sessions"] = pipeline.concurrency
            changes["max_concurrent_calls"] = min(pipeline.concurrency, 4)
        if pipeline.backend:
            changes["backend"] = pipeline.backend
        return replace(self, **changes)

    def for_trigger(self, trigger: ServiceBusTrigger) -> HostOptions:
        """``for_function``, and the binding's own ``autoCompleteMessages``."""
        options = self.for_function(trigger.function)
        if trigger.auto_complete is not None:
            options = replace(options, auto_complete_messages=trigger.auto_complete)
        return options

    @classmethod
    def from_host_json(cls, data: dict[str, Any]) -> HostOptions:
        sb = (data.get("extensions") or {}).get("serviceBus") or {}
        return cls(
            prefetch_count=int(sb.get("prefetchCount", 100)),
            max_message_batch_size=int(sb.get("maxMessageBatchSize", 100)),
            max_concurrent_calls=max(1, min(int(sb.get("maxConcurrentCalls", 1)), 4)),
            max_concurrent_sessions=int(sb.get("maxConcurrentSessions", 8)),
            session_idle_timeout=_timespan(sb.get("sessionIdleTimeout", "00:00:01")),
            auto_complete_messages=bool(sb.get("autoCompleteMessages", True)),
            max_auto_lock_renewal_duration=_timespan(
                sb.get("maxAutoLockRenewalDuration", "00:05:00")
            ),
        )


def _timespan(value: Any) -> float:
    """A .NET TimeSpan as host.json writes it (``hh:mm:ss``), in seconds."""
    hours, minutes, seconds = (float(part) for part in str(value).split(":"))
    return hours * 3600 + minutes * 60 + seconds


@dataclass(slots=True)
class TriggerStats:
    received: int = 0
    completed: int = 0
    abandoned: int = 0
    dead_lettered: int = 0
    deferred: int = 0
    released: int = 0
    """Given back without a delivery counted: their worker process died under them."""
    failed_calls: int = 0


@dataclass(slots=True)
class CrashedBefore:
    """The messages (by sequence number) that were in a batch whose worker died: released
    the first time, abandoned if they are again, so one that kills every worker it reaches
    still runs out of deliveries (``MaxDeliveryCount``) instead of coming back for ever."""

    limit: int = 10_000
    seen: dict[Any, None] = field(default_factory=dict)

    def again(self, messages: list[Message]) -> list[Message]:
        """Those of ``messages`` seen in a crash before; remembers them all."""
        keys = [
            m.sequence_number if m.sequence_number is not None else m.message_id for m in messages
        ]
        before = [m for m, key in zip(messages, keys, strict=True) if key in self.seen]
        for key in keys:
            self.seen[key] = None
        while len(self.seen) > self.limit:
            del self.seen[next(iter(self.seen))]
        return before


class TriggerRunner:
    """Receives for one trigger and calls its function until ``stop`` is set."""

    def __init__(
        self,
        trigger: ServiceBusTrigger,
        connection_string: str,
        options: HostOptions,
        on_batch: Callable[[ServiceBusTrigger, int, bool], None] | None = None,
        failover: Failover | None = None,
        worker: Invoker | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        self.trigger = trigger
        self.connection_string = connection_string
        """The namespace read now (with ``failover``: the one it resolved to last)."""
        self.options = options
        self.on_batch = on_batch
        self.failover = failover
        self.worker: Invoker = worker or Worker()
        self.settlement = SettlementService.shared()
        self.stats = TriggerStats()
        self._crashed = CrashedBefore()
        self.clock = clock
        """What retry pauses and lock renewals wait on (tests pass a ``ManualClock``)."""

    async def run(self, stop: asyncio.Event) -> None:
        """Receives until ``stop``; with ``failover``, wherever it resolves (on a switch the
        batches in flight finish and settle, then receiving goes on at the new namespace)."""
        if self.failover is None:
            await self._run_on(self.connection_string, stop)
            return
        from ..failover import run_switching

        await run_switching(self.failover, stop, self._run_on)

    async def _run_on(self, connection_string: str, stop: asyncio.Event) -> None:
        self.connection_string = connection_string
        options, sessions = self.options, self.trigger.sessions
        workers = options.max_concurrent_sessions if sessions else options.max_concurrent_calls
        async with self._source(connection_string) as namespace:
            await ReceiveLoop(
                namespace,
                self.trigger.entity,
                _TriggerHooks(self, stop),
                stop,
                sessions=sessions,
                workers=workers,
                prefetch=options.prefetch_count,
                max_batch=options.max_message_batch_size if self.trigger.many else 1,
                max_wait=options.session_idle_timeout,
                max_lock_renewal=options.max_auto_lock_renewal_duration,
                clock=self.clock,
            ).run()

    def _source(self, connection_string: str) -> AmqpSource | SdkSource:
        """The namespace through the pipeline's backend. The SDK's own retries (3, with
        backoff) would hide a dead namespace from a failover: one retry, as for targets."""
        if self.options.backend == "sdk":
            options = FAILOVER_CLIENT_OPTIONS if self.failover is not None else {}
            return SdkSource.from_connection_string(connection_string, **options)
        return AmqpSource(Endpoint.from_connection_string(connection_string))

    async def _failed(self, error: SourceError, stop: asyncio.Event) -> bool:
        """Reports a receive failure; True when failover moved the trigger elsewhere."""
        if self.failover is not None and await self.failover.report_failure(error):
            return True
        pause = RETRY_PAUSE if error.retryable else BROKEN_PAUSE
        log.warning("%s: receiver failed: %s; retrying in %g s", self.trigger.name, error, pause)
        await wait_event(stop, pause, self.clock)
        return False

    async def _invoke(
        self, receiver: SourceReceiver, batch: list[Message], session: HeldSession | None
    ) -> bool:
        """Calls the function with the batch, then settles what it left (see the module)."""
        loop = asyncio.get_running_loop()
        held: list[tuple[Any, Held]] = []
        for message in batch:
            token = lock_token(message) or sdk_source.lock_token(message)
            item = Held(message, receiver, loop)
            held.append((token, item))
            self.settlement.hold(token, item)  # type: ignore[arg-type]  # peek-locked: it has one
        try:
            outcome = await self._call(receiver, batch, [t for t, _ in held])
        except asyncio.CancelledError:  # the host stopped waiting: no delivery spent
            receiver.release([h.message for _, h in held if h.outcome is None])
            raise
        finally:
            for token, _ in held:
                self.settlement.let_go(token)
        self._settle_rest(receiver, [h for _, h in held], outcome, session)
        return outcome == "ok"

    async def _call(
        self, receiver: SourceReceiver, batch: list[Message], tokens: list[Any]
    ) -> Outcome:
        """The invocation in the worker: ``ok``, ``failed`` (the function raised) or
        ``crashed`` (its worker process died under it) or ``not-run`` (no worker could be
        started for it)."""
        if isinstance(receiver, SdkReceiver):  # the SDK's messages, detached (the module)
            invocation = Invocation(
                self.trigger.name, received=[bindings.functions_received(m.source) for m in batch]
            )
        else:
            contents = [
                bindings.binding_content(m.source.delivery.payload, t)
                for m, t in zip(batch, tokens, strict=True)
            ]
            invocation = Invocation(self.trigger.name, contents=contents)
        try:
            await self.worker.invoke(self.trigger, invocation)
            return "ok"
        except WorkerUnavailable as exc:
            log.error(
                "%s: %s; %d message(s) go back, no delivery counted; the next try to start "
                "a worker in %.0f s",
                self.trigger.name,
                exc,
                len(batch),
                exc.retry_in,
            )
            return "not-run"
        except WorkerCrashed as exc:
            self.stats.failed_calls += 1
            log.error("%s: %s on %d message(s)", self.trigger.name, exc, len(batch))
            return "crashed"
        except Exception as exc:
            self.stats.failed_calls += 1
            log.warning(
                "%s: function failed on %d message(s): %s", self.trigger.name, len(batch), exc
            )
            if invocation.contents is not None and bindings.DECODE_FAILED in str(exc):
                self._say_what_cannot_be_decoded(batch)
            return "failed"

    def _say_what_cannot_be_decoded(self, batch: list[Message]) -> None:
        """The extension's error names no message: name each one it cannot decode, and
        why. The batch fails on them every time, here as in Azure, until they and the
        messages they keep coming with are dead-lettered (docs/local-host.md)."""
        for message in batch:
            why = bindings.undecodable(message.source.delivery.payload)
            if why is not None:
                log.error(
                    "%s: the Functions Python worker cannot decode message %r (sequence "
                    "number %s): %s; its batch fails until MaxDeliveryCount dead-letters it",
                    self.trigger.name,
                    message.message_id,
                    message.sequence_number,
                    why,
                )

    def _settle_rest(
        self,
        receiver: SourceReceiver,
        held: list[Held],
        outcome: Outcome,
        session: HeldSession | None,
    ) -> None:
        stats = self.stats
        for item in held:
            if item.outcome == "complete":
                stats.completed += 1
            elif item.outcome == "abandon":
                stats.abandoned += 1
            elif item.outcome == "deadletter":
                stats.dead_lettered += 1
            elif item.outcome == "defer":
                stats.deferred += 1
        rest = [item.message for item in held if item.outcome is None]
        if not rest:
            return
        if outcome == "not-run":  # the function never saw them
            stats.released += len(rest)
            receiver.release(rest)
        elif outcome == "crashed":
            again = self._crashed.again(rest)
            if again:  # it crashed a worker before: this time it costs a delivery
                stats.abandoned += receiver.abandon(again)
            rest = [m for m in rest if all(m is not a for a in again)]
            stats.released += len(rest)
            receiver.release(rest)  # the worker died under them: no delivery counted
        elif outcome == "failed":
            stats.abandoned += receiver.abandon(rest)
        elif self.options.auto_complete_messages:
            stats.completed += receiver.complete(rest)
        elif session is not None and (session.released or session.abandoned):
            receiver.release(rest)  # they go back with the session, no delivery counted
        else:
            log.warning(
                "%s: the function returned without settling %d message(s) and "
                "autoCompleteMessages is off: they come again when their locks expire",
                self.trigger.name,
                len(rest),
            )


@dataclass(slots=True)
class _TriggerHooks:
    """What a trigger does with what the receive loop hands it (``receiving.Hooks``): the
    function called with the batch (the Functions host's semantics: ``_invoke``), a session
    held for the settlement service while its receiver is open."""

    runner: TriggerRunner
    stop: asyncio.Event
    sessions: dict[SourceReceiver, HeldSession] = field(default_factory=dict)

    @contextlib.asynccontextmanager
    async def opened(self, receiver: SourceReceiver) -> AsyncIterator[None]:
        runner = self.runner
        if runner.failover is not None:
            runner.failover.report_success()
        session_id = receiver.session_id
        if session_id is None:
            yield
            return
        session = self.sessions[receiver] = HeldSession(receiver, asyncio.get_running_loop())
        runner.settlement.hold_session(session_id, session)
        try:
            yield
        finally:
            runner.settlement.let_go_session(session_id, session)
            del self.sessions[receiver]

    async def handle(self, receiver: SourceReceiver, batch: list[Message]) -> bool:
        runner = self.runner
        runner.stats.received += len(batch)
        session = self.sessions.get(receiver)
        ok = await runner._invoke(receiver, batch, session)
        if runner.on_batch is not None:
            runner.on_batch(runner.trigger, len(batch), ok)
        # give the session back; an abandoned message comes first again
        return session is not None and (not ok or session.released or bool(session.abandoned))

    async def failed(self, error: SourceError, draining: bool) -> bool:
        return await self.runner._failed(error, self.stop)
