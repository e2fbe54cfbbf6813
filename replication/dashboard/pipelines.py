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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import metrics
from ..failover.runtime import endpoint_host

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
    ``host.app.Host``)."""

    host: Any
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
        for runner in self.host.runners:
            failover = getattr(runner, "failover", None)
            if failover is not None and id(failover) not in self._watched:
                failover.on_switch(self._switched(failover))
            if failover is not None:
                self._watched[id(failover)] = failover.host

    def _switched(self, failover: Any) -> Callable[[str, str], None]:
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
        configured = {p.name: p for p in getattr(self.host, "pipeline_set", None) or ()}
        found = []
        for name in self.host.pipelines():
            counts = metrics.counts(name)
            ring = self.samples.get(name)
            found.append({
                "name": name,
                "counts": {f: counts[f] for f in FIELDS},
                "rate": _rate(ring),
                "sources": [self._source(r) for r in self.host.runners if _pipeline(r) == name],
                "targets": _targets(configured.get(name), self.host.settings),
            })  # fmt: skip
        return found

    def _source(self, runner: Any) -> dict[str, Any]:
        failover = getattr(runner, "failover", None)
        found: dict[str, Any] = {
            "entity": _entity(runner), "connection": _connection_name(runner),
            "namespace": endpoint_host(runner.connection_string), "failover": None,
        }  # fmt: skip
        if failover is not None:
            resolution = failover.resolution
            switches = self.switches.get(failover.name)
            last = switches[-1] if switches else None
            found["failover"] = {
                "name": failover.name,
                "resolver": failover.resolver.describe(),
                "resolved": failover.host,
                "chain": list(resolution.chain) if resolution is not None else [],
                "switches": failover.switches,
                "last_switch": None if last is None else {
                    "at": last.at, "from": last.old, "to": last.new, "why": list(last.chain),
                },
            }  # fmt: skip
        return found


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
    return str(getattr(trigger.function, "pipeline_name", trigger.name))


def _entity(runner: Any) -> str:
    entity = getattr(runner, "entity", None)
    if isinstance(entity, str):
        return entity
    return str(runner.trigger.entity)


def _connection_name(runner: Any) -> str | None:
    trigger = getattr(runner, "trigger", None)
    return getattr(trigger, "connection", None) or getattr(runner, "connection", None)


def _targets(pipeline: Any, settings: dict[str, str]) -> list[dict[str, Any]]:
    if pipeline is None:
        return []
    endpoints = [("target", pipeline.target), ("default", pipeline.default)]
    endpoints += [(f"route {route.when}", route.target) for route in pipeline.routes or ()]
    endpoints.append(("error target", pipeline.error_target))
    found = []
    for role, endpoint in endpoints:
        if endpoint is None:
            continue
        found.append({
            "role": role, "entity": endpoint.entity, "connection": endpoint.connection,
            "namespace": endpoint_host(settings.get(endpoint.connection, "")),
            "failover": endpoint.failover.describe() if endpoint.failover else None,
        })  # fmt: skip
    return found
