"""The router: one source, many targets, chosen by ordered conditions.

``route`` checks its routes in order and sends the message to the first route whose
condition (the broker's SQL filter grammar, ``body.`` fields allowed) is TRUE; ``fanout``
sends a copy to every matching route. A message no route takes goes to ``default`` when
set, else it is dropped (logged) or dead-lettered, as ``unmatched`` says.
"""

from __future__ import annotations

import logging
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator

from ..messages import Message
from .facts import compile_condition
from .steps import Step, StepContext, StepFailed, StepOptions, step

log = logging.getLogger("replication.tasks.router")


class Route(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    when: str
    target: str

    @field_validator("when")
    @classmethod
    def _parses(cls, text: str) -> str:
        compile_condition(text)  # a syntax error names the position now, at load
        return text


class RouteOptions(StepOptions):
    routes: list[Route]
    default: str | None = None
    unmatched: Literal["drop", "dead-letter"] = "dead-letter"
    mode: Literal["first", "all"] = "first"
    """first: the first matching route only; all: a copy per matching route."""


@step("route", RouteOptions)
def route(options: RouteOptions, context: StepContext) -> Step:
    """Sets each message's target from the first (or every) matching route."""
    routes = [(compile_condition(r.when), r.target) for r in options.routes]

    def run(message: Message) -> list[Message]:
        chosen = []
        for condition, target in routes:
            if condition(message):
                chosen.append(target)
                if options.mode == "first":
                    break
        if not chosen and options.default is not None:
            chosen = [options.default]
        if not chosen:
            if options.unmatched == "drop":
                log.info("no route for message %s: dropped", message.message_id)
                return []
            raise StepFailed("NoRoute", "no route matched and there is no default")
        return [message.copy(target=target) for target in chosen]

    return run


__all__ = ["Route", "RouteOptions", "route"]
