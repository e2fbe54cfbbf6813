"""The metrics a worker process counts, relayed to the host that serves them.

Functions count what they do (``metrics``: forwarded, filtered, dead-lettered, the lag
per copy, the recovery point) in the process they run in. In Azure the worker exports its
own; the local host shows them in ``/metrics``, the progress display and the dashboard,
which read the host's process. So each of the worker's replies carries what changed since
its previous one (``Relay.take``: counter increments, gauge values set, lag aggregated as
``telemetry.lag.Distribution``), and the host adds it to its own instruments (``apply``).

The dashboard also shows where each failover target of a generated function sends now, which
the function's runtime resolves as it sends: the replies carry each such target's state when
it changed, and the host keeps a view of it (``runtime_targets``: what the dashboard reads
of a ``tasks.targets.Target``, its ``failover`` a ``FailoverView`` that tells its listeners
of a switch as ``failover.Failover`` does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import metrics
from ..failover.base import Resolution
from ..failover.runtime import connection_for
from ..generated import generated
from ..telemetry.instruments import Counter, Gauge
from ..telemetry.lag import Distribution, Key

if TYPE_CHECKING:
    from ..failover.runtime import Failover

Labels = tuple[str, ...]


@dataclass(slots=True, frozen=True)
class FailoverState:
    """A failover endpoint as the worker's runtime has it now (picklable)."""

    name: str
    resolver: str
    """The resolver's ``describe()``."""
    base_connection: str
    host_map: dict[str, str]
    resolution: Resolution | None
    switches: int


@dataclass(slots=True, frozen=True)
class TargetState:
    """A failover target of a generated function's runtime (picklable)."""

    entity: str
    connection_string: str
    failover: FailoverState


@dataclass(slots=True)
class Changes:
    """What the worker's instruments did since the last take (picklable)."""

    counters: dict[str, dict[Labels, float]] = field(default_factory=dict)
    gauges: dict[str, dict[Labels, float]] = field(default_factory=dict)
    lag: dict[Key, Distribution] = field(default_factory=dict)
    targets: dict[str, list[TargetState]] = field(default_factory=dict)
    """Function name -> its failover targets, for the functions whose targets changed."""

    def __bool__(self) -> bool:
        return bool(self.counters or self.gauges or self.lag or self.targets)


class Relay:
    """The worker's side: what changed since the previous ``take`` (``functions``: the
    worker's functions by name, whose runtimes' failover targets it follows)."""

    def __init__(self, functions: dict[str, Callable[..., Any]] | None = None) -> None:
        self._functions = functions or {}
        self._counted: dict[str, dict[Labels, float]] = {}
        self._gauged: dict[str, dict[Labels, float]] = {}
        self._targets: dict[str, list[TargetState]] = {}
        self._lag = metrics.LAG.reader()

    def take(self) -> Changes:
        changes = Changes(lag=self._lag.take(), targets=self._changed_targets())
        for instrument in metrics.INSTRUMENTS:
            if isinstance(instrument, Counter):
                seen = self._counted.setdefault(instrument.name, {})
                deltas = {}
                for labels, value in instrument.values().items():
                    if value != seen.get(labels, 0.0):
                        deltas[labels] = value - seen.get(labels, 0.0)
                        seen[labels] = value
                if deltas:
                    changes.counters[instrument.name] = deltas
            else:
                shown = self._gauged.setdefault(instrument.name, {})
                values = {k: v for k, v in instrument.values().items() if shown.get(k) != v}
                if values:
                    shown.update(values)
                    changes.gauges[instrument.name] = values
        return changes

    def _changed_targets(self) -> dict[str, list[TargetState]]:
        changed = {}
        for name, function in self._functions.items():
            info = generated(function)
            if info is None or not info.runtime:
                continue
            states = [
                TargetState(t.entity, t.connection_string, _state(t.failover))
                for t in info.runtime[0].targets.values()
                if t.failover is not None
            ]
            if states != self._targets.get(name, []):
                changed[name] = self._targets[name] = states
        return changed


def _state(failover: Failover) -> FailoverState:
    return FailoverState(
        failover.name,
        failover.resolver.describe(),
        failover.base_connection,
        failover.host_map,
        failover.resolution,
        failover.switches,
    )


@dataclass(slots=True)
class Described:
    """A resolver as the dashboard reads it: its description."""

    text: str

    def describe(self) -> str:
        return self.text


class FailoverView:
    """The host's view of a worker's failover endpoint (what the dashboard reads of a
    ``failover.Failover``); its listeners hear of each switch the worker made."""

    def __init__(self, state: FailoverState) -> None:
        self.state = state
        self.resolver = Described(state.resolver)
        self._listeners: list[Callable[[str, str], None]] = []

    name = property(lambda self: self.state.name)
    resolution = property(lambda self: self.state.resolution)
    switches = property(lambda self: self.state.switches)

    @property
    def host(self) -> str | None:
        return self.state.resolution.host if self.state.resolution else None

    def connection_for(self, host: str) -> str:
        return connection_for(self.state.base_connection, host, self.state.host_map)

    def on_switch(self, listener: Callable[[str, str], None]) -> None:
        self._listeners.append(listener)

    def update(self, state: FailoverState) -> None:
        old, self.state = self.host, state
        self.resolver = Described(state.resolver)
        if old is not None and self.host is not None and old != self.host:
            before, after = self.connection_for(old), self.connection_for(self.host)
            for listener in list(self._listeners):
                listener(before, after)


@dataclass(slots=True)
class TargetView:
    entity: str
    connection_string: str
    failover: FailoverView


_TARGETS: dict[str, list[TargetView]] = {}


def runtime_targets(function: str) -> list[TargetView]:
    """The failover targets of a function that runs in a worker process, as last relayed."""
    return list(_TARGETS.get(function, []))


def apply(changes: Changes) -> None:
    """The host's side: the worker's changes into this process's instruments."""
    by_name: dict[str, Counter | Gauge] = {i.name: i for i in metrics.INSTRUMENTS}
    for name, deltas in changes.counters.items():
        counter = by_name[name]
        assert isinstance(counter, Counter)
        for labels, delta in deltas.items():
            counter.labels(*labels).inc(delta)
    for name, values in changes.gauges.items():
        gauge = by_name[name]
        assert isinstance(gauge, Gauge)
        for labels, value in values.items():
            gauge.labels(*labels).set(value)
    for (pipeline, target, scope), distribution in changes.lag.items():
        metrics.LAG.add(pipeline, target, scope, distribution)
    for function, states in changes.targets.items():
        views = {(v.entity, v.failover.name): v for v in _TARGETS.get(function, [])}
        kept = []
        for state in states:
            view = views.get((state.entity, state.failover.name))
            if view is None:
                view = TargetView(
                    state.entity, state.connection_string, FailoverView(state.failover)
                )
            else:
                view.failover.update(state.failover)
            kept.append(view)
        _TARGETS[function] = kept
