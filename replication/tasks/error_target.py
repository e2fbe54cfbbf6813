"""Dead-letter decisions sent to a pipeline's ``error_target`` instead of the source's
dead-letter queue: one place for the Functions runtime and the Spark executors.

The copy carries the decision as ``DeadLetterReason`` / ``DeadLetterErrorDescription``
application properties (what the dead-letter queue would have shown); the source message is
completed once the error target accepted it, and abandoned (comes again) if it refused.
"""

from __future__ import annotations

from ..clock import SYSTEM, Clock
from .breaker import Breakers
from .sender import SenderFor, send_ordered
from .task import Decision, ReplicationTask, Settlement

ERROR_TARGET = "error_target"
"""The target name a pipeline's error target has in its ``SenderPool``."""


async def divert_to_error_target(
    dead: list[Settlement],
    task: ReplicationTask,
    sender_for: SenderFor,
    breakers: Breakers | None = None,
    clock: Clock = SYSTEM,
) -> None:
    """Sends ``dead`` (dead-letter decisions) to the error target and turns each decision
    into complete (accepted) or abandon (refused)."""
    copies = []
    for item in dead:
        props = dict(item.message.application_properties)
        props["DeadLetterReason"] = item.reason
        props["DeadLetterErrorDescription"] = item.description
        copies.append(item.message.copy(application_properties=props, target=ERROR_TARGET))
    result = await send_ordered(copies, sender_for, task.policy, breakers, clock)
    for index, item in enumerate(dead):
        error = result.errors[index]
        if error is None:
            item.decision, item.outputs = Decision.COMPLETE, 1
        else:
            item.decision, item.description, item.error = Decision.ABANDON, repr(error), error
