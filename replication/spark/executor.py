"""The pipeline runner's task on an executor: receive, steps, send and settle on one link.

``run_assignment`` is what ``read(assignment)`` runs on the Python worker's loop (README
"(a)"): it takes the worker's connection to the namespace the assignment names
(``worker.source_for``), opens a peek-lock receiver (or accepts up to ``sessions``
next-available sessions), and until the assignment's share is received, its
``max_seconds`` have passed or nothing more comes, takes a batch (the pipeline's
``batch_size``), runs it through ``process_batch`` with the worker's ``SenderPool`` and
settles each message on the receiving link with ``settle_amqp``, as the local host does:
complete once every copy was accepted (or the steps filtered it out), dead-letter with the
step's reason (to the pipeline's ``error_target`` instead when it has one, as in
Functions), abandon what a target refused, release the later messages of a session behind
an abandoned one and give the session back.
A ``LockKeeper`` renews the locks (or the session lock) while the task holds them. The
receiver is closed at the end, which gives back what was prefetched and not taken.

Nothing is settled before its copies were accepted, and nothing waits for Spark's commit.
If the worker dies, its connection drops and Service Bus gives the locked messages back at
once without counting a delivery: what was sent and not completed comes again, a duplicate
the target's duplicate detection removes (the copy keeps the message-id).

Why this is not ``tasks.receiving.ReceiveLoop`` (the loop of the pump and the host's
triggers): a task receives a bounded share once and ends when it is taken, its time is up or
the source runs dry (``FOLLOW_UP_WAIT``), not when told to stop; it caps the link's credit
to what the share still wants (what arrives beyond it would be released and received again
by the next task); it releases messages enqueued after an ``AvailableNow`` cutoff; and it
does not retry a receiver that failed: it counts it, and Spark plans the next task (or
retries this one). The parts that are the same are shared: ``worker.next_sessions``,
``LockKeeper``, ``process_batch`` and ``settle_amqp``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from ..messages import Message
from ..servicebus.client import AmqpReceiver, AmqpSource, SourceError
from ..tasks.error_target import ERROR_TARGET, divert_to_error_target
from ..tasks.inflight import InFlight
from ..tasks.locks import LockKeeper
from ..tasks.pump import PumpStats, settle_amqp
from ..tasks.sender import AsyncSender, send_batch
from ..tasks.task import Decision, Settlement, process_batch
from ..tasks.turns import SendTurns, Turn
from .assignment import Assignment
from .worker import next_sessions, pool_for, source_for

if TYPE_CHECKING:
    from ..failover.runtime import Failover
    from ..pipeline import BuiltPipeline

log = logging.getLogger("replication.spark")

FOLLOW_UP_WAIT = 0.2
"""Seconds a task that has received waits for the next batch before it ends."""

BATCHES_IN_FLIGHT = 2
"""Batches of a plain receiver handled side by side, as the pump does (``tasks/pump.py``):
one task alone keeps its Python worker busy while a batch's sends wait for the target."""

PipelineRefTuple = tuple[str, str, str, str | None]
"""(pipeline file text, pipeline name, settings JSON, pipeline folder): ``PipelineRef``'s
fields, what ``pipeline.built_pipeline`` builds from."""


@dataclass(frozen=True)
class PipelineJob:
    """One source of a pipeline, as executors rebuild it (picklable; travels with the
    reader, not with each assignment)."""

    ref: PipelineRefTuple
    source: int = 0

    @property
    def pipeline(self) -> str:
        """The pipeline's name: the ``pipeline`` label of its metrics and lag."""
        return self.ref[1]

    def built(self) -> BuiltPipeline:
        from .pipeline import built_pipeline

        return built_pipeline(*self.ref)

    def configured_connection(self) -> str:
        endpoint = self.built().sources[self.source]
        return str(json.loads(self.ref[2])[endpoint.connection])

    def failover(self) -> Failover | None:
        """The source's ``Failover`` (None without a ``failover`` block); one per process."""
        failovers = self.built().source_failovers
        return failovers[self.source] if self.source < len(failovers) else None

    def connection(self, namespace: str) -> str:
        """The connection string of the source on ``namespace`` (a resolved host)."""
        failover = self.failover()
        if failover is None or not namespace:
            return self.configured_connection()
        return str(failover.connection_for(namespace))

    def path(self) -> str:
        endpoint = self.built().sources[self.source]
        if endpoint.queue:
            return str(endpoint.queue)
        return f"{endpoint.topic}/Subscriptions/{endpoint.subscription}"

    def sessions(self) -> bool:
        return bool(self.built().sources[self.source].sessions)


@dataclass(slots=True)
class Counts:
    """What one task did: the row it yields (``COUNTS_SCHEMA``)."""

    received: int = 0
    """Messages taken into the pipeline (not counting ``late`` ones)."""
    completed: int = 0
    forwarded: int = 0
    """Copies the targets accepted (error targets not counted)."""
    to_error_target: int = 0
    """Copies an error target accepted (a step's ``on_error: route``, or a dead-letter
    decision with the pipeline's ``error_target``)."""
    filtered: int = 0
    """Completed with nothing to send."""
    dead_lettered: int = 0
    abandoned: int = 0
    released: int = 0
    late: int = 0
    """``Trigger.AvailableNow``: enqueued after the cutoff, released untouched."""
    errors: int = 0
    """Receivers that failed (the source could not be reached, a link or session lost)."""

    def row(self, slot: int, lag: str | None = None) -> tuple[int | str | None, ...]:
        """The task's row; ``lag`` is what it measured (``task_lag.TaskLag.encoded``)."""
        return (slot, *(getattr(self, f.name) for f in fields(self)), lag)


COUNTS_SCHEMA = "slot int, " + ", ".join(f"{f.name} long" for f in fields(Counts)) + ", lag string"
"""A task's row: its slot, its counts and the lag of the copies it made (``task_lag``)."""


class _CountingSender:
    reports_queued = True
    """Passes the sender's "on the wire" on (``send_batch``): the next batch sends then."""

    def __init__(self, sender: AsyncSender, name: str | None, accepted: Counter[str | None]):
        self.sender, self.name, self.accepted = sender, name, accepted

    async def send_messages(
        self, messages: list[Message], queued: Callable[[], None] | None = None
    ) -> None:
        await send_batch(self.sender, messages, queued)
        self.accepted[self.name] += len(messages)


@dataclass
class _CountingSenders:
    """The worker's pool, counting what each target accepted."""

    pool: Any
    accepted: Counter[str | None] = field(default_factory=Counter)

    @contextlib.asynccontextmanager
    async def __call__(self, name: str | None) -> AsyncIterator[AsyncSender]:
        async with self.pool(name) as sender:
            yield _CountingSender(sender, name, self.accepted)


class _Task:
    """One assignment's receive-process-settle loop and its counts."""

    def __init__(
        self, job: PipelineJob, assignment: Assignment, clock: Callable[[], float]
    ) -> None:
        built = job.built()
        self.assignment = assignment
        self.clock = clock
        self.deadline = None if assignment.max_seconds is None else clock() + assignment.max_seconds
        self.task = built.tasks[job.source]
        self.targets = built.targets
        pool, self.breakers = pool_for(job.ref, built.targets, built.pipeline.backend)
        self.senders = _CountingSenders(pool)
        self.chunk = max(1, int(built.pipeline.batch_size))
        self.remaining = assignment.max_messages
        self.stats = PumpStats()
        self.counts = Counts()

    @property
    def taking(self) -> bool:
        """Whether to take another batch: the share wants more and time is left."""
        return self.remaining > 0 and (self.deadline is None or self.clock() < self.deadline)

    @property
    def prefetch(self) -> int:
        return max(1, min(2 * self.chunk, self.assignment.max_messages))

    # ------------------------------------------------------------------ receivers

    async def plain(self, source: AmqpSource) -> None:
        try:
            receiver = await source.receiver(self.assignment.path, prefetch=self.prefetch)
        except SourceError as exc:
            self._failed(exc, "cannot receive from")
            return
        try:
            async with LockKeeper(receiver) as keeper:
                await self.drain(receiver, keeper, self.assignment.max_wait)
        except SourceError as exc:
            self._failed(exc, "receiving failed on")
        finally:
            await receiver.close()

    async def sessions(self, source: AmqpSource) -> None:
        async with asyncio.TaskGroup() as slots:
            for _ in range(self.assignment.sessions):
                slots.create_task(self.session_slot(source))

    async def session_slot(self, source: AmqpSource) -> None:
        """Takes next-available sessions one after another until the share is received or
        no session comes; a session is kept until it runs dry, is given back (something of
        it was abandoned) or its next message came after the cutoff."""
        if not self.taking:
            return
        path, wait = self.assignment.path, self.assignment.max_wait
        sessions = next_sessions(source, path, self.prefetch, wait, self._failed)
        async with contextlib.aclosing(sessions):
            async for receiver in sessions:
                try:
                    async with LockKeeper(receiver) as keeper:
                        late = await self.drain(receiver, keeper, self.assignment.max_wait)
                except SourceError as exc:  # e.g. the session lock was lost: it comes again
                    self._failed(exc, f"session {receiver.session_id!r} failed on")
                    late = False
                finally:
                    await receiver.close()
                if late or not self.taking:
                    return  # late: the rest of it is too; taking it again would only release it

    def _failed(self, exc: SourceError, what: str) -> None:
        if not exc.retryable:
            raise exc
        self.counts.errors += 1
        log.warning(
            "%s %s (batch %d, slot %d): %s",
            what,
            self.assignment.path,
            self.assignment.batch,
            self.assignment.slot,
            exc,
        )

    async def drain(self, receiver: AmqpReceiver, keeper: LockKeeper, wait: float) -> bool:
        """Receives and processes batches until the share is taken or its time is up
        (``taking``), nothing more comes within ``FOLLOW_UP_WAIT``, or a session must be
        given back. A plain receiver's next batch is received and planned while the one
        before waits for its targets (``BATCHES_IN_FLIGHT``, sends kept in receive order by
        ``SendTurns``); a session's batches go one after another. True when it ended on a
        message enqueued after the cutoff."""
        plain = receiver.session_id is None
        flight = InFlight[Message](BATCHES_IN_FLIGHT if plain else 1)
        turns = SendTurns()
        late = False

        async def handle(batch: list[Message], turn: Turn | None) -> bool:
            """True: receive no more here (a message came after the cutoff, or a session
            must be given back: the abandoned one comes first again)."""
            nonlocal late
            try:
                came_late, settlements = await self.process(receiver, batch, turn)
            finally:
                keeper.settled(batch)
            late = late or came_late
            return came_late or (
                not plain
                and any(s.decision in (Decision.ABANDON, Decision.RELEASE) for s in settlements)
            )

        async with flight:
            while flight.going and self.taking:
                # given back when the batch's handler finished
                batch = await flight.take(functools.partial(self.receive, receiver, wait))
                if not batch:
                    break
                wait = FOLLOW_UP_WAIT
                keeper.hold(batch)
                # the turn is taken before any await: batches side by side send in order
                flight.start(handle(batch, turns.take() if plain else None))
        return late

    async def receive(self, receiver: AmqpReceiver, wait: float) -> list[Message]:
        """The next batch of the share (``remaining`` is reserved while it is received:
        session slots receive side by side)."""
        want = min(self.chunk, self.remaining)
        self.remaining -= want
        # the prefetch never asks for more than the share still wants: what arrives beyond
        # it is released at the end, received again by the next task (was ~7% of the
        # messages with shares of 2,500)
        receiver.link.credit = min(self.prefetch, self.remaining)
        batch: list[Message] = []
        try:
            batch = await receiver.receive(want, wait)
        finally:
            self.remaining += want - len(batch)
        return batch

    # ------------------------------------------------------------------ one batch

    async def process(
        self, receiver: AmqpReceiver, batch: list[Message], turn: Turn | None = None
    ) -> tuple[bool, list[Settlement]]:
        late: list[Message] = []
        cutoff = self.assignment.cutoff
        if cutoff is not None:
            late = [m for m in batch if _after(m, cutoff)]
            if late:
                gone = {id(m) for m in late}
                batch = [m for m in batch if id(m) not in gone]
        settlements: list[Settlement] = []
        if batch:
            self.counts.received += len(batch)
            settlements = await process_batch(
                self.task, batch, self.senders, self.breakers, turn=turn
            )
            dead = [s for s in settlements if s.decision is Decision.DEAD_LETTER]
            if dead and ERROR_TARGET in self.targets:
                await divert_to_error_target(dead, self.task, self.senders, self.breakers)
            settle_amqp(receiver, settlements, self.stats)
            self.counts.filtered += sum(
                1 for s in settlements if s.decision is Decision.COMPLETE and not s.outputs
            )
        elif turn is not None:
            turn.end()  # nothing of it to send: the batch after it need not wait
        if late:
            self.counts.late += receiver.release(late)
        return bool(late), settlements

    def result(self) -> Counts:
        counts = self.counts
        counts.completed = self.stats.completed
        counts.dead_lettered = self.stats.dead_lettered
        counts.abandoned = self.stats.abandoned
        counts.released = self.stats.released
        for name, accepted in self.senders.accepted.items():
            if name is not None and name.startswith(ERROR_TARGET):
                counts.to_error_target += accepted
            else:
                counts.forwarded += accepted
        return counts


def _after(message: Message, cutoff: float) -> bool:
    enqueued = message.enqueued_time
    return enqueued is not None and enqueued.timestamp() > cutoff


async def run_assignment(
    job: PipelineJob, assignment: Assignment, clock: Callable[[], float] = time.monotonic
) -> Counts:
    """Receives, processes and settles one assignment on this worker (see the module);
    ``clock`` is read at the start and before each batch (``Assignment.max_seconds``)."""
    task = _Task(job, assignment, clock)
    source = source_for(job.connection(assignment.namespace))
    if assignment.sessions:
        await task.sessions(source)
    else:
        await task.plain(source)
    counts = task.result()
    log.debug(
        "batch %d slot %d on %s: %s",
        assignment.batch,
        assignment.slot,
        assignment.namespace,
        counts,
    )
    return counts
