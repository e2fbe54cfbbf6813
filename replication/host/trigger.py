"""Runs one Service Bus trigger with the Functions host's semantics.

What the host does for a Python function with a Service Bus trigger, and so what we do:
receive with peek-lock (prefetch), hand the function a batch (``cardinality=many``, at most
``maxMessageBatchSize``) or one message, then with ``autoCompleteMessages`` complete every
message when the function returned and abandon every message when it raised. Session
triggers take the next available session per worker, at most ``maxConcurrentSessions``
sessions at a time, and keep a session until it has been idle (``sessionIdleTimeout``), so
a session's messages reach the function in order. Sync functions run in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import azure.functions as func
from azure.functions.servicebus import ServiceBusMessage as FunctionsMessage
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusReceivedMessage
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver
from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusError

from ..messages import body_bytes, properties_from_amqp
from ..tasks.pump import sdk_receiver
from .discovery import ServiceBusTrigger

if TYPE_CHECKING:
    from ..failover import Failover

log = logging.getLogger("replication.host")


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

    def for_function(self, function: Any) -> HostOptions:
        """These options with a pipeline's own batch size and concurrency (set by
        ``replication.functions`` on the functions it generates), when it has them."""
        from dataclasses import replace

        changes: dict[str, int] = {}
        batch = getattr(function, "batch_size", None)
        if batch:
            changes["max_message_batch_size"] = int(batch)
            changes["prefetch_count"] = max(self.prefetch_count, int(batch))
        concurrency = getattr(function, "concurrency", None)
        if concurrency:
            changes["max_concurrent_sessions"] = int(concurrency)
            changes["max_concurrent_calls"] = min(int(concurrency), 4)
        return replace(self, **changes)

    @classmethod
    def from_host_json(cls, data: dict[str, Any]) -> HostOptions:
        sb = (data.get("extensions") or {}).get("serviceBus") or {}
        idle = str(sb.get("sessionIdleTimeout", "00:00:01"))
        hours, minutes, seconds = (float(part) for part in idle.split(":"))
        return cls(
            prefetch_count=int(sb.get("prefetchCount", 100)),
            max_message_batch_size=int(sb.get("maxMessageBatchSize", 100)),
            max_concurrent_calls=max(1, min(int(sb.get("maxConcurrentCalls", 1)), 4)),
            max_concurrent_sessions=int(sb.get("maxConcurrentSessions", 8)),
            session_idle_timeout=hours * 3600 + minutes * 60 + seconds,
            auto_complete_messages=bool(sb.get("autoCompleteMessages", True)),
        )


@dataclass(slots=True)
class TriggerStats:
    received: int = 0
    completed: int = 0
    abandoned: int = 0
    failed_calls: int = 0


def to_functions_message(message: ServiceBusReceivedMessage) -> func.ServiceBusMessage:
    """What the Python worker builds from the trigger's metadata, built from the SDK's message."""
    props = properties_from_amqp(message.application_properties or {})

    def text(value: Any) -> str | None:
        return value.decode() if isinstance(value, bytes) else value

    return FunctionsMessage(
        body=body_bytes(message), trigger_metadata=None, application_properties=props,
        content_type=text(message.content_type), correlation_id=text(message.correlation_id),
        dead_letter_error_description=message.dead_letter_error_description,
        dead_letter_reason=message.dead_letter_reason,
        dead_letter_source=message.dead_letter_source, delivery_count=message.delivery_count,
        enqueued_sequence_number=message.enqueued_sequence_number,
        enqueued_time_utc=message.enqueued_time_utc, expires_at_utc=message.expires_at_utc,
        label=text(message.subject), locked_until=message.locked_until_utc,
        lock_token=str(message.lock_token) if message.lock_token else None,
        message_id=str(text(message.message_id) or ""),
        partition_key=text(message.partition_key), reply_to=text(message.reply_to),
        reply_to_session_id=text(message.reply_to_session_id),
        scheduled_enqueue_time_utc=message.scheduled_enqueue_time_utc,
        sequence_number=message.sequence_number, session_id=text(message.session_id),
        state=int(message.state) if message.state is not None else None,
        subject=text(message.subject), time_to_live=message.time_to_live,
        to=text(message.to), transaction_partition_key=None, user_properties=props,
    )  # fmt: skip


class TriggerRunner:
    """Receives for one trigger and calls its function until ``stop`` is set."""

    def __init__(
        self,
        trigger: ServiceBusTrigger,
        connection_string: str,
        options: HostOptions,
        on_batch: Callable[[ServiceBusTrigger, int, bool], None] | None = None,
        failover: Failover | None = None,
    ) -> None:
        self.trigger = trigger
        self.connection_string = connection_string
        """The namespace read now (with ``failover``: the one it resolved to last)."""
        self.options = options
        self.on_batch = on_batch
        self.failover = failover
        self.stats = TriggerStats()

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
        # Session triggers: no SDK retries. Waiting for a free session ends in a timeout
        # that the SDK would retry 3 times with backoff (half a minute before Ctrl-C is
        # noticed); our worker loop tries again itself, checking ``stop`` in between. With
        # failover, a dead namespace must show quickly too.
        retry = self.trigger.sessions or self.failover is not None
        options = {"retry_total": 0} if retry else {}
        async with ServiceBusClient.from_connection_string(connection_string, **options) as client:
            workers = (
                self.options.max_concurrent_sessions if self.trigger.sessions
                else self.options.max_concurrent_calls
            )  # fmt: skip
            await asyncio.gather(*(self._worker(client, stop) for _ in range(workers)))

    def _receiver(self, client: ServiceBusClient, **kwargs: Any) -> ServiceBusReceiver:
        t = self.trigger
        kwargs.setdefault("prefetch_count", self.options.prefetch_count)
        entity = t.queue if t.queue is not None else str(t.topic)
        return sdk_receiver(client, entity, t.subscription if t.queue is None else None, **kwargs)

    async def _worker(self, client: ServiceBusClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                if self.trigger.sessions:
                    receiver = self._receiver(
                        client, session_id=NEXT_AVAILABLE_SESSION,
                        max_wait_time=self.options.session_idle_timeout,
                    )  # fmt: skip
                else:
                    receiver = self._receiver(client)
                async with receiver:
                    await self._drain(receiver, stop)
            except OperationTimeoutError:
                continue  # no session free right now
            except ServiceBusError as exc:
                if self.failover is not None and await self.failover.report_failure(exc):
                    return  # switched: ``run`` starts again on the new namespace
                log.warning("%s: receiver failed: %r; retrying", self.trigger.name, exc)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)

    async def _drain(self, receiver: ServiceBusReceiver, stop: asyncio.Event) -> None:
        size = self.options.max_message_batch_size if self.trigger.many else 1
        wait = self.options.session_idle_timeout
        while not stop.is_set():
            batch = await receiver.receive_messages(max_message_count=size, max_wait_time=wait)
            if not batch:
                if self.trigger.sessions:
                    return  # the session went idle: let it go
                continue
            self.stats.received += len(batch)
            if self.failover is not None:
                self.failover.report_success()
            ok = await self._call(batch)
            for message in batch:
                try:
                    if ok and self.options.auto_complete_messages:
                        await receiver.complete_message(message)
                    elif not ok:
                        await receiver.abandon_message(message)
                except ServiceBusError as exc:  # lock lost: it comes again (at-least-once)
                    log.warning("%s: settling failed: %r", self.trigger.name, exc)
            if ok:
                self.stats.completed += len(batch)
            else:
                self.stats.abandoned += len(batch)
            if self.on_batch is not None:
                self.on_batch(self.trigger, len(batch), ok)
            if not ok and self.trigger.sessions:
                return  # give the session back; its head comes first again

    async def _call(self, batch: list[ServiceBusReceivedMessage]) -> bool:
        messages = [to_functions_message(m) for m in batch]
        argument: Any = messages if self.trigger.many else messages[0]
        function = self.trigger.function
        try:
            if inspect.iscoroutinefunction(function):
                await function(**{self.trigger.arg_name: argument})
            else:
                await asyncio.to_thread(function, **{self.trigger.arg_name: argument})
            return True
        except Exception as exc:
            self.stats.failed_calls += 1
            log.warning("%s: function failed, %d message(s) abandoned: %s",
                        self.trigger.name, len(batch), exc)  # fmt: skip
            return False
