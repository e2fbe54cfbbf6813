"""A checked pipeline: what the runners (Functions, the local host, Spark) are given.

``check.py`` makes a ``Pipeline`` from each valid item of the file (``spec.py``); ``build()``
(``build.py``) turns it into what runs, given the app settings. A pipeline remembers where
it is in its file, so problems found later (at build, or a runner refusing it) are located
like those found when loading.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..clock import SYSTEM, Clock
from ..configproblems import Loc, Positions, did_you_mean
from ..tasks.recovery_point import RecoveryPointProbe
from ..tasks.steps import StepContext
from .build import BuiltPipeline, build_pipeline, recovery_point_probes
from .spec import DEFAULT_KEY, ERROR_TARGET_KEY, TARGET_KEY, Endpoint

TRANSACTIONAL_RUNNERS = (
    "the local host (python -m replication start) or the task pump "
    "(replication.tasks.pump.pump with transaction_targets=BuiltPipeline.transaction_targets())"
)
"""What runs a ``transactional`` pipeline: whatever receives from the source itself."""
NO_TRANSACTIONS: dict[str, tuple[str, str]] = {
    "functions": (
        "Azure Functions",
        (
            "the Functions host receives the source's messages and settles them on its own "
            "connection, which cannot join the transaction the copies are sent in"
        ),
    ),
    "spark": (
        "the Spark runner",
        ("its executors receive and settle each micro-batch outside any transaction"),
    ),
}
"""The runners that cannot run a ``transactional`` pipeline: (name, why)."""


@dataclass(frozen=True, slots=True)
class Route:
    when: str
    target: Endpoint
    key: str
    """The target name the route step gives matching messages (``route:0``, ...)."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a pipeline is in its file (for problems found after loading)."""

    positions: Positions
    loc: Loc
    single_source: bool = True


@dataclass(frozen=True, eq=False)
class Pipeline:
    """One validated pipeline. ``steps`` hold options ready for ``build_step``: a step's
    ``error_target`` is the name of its target (``error_target``, or ``error_target:<i>``
    for a step's own), and ``*_file`` paths are resolved against the pipeline file."""

    name: str
    sources: list[Endpoint]
    steps: list[tuple[str, dict[str, Any]]]
    target: Endpoint | None = None
    routes: list[Route] = field(default_factory=list)
    default: Endpoint | None = None
    unmatched: Literal["drop", "dead-letter"] = "dead-letter"
    route_mode: Literal["first", "all"] = "first"
    error_target: Endpoint | None = None
    step_error_targets: dict[str, Endpoint] = field(default_factory=dict)
    loop_guard: bool = False
    batch_size: int = 100
    concurrency: int | None = None
    backend: Literal["amqp", "sdk"] = "amqp"
    transactional: bool = False
    """Each batch's copies sent via the source queue and its completes in one transaction."""
    description: str | None = None
    base_dir: Path | None = None
    """The pipeline file's folder: relative paths in it (``*_file``, failover files) start here."""
    _origin: Origin | None = field(default=None, repr=False)

    def function_names(self) -> list[str]:
        """One Functions function name per source: ``orders_to_secondary``, or with several
        sources ``merge_1``, ``merge_2``, ... (in ``sources`` order)."""
        return function_names(self.name, len(self.sources))

    def refuse_transactional(self, runner: Literal["functions", "spark"]) -> None:
        """Raises a ``PipelineConfigError`` (at this pipeline's ``transactional``) when the
        pipeline is transactional: ``runner`` (``NO_TRANSACTIONS``) would replicate it
        outside the transaction it asks for, which must not happen silently."""
        if not self.transactional:
            return
        name, why = NO_TRANSACTIONS[runner]
        raise self.positions().error(
            [
                (
                    self.loc("transactional"),
                    (
                        f"pipeline {self.name!r} is transactional, which {name} cannot run "
                        f"({why}); it "
                        f"runs in {TRANSACTIONAL_RUNNERS}, or set transactional: false"
                    ),
                )
            ]
        )

    def target_endpoints(self) -> dict[str | None, Endpoint]:
        """Every place outputs may go, by target name (None: the single ``target``)."""
        found: dict[str | None, Endpoint] = {}
        if self.target is not None:
            found[TARGET_KEY] = self.target
        for route in self.routes:
            found[route.key] = route.target
        if self.default is not None:
            found[DEFAULT_KEY] = self.default
        if self.error_target is not None:
            found[ERROR_TARGET_KEY] = self.error_target
        found.update(self.step_error_targets)
        return found

    def route_options(self) -> dict[str, Any] | None:
        """Options of the ``route`` step appended to the steps (None without routes)."""
        if not self.routes:
            return None
        return {
            "routes": [{"when": r.when, "target": r.key} for r in self.routes],
            "default": DEFAULT_KEY if self.default is not None else None,
            "unmatched": self.unmatched,
            "mode": self.route_mode,
        }

    def describe(self) -> str:
        """One line: sources -> steps -> targets."""
        sources = " + ".join(s.describe() for s in self.sources)
        steps = "".join(f" -> {name}" for name, _ in self.steps)
        if self.target is not None:
            targets = self.target.describe()
        else:
            targets = "route[" + ", ".join(r.target.describe() for r in self.routes)
            if self.default is not None:
                targets += f"; default {self.default.describe()}"
            targets += "]"
        guard = " (loop guard)" if self.loop_guard else ""
        return f"{self.name}: {sources}{steps} -> {targets}{guard}"

    def build(
        self, settings: Mapping[str, str], context: StepContext | None = None
    ) -> BuiltPipeline:
        """The runnable pipeline: steps built (a ``route`` step appended for ``routes``),
        targets resolved from ``settings``, one ``ReplicationTask`` per source."""
        return build_pipeline(self, settings, context)

    def recovery_point_probes(
        self, settings: Mapping[str, str], clock: Clock = SYSTEM
    ) -> list[RecoveryPointProbe | None]:
        """Per source, the probe of its recovery point (``tasks.recovery_point``; None for
        a source that cannot be probed: an event hub, an identity-based connection)."""
        return recovery_point_probes(self, settings, clock)

    # ------------------------------------------------------------------ where in the file

    def positions(self) -> Positions:
        """The positions of the file this pipeline came from (for located problems)."""
        return self._origin.positions if self._origin else Positions("<pipelines>")

    def loc(self, *parts: str | int) -> Loc:
        """The location of ``parts`` of this pipeline in its file."""
        base = self._origin.loc if self._origin else ()
        return (*base, *parts)

    def source_loc(self, index: int) -> Loc:
        if self._origin is None or self._origin.single_source:
            return self.loc("source")
        return self.loc("sources", index)

    def target_locs(self) -> dict[str | None, tuple[Endpoint, Loc]]:
        """Every target with its location, by target name (as ``target_endpoints``)."""
        locs: dict[str | None, tuple[Endpoint, Loc]] = {}
        if self.target is not None:
            locs[TARGET_KEY] = (self.target, self.loc("target"))
        for index, route in enumerate(self.routes):
            locs[route.key] = (route.target, self.loc("routes", index, "target"))
        if self.default is not None:
            locs[DEFAULT_KEY] = (self.default, self.loc("default"))
        if self.error_target is not None:
            locs[ERROR_TARGET_KEY] = (self.error_target, self.loc("error_target"))
        for key, endpoint in self.step_error_targets.items():
            index = int(key.rpartition(":")[2])
            name = self.steps[index][0]
            locs[key] = (endpoint, self.loc("steps", index, name, "error_target"))
        return locs


def function_names(name: str, sources: int) -> list[str]:
    base = name.replace("-", "_")
    return [base] if sources == 1 else [f"{base}_{i}" for i in range(1, sources + 1)]


@dataclass(slots=True)
class PipelineFile:
    pipelines: list[Pipeline]
    path: Path | None = None

    def get(self, name: str) -> Pipeline:
        for pipeline in self.pipelines:
            if pipeline.name == name:
                return pipeline
        known = [p.name for p in self.pipelines]
        raise KeyError(f"no pipeline named {name!r}{did_you_mean(name, known)}")

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.pipelines]
