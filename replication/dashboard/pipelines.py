"""The local host's pipelines as the dashboard shows them: counts, their history, endpoints.

Counts come from ``metrics`` (what ``/metrics`` serves), sampled every ``interval`` seconds
into a ring of the last ``HISTORY`` seconds, so the page can draw rates and backlog over
time from the first look. Endpoints are the pipelines file's, with the namespace each
source reads now (a failover source: which resolver, what it resolved to, when it last
switched and how the resolver found the answer).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .. import metrics
from ..failover.runtime import endpoint_host
from ..generated import pipeline_name
from ..telemetry.lag import HOP

if TYPE_CHECKING:
    from ..failover.runtime import Failover
    from ..pipeline import Endpoint, Pipeline


class PipelineHost(Protocol):
    """What the board reads of a running local host (``host.app.Host`` has it): the
    pipelines' names, their runners (trigger runners and pumps, read by attribute), the
    pipelines file's pipelines and the app settings. The host composes the board, so the
    board knows the host only through this."""

    @property
    def runners(self) -> Sequence[Any]: ...
    @property
    def pipeline_set(self) -> Sequence[Pipeline]: ...
    @property
    def settings(self) -> Mapping[str, str]: ...
    def pipelines(self) -> list[str]: ...
    def runtime_targets(self, runner: Any) -> list[Any]:
        """The targets of the pipeline a runner's function runs (``tasks.targets.Target``:
        ``entity``, ``connection_string``, ``failover``), once its first batch built them."""
        ...


HISTORY = 600.0
"""Seconds of samples kept (the page's chart shows the last ten minutes)."""
FIELDS = ("received", "forwarded", "filtered", "dead_lettered", "failed_batches", "backlog")


@dataclass
class Switch:
    at: float
    old: str
    new: str
    chain: tuple[str, ...]


@dataclass
class PipelineBoard:
    """Samples the host's pipeline metrics and describes its pipelines (``host``: a running
    local host)."""

    host: PipelineHost
    interval: float = 2.0
    clock: Callable[[], float] = time.time
    samples: dict[str, deque[tuple[float, ...]]] = field(default_factory=dict)
    switches: dict[str, list[Switch]] = field(default_factory=dict)
    _watched: dict[int, str | None] = field(default_factory=dict)
    """id(failover) -> the host it resolved to when last seen (a switch's "from")."""

    def sample(self) -> None:
        """Takes one sample of every pipeline (and starts watching new failover sources)."""
        now = self.clock()
        keep = int(HISTORY / self.interval) + 1
        for name in self.host.pipelines():
            counts = metrics.counts(name)
            ring = self.samples.setdefault(name, deque(maxlen=keep))
            ring.append((now, *(float(counts[f]) for f in FIELDS)))
        for failover in self._failovers():
            if id(failover) not in self._watched:
                failover.on_switch(self._switched(failover))
            self._watched[id(failover)] = failover.host

    def _failovers(self) -> list[Failover]:
        """Every failover endpoint the host runs: its sources' and its pipelines' targets'."""
        found: list[Failover] = []
        for runner in self.host.runners:
            source = getattr(runner, "failover", None)  # a transactional pipeline's pump: none
            if source is not None:
                found.append(source)
            targets = self.host.runtime_targets(runner)
            found += [t.failover for t in targets if t.failover is not None]
        return found

    def _switched(self, failover: Failover) -> Callable[[str, str], None]:
        def record(old: str, new: str) -> None:
            resolution = failover.resolution
            chain = tuple(resolution.chain) if resolution is not None else ()
            before = self._watched.get(id(failover)) or endpoint_host(old)
            after = failover.host or endpoint_host(new)
            self._watched[id(failover)] = after
            self.switches.setdefault(failover.name, []).append(
                Switch(self.clock(), before, after, chain)
            )

        return record

    def history(self) -> dict[str, list[list[float]]]:
        """Per pipeline: ``[time, received, forwarded, filtered, dead_lettered,
        failed_batches, backlog]`` rows, oldest first."""
        return {name: [list(row) for row in ring] for name, ring in self.samples.items()}

    def describe(self) -> list[dict[str, Any]]:
        configured = {p.name: p for p in self.host.pipeline_set}
        found = []
        for name in self.host.pipelines():
            counts = metrics.counts(name)
            ring = self.samples.get(name)
            found.append(
                {
                    "name": name,
                    "counts": {f: counts[f] for f in FIELDS},
                    "rate": _rate(ring),
                    "lag": lag_now(name),
                    "rpo": recovery_point_now(name),
                    "sources": [self._source(r) for r in self.host.runners if _pipeline(r) == name],
                    "targets": self._targets(name, configured.get(name)),
                }
            )
        return found

    def _targets(self, name: str, pipeline: Pipeline | None) -> list[dict[str, Any]]:
        """The pipeline file's targets; where the pipeline runs, each failover target with
        the namespace its sends go to now."""
        running = [
            t
            for r in self.host.runners
            if _pipeline(r) == name
            for t in self.host.runtime_targets(r)
        ]
        found = []
        settings = self.host.settings
        for role, endpoint in _endpoints(pipeline):
            connection = settings.get(endpoint.connection, "")
            item: dict[str, Any] = {
                "role": role,
                "entity": endpoint.entity,
                "connection": endpoint.connection,
                "namespace": endpoint_host(connection),
                "failover": None,
            }
            if endpoint.failover is not None:
                failover = next(
                    (
                        t.failover
                        for t in running
                        if t.failover is not None
                        and t.entity == endpoint.entity
                        and t.connection_string == connection
                    ),
                    None,
                )
                item["failover"] = (
                    self._failover(failover)
                    if failover is not None
                    else {
                        "resolver": endpoint.failover.describe(),
                        "resolved": None,
                        "switches": 0,
                        "chain": [],
                        "last_switch": None,
                    }
                )
                if failover is not None and failover.host:
                    item["namespace"] = endpoint_host(failover.connection_for(failover.host))
            found.append(item)
        return found

    def _failover(self, failover: Failover) -> dict[str, Any]:
        resolution = failover.resolution
        switches = self.switches.get(failover.name)
        last = switches[-1] if switches else None
        return {
            "name": failover.name,
            "resolver": failover.resolver.describe(),
            "resolved": failover.host,
            "chain": list(resolution.chain) if resolution is not None else [],
            "switches": failover.switches,
            "last_switch": None
            if last is None
            else {
                "at": last.at,
                "from": last.old,
                "to": last.new,
                "why": list(last.chain),
            },
        }

    def _source(self, runner: Any) -> dict[str, Any]:
        failover = getattr(runner, "failover", None)
        found: dict[str, Any] = {
            "entity": _entity(runner),
            "connection": _connection_name(runner),
            "namespace": endpoint_host(runner.connection_string),
            "failover": None,
        }
        if failover is not None:
            found["failover"] = self._failover(failover)
        return found


def lag_now(pipeline: str) -> dict[str, float | None]:
    """How far behind the pipeline's copies are now (seconds, this hop, the worst target):
    the last copy's lag and the largest in the lag window; None before any copy."""
    last = [v for (p, _, scope), v in metrics.LAG.last().items() if p == pipeline and scope == HOP]
    peak = [
        v for (p, _, scope), v in metrics.LAG.window_max().items() if p == pipeline and scope == HOP
    ]
    return {
        "last": max(last) if last else None,
        "max": max(peak) if peak else None,
        "window": metrics.LAG.window,
    }


def recovery_point_now(pipeline: str) -> dict[str, float] | None:
    """The pipeline's recovery point at its sources, as last probed (the worst source: the
    oldest message not yet replicated, and how many wait); None before the first probe."""
    seconds = [v for (p, _), v in metrics.RPO_SECONDS.values().items() if p == pipeline]
    messages = [v for (p, _), v in metrics.RPO_MESSAGES.values().items() if p == pipeline]
    if not seconds:
        return None
    return {"seconds": max(seconds), "messages": sum(messages)}


def _rate(ring: deque[tuple[float, ...]] | None, window: float = 10.0) -> float:
    """Messages received per second over about the last ``window`` seconds."""
    if not ring or len(ring) < 2:
        return 0.0
    last = ring[-1]
    first = next((row for row in ring if row[0] >= last[0] - window), ring[0])
    if first is last:
        first = ring[-2]
    span = last[0] - first[0]
    return (last[1] - first[1]) / span if span > 0 else 0.0


def _pipeline(runner: Any) -> str:
    pipeline = getattr(runner, "pipeline", None)
    if isinstance(pipeline, str):  # the task pump of a transactional pipeline
        return pipeline
    trigger = runner.trigger
    return pipeline_name(trigger.function, trigger.name)


def _entity(runner: Any) -> str:
    entity = getattr(runner, "entity", None)
    if isinstance(entity, str):
        return entity
    return str(runner.trigger.entity)


def _connection_name(runner: Any) -> str | None:
    trigger = getattr(runner, "trigger", None)
    return getattr(trigger, "connection", None) or getattr(runner, "connection", None)


def _endpoints(pipeline: Pipeline | None) -> list[tuple[str, Endpoint]]:
    """(role, endpoint) of each target a pipeline sends to."""
    if pipeline is None:
        return []
    endpoints = [("target", pipeline.target), ("default", pipeline.default)]
    endpoints += [(f"route {route.when}", route.target) for route in pipeline.routes or ()]
    endpoints.append(("error target", pipeline.error_target))
    return [(role, endpoint) for role, endpoint in endpoints if endpoint is not None]
