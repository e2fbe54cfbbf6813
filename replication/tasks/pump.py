"""Runs a task against a live source with the asyncio SDK: receive, process, settle, repeat.

This is the trigger loop of the local host (and of tests and benchmarks): what the Functions
Service Bus trigger does for a function, minus the function. Plain sources are read by one
peek-lock receiver with prefetch; session sources by ``session_workers`` receivers that each
take the next available session and keep it until it runs dry, so a session's messages are
processed by one worker, in order. Settlement follows ``process_batch``'s decisions: complete
only after the target accepted, abandon on failure, dead-letter when a step says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from azure.servicebus import NEXT_AVAILABLE_SESSION
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver
from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusError

from ..messages import from_received
from .sender import SenderFor
from .task import Decision, ReplicationTask, Settlement, process_batch

log = logging.getLogger("replication.tasks.pump")


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
    abandoned: int = 0
    dead_lettered: int = 0


def _receiver(client: ServiceBusClient, source: Source, **kwargs: object) -> ServiceBusReceiver:
    if source.subscription is not None:
        receiver = client.get_subscription_receiver(
            source.entity, source.subscription, **kwargs
        )
    else:
        receiver = client.get_queue_receiver(source.entity, **kwargs)
    if hasattr(receiver, "_await_settlement_outcome"):
        # azure-servicebus 7.15 waits for the broker's echo of every settlement, one round
        # trip per message (4x slower here). We settle only after the target accepted the
        # copies, so at-least-once holds either way; an unconfirmed complete that is lost
        # means one redelivery, a duplicate the target's duplicate detection removes.
        receiver._await_settlement_outcome = False
    return receiver


async def settle(
    receiver: ServiceBusReceiver, settlements: list[Settlement], stats: PumpStats
) -> None:
    for item in settlements:
        await _settle_one(receiver, item, stats)


async def _settle_one(receiver: ServiceBusReceiver, item: Settlement, stats: PumpStats) -> None:
    received = item.message.source
    try:
        if item.decision is Decision.COMPLETE:
            await receiver.complete_message(received)
            stats.completed += 1
        elif item.decision is Decision.DEAD_LETTER:
            await receiver.dead_letter_message(
                received, reason=item.reason[:256], error_description=item.description[:1024]
            )
            stats.dead_lettered += 1
        else:
            await receiver.abandon_message(received)
            stats.abandoned += 1
    except ServiceBusError as exc:  # lock lost: the message comes again (at-least-once)
        log.warning("settling %s failed: %r", item.message.message_id, exc)


async def pump(
    task: ReplicationTask,
    client: ServiceBusClient,
    source: Source,
    sender_for: SenderFor,
    stop: asyncio.Event,
    *,
    max_batch: int = 100,
    max_wait: float = 1.0,
    session_workers: int = 4,
    stats: PumpStats | None = None,
    on_batch: Callable[[PumpStats], None] | None = None,
) -> PumpStats:
    """Moves messages until ``stop`` is set; returns the counts."""
    stats = stats or PumpStats()
    if source.sessions:
        await asyncio.gather(*(
            _session_worker(task, client, source, sender_for, stop, max_batch, max_wait,
                            stats, on_batch)
            for _ in range(session_workers)
        ))  # fmt: skip
        return stats
    async with _receiver(client, source, prefetch_count=max_batch) as receiver:
        await _drain(task, receiver, sender_for, stop, max_batch, max_wait, stats, on_batch, False)
    return stats


async def _drain(
    task: ReplicationTask,
    receiver: ServiceBusReceiver,
    sender_for: SenderFor,
    stop: asyncio.Event,
    max_batch: int,
    max_wait: float,
    stats: PumpStats,
    on_batch: Callable[[PumpStats], None] | None,
    until_empty: bool,
) -> None:
    while not stop.is_set():
        batch = await receiver.receive_messages(max_message_count=max_batch, max_wait_time=max_wait)
        if not batch:
            if until_empty:
                return
            continue
        stats.received += len(batch)
        settlements = await process_batch(task, [from_received(m) for m in batch], sender_for)
        await settle(receiver, settlements, stats)
        if on_batch is not None:
            on_batch(stats)
        if until_empty and any(s.decision is Decision.ABANDON for s in settlements):
            return  # give the session back: its abandoned head comes first for whoever is next


async def _session_worker(
    task: ReplicationTask,
    client: ServiceBusClient,
    source: Source,
    sender_for: SenderFor,
    stop: asyncio.Event,
    max_batch: int,
    max_wait: float,
    stats: PumpStats,
    on_batch: Callable[[PumpStats], None] | None,
) -> None:
    while not stop.is_set():
        try:
            receiver = _receiver(
                client, source, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=max_wait,
                prefetch_count=max_batch,
            )  # fmt: skip
            async with receiver:
                await _drain(task, receiver, sender_for, stop, max_batch, max_wait, stats,
                             on_batch, True)  # fmt: skip
        except OperationTimeoutError:
            continue  # no session free right now
        except ServiceBusError as exc:
            log.warning("session receiver on %s failed: %r", source, exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
