"""Deployment checks for ``validate``: will a poison message be dead-lettered alone?

A pipeline whose steps (or router) can decide to dead-letter a message, without an
``error_target``, needs per-message settlement: functions that take the SDK-type bindings
(``ServiceBusMessageActions``), so it can dead-letter the bad one itself (with
``autoCompleteMessages`` on the host completes only what the function left unsettled), and
the extension package in requirements.txt. A function that settles per batch
(``azure.functions.ServiceBusMessage`` with auto-complete) can only fail the whole batch:
every healthy message in it is redelivered with the bad one until MaxDeliveryCount
dead-letters them all. These checks say so before it is deployed.

A pipeline reading an event hub has no dead-letter queue to send to: what its steps would
dead-letter goes to its ``error_target``, else it is only logged; ``validate`` says so.

A ``transactional`` pipeline is no function at all: the local host runs it with the task
pump, and Azure Functions cannot run it (``register_pipelines`` and ``package`` refuse it).
``validate`` warns (the same file may be meant for the local host only).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ..generated import pipeline_of
from ..tasks.pump import Source

if TYPE_CHECKING:
    from ..pipeline import Pipeline, PipelineFile

EXTENSION = "azurefunctions-extensions-bindings-servicebus"


def settlement_warnings(
    pipelines: PipelineFile, folder: Path, settings: dict[str, str]
) -> list[str]:
    """Warnings for the app in ``folder`` (function_app.py, requirements.txt), if any."""
    risky = {
        p.name: why
        for p in pipelines.pipelines
        if not all(s.is_event_hub for s in p.sources) and (why := _can_dead_letter(p))
    }
    if not risky:
        return []
    warnings = []
    requirements = folder / "requirements.txt"
    if requirements.is_file() and not _lists(requirements.read_text(), EXTENSION):
        warnings.append(
            f"{requirements}: {EXTENSION} is not listed; function_app.py cannot settle "
            "messages one at a time in Azure without it"
        )
    app_file = folder / "function_app.py"
    if app_file.is_file():
        sources = {
            (s.connection, str(Source(s.entity, s.subscription))): p.name
            for p in pipelines.pipelines
            for s in p.sources
        }
        warnings += _batch_settled(app_file, risky, sources, settings)
    return warnings


def transactional_warnings(pipelines: PipelineFile) -> list[str]:
    """One warning per transactional pipeline: not deployable as Azure Functions."""
    from ..pipeline.model import NO_TRANSACTIONS

    _, why = NO_TRANSACTIONS["functions"]
    return [
        f"pipeline {p.name!r} is transactional: the local host (python -m replication start) "
        f"runs it with the task pump, but Azure Functions cannot ({why}): register_pipelines "
        "and python -m replication package refuse it"
        for p in pipelines.pipelines
        if p.transactional
    ]


def event_hub_warnings(pipelines: PipelineFile) -> list[str]:
    """One warning per pipeline reading an event hub that can dead-letter without an
    ``error_target``: an event hub has no dead-letter queue, so such an event is only logged."""
    return [
        f"pipeline {p.name!r} reads event hub(s) "
        f"{', '.join(repr(s.eventhub) for s in p.sources if s.is_event_hub)} and can "
        f"dead-letter ({why}) without an error_target: an event hub has no dead-letter queue, "
        "so such events are logged and left behind; set error_target to keep them"
        for p in pipelines.pipelines
        if any(s.is_event_hub for s in p.sources) and (why := _can_dead_letter(p))
    ]


def _can_dead_letter(pipeline: Pipeline) -> str | None:
    """What in the pipeline can dead-letter a message (None: nothing, or an error target
    takes those messages)."""
    if pipeline.error_target is not None:
        return None
    for name, options in pipeline.steps:
        if options.get("on_error", "dead-letter") == "dead-letter":
            return f"step {name}"
    if pipeline.routes and pipeline.default is None and pipeline.unmatched == "dead-letter":
        return "routes with unmatched: dead-letter"
    return None


def _lists(requirements: str, package: str) -> bool:
    names = (
        re.split(r"[\s<>=!~;\[]", line.strip(), maxsplit=1)[0] for line in requirements.splitlines()
    )
    return any(n.lower().replace("_", "-") == package for n in names if n)


def _batch_settled(
    app_file: Path,
    risky: dict[str, str],
    sources: dict[tuple[str, str], str],
    settings: dict[str, str],
) -> list[str]:
    """Warnings for the functions that read a risky pipeline's source and settle per batch
    (a function is matched by the pipeline it was generated for, else by its source)."""
    from ..functions import pumped_by_host
    from .bindings import is_sdk_type
    from .discovery import load_app, service_bus_triggers

    try:
        # azure.functions warns that an app without HTTP has no auth level; loaded as the
        # local host loads it (a transactional pipeline has its own warning, not this error)
        with _quiet(), pumped_by_host():
            app = load_app(app_file)
            triggers = service_bus_triggers(app, settings)
    except Exception as exc:  # not importable here: say so, the rest was checked
        return [f"{app_file}: cannot check how it settles messages ({exc})"]
    warnings = []
    for trigger in triggers:
        pipeline = pipeline_of(trigger.function)
        source = (trigger.connection, trigger.entity)
        name = sources.get(source) if pipeline is None else pipeline.name
        if name not in risky:
            continue
        per_message = is_sdk_type(trigger.annotation) and trigger.settlement_arg is not None
        if not per_message:
            warnings.append(
                f"{app_file}: function {trigger.name} settles its batch as a whole, but pipeline "
                f"{name!r} can dead-letter ({risky[name]}): one bad message fails the "
                "batch and its healthy neighbours are redelivered until MaxDeliveryCount "
                "dead-letters them too. Take ServiceBusReceivedMessage and "
                "ServiceBusMessageActions (as replication.functions.register_pipelines "
                "does), or give it an error_target."
            )
    return warnings


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
