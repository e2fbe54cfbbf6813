"""Pipelines as Azure Functions (Python v2 programming model): one trigger function per source.

``register_pipelines(app, pipelines)`` adds, for every pipeline and each of its sources, a
``service_bus_queue_trigger`` or ``service_bus_topic_trigger`` function with the source's
connection app-setting name, ``cardinality=many`` and sessions as the source needs them.
The functions take the SDK-type bindings of
``azurefunctions-extensions-bindings-servicebus``: a list of
``azure.servicebus.ServiceBusReceivedMessage`` and a ``ServiceBusMessageActions``.

Settlement, one message at a time, after its fate is known:

- complete, once every copy of the message was accepted by its targets (or the steps
  filtered it out);
- dead-letter with the step's reason and description when a step decides so; with an
  ``error_target`` the message goes there instead (reason and description as
  ``DeadLetterReason`` / ``DeadLetterErrorDescription`` properties) and is completed;
- abandon only what failed: a target refused the copy (too big, not found, no rights);
  within a session the messages after it are left unsettled and the session is released,
  so nothing overtakes it and they come again after it without a delivery counted (the
  local host releases them; in Azure they return with the session).

Who sends the completes: for a plain (not session) source the function is registered with
``auto_complete_messages=True`` and settles through the actions only what is not completed;
the host completes the rest once the function returned, skipping what the function settled
(the Service Bus extension's ``SettledMessages``), without a gRPC call per message. If an
explicit settlement fails, the function completes the batch's good messages through the
actions and raises, so the host abandons only the one it could not settle (auto-complete
must not complete a message meant for the dead-letter queue). A session source keeps
``auto_complete_messages=False``: the messages held back behind a failed one must stay
unsettled until the session is released, and auto-complete would complete them.

Nothing else in the batch is touched. A target that is unreachable does not make anything
fail: its breaker opens (``tasks.breaker``), the sends wait for it, and meanwhile the batch's
locks are renewed through the same actions, so the length of an outage costs no delivery.
While the batch waits the function does not return, so the host hands it nothing new
(``maxConcurrentCalls`` batches at most are held). Duplicates can occur where a complete is
lost after the copies were accepted (lock lost, host killed): the message comes again and is
sent again; the target removes it by message-id (RequiresDuplicateDetection or ``dedupe``).

An event hub source (``eventhub:``) registers an ``event_hub_message_trigger`` instead, with
``cardinality=many``, the source's consumer group and connection: the host hands the
function one partition's batch (``azure.functions.EventHubEvent``, metadata per event) and
checkpoints the partition after the function returned. So the function returns only once
every copy was accepted; if one was refused it raises, and (with the retry policy the
function is registered with, as Microsoft's replication sample does: exponential backoff,
unlimited) the host runs the batch again, checkpointing nothing before: at-least-once,
duplicates only from a batch that is run again. An event hub has no dead-letter queue: a
step's dead-letter decision goes to the ``error_target`` when there is one, else the event
is logged and left behind (counted as dead-lettered).

Recovery point: beside each Service Bus source's trigger, a timer function
``<function>_rpo`` probes the source (``tasks.recovery_point``: the age of the oldest message
not yet replicated and how many there are, as ``replication_rpo_seconds`` and
``replication_rpo_messages``) on the schedule of the app setting ``REPLICATION_RPO_SCHEDULE``
(NCRONTAB with seconds, default every 30 s; ``off``: no timer functions). A timer, not the
trigger's own turn: the trigger runs only when messages arrive and the function is healthy,
so exactly when the recovery point matters (the function failing, stopped, throttled, its
target down and every batch held) it would not run, or not return, and the last value it
reported would stand for a source that is filling up. The timer fires on its schedule
whatever the trigger does (and, a singleton across the app's instances, once per schedule,
not once per instance). An event hub source has no timer: an event hub keeps what was
replicated as well as what was not, there is no head to peek (``tasks.recovery_point``); nor
has a source with an identity-based connection (``__fullyQualifiedNamespace``): the probe
has no key to sign its requests with.

A ``transactional: true`` pipeline is not registered: its copies and its source's completes
must be one Service Bus transaction, and a function's messages are received and settled by
the Functions host on its own connection, which that transaction cannot include. Replicating
it as a plain function would quietly give up what it asks for, so ``register_pipelines``
raises a ``PipelineConfigError`` naming the pipeline (Azure then indexes no function and
says why). The local host imports ``function_app.py`` inside ``pumped_by_host()``: there
``register_pipelines`` hands those pipelines to the host, which runs them with the task pump.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import time
import typing
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import azure.functions as func
import azurefunctions.extensions.bindings.servicebus as servicebus

from . import metrics
from .adapters.eventhubs import from_event_hub_event
from .adapters.sdk import from_received
from .clock import SYSTEM, Clock
from .generated import GeneratedFunction, mark
from .messages import Message
from .ncrontab import parse_schedule
from .tasks.breaker import Breakers
from .tasks.error_target import ERROR_TARGET, divert_to_error_target
from .tasks.recovery_point import RecoveryPointProbe, schedule_setting
from .tasks.task import Decision, Settlement, process_batch

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusReceivedMessage

    from .pipeline import Pipeline, PipelineFile

log = logging.getLogger("replication.functions")

MIN_RENEW_INTERVAL = 1.0
SETTLE_CALLS = 8
_SETTLERS = concurrent.futures.ThreadPoolExecutor(SETTLE_CALLS, thread_name_prefix="settle")
_PUMPED: ContextVar[list[Pipeline] | None] = ContextVar("replication_pumped", default=None)
_HOST_CLOCK: ContextVar[Clock] = ContextVar("replication_host_clock", default=SYSTEM)
RPO_SUFFIX = "_rpo"
"""A source's recovery point timer function: its trigger function's name and this."""
_SENDING_ON: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, weakref.WeakSet[PipelineRuntime]
] = weakref.WeakKeyDictionary()
"""The runtimes whose senders were opened on each loop (a worker's: see ``close_senders``)."""


class PipelineRuntime:
    """One pipeline in a worker: its task and targets, built once, senders kept open."""

    def __init__(
        self, pipeline: Pipeline, settings: Mapping[str, str], clock: Clock = SYSTEM
    ) -> None:
        """``clock``: what send retries, breaker probes and lock renewals wait on."""
        from .tasks.targets import SenderPool

        self.name: str = pipeline.name
        built = pipeline.build(settings)
        self.tasks = built.tasks
        """One per source (each knows its source namespace for the loop guard)."""
        self.task = built.task
        self.targets = built.targets
        self._pool = SenderPool(self.targets, backend=built.pipeline.backend)
        self.clock = clock
        self.breakers = Breakers(clock=clock.monotonic, sleep=clock.sleep)

    async def handle(
        self,
        received: list[ServiceBusReceivedMessage],
        actions: servicebus.ServiceBusMessageActions,
        source: int = 0,
        *,
        sessions: bool = False,
    ) -> list[Settlement]:
        """Processes one trigger batch and settles each message through ``actions``."""
        self._sending_here()
        messages = [from_received(m) for m in received]
        metrics.RECEIVED.labels(self.name).inc(len(messages))
        async with self._locks_kept(messages, actions, sessions):
            settlements = await process_batch(
                self.tasks[source], messages, self._pool, self.breakers, self.clock
            )
            dead = [s for s in settlements if s.decision is Decision.DEAD_LETTER]
            if dead and ERROR_TARGET in self.targets:
                await divert_to_error_target(dead, self.task, self._pool, self.breakers, self.clock)
        # a plain source's function is registered with auto-complete (see the module): a
        # batch that only completes leaves everything to the host, no thread hop needed
        failures: list[str] = []
        if sessions or any(s.decision is not Decision.COMPLETE for s in settlements):
            failures = await asyncio.to_thread(_settle_all, actions, settlements, not sessions)
        self._count(settlements)
        if failures and not sessions:
            raise SettlementsFailed(failures)
        return settlements

    async def handle_events(
        self, events: list[func.EventHubEvent], source: int = 0
    ) -> list[Settlement]:
        """Processes one partition's batch of an event hub source; raises ``EventsFailed``
        when a copy was refused, so the batch is not checkpointed (see the module)."""
        self._sending_here()
        messages = [from_event_hub_event(event, i) for i, event in enumerate(events)]
        metrics.RECEIVED.labels(self.name).inc(len(messages))
        settlements = await process_batch(
            self.tasks[source], messages, self._pool, self.breakers, self.clock
        )
        dead = [s for s in settlements if s.decision is Decision.DEAD_LETTER]
        if dead and ERROR_TARGET in self.targets:
            await divert_to_error_target(dead, self.task, self._pool, self.breakers, self.clock)
        elif dead:
            log.warning(
                "%s: %d event(s) a step dead-lettered are left behind (an event hub "
                "has no dead-letter queue; set error_target to keep them), first: %s %s",
                self.name,
                len(dead),
                dead[0].reason,
                dead[0].description,
            )
        self._count(settlements)
        failed = [s for s in settlements if s.decision in (Decision.ABANDON, Decision.RELEASE)]
        if failed:
            raise EventsFailed(
                f"{self.name}: {len(failed)} of {len(settlements)} events not "
                f"sent, first: {failed[0].description}"
            )
        return settlements

    def _sending_here(self) -> None:
        loop = asyncio.get_running_loop()
        _SENDING_ON.setdefault(loop, weakref.WeakSet()).add(self)

    async def close(self) -> None:
        """Closes the senders (they open again when next used)."""
        await self._pool.close()

    def _count(self, settlements: list[Settlement]) -> None:
        complete = [s for s in settlements if s.decision is Decision.COMPLETE]
        filtered = sum(1 for s in complete if s.outputs == 0)
        failed = [s for s in settlements if s.decision in (Decision.ABANDON, Decision.RELEASE)]
        dead = sum(1 for s in settlements if s.decision is Decision.DEAD_LETTER)
        to_errors = sum(1 for s in complete if s.reason)  # a dead-letter decision sent on
        metrics.FORWARDED.labels(self.name).inc(len(complete) - filtered - to_errors)
        metrics.FILTERED.labels(self.name).inc(filtered)
        metrics.DEAD_LETTERED.labels(self.name).inc(dead + to_errors)
        if failed:
            metrics.FAILED.labels(self.name).inc()
            first = failed[0]
            log.warning(
                "%s: %d of %d messages abandoned for redelivery (first: %s: %s %s)",
                self.name,
                len(failed),
                len(settlements),
                first.message.message_id,
                first.reason,
                first.description,
            )

    @contextlib.asynccontextmanager
    async def _locks_kept(
        self, messages: list[Message], actions: servicebus.ServiceBusMessageActions, sessions: bool
    ) -> AsyncIterator[None]:
        """While one of the targets is held by its breaker, renews the batch's locks (the
        host renews them only up to ``maxAutoLockRenewalDuration``)."""
        keeper = asyncio.create_task(
            _keep_locks(
                messages, actions, sessions, self.breakers, self.clock.time, self.clock.sleep
            )
        )
        try:
            yield
        finally:
            keeper.cancel()  # not awaited: that could swallow a cancel meant for us


async def close_senders() -> None:
    """Closes the senders the pipelines opened on this loop, as the worker that runs them
    stops: their connections would stay open until the process ends (a broker stopping
    meanwhile waits for each one's answer to its close)."""
    for runtime in list(_SENDING_ON.pop(asyncio.get_running_loop(), ())):
        try:
            await runtime.close()
        except Exception:
            log.warning("%s: closing its senders failed", runtime.name, exc_info=True)


async def _keep_locks(
    messages: list[Message],
    actions: servicebus.ServiceBusMessageActions,
    sessions: bool,
    breakers: Breakers,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Renews every lock of the batch each half lock period, while a breaker is open."""
    now = clock()
    remaining = [m.locked_until.timestamp() - now for m in messages if m.locked_until]
    interval = max(MIN_RENEW_INTERVAL, min(remaining, default=10.0) / 2)
    while True:
        await sleep(interval)
        if breakers.open():
            await asyncio.to_thread(_renew_all, actions, messages, sessions)


class EventsFailed(Exception):
    """Raised by an event hub function when a target refused a copy: the host must not
    checkpoint the batch (it runs it again)."""


class SettlementsFailed(Exception):
    """Raised by a function with auto-complete when it could not settle some messages
    itself: the host then abandons those instead of completing them."""

    def __init__(self, failures: list[str]) -> None:
        super().__init__(f"{len(failures)} settlement(s) failed, first: {failures[0]}")


def _settle_all(
    actions: servicebus.ServiceBusMessageActions,
    settlements: list[Settlement],
    auto_complete: bool = False,
) -> list[str]:
    """Blocking gRPC calls, run off the worker's event loop, ``SETTLE_CALLS`` at a time
    (each is a round trip to the host; their order does not matter, the sessions to let go
    are released after them). With ``auto_complete`` the completes are the host's, unless
    another settlement failed: then they are sent here too, and the failures returned make
    the function raise. A settlement that fails (the lock was lost with the source's
    connection) means the message comes again: logged once per batch."""
    completes: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
    others: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
    let_go: set[str] = set()
    for item in settlements:
        received = item.message.source
        if item.decision is Decision.COMPLETE:
            completes.append((actions.complete, (received,)))
        elif item.decision is Decision.DEAD_LETTER:
            reason, description = item.reason[:256], item.description[:1024]
            others.append((actions.deadletter, (received, reason, description)))
        elif item.decision is Decision.ABANDON or auto_complete:
            # RELEASE from a plain source: it cannot be released, and must not be completed
            others.append((actions.abandon, (received,)))
        failed = item.decision in (Decision.ABANDON, Decision.RELEASE)
        if failed and item.message.session_id and not auto_complete:  # a session source
            let_go.add(item.message.session_id)
    calls = others if auto_complete else completes + others
    failures = [f for f in _SETTLERS.map(_attempt, calls) if f is not None]
    if auto_complete and failures:
        failures += [f for f in _SETTLERS.map(_attempt, completes) if f is not None]
    for session_id in sorted(let_go):  # the abandoned head comes first to the next taker
        failure = _attempt((actions.release_session, (session_id,)))
        if failure is not None:
            failures.append(failure)
    if failures:
        log.warning(
            "%d of %d settlements failed (they come again): %s",
            len(failures),
            len(settlements),
            failures[0],
        )
    return failures


def _renew_all(
    actions: servicebus.ServiceBusMessageActions, messages: list[Message], sessions: bool
) -> None:
    if sessions:
        calls = [
            (actions.renew_session_lock, (session_id,))
            for session_id in {m.session_id for m in messages if m.session_id}
        ]
    else:
        calls = [(actions.renew_message_lock, (message.source,)) for message in messages]
    failures = [f for f in map(_attempt, calls) if f is not None]
    if failures:
        log.warning("%d lock renewals failed: %s", len(failures), failures[0])


def _attempt(call: tuple[Callable[..., Any], tuple[Any, ...]]) -> str | None:
    action, args = call
    try:
        action(*args)
    except Exception as exc:  # SettlementError, or the channel is gone
        return f"{getattr(action, '__name__', action)}: {exc}"
    return None


@contextlib.contextmanager
def pumped_by_host(clock: Clock = SYSTEM) -> Iterator[list[Pipeline]]:
    """The local host imports ``function_app.py`` in here: ``register_pipelines`` then adds
    the transactional pipelines it is given to the list yielded (the host runs them with the
    task pump) instead of refusing them, and the functions it registers run on the host's
    ``clock`` (retry pauses, lock renewals, the recovery point's age)."""
    pumped: list[Pipeline] = []
    token = _PUMPED.set(pumped)
    clock_token = _HOST_CLOCK.set(clock)
    try:
        yield pumped
    finally:
        _HOST_CLOCK.reset(clock_token)
        _PUMPED.reset(token)


def register_pipelines(
    app: func.FunctionApp, pipelines: PipelineFile, settings: Mapping[str, str] | None = None
) -> list[str]:
    """Adds a trigger function per pipeline source to ``app``, and per Service Bus source
    its recovery point timer (``<name>_rpo``, unless ``REPLICATION_RPO_SCHEDULE`` is
    ``off``); returns their names.

    A transactional pipeline raises ``PipelineConfigError`` (before anything is registered):
    a function cannot run it (see the module); under ``pumped_by_host()`` it is handed to
    the local host instead."""
    settings = os.environ if settings is None else settings
    metrics.export(settings)  # Azure Monitor in Azure (Functions sets its connection string)
    schedule = schedule_setting(settings)
    if schedule is not None:
        parse_schedule(schedule)  # a wrong one is refused here, saying what is wrong
    clock = _HOST_CLOCK.get()
    pumped = _PUMPED.get()
    for pipeline in pipelines.pipelines:
        if pumped is None:
            pipeline.refuse_transactional("functions")
        elif pipeline.transactional:
            pumped.append(pipeline)
    names = []
    for pipeline in pipelines.pipelines:
        if pipeline.transactional:
            continue
        runtime: list[PipelineRuntime] = []  # built on first call: settings exist by then

        for index, (source, name) in enumerate(
            zip(pipeline.sources, pipeline.function_names(), strict=True)
        ):
            if source.is_event_hub:
                handler = _event_handler(pipeline, runtime, settings, name, index, clock)
                trigger = app.event_hub_message_trigger(
                    arg_name="events",
                    connection=source.connection,
                    event_hub_name=source.entity,
                    cardinality=func.Cardinality.MANY,
                    consumer_group=source.group,
                )
                app.function_name(name)(app.retry(**EVENT_RETRY)(trigger(handler)))
                names.append(name)
                continue
            handler = _handler(pipeline, runtime, settings, name, index, source.sessions, clock)
            if source.subscription is not None:
                trigger = app.service_bus_topic_trigger(
                    arg_name="messages",
                    topic_name=source.entity,
                    subscription_name=source.subscription,
                    connection=source.connection,
                    cardinality=func.Cardinality.MANY,
                    is_sessions_enabled=source.sessions,
                    auto_complete_messages=not source.sessions,
                )
            else:
                trigger = app.service_bus_queue_trigger(
                    arg_name="messages",
                    queue_name=source.entity,
                    connection=source.connection,
                    cardinality=func.Cardinality.MANY,
                    is_sessions_enabled=source.sessions,
                    auto_complete_messages=not source.sessions,
                )
            app.function_name(name)(trigger(handler))
            names.append(name)
            if schedule is not None and not _identity_based(settings, source.connection):
                names.append(_register_rpo(app, pipeline, index, name, schedule, settings, clock))
    return names


def _register_rpo(
    app: func.FunctionApp,
    pipeline: Pipeline,
    source: int,
    name: str,
    schedule: str,
    settings: Mapping[str, str],
    clock: Clock,
) -> str:
    """The recovery point timer of source ``source`` (see the module): a singleton timer, not
    run at startup (the first occurrence comes within one period), without the schedule
    monitor (missed occurrences need no catching up: the next probe measures anew)."""
    timer_name = f"{name}{RPO_SUFFIX}"
    probes: list[RecoveryPointProbe] = []  # built on the first call: settings exist by then
    lock = asyncio.Lock()

    async def probe(timer: func.TimerRequest) -> None:
        async with lock:
            if not probes:
                built = pipeline.recovery_point_probes(settings, clock)[source]
                if built is None:  # its connection setting is gone or not a connection string
                    log.warning(
                        "%s: no connection string in %r to probe the source with",
                        timer_name,
                        pipeline.sources[source].connection,
                    )
                    return
                probes.append(built)
            await probes[0].record()

    probe.__name__ = probe.__qualname__ = timer_name
    probe.__annotations__ = {"timer": func.TimerRequest, "return": None}
    trigger = app.timer_trigger(
        arg_name="timer", schedule=schedule, run_on_startup=False, use_monitor=False
    )
    app.function_name(timer_name)(trigger(probe))
    return timer_name


def _identity_based(settings: Mapping[str, str], connection: str) -> bool:
    """The connection is an identity (``<name>__fullyQualifiedNamespace``), no connection
    string: the probe has no key to sign with, so such a source gets no RPO timer."""
    from .pipeline.settings import FQNS_SUFFIX

    return not settings.get(connection) and bool(settings.get(connection + FQNS_SUFFIX))


EVENT_RETRY: dict[str, Any] = {
    "strategy": "exponential_backoff",
    "max_retry_count": "-1",
    "minimum_interval": "00:00:05",
    "maximum_interval": "00:05:00",
}
"""An event hub function's retry policy: the replication sample's
``[ExponentialBackoffRetry(-1, "00:00:05", "00:05:00")]``. Without one the Event Hubs trigger
checkpoints a failed batch as done; with it, the batch is run again until it goes through."""


def _event_handler(
    pipeline: Pipeline,
    runtime: list[PipelineRuntime],
    settings: Mapping[str, str],
    name: str,
    source: int,
    clock: Clock,
) -> Callable[..., Awaitable[None]]:
    lock = asyncio.Lock()

    async def handler(events: list[func.EventHubEvent]) -> None:
        async with lock:
            if not runtime:
                runtime.append(PipelineRuntime(pipeline, settings, clock))
        await runtime[0].handle_events(events, source)

    handler.__name__ = handler.__qualname__ = name
    mark(handler, GeneratedFunction(pipeline, source, runtime))  # for the local host
    handler.__annotations__ = {
        "events": typing.List[func.EventHubEvent],  # noqa: UP006
        "return": None,
    }
    return handler


def _handler(
    pipeline: Pipeline,
    runtime: list[PipelineRuntime],
    settings: Mapping[str, str],
    name: str,
    source: int,
    sessions: bool,
    clock: Clock,
) -> Callable[..., Awaitable[None]]:
    lock = asyncio.Lock()

    async def handler(
        messages: list[ServiceBusReceivedMessage],
        message_actions: servicebus.ServiceBusMessageActions,
    ) -> None:
        async with lock:
            if not runtime:
                runtime.append(PipelineRuntime(pipeline, settings, clock))
        await runtime[0].handle(messages, message_actions, source, sessions=sessions)

    handler.__name__ = handler.__qualname__ = name
    # per-pipeline trigger settings (host.json-wide in Azure) the local host applies per function
    mark(handler, GeneratedFunction(pipeline, source, runtime))
    # the worker reads the annotations to pick the bindings: the SDK types, real types
    handler.__annotations__ = {
        "messages": typing.List[servicebus.ServiceBusReceivedMessage],  # noqa: UP006
        "message_actions": servicebus.ServiceBusMessageActions,
        "return": None,
    }
    return handler
