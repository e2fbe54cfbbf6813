"""Editor steps: small pure functions over ``Message``, registered by name with typed options.

A step is registered by name with ``@step(name, Options)``; ``replication.tasks.registry``
looks steps up, lists them and builds one from its options once
(``build_step("transcode", {...}, context)``). The built step is then called per message: it
returns the messages that go on (none: filtered out, several: split or routed). A step that
cannot handle a message raises ``StepFailed`` with a reason; the chain then applies that
step's error path (``on_error``): dead-letter the source message with the reason (the
default), drop it (logged), or send it to ``error_target`` with the reason in its
properties. Any other exception a step raises on bad input is treated the same way, so one
bad message never fails a batch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..messages import Message

log = logging.getLogger("replication.tasks")

ERROR_STEP = "repl-error-step"
ERROR_REASON = "repl-error-reason"
ERROR_DESCRIPTION = "repl-error-description"


class StepFailed(Exception):
    """A message this step cannot process: ``reason`` is short (a dead-letter reason),
    ``description`` says what exactly was wrong."""

    def __init__(self, reason: str, description: str = "") -> None:
        super().__init__(f"{reason}: {description}" if description else reason)
        self.reason = reason
        self.description = description


class StepConfigError(ValueError):
    """A step named or configured wrongly (caught when the pipeline is loaded)."""


class StepOptions(BaseModel):
    """Options every step has: what happens to a message it fails on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    on_error: Literal["dead-letter", "drop", "route"] = Field(
        "dead-letter",
        description="What happens to a message this step fails on: "
        "dead-lettered with the reason, dropped (logged), or routed to error_target.",
    )
    error_target: str | None = None

    @model_validator(mode="after")
    def _route_needs_target(self) -> StepOptions:
        if self.on_error == "route" and not self.error_target:
            raise ValueError("on_error 'route' needs error_target")
        return self


@dataclass(slots=True)
class StepContext:
    """What steps may use besides the message: settings (keys, endpoints) and a clock."""

    settings: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    now: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))

    def setting(self, name: str) -> str:
        value = self.settings.get(name)
        if not value:
            raise StepConfigError(f"setting {name!r} is not set")
        return value


Step = Callable[[Message], list[Message]]
Builder = Callable[[Any, StepContext], Step]


@dataclass(slots=True, frozen=True)
class StepSpec:
    name: str
    options: type[StepOptions]
    build: Builder
    doc: str = ""


STEPS: dict[str, StepSpec] = {}
"""The steps ``@step`` registered, by name: look them up through ``replication.tasks.registry``,
which imports the built-in steps first."""


def step(name: str, options: type[StepOptions] = StepOptions) -> Callable[[Builder], Builder]:
    """Registers a step builder: ``build(options, context) -> (message -> list[message])``."""

    def register(build: Builder) -> Builder:
        if name in STEPS:
            raise ValueError(f"step {name!r} registered twice")
        STEPS[name] = StepSpec(name, options, build, (build.__doc__ or "").strip())
        return build

    return register


@dataclass(slots=True, frozen=True)
class BoundStep:
    """A step with its options, ready to run."""

    name: str
    options: StepOptions
    run: Step


# ---------------------------------------------------------------------- running a chain


@dataclass(slots=True)
class Outcome:
    """What a chain made of one source message."""

    outputs: list[Message] = field(default_factory=list)
    """To send, in order (``target`` set by routers and error routes)."""
    dead_letter: tuple[str, str] | None = None
    """(reason, description): dead-letter the source message instead of sending anything."""
    dropped: list[tuple[str, str]] = field(default_factory=list)
    """(step, reason) of messages dropped on an error path (filtered ones are not listed)."""


def run_chain(message: Message, steps: list[BoundStep]) -> Outcome:
    """Runs ``message`` through ``steps``; a failure takes the failing step's error path."""
    outcome = Outcome()
    current = [message]
    for bound in steps:
        following: list[Message] = []
        for item in current:
            try:
                following += bound.run(item)
            except Exception as exc:  # bad input: the step's error path, never a crash
                failure = (
                    exc if isinstance(exc, StepFailed) else StepFailed(type(exc).__name__, str(exc))
                )
                if not _take_error_path(bound, item, failure, outcome):
                    return outcome
        current = following
    outcome.outputs[:0] = current
    return outcome


def _take_error_path(
    bound: BoundStep, message: Message, failure: StepFailed, outcome: Outcome
) -> bool:
    """Applies the step's ``on_error``; False when the source is to be dead-lettered."""
    policy = bound.options.on_error
    if policy == "drop":
        log.warning("step %s dropped message %s: %s", bound.name, message.message_id, failure)
        outcome.dropped.append((bound.name, str(failure)))
        return True
    if policy == "route":
        props = dict(message.application_properties)
        props[ERROR_STEP] = bound.name
        props[ERROR_REASON] = failure.reason
        props[ERROR_DESCRIPTION] = failure.description[:1024]
        outcome.outputs.append(
            message.copy(application_properties=props, target=bound.options.error_target)
        )
        return True
    outcome.outputs.clear()
    outcome.dead_letter = (f"{bound.name}: {failure.reason}", failure.description[:4096])
    return False
