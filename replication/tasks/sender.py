"""Session-ordered sending to target entities: grouped, batched, bounded, retried, never lost.

Messages are grouped by (target, session id, partition key). Inside a group they are sent in
the order given, in batches bounded by the target's size limit and a count; a group's next
batch goes only after the previous one was accepted, and once a batch fails for good the
rest of a session's group is not sent (sending it would overtake the failed messages;
without a session there is no order to keep, and the rest go on). Groups go
concurrently, at most ``max_concurrent_groups`` at a time. A batch that fails with a
transient error is retried with exponential backoff and full jitter.

The result says, per message, whether the target accepted it: the caller completes the
source messages whose outputs were all accepted and abandons the others (so Service Bus's
delivery count and MaxDeliveryCount dead-lettering apply). Nothing is fire-and-forget.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from azure.eventhub.exceptions import AuthenticationError, EventDataError, EventHubError
from azure.servicebus.exceptions import (
    MessageSizeExceededError,
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusError,
)

from ..clock import SYSTEM, Clock
from ..messages import Message
from ..servicebus.client import SourceError
from ..servicebus.sender import MESSAGE_SIZE_EXCEEDED
from .batches import batch_count
from .breaker import Breaker, Breakers

log = logging.getLogger("replication.tasks.sender")


class AsyncSender(Protocol):
    """Sends a batch of messages to one entity, returning once it was accepted
    (``servicebus.sender.AmqpSender``, or ``targets.SdkSender`` over the SDK).

    A sender that can tell when a batch is on the wire (ours) has ``reports_queued = True``
    and takes ``send_messages(messages, queued=callback)``."""

    async def send_messages(self, messages: list[Message]) -> None: ...


async def send_batch(
    sender: AsyncSender, messages: list[Message], queued: Callable[[], None] | None = None
) -> None:
    """``sender.send_messages``, passing ``queued`` on where the sender can tell when the batch
    is on the wire (``reports_queued``); a sender that cannot is on the wire when it returns,
    and ``queued`` is the caller's to call then. A sender that wraps another (to count, or to
    follow a failover) sends with this and says ``reports_queued = True``: dropping ``queued``
    would make the next batch wait for this one's answer (batches side by side lose their
    overlap)."""
    if queued is not None and getattr(sender, "reports_queued", False):
        await sender.send_messages(messages, queued=queued)  # type: ignore[call-arg]  # ours
    else:
        await sender.send_messages(messages)


SenderFor = Callable[[str | None], AbstractAsyncContextManager[AsyncSender]]
"""Lends a sender of a target (None: the task's default target) for one group's sends."""


DEFAULT_MAX_BATCH_BYTES = 256 * 1024


@dataclass(slots=True, frozen=True)
class SendPolicy:
    max_batch_messages: int = 100
    max_batch_bytes: int | None = None
    """None: ``DEFAULT_MAX_BATCH_BYTES`` (Service Bus Standard: 256 KiB per batch)."""
    max_concurrent_groups: int = 16
    attempts: int = 5
    backoff_initial: float = 0.2
    backoff_max: float = 10.0


@dataclass(slots=True)
class SendResult:
    """Per input message: None when the target accepted it, else the error; and when its
    target accepted it (``clock.time()``, None when it did not), for the lag."""

    errors: list[BaseException | None]
    accepted_at: list[float | None] = field(default_factory=list)

    @property
    def all_sent(self) -> bool:
        return all(error is None for error in self.errors)

    def failed(self) -> list[int]:
        return [i for i, error in enumerate(self.errors) if error is not None]


@dataclass(slots=True)
class _Group:
    target: str | None
    ordered: bool
    """A session's messages: one that fails stops the rest (they must not overtake it)."""
    indexes: list[int] = field(default_factory=list)


def retryable(error: BaseException) -> bool:
    """Transient errors are worth another try; a bad message or credential is not."""
    if isinstance(error, SourceError):
        return error.retryable
    if isinstance(error, EventHubError):  # an event hub target (tasks.eventhubs)
        return not isinstance(error, AuthenticationError | EventDataError)
    if isinstance(
        error,
        MessageSizeExceededError
        | ServiceBusAuthorizationError
        | ServiceBusAuthenticationError
        | MessagingEntityNotFoundError
        | MessagingEntityDisabledError
        | ValueError
        | TypeError
        | KeyError,
    ):
        return False
    if isinstance(error, ServiceBusError):
        return bool(getattr(error, "retryable", True))
    return isinstance(error, OSError | asyncio.TimeoutError | ConnectionError)


async def send_ordered(
    messages: list[Message],
    sender_for: SenderFor,
    policy: SendPolicy | None = None,
    breakers: Breakers | None = None,
    clock: Clock = SYSTEM,
    queued: Callable[[], None] | None = None,
) -> SendResult:
    """Sends ``messages`` (each to its ``target``) keeping per-group order; see the module.

    ``queued`` is called once every message is on its target's link (or failed), possibly
    before the targets answered: what is sent after it cannot overtake them on the wire.
    A sender that cannot tell (the SDK's) counts as queued when it returns.

    With ``breakers``, a target that stays unreachable after the policy's attempts does not
    fail the messages: its breaker opens and the sends wait for it (see ``breaker``); they
    fail only with errors the target gave (or ``TargetUnavailable`` when it is stopped).
    ``clock``: what the pauses between retries wait on (tests pass a ``ManualClock``)."""
    policy = policy or SendPolicy()
    errors: list[BaseException | None] = [None] * len(messages)
    accepted_at: list[float | None] = [None] * len(messages)
    groups: dict[tuple[str | None, str | None, str | None], _Group] = {}
    for index, message in enumerate(messages):
        key = (message.target, message.session_id, message.partition_key)
        group = groups.get(key)
        if group is None:  # not setdefault: that made a group for every message
            group = groups[key] = _Group(message.target, message.session_id is not None)
        group.indexes.append(index)
    limit = asyncio.Semaphore(policy.max_concurrent_groups)
    unqueued = len(groups)

    def group_queued() -> None:
        nonlocal unqueued
        unqueued -= 1
        if unqueued == 0 and queued is not None:
            queued()

    async def run(group: _Group) -> None:
        on_wire = _Once(group_queued)
        try:
            async with limit:
                breaker = breakers(group.target) if breakers is not None else None
                await _send_group(
                    group,
                    messages,
                    errors,
                    accepted_at,
                    sender_for,
                    policy,
                    breaker,
                    clock,
                    on_wire,
                )
        finally:
            on_wire()

    if not groups and queued is not None:
        queued()
    await asyncio.gather(*(run(group) for group in groups.values()))
    return SendResult(errors, accepted_at)


class _Once:
    """A callback that runs the first time it is called only."""

    __slots__ = ("_callback",)

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback: Callable[[], None] | None = callback

    def __call__(self) -> None:
        callback, self._callback = self._callback, None
        if callback is not None:
            callback()


async def _send_group(
    group: _Group,
    messages: list[Message],
    errors: list[BaseException | None],
    accepted_at: list[float | None],
    sender_for: SenderFor,
    policy: SendPolicy,
    breaker: Breaker | None,
    clock: Clock,
    on_wire: Callable[[], None],
) -> None:
    try:
        async with sender_for(group.target) as sender:
            await _send_in_order(
                sender, group, messages, errors, accepted_at, policy, breaker, clock, on_wire
            )
    except Exception as exc:  # no sender for the target (unknown name, cannot connect)
        for index in group.indexes:
            if errors[index] is None:
                errors[index] = exc


async def _send_in_order(
    sender: AsyncSender,
    group: _Group,
    messages: list[Message],
    errors: list[BaseException | None],
    accepted_at: list[float | None],
    policy: SendPolicy,
    breaker: Breaker | None,
    clock: Clock,
    on_wire: Callable[[], None],
) -> None:
    pending = list(group.indexes)
    while pending:
        try:
            batch, count = await _fill_batch(sender, [messages[i] for i in pending], policy)
        except Exception as exc:  # e.g. a single message bigger than the target allows
            for index in pending:
                errors[index] = exc
            return
        last = on_wire if count == len(pending) else None  # the group's last batch
        error = await _send_with_retries(
            sender, batch, policy, group.target, breaker, clock, queued=last
        )
        if _too_large(error) and count > 1:
            policy = replace(policy, max_batch_messages=max(1, count // 2))
            continue  # the estimate was short: the same messages in smaller batches
        if error is not None and group.ordered:
            for index in pending:  # the rest would overtake what failed: not sent either
                errors[index] = error
            return
        if error is None:
            now = clock.time()
            for index in pending[:count]:
                accepted_at[index] = now
        else:
            for index in pending[:count]:
                errors[index] = error  # no order to keep (no session): the rest go on
        pending = pending[count:]


def _too_large(error: BaseException | None) -> bool:
    if isinstance(error, SourceError):
        return error.condition == MESSAGE_SIZE_EXCEEDED
    return isinstance(error, MessageSizeExceededError)


async def _fill_batch(
    sender: AsyncSender, messages: list[Message], policy: SendPolicy
) -> tuple[list[Message], int]:
    """The next batch: as many of ``messages`` (in order) as fit the count and an estimated
    size limit (``batches``; the sender refuses a batch whose estimate was short: it is sent
    again in smaller ones).

    A list, not the SDK's ``create_message_batch``: that call waits on the connection every
    time it is made (about 30 ms with azure-servicebus 7.15).
    """
    max_bytes = policy.max_batch_bytes or DEFAULT_MAX_BATCH_BYTES
    count = batch_count(messages, policy.max_batch_messages, max_bytes)
    return messages[:count], count


async def _send_with_retries(
    sender: AsyncSender,
    batch: Any,
    policy: SendPolicy,
    target: str | None,
    breaker: Breaker | None = None,
    clock: Clock = SYSTEM,
    queued: Callable[[], None] | None = None,
) -> BaseException | None:
    """None once the batch was accepted, else the error that ends trying. Without a
    breaker, transient errors are retried ``policy.attempts`` times; with one, a target
    still unreachable then opens it and the batch waits for its turn to probe."""
    delay = policy.backoff_initial
    attempt = 0
    while True:
        if breaker is not None:
            try:
                await breaker.turn()
            except ConnectionError as stopped:  # TargetUnavailable: stopped while unreachable
                return stopped
        attempt += 1
        try:
            await send_batch(sender, batch, queued)
        except asyncio.CancelledError:  # e.g. functionTimeout ended the invocation
            if breaker is not None and breaker.is_open:
                breaker.gave_up()
            raise
        except Exception as exc:
            if not retryable(exc):
                if breaker is not None:
                    breaker.answered()
                log.warning("send to %s failed for good (attempt %d): %r", target, attempt, exc)
                return exc
            if breaker is not None and breaker.is_open:
                breaker.failed(exc)
                continue
            if attempt >= policy.attempts:
                if breaker is None:
                    log.warning("send to %s failed for good (attempt %d): %r", target, attempt, exc)
                    return exc
                breaker.trip(exc)
                continue
            pause = random.uniform(0, delay)  # full jitter
            log.info(
                "send to %s failed (attempt %d), retrying in %.2fs: %r", target, attempt, pause, exc
            )
            await clock.sleep(pause)
            delay = min(delay * 2, policy.backoff_max)
            continue
        if breaker is not None:
            breaker.answered()
        return None
