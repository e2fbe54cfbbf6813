"""A replication task: what to do with one received batch, from steps to settlement decisions.

``ReplicationTask.plan`` runs a source message through the task's steps, drops outputs that
would loop back into a namespace they came through (merge / active-active mirrors), adds the
``repl-path`` marker and the replication stamp. ``process_batch`` plans a whole batch, sends
every output with ``send_ordered`` and decides per source message: complete (all outputs
accepted, or none to send), abandon (its target refused an output: redelivery keeps it
at-least-once), release (held back behind an abandoned message of its session, so it must
not overtake it, and it is no poison: no delivery counted) or dead-letter (a step's error
path said so). An unreachable target is no failure: with ``breakers`` the sends wait for it.
Settling happens in the caller, only after this returns, so a message is never completed
before its copies are on the target.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum

from ..clock import SYSTEM, Clock
from ..messages import Message
from ..telemetry.tracing import batch_span
from .breaker import Breakers
from .lag import record_lag
from .sender import SenderFor, SendPolicy, send_ordered
from .stamping import stamp
from .steps import BoundStep, Outcome, run_chain
from .turns import Turn

log = logging.getLogger("replication.tasks")

PATH = "repl-path"
"""The namespaces a message was replicated from, ``;``-separated, oldest first."""


def passed_through(message: Message) -> list[str]:
    path = str(message.application_properties.get(PATH) or "")
    return [part for part in path.split(";") if part]


class Decision(Enum):
    COMPLETE = "complete"
    ABANDON = "abandon"
    DEAD_LETTER = "dead-letter"
    RELEASE = "release"
    """Held back behind a failed message of its session (it must not overtake it): given
    back without counting a delivery (the session is let go, so the failed one comes
    first again)."""


@dataclass(slots=True)
class Settlement:
    message: Message
    decision: Decision
    reason: str = ""
    description: str = ""
    outputs: int = 0
    """Copies sent for this message (0 on COMPLETE: the steps filtered it out)."""
    error: BaseException | None = field(default=None, repr=False, compare=False)
    """ABANDON: the send error (``TargetUnavailable``: a target outage that outlasted the
    runner, which may then release the message instead of counting a delivery)."""


@dataclass(slots=True)
class ReplicationTask:
    """Replicate (one source, one target), merge (many sources, loop guard) or route (steps
    set each output's ``target``): the same object, configured differently."""

    name: str
    steps: list[BoundStep] = field(default_factory=list)
    source_namespace: str | None = None
    target_namespaces: dict[str | None, str] = field(default_factory=dict)
    """Target name (None: the default target) -> its namespace, for the loop guard."""
    loop_guard: bool = False
    """Drop outputs whose target namespace the message already came through (merge)."""
    policy: SendPolicy = field(default_factory=SendPolicy)
    pipeline: str = ""
    """The pipeline this task is one source of (metrics label; ``name`` when empty)."""
    session_id_from_key: bool = False
    """An event hub source's ``session_id_from: partition_key``: an event without a session
    id gets its partition key as one (before the steps, so they see it)."""

    def plan(self, message: Message, now: datetime | None = None) -> Outcome:
        if self.session_id_from_key and message.session_id is None and message.partition_key:
            message = message.copy(session_id=message.partition_key)
        steps = self.steps  # none: the message itself, as run_chain says, without the call
        outcome = run_chain(message, steps) if steps else Outcome([message])
        outputs = []
        marked = self.loop_guard or self.source_namespace is not None  # else no path to read
        for output in outcome.outputs:
            path = passed_through(output) if marked else []
            if self.loop_guard:
                target_ns = self.target_namespaces.get(output.target)
                if target_ns is not None and target_ns in path:
                    log.debug(
                        "%s: %s already passed %s, not sent back",
                        self.name,
                        output.message_id,
                        target_ns,
                    )
                    continue
            if self.source_namespace is not None and (
                not path or path[-1] != self.source_namespace
            ):
                props = dict(output.application_properties)
                props[PATH] = ";".join([*path, self.source_namespace])
                output = output.copy(application_properties=props)
            outputs.append(stamp(output, now))  # stamp reads the clock only when it must
        outcome.outputs = outputs
        return outcome


def _keyed(message: Message) -> bool:
    """A message whose order matters to its target: a session's, or a partition key's."""
    return message.session_id is not None or message.partition_key is not None


async def process_batch(
    task: ReplicationTask,
    messages: list[Message],
    sender_for: SenderFor,
    breakers: Breakers | None = None,
    clock: Clock = SYSTEM,
    turn: Turn | None = None,
) -> list[Settlement]:
    """Plans, sends and decides; the caller settles each source message as decided.

    With ``breakers`` an unreachable target holds the batch here until it answers again
    (the caller keeps the source locks meanwhile), so an outage costs no delivery.
    ``clock``: what the pauses between send retries wait on. ``turn``: the batch's turn
    among batches handled side by side (``turns.SendTurns``): planned at once, sent in turn.
    A batch with messages of a session or partition key ends its turn once the targets
    accepted them (a failed one is not overtaken); any other once its messages are on their
    links, so the next batch's sends follow them on the wire while their answers are out."""
    pipeline = task.pipeline or task.name
    with batch_span(pipeline, messages) as span:
        settlements = await _process(task, messages, sender_for, breakers, clock, turn, pipeline)
        if span is not None:
            decided = Counter(settlement.decision.value for settlement in settlements)
            span.set_attributes({f"replication.{k}": v for k, v in decided.items()})
    return settlements


async def _process(
    task: ReplicationTask,
    messages: list[Message],
    sender_for: SenderFor,
    breakers: Breakers | None,
    clock: Clock,
    turn: Turn | None,
    pipeline: str,
) -> list[Settlement]:
    try:
        outcomes = [task.plan(message) for message in messages]
        outputs: list[Message] = []
        owners: list[int] = []
        for index, outcome in enumerate(outcomes):
            for output in outcome.outputs:
                outputs.append(output)
                owners.append(index)
        if turn is None:
            result = await send_ordered(outputs, sender_for, task.policy, breakers, clock)
        else:
            # keyed: the next batch waits for the answer; else only for these to be on the wire
            on_wire = None if any(_keyed(output) for output in outputs) else turn.end
            async with turn:
                result = await send_ordered(
                    outputs, sender_for, task.policy, breakers, clock, queued=on_wire
                )
    finally:
        if turn is not None:
            turn.end()
    record_lag(pipeline, messages, outputs, owners, result)
    failed = {owners[i]: result.errors[i] for i in result.failed()}
    settlements = []
    failed_sessions: set[str] = set()
    for index, (message, outcome) in enumerate(zip(messages, outcomes, strict=True)):
        if outcome.dead_letter is not None:
            reason, description = outcome.dead_letter
            settlements.append(Settlement(message, Decision.DEAD_LETTER, reason, description))
        elif index in failed:
            error = failed[index]
            session = message.session_id
            held_back = session is not None and session in failed_sessions
            decision = Decision.RELEASE if held_back else Decision.ABANDON
            settlements.append(
                Settlement(message, decision, "SendFailed", repr(error), error=error)
            )
            if session is not None:
                failed_sessions.add(session)
        else:
            settlements.append(  # by position: a keyword call costs twice as much
                Settlement(message, Decision.COMPLETE, "", "", len(outcome.outputs))
            )
    return settlements
