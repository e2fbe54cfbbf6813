"""Building a pipeline: what runs it, from a checked ``Pipeline`` and the app settings.

Each step is built through the step registry (a ``route`` step appended for ``routes``), each
target's connection resolved to a ``Target`` (with its failover), one ``ReplicationTask`` per
source. What only the settings can tell (a missing or wrong connection, a transaction across
namespaces, a key a step reads) is reported here, located in the pipeline file.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..clock import SYSTEM, Clock
from ..configproblems import Loc
from ..failover import Failover
from ..servicebus.connection_string import namespace_of
from ..tasks.recovery_point import RecoveryPointProbe, peek_limit_setting
from ..tasks.registry import build_step
from ..tasks.steps import BoundStep, StepConfigError, StepContext
from ..tasks.targets import DEFAULT_TARGET_NAME, Target
from ..tasks.task import ReplicationTask
from .settings import missing_reason, resolve_connection, setting_namespace
from .spec import Endpoint

if TYPE_CHECKING:  # model.py imports this module for Pipeline.build
    from .model import Pipeline

log = logging.getLogger("replication.pipeline")


@dataclass(slots=True)
class BuiltPipeline:
    """What a runner needs: the task(s), the targets and the sources to read."""

    pipeline: Pipeline
    tasks: list[ReplicationTask]
    """One per source (same order as ``sources`` and ``function_names()``); they share the
    built steps, so stateful steps (dedupe, chain) see the merged stream."""
    targets: dict[str | None, Target]
    sources: list[Endpoint]
    source_failovers: list[Failover | None] = field(default_factory=list)
    """Per source: where it is read now, when its endpoint has ``failover`` (else None)."""

    @property
    def task(self) -> ReplicationTask:
        """The task of the first (usually only) source."""
        return self.tasks[0]

    def transaction_targets(self) -> dict[str | None, str] | None:
        """For a ``transactional`` pipeline, each target's entity by target name (what
        ``tasks.pump.pump`` sends to via the source, in the batch's transaction); else None."""
        if not self.pipeline.transactional:
            return None
        return {name: target.entity for name, target in self.targets.items()}


def build_pipeline(
    pipeline: Pipeline, settings: Mapping[str, str], context: StepContext | None = None
) -> BuiltPipeline:
    """The runnable pipeline (``Pipeline.build``)."""
    problems: list[tuple[Loc, str]] = []
    targets: dict[str | None, Target] = {}
    target_namespaces: dict[str | None, str] = {}
    for key, (endpoint, loc) in pipeline.target_locs().items():
        resolved = resolve_connection(settings, endpoint.connection, role="target")
        if isinstance(resolved, str) and not resolved.startswith("!"):
            failover = _failover(pipeline, endpoint, resolved, settings, key or DEFAULT_TARGET_NAME)
            targets[key] = Target(resolved, endpoint.entity, failover, endpoint.is_event_hub)
            target_namespaces[key] = namespace_of(resolved)
        else:
            problems.append(((*loc, "connection"), missing_reason(resolved, endpoint, settings)))
    source_namespaces: list[str | None] = []
    source_failovers: list[Failover | None] = []
    for index, endpoint in enumerate(pipeline.sources):
        loc = pipeline.source_loc(index)
        resolved = resolve_connection(settings, endpoint.connection, role="source")
        if resolved == "fqns" and endpoint.failover is not None:
            problems.append(
                (
                    (*loc, "failover"),
                    (
                        f"failover needs a connection string in {endpoint.connection!r} (its keys "
                        "are used on every namespace); an identity-based connection has none"
                    ),
                )
            )
        elif isinstance(resolved, str) and not resolved.startswith("!"):
            source_namespaces.append(setting_namespace(settings, endpoint.connection))
            role = "source" if len(pipeline.sources) == 1 else f"sources[{index}]"
            source_failovers.append(_failover(pipeline, endpoint, resolved, settings, role))
        else:
            problems.append(((*loc, "connection"), missing_reason(resolved, endpoint, settings)))
    if pipeline.transactional:
        for key, namespace in target_namespaces.items():
            if any(namespace != source for source in source_namespaces if source):
                endpoint, loc = pipeline.target_locs()[key]
                problems.append(
                    (
                        (*loc, "connection"),
                        (
                            f"transactional: the target {endpoint.entity!r} is on namespace "
                            f"{namespace!r}, the source on {source_namespaces[0]!r}; a Service "
                            "Bus transaction cannot span namespaces"
                        ),
                    )
                )
    context = context or StepContext(settings=settings)
    steps: list[BoundStep] = []
    for index, (name, options) in enumerate(pipeline.steps):
        try:
            steps.append(build_step(name, options, context))
        except StepConfigError as exc:
            problems.append(((*pipeline.loc("steps", index), name), str(exc)))
    route = pipeline.route_options()
    if route is not None:
        steps.append(build_step("route", route, context))
    if problems:
        raise pipeline.positions().error(problems)
    tasks = [
        ReplicationTask(
            function,
            steps=list(steps),
            source_namespace=namespace,
            target_namespaces=dict(target_namespaces),
            loop_guard=pipeline.loop_guard,
            pipeline=pipeline.name,
            session_id_from_key=source.session_id_from == "partition_key",
        )
        for function, namespace, source in zip(
            pipeline.function_names(), source_namespaces, pipeline.sources, strict=True
        )
    ]
    return BuiltPipeline(pipeline, tasks, targets, list(pipeline.sources), source_failovers)


def _failover(
    pipeline: Pipeline,
    endpoint: Endpoint,
    connection: str,
    settings: Mapping[str, str],
    role: str,
    clock: Clock = SYSTEM,
) -> Failover | None:
    if endpoint.failover is None or connection == "fqns":
        return None
    return endpoint.failover.build(
        f"{pipeline.name}/{role}", connection, settings, pipeline.base_dir, clock
    )


def recovery_point_probes(
    pipeline: Pipeline, settings: Mapping[str, str], clock: Clock = SYSTEM
) -> list[RecoveryPointProbe | None]:
    """A ``RecoveryPointProbe`` per source (``Pipeline.recovery_point_probes``), through the
    source's failover when it has one; None for a source that cannot be probed: an event
    hub (no head to peek: ``tasks.recovery_point``), or an identity-based connection (no
    key to sign with). The peek limit is the app setting ``REPLICATION_RPO_PEEK_LIMIT``."""
    limit = peek_limit_setting(settings)
    probes: list[RecoveryPointProbe | None] = []
    for index, endpoint in enumerate(pipeline.sources):
        resolved = resolve_connection(settings, endpoint.connection, role="source")
        if endpoint.is_event_hub or resolved.startswith("!") or resolved == "fqns":
            if resolved == "fqns" and not endpoint.is_event_hub:
                log.info(
                    "%s: source %s uses an identity-based connection: its RPO is not probed",
                    pipeline.name,
                    endpoint.entity,
                )
            probes.append(None)
            continue
        role = "source" if len(pipeline.sources) == 1 else f"sources[{index}]"
        failover = _failover(pipeline, endpoint, resolved, settings, f"{role} (rpo)", clock)
        probes.append(
            RecoveryPointProbe(
                pipeline.name,
                endpoint.entity,
                endpoint.subscription,
                failover or resolved,
                clock=clock,
                peek_limit=limit,
            )
        )
    return probes
