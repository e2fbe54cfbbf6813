"""The pipeline file: typed model, loading, validation and building tasks from it.

See ``replication/pipeline/README.md`` for the file format. In short::

    pipelines:
      - name: orders-to-secondary
        source: {connection: PrimaryServiceBus, queue: orders, sessions: true}
        steps:
          - filter: {condition: "region = 'eu'"}
        target: {connection: SecondaryServiceBus, queue: orders}

Loading checks everything that can be checked without a broker: the structure (unknown
properties with "did you mean"), every step's options with that step's own options model,
SQL conditions, cross-field rules (one of ``source``/``sources``, one of ``target``/``routes``,
queue or topic + subscription, sessions only on sources, names unique, ...), and builds each
step once so that e.g. an invalid Avro schema is reported now. With ``settings`` the
connection setting names (and settings steps read) must be present too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
)

from ..configproblems import Loc, Positions, did_you_mean, read_text, show, validation_problems
from ..failover import Failover, FailoverSpec
from ..servicebus.connection_string import namespace_of
from ..tasks.facts import compile_condition
from ..tasks.steps import (
    STEPS,
    BoundStep,
    StepConfigError,
    StepContext,
    _load_builtin_steps,
    build_step,
)
from ..tasks.targets import Target
from ..tasks.task import ReplicationTask
from .documents import parse_document

NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]*$"
MAX_NAME_LENGTH = 100
MAX_ENTITY_NAME_LENGTH = 260
MAX_SUBSCRIPTION_NAME_LENGTH = 50
FQNS_SUFFIX = "__fullyQualifiedNamespace"
"""``<connection>__fullyQualifiedNamespace``: an identity-based connection, as Functions
bindings read it (sources only: targets are sent to with a connection string)."""

SETTING_CUTOFF = 0.8
"""Setting names share words ('PrimaryServiceBus', 'SecondaryServiceBus'): suggest only a
very near miss, never another real connection."""

TARGET_KEY = None
DEFAULT_KEY = "default"
ERROR_TARGET_KEY = "error_target"
TRANSACTIONAL_RUNNERS = (
    "the local host (python -m replication start) or the task pump "
    "(replication.tasks.pump.pump with transaction_targets=BuiltPipeline.transaction_targets())"
)
"""What runs a ``transactional`` pipeline: whatever receives from the source itself."""
NO_TRANSACTIONS: dict[str, tuple[str, str]] = {
    "functions": ("Azure Functions", (
        "the Functions host receives the source's messages and settles them on its own "
        "connection, which cannot join the transaction the copies are sent in"
    )),
    "spark": ("the Spark runner", (
        "its executors receive and settle each micro-batch outside any transaction"
    )),
}  # fmt: skip
"""The runners that cannot run a ``transactional`` pipeline: (name, why)."""


def route_key(index: int) -> str:
    return f"route:{index}"


def step_error_target_key(index: int) -> str:
    return f"error_target:{index}"


# ---------------------------------------------------------------------- value checks

_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")


def _entity_name(name: str) -> str:
    """Queue and topic names: up to 260 characters, '/'-separated segments of letters,
    digits, '.', '-' and '_' (Service Bus's rules)."""
    if not name:
        raise ValueError("must not be empty")
    if len(name) > MAX_ENTITY_NAME_LENGTH:
        raise ValueError(f"{name[:40]!r}... is {len(name)} characters; at most 260 are allowed")
    segments = name.split("/")
    if any(not s for s in segments):
        raise ValueError(f"{name!r} has an empty path segment (or starts or ends with '/')")
    for segment in segments:
        if not _SEGMENT.fullmatch(segment):
            raise ValueError(
                f"{name!r} has characters other than letters, digits, '.', '-', '_' and '/'"
            )
    return name


def _subscription_name(name: str) -> str:
    if not name:
        raise ValueError("must not be empty")
    if len(name) > MAX_SUBSCRIPTION_NAME_LENGTH or not _SEGMENT.fullmatch(name):
        raise ValueError(
            f"{name!r} is not a subscription name: 1-50 letters, digits, '.', '-' and '_'"
        )
    return name


def _setting_name(name: str) -> str:
    if not name.strip():
        raise ValueError("must name the app setting that holds the connection string")
    if "endpoint=" in name.lower() or ";" in name:
        raise ValueError(
            "give the NAME of the app setting that holds the connection string, not the "
            "connection string itself (keep secrets out of this file)"
        )
    if any(c.isspace() for c in name):
        raise ValueError(f"{name!r} is not an app setting name (it contains whitespace)")
    return name


def _pipeline_name(name: str) -> str:
    if not re.fullmatch(NAME_PATTERN, name) or len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"{name!r} is not a valid pipeline name: a letter, then letters, digits, '-' or "
            f"'_', at most {MAX_NAME_LENGTH} characters"
        )
    return name


def _condition(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    try:
        compile_condition(text)
    except (ValueError, TypeError) as exc:  # SqlSyntaxError is a ValueError
        raise ValueError(f"invalid condition: {exc}") from None
    return text


EntityName = Annotated[str, AfterValidator(_entity_name)]
SubscriptionName = Annotated[str, AfterValidator(_subscription_name)]
SettingName = Annotated[str, AfterValidator(_setting_name)]
PipelineName = Annotated[
    str,
    AfterValidator(_pipeline_name),
    Field(json_schema_extra={"pattern": NAME_PATTERN, "maxLength": MAX_NAME_LENGTH}),
]
Condition = Annotated[str, AfterValidator(_condition)]


# ---------------------------------------------------------------------- endpoints


class Endpoint(BaseModel):
    """A queue, or a topic (+ subscription when read from), in the namespace whose
    connection string the app setting ``connection`` holds."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={"anyOf": [{"required": ["queue"]}, {"required": ["topic"]}]},
    )

    connection: SettingName = Field(
        description="Name of the app setting holding the namespace's connection string "
        "(as Functions bindings name connections)."
    )
    queue: EntityName | None = None
    topic: EntityName | None = None
    subscription: SubscriptionName | None = Field(
        None, description="The subscription of `topic` to read (sources only)."
    )
    sessions: bool = Field(
        False, description="Sources only: the entity requires sessions (session trigger)."
    )
    failover: FailoverSpec | None = Field(
        None, description="Resolve the namespace at run time (DNS alias, file or URL) and "
        "switch when it changes; the connection's keys are used on every namespace.",
    )  # fmt: skip

    @property
    def entity(self) -> str:
        """The queue or topic: what a target sends to, what a source reads (with the
        subscription, for a topic)."""
        return self.queue or self.topic or ""

    @property
    def is_subscription(self) -> bool:
        return self.subscription is not None

    def describe(self) -> str:
        if self.queue:
            what = f"queue {self.queue}"
        else:
            what = f"topic {self.topic}"
            if self.subscription:
                what += f" subscription {self.subscription}"
        flags = ", sessions" if self.sessions else ""
        if self.failover is not None:
            flags += f", failover {self.failover.describe()}"
        return f"{what} ({self.connection}{flags})"


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RouteSpec(_Spec):
    when: Condition = Field(description="SQL filter condition; `body.` names read JSON fields.")
    target: Endpoint


class PipelineSpec(_Spec):
    """One pipeline as written in the file (before normalisation)."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {"oneOf": [{"required": ["source"]}, {"required": ["sources"]}]},
                {"oneOf": [{"required": ["target"]}, {"required": ["routes"]}]},
            ]
        }
    )

    name: PipelineName
    description: str | None = None
    source: Endpoint | None = None
    sources: Annotated[list[Endpoint], Field(min_length=1)] | None = Field(
        None, description="Several sources (merge), one target."
    )
    steps: list[Any] = Field(
        default_factory=list,
        description="Editor steps in order; each a one-key mapping: step name -> options.",
    )
    target: Endpoint | None = None
    routes: Annotated[list[RouteSpec], Field(min_length=1)] | None = None
    default: Endpoint | None = Field(None, description="Where messages no route takes go.")
    unmatched: Literal["drop", "dead-letter"] | None = Field(
        None, description="What happens to messages no route takes (no default); dead-letter."
    )
    route_mode: Literal["first", "all"] | None = Field(
        None, description="first: the first matching route (default); all: every match."
    )
    error_target: Endpoint | None = Field(
        None, description="Where steps with `on_error: route` send failed messages."
    )
    loop_guard: bool = Field(
        False, description="Drop messages that already passed the target namespace (merge)."
    )
    batch_size: int = Field(100, ge=1, description="maxMessageBatchSize of the trigger.")
    concurrency: int | None = Field(
        None, ge=1, description="maxConcurrentCalls (maxConcurrentSessions with sessions)."
    )
    backend: Literal["amqp", "sdk"] = Field(
        "amqp",
        description="How the app talks to Service Bus: amqp, its own AMQP client (the "
        "default, faster), or sdk, azure-servicebus. It picks how the targets are sent to, "
        "and how the local host (`python -m replication start`) receives from the sources; "
        "in Azure the Functions host receives. sdk keeps the same semantics, except that "
        "each message is settled with its own call (no ranged settlement), a message given "
        "back without a delivery counted goes back with its session when the receiver "
        "closes but a plain (not session) receiver can only abandon it (a delivery counted), "
        "abandon and defer cannot change properties (dropped, with a warning), and locks of "
        "prefetched messages are not renewed (a session lock covers them).",
    )
    transactional: bool = Field(
        False,
        description="Send each batch's copies and complete its source messages in one "
        "Service Bus transaction: a crash between the sends and the completes leaves "
        "neither (no duplicate at a target), and a batch whose copy a target refused is "
        "rolled back whole (the failed message abandoned, the others released). The copies "
        "go via the source queue (send-via), so the source must be a queue and every "
        "target (routes, default and error targets too) an entity of the source's "
        "namespace, without failover; backend amqp only. Runs where the app receives "
        "itself: the local host (`python -m replication start`) runs its sources with the "
        "task pump (`replication.tasks.pump`) instead of as functions. Azure Functions "
        "cannot run it (the Functions host settles on its own connection, outside the "
        "transaction): `register_pipelines` and `python -m replication package` refuse it, "
        "and `validate` warns.",
    )


class FileSpec(_Spec):
    """The whole file (used for the JSON Schema; loading validates item by item)."""

    schema_: str | None = Field(None, alias="$schema")
    pipelines: Annotated[list[PipelineSpec], Field(min_length=1)]


# ---------------------------------------------------------------------- the API


@dataclass(frozen=True, slots=True)
class Route:
    when: str
    target: Endpoint
    key: str
    """The target name the route step gives matching messages (``route:0``, ...)."""


@dataclass(frozen=True, slots=True)
class _Origin:
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
    _origin: _Origin | None = field(default=None, repr=False)

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
        raise self._positions().error([(self._loc("transactional"), (
            f"pipeline {self.name!r} is transactional, which {name} cannot run ({why}); it "
            f"runs in {TRANSACTIONAL_RUNNERS}, or set transactional: false"
        ))])  # fmt: skip

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

    # ------------------------------------------------------------------ building

    def build(
        self, settings: Mapping[str, str], context: StepContext | None = None
    ) -> BuiltPipeline:
        """The runnable pipeline: steps built (a ``route`` step appended for ``routes``),
        targets resolved from ``settings``, one ``ReplicationTask`` per source."""
        problems: list[tuple[Loc, str]] = []
        targets: dict[str | None, Target] = {}
        target_namespaces: dict[str | None, str] = {}
        for key, (endpoint, loc) in self._target_locs().items():
            resolved = _connection(settings, endpoint.connection, role="target")
            if isinstance(resolved, str) and not resolved.startswith("!"):
                failover = self._failover(endpoint, resolved, settings, key or "target")
                targets[key] = Target(resolved, endpoint.entity, failover)
                target_namespaces[key] = namespace_of(resolved)
            else:
                problems.append(((*loc, "connection"), _missing(resolved, endpoint, settings)))
        source_namespaces: list[str | None] = []
        source_failovers: list[Failover | None] = []
        for index, endpoint in enumerate(self.sources):
            loc = self._source_loc(index)
            resolved = _connection(settings, endpoint.connection, role="source")
            if resolved == "fqns" and endpoint.failover is not None:
                problems.append(((*loc, "failover"), (
                    f"failover needs a connection string in {endpoint.connection!r} (its keys "
                    "are used on every namespace); an identity-based connection has none"
                )))  # fmt: skip
            elif isinstance(resolved, str) and not resolved.startswith("!"):
                source_namespaces.append(_namespace(settings, endpoint.connection))
                role = "source" if len(self.sources) == 1 else f"sources[{index}]"
                source_failovers.append(self._failover(endpoint, resolved, settings, role))
            else:
                problems.append(((*loc, "connection"), _missing(resolved, endpoint, settings)))
        if self.transactional:
            for key, namespace in target_namespaces.items():
                if any(namespace != source for source in source_namespaces if source):
                    endpoint, loc = self._target_locs()[key]
                    problems.append(((*loc, "connection"), (
                        f"transactional: the target {endpoint.entity!r} is on namespace "
                        f"{namespace!r}, the source on {source_namespaces[0]!r}; a Service "
                        "Bus transaction cannot span namespaces"
                    )))  # fmt: skip
        context = context or StepContext(settings=settings)
        steps: list[BoundStep] = []
        for index, (name, options) in enumerate(self.steps):
            try:
                steps.append(build_step(name, options, context))
            except StepConfigError as exc:
                problems.append(((*self._loc("steps", index), name), str(exc)))
        route = self.route_options()
        if route is not None:
            steps.append(build_step("route", route, context))
        if problems:
            raise self._positions().error(problems)
        tasks = [
            ReplicationTask(
                function,
                steps=list(steps),
                source_namespace=namespace,
                target_namespaces=dict(target_namespaces),
                loop_guard=self.loop_guard,
            )
            for function, namespace in zip(self.function_names(), source_namespaces, strict=True)
        ]
        return BuiltPipeline(self, tasks, targets, list(self.sources), source_failovers)

    def _failover(
        self, endpoint: Endpoint, connection: str, settings: Mapping[str, str], role: str
    ) -> Failover | None:
        if endpoint.failover is None or connection == "fqns":
            return None
        return endpoint.failover.build(f"{self.name}/{role}", connection, settings, self.base_dir)

    def _positions(self) -> Positions:
        return self._origin.positions if self._origin else Positions("<pipelines>")

    def _loc(self, *parts: str | int) -> Loc:
        base = self._origin.loc if self._origin else ()
        return (*base, *parts)

    def _source_loc(self, index: int) -> Loc:
        if self._origin is None or self._origin.single_source:
            return self._loc("source")
        return self._loc("sources", index)

    def _target_locs(self) -> dict[str | None, tuple[Endpoint, Loc]]:
        locs: dict[str | None, tuple[Endpoint, Loc]] = {}
        if self.target is not None:
            locs[TARGET_KEY] = (self.target, self._loc("target"))
        for index, route in enumerate(self.routes):
            locs[route.key] = (route.target, self._loc("routes", index, "target"))
        if self.default is not None:
            locs[DEFAULT_KEY] = (self.default, self._loc("default"))
        if self.error_target is not None:
            locs[ERROR_TARGET_KEY] = (self.error_target, self._loc("error_target"))
        for key, endpoint in self.step_error_targets.items():
            index = int(key.rpartition(":")[2])
            name = self.steps[index][0]
            locs[key] = (endpoint, self._loc("steps", index, name, "error_target"))
        return locs


def function_names(name: str, sources: int) -> list[str]:
    base = name.replace("-", "_")
    return [base] if sources == 1 else [f"{base}_{i}" for i in range(1, sources + 1)]


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


# ---------------------------------------------------------------------- settings


def _connection(settings: Mapping[str, str], name: str, *, role: str) -> str:
    """The connection string, or ``!missing`` / ``!not-a-connection-string``."""
    value = settings.get(name)
    if not value:
        if role == "source" and settings.get(name + FQNS_SUFFIX):
            return "fqns"
        return "!missing"
    try:
        namespace_of(value)
    except ValueError:
        return "!not-a-connection-string"
    return value


def _namespace(settings: Mapping[str, str], name: str) -> str:
    value = settings.get(name)
    if value:
        return namespace_of(value)
    return str(settings.get(name + FQNS_SUFFIX, "")).strip().strip("/").lower()


def _missing(resolved: str, endpoint: Endpoint, settings: Mapping[str, str]) -> str:
    name = endpoint.connection
    if resolved == "!not-a-connection-string":
        return f"setting {name!r} does not hold a Service Bus connection string (no 'Endpoint=')"
    return f"setting {name!r} is not set{did_you_mean(name, list(settings), SETTING_CUTOFF)}"


class _RecordingSettings(Mapping[str, str]):
    """Settings that remember which names were asked for but missing."""

    def __init__(self, base: Mapping[str, str]) -> None:
        self.base = base
        self.missing: set[str] = set()

    def __getitem__(self, key: str) -> str:
        try:
            return self.base[key]
        except KeyError:
            self.missing.add(key)
            raise

    def get(self, key: str, default: Any = None) -> Any:
        value = self.base.get(key)
        if not value:
            self.missing.add(key)
            return default
        return value

    def __iter__(self) -> Any:
        return iter(self.base)

    def __len__(self) -> int:
        return len(self.base)


# ---------------------------------------------------------------------- loading


def load_pipelines(path: str | Path, *, settings: Mapping[str, str] | None = None) -> PipelineFile:
    """Reads and validates a pipeline file (YAML; JSON when it ends in ``.json``)."""
    text = read_text(path)
    loaded = parse_pipelines(text, str(path), settings=settings, base_dir=Path(path).parent)
    loaded.path = Path(path)
    return loaded


def parse_pipelines(
    text: str,
    source: str = "<string>",
    *,
    settings: Mapping[str, str] | None = None,
    base_dir: str | Path | None = None,
) -> PipelineFile:
    """Validates pipeline file text; ``source`` names it in errors (and picks JSON when it
    ends in ``.json``). Relative ``*_file`` step options are resolved against ``base_dir``
    (default: the directory of ``source`` when it names a file, else left as they are)."""
    _load_builtin_steps()
    document = parse_document(text, source)
    if base_dir is None and not source.startswith("<"):
        base_dir = Path(source).parent
    checker = _Checker(document.positions, settings, Path(base_dir) if base_dir else None)
    pipelines = checker.check_file(document.data)
    if checker.problems:
        raise document.positions.error(checker.problems)
    path = None if source.startswith("<") else Path(source)
    return PipelineFile(pipelines, path)


_TOP_LEVEL = ("$schema", "pipelines")


class _Checker:
    def __init__(
        self, positions: Positions, settings: Mapping[str, str] | None, base_dir: Path | None
    ) -> None:
        self.positions = positions
        self.settings = settings
        self.base_dir = base_dir
        self.problems: list[tuple[Loc, str]] = []

    def add(self, loc: Loc, reason: str) -> None:
        self.problems.append((loc, reason))

    def check_file(self, data: object) -> list[Pipeline]:
        if data is None:
            self.add((), "the file is empty: expected a mapping with 'pipelines'")
            return []
        if not isinstance(data, Mapping):
            self.add((), f"expected a mapping with 'pipelines', got {show(data)}")
            return []
        for key in data:
            if key not in _TOP_LEVEL:
                hint = did_you_mean(str(key), _TOP_LEVEL) or "; expected 'pipelines'"
                self.add((str(key),), f"unknown property {str(key)!r}{hint}")
        if "$schema" in data and not isinstance(data["$schema"], str):
            self.add(("$schema",), f"expected a string, got {show(data['$schema'])}")
        raw = data.get("pipelines")
        if raw is None:
            if "pipelines" not in data:
                self.add(("pipelines",), "required property 'pipelines' is missing")
            else:
                self.add(("pipelines",), "expected a list of pipelines, got null")
            return []
        if not isinstance(raw, list):
            self.add(("pipelines",), f"expected a list of pipelines, got {show(raw)}")
            return []
        if not raw:
            self.add(("pipelines",), "no pipelines: give at least one")
            return []
        pipelines = []
        for index, item in enumerate(raw):
            pipeline = self.check_pipeline(item, ("pipelines", index))
            if pipeline is not None:
                pipelines.append(pipeline)
        self.check_unique(raw)
        return pipelines

    def check_unique(self, raw: list[Any]) -> None:
        names: dict[str, tuple[int, str]] = {}
        functions: dict[str, tuple[int, str]] = {}
        for index, item in enumerate(raw):
            if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
                continue
            name = item["name"]
            loc: Loc = ("pipelines", index, "name")
            earlier = names.setdefault(name.lower(), (index, name))
            if earlier[0] != index:
                self.add(loc, (
                    f"duplicate pipeline name {name!r}: pipelines[{earlier[0]}] is already "
                    f"named {earlier[1]!r} (names are case-insensitive)"
                ))  # fmt: skip
                continue
            sources = item.get("sources")
            count = len(sources) if isinstance(sources, list) and sources else 1
            for function in function_names(name, count):
                first = functions.setdefault(function.lower(), (index, name))
                if first[0] != index:
                    self.add(loc, (
                        f"function name {function!r} of pipeline {name!r} is also the function "
                        f"name of pipeline {first[1]!r} (pipelines[{first[0]}]): rename one"
                    ))  # fmt: skip
                    break

    # ------------------------------------------------------------------ one pipeline

    def check_pipeline(self, item: object, loc: Loc) -> Pipeline | None:
        if not isinstance(item, Mapping):
            self.add(loc, f"expected a pipeline (a mapping with 'name'), got {show(item)}")
            return None
        before = len(self.problems)
        if "failover" in item:
            self.add((*loc, "failover"), (
                "'failover' goes on an endpoint: give it under 'source' (or each of 'sources') "
                "and/or 'target', e.g. target: {connection: ..., queue: ..., failover: {dns: "
                "{alias: ...}}}"
            ))  # fmt: skip
            item = {k: v for k, v in item.items() if k != "failover"}
        try:
            spec = PipelineSpec.model_validate(item)
        except ValidationError as exc:
            self.problems += validation_problems(exc, loc, item, PipelineSpec)
            spec = None
        if spec is None:
            # the steps are checked even when something else is wrong
            if isinstance(item.get("steps"), list):
                self.check_steps(item["steps"], (*loc, "steps"), item.get("error_target"))
            return None
        sources = self.check_endpoints(spec, loc)
        self.check_routing(spec, loc)
        steps, step_targets = self.check_steps(spec.steps, (*loc, "steps"), spec.error_target)
        self.check_loops(spec, sources, loc)
        if spec.transactional:
            self.check_transactional(spec, sources, step_targets, loc)
        if len(self.problems) > before:
            return None
        routes = [Route(r.when, r.target, route_key(i)) for i, r in enumerate(spec.routes or [])]
        return Pipeline(
            name=spec.name,
            sources=sources,
            steps=steps,
            target=spec.target,
            routes=routes,
            default=spec.default,
            unmatched=spec.unmatched or "dead-letter",
            route_mode=spec.route_mode or "first",
            error_target=spec.error_target,
            step_error_targets=step_targets,
            loop_guard=spec.loop_guard,
            batch_size=spec.batch_size,
            concurrency=spec.concurrency,
            backend=spec.backend,
            transactional=spec.transactional,
            description=spec.description,
            base_dir=self.base_dir,
            _origin=_Origin(self.positions, loc, spec.source is not None),
        )

    def check_endpoints(self, spec: PipelineSpec, loc: Loc) -> list[Endpoint]:
        sources: list[tuple[Endpoint, Loc]] = []
        if spec.source is not None and spec.sources is not None:
            self.add((*loc, "sources"), "give 'source' or 'sources', not both")
        elif spec.source is not None:
            sources = [(spec.source, (*loc, "source"))]
        elif spec.sources is not None:
            sources = [(s, (*loc, "sources", i)) for i, s in enumerate(spec.sources)]
        else:
            self.add(loc, "required property 'source' (or 'sources') is missing")
        for endpoint, where in sources:
            self.check_endpoint(endpoint, where, "source")
        seen: dict[tuple[str, str, str | None], int] = {}
        for index, (endpoint, where) in enumerate(sources):
            key = (endpoint.connection, endpoint.entity.lower(), endpoint.subscription)
            if seen.setdefault(key, index) != index:
                self.add(where, f"the same source as sources[{seen[key]}]")
        for name in ("target", "default", "error_target"):
            endpoint = getattr(spec, name)
            if endpoint is not None:
                self.check_endpoint(endpoint, (*loc, name), name.replace("_", " "))
        for index, route in enumerate(spec.routes or []):
            self.check_endpoint(route.target, (*loc, "routes", index, "target"), "route target")
        return [endpoint for endpoint, _ in sources]

    def check_endpoint(self, endpoint: Endpoint, loc: Loc, role: str) -> None:
        if endpoint.queue is not None and endpoint.topic is not None:
            self.add((*loc, "topic"), "give 'queue' or 'topic', not both")
        elif endpoint.queue is None and endpoint.topic is None:
            if role == "source":
                self.add(loc, "the source needs 'queue', or 'topic' and 'subscription'")
            else:
                self.add(loc, f"the {role} needs 'queue' or 'topic'")
        if endpoint.queue is not None and endpoint.topic is not None:
            pass  # reported above
        elif role == "source":
            if endpoint.topic is not None and endpoint.subscription is None:
                self.add((*loc, "topic"), (
                    f"reading from topic {endpoint.topic!r} needs 'subscription' (the "
                    "subscription of the topic to read)"
                ))  # fmt: skip
            if endpoint.queue is not None and endpoint.subscription is not None:
                self.add((*loc, "subscription"), "'subscription' goes with 'topic', not 'queue'")
        else:
            if endpoint.subscription is not None:
                self.add((*loc, "subscription"), (
                    f"a {role} is a queue or a topic: messages cannot be sent to a subscription"
                ))  # fmt: skip
            if endpoint.sessions:
                self.add((*loc, "sessions"), (
                    "'sessions' is for sources (it makes the trigger read sessions); a "
                    f"{role} keeps each message's session id"
                ))  # fmt: skip
        self.check_setting(endpoint.connection, (*loc, "connection"), role == "source")
        if endpoint.failover is not None:
            self.check_failover_settings((*loc, "failover"))

    def check_failover_settings(self, loc: Loc) -> None:
        """The environment's half of failover: the host map and the default DNS server."""
        if self.settings is None:
            return
        from ..failover import HOST_MAP_SETTING, NAMESERVER_SETTING, parse_host_map
        from ..failover.dns import parse_nameserver

        try:
            parse_host_map(self.settings.get(HOST_MAP_SETTING))
        except ValueError as exc:
            self.add(loc, f"setting {HOST_MAP_SETTING!r}: {exc}")
        nameserver = self.settings.get(NAMESERVER_SETTING)
        if nameserver:
            try:
                parse_nameserver(nameserver)
            except ValueError as exc:
                self.add(loc, f"setting {NAMESERVER_SETTING!r}: {exc}")

    def check_setting(self, name: str, loc: Loc, source: bool) -> None:
        if self.settings is None:
            return
        value = self.settings.get(name)
        if not value:
            if source and self.settings.get(name + FQNS_SUFFIX):
                return
            hint = did_you_mean(name, list(self.settings), SETTING_CUTOFF)
            self.add(loc, f"setting {name!r} is not set{hint}")
            return
        try:
            namespace_of(value)
        except ValueError as exc:
            self.add(loc, f"setting {name!r} does not hold a Service Bus connection string: {exc}")

    def check_routing(self, spec: PipelineSpec, loc: Loc) -> None:
        if spec.target is not None and spec.routes is not None:
            self.add((*loc, "routes"), "give 'target' or 'routes', not both")
        elif spec.target is None and spec.routes is None:
            self.add(loc, "required property 'target' (or 'routes') is missing")
        if spec.routes is None:
            for name in ("default", "unmatched", "route_mode"):
                if getattr(spec, name) is not None:
                    self.add((*loc, name), f"{name!r} goes with 'routes'")
        elif spec.default is not None and spec.unmatched is not None:
            self.add((*loc, "unmatched"), (
                "'unmatched' has no effect when 'default' is set (messages no route takes go "
                "to the default)"
            ))  # fmt: skip

    def check_loops(self, spec: PipelineSpec, sources: list[Endpoint], loc: Loc) -> None:
        """A target that is the source itself sends every message round and round."""
        outs: list[tuple[Endpoint, Loc]] = []
        if spec.target is not None:
            outs.append((spec.target, (*loc, "target")))
        outs += [(r.target, (*loc, "routes", i, "target")) for i, r in enumerate(spec.routes or [])]
        if spec.default is not None:
            outs.append((spec.default, (*loc, "default")))
        for source in sources:
            for out, where in outs:
                if out.entity.lower() != source.entity.lower() or not self.same_namespace(
                    out.connection, source.connection
                ):
                    continue
                if source.queue is not None and out.queue is not None:
                    self.add(where, (
                        f"the target is the source queue {source.queue!r}: every message would "
                        "come back"
                    ))  # fmt: skip
                elif source.topic is not None and out.topic is not None and not spec.loop_guard:
                    self.add(where, (
                        f"the target is the source topic {source.topic!r}: messages would come "
                        "back through the subscription (set loop_guard: true if that is meant)"
                    ))  # fmt: skip

    def check_transactional(
        self, spec: PipelineSpec, sources: list[Endpoint], step_targets: dict[str, Endpoint],
        loc: Loc,
    ) -> None:  # fmt: skip
        """A transaction lives on one connection to one namespace, reaches a second entity
        only through a via entity (the source queue), and only our AMQP client runs one."""
        where: Loc = (*loc, "transactional")
        if spec.backend == "sdk":
            self.add(where, (
                "transactional needs backend 'amqp': the transaction spans the source's "
                "receiver and the targets' senders on one connection, which azure-servicebus "
                "(backend 'sdk') cannot share or run a transaction on"
            ))  # fmt: skip
        for index, source in enumerate(sources):
            source_loc: Loc = (*loc, "source") if spec.source is not None else (
                *loc, "sources", index,
            )  # fmt: skip
            if source.queue is None:
                self.add(source_loc, (
                    "transactional needs a queue source: the copies are sent via the source "
                    "entity in the same transaction as its completes, and a subscription "
                    "cannot be sent through"
                ))  # fmt: skip
            if source.failover is not None:
                self.add((*source_loc, "failover"), (
                    "transactional pipelines cannot fail over: a transaction and its targets "
                    "are bound to the one namespace the source is on"
                ))  # fmt: skip
        outs: list[tuple[Endpoint, Loc]] = []
        if spec.target is not None:
            outs.append((spec.target, (*loc, "target")))
        outs += [(r.target, (*loc, "routes", i, "target")) for i, r in enumerate(spec.routes or [])]
        for name in ("default", "error_target"):
            endpoint = getattr(spec, name)
            if endpoint is not None:
                outs.append((endpoint, (*loc, name)))
        for key, endpoint in step_targets.items():
            outs.append((endpoint, (*loc, "steps", int(key.rpartition(":")[2]), "error_target")))
        for out, out_loc in outs:
            if out.failover is not None:
                self.add((*out_loc, "failover"), (
                    "transactional pipelines cannot fail over: a transaction and its targets "
                    "are bound to the one namespace the source is on"
                ))  # fmt: skip
            for source in sources:
                if self.other_namespace(out.connection, source.connection):
                    self.add((*out_loc, "connection"), (
                        f"transactional: the target {out.entity!r} is on another namespace "
                        f"than the source ({out.connection!r} vs {source.connection!r}); a "
                        "Service Bus transaction cannot span namespaces (put the target in "
                        "the source's namespace, or drop transactional)"
                    ))  # fmt: skip
                    break

    def other_namespace(self, first: str, second: str) -> bool:
        """Known to be different namespaces (False when the settings cannot tell: then
        ``Pipeline.build`` checks it)."""
        if first == second or self.settings is None:
            return False
        try:
            one, other = _namespace(self.settings, first), _namespace(self.settings, second)
        except ValueError:  # not a connection string: reported on its own
            return False
        return bool(one) and bool(other) and one != other

    def same_namespace(self, first: str, second: str) -> bool:
        if first == second:
            return True
        if self.settings is None:
            return False
        try:
            namespace = _namespace(self.settings, first)
            return bool(namespace) and namespace == _namespace(self.settings, second)
        except ValueError:  # not a connection string: reported on its own
            return False

    # ------------------------------------------------------------------ steps

    def check_steps(
        self, raw: list[Any], loc: Loc, pipeline_error_target: object
    ) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, Endpoint]]:
        steps: list[tuple[str, dict[str, Any]]] = []
        targets: dict[str, Endpoint] = {}
        for index, item in enumerate(raw):
            parsed = self.check_step(item, (*loc, index), index, pipeline_error_target, targets)
            if parsed is not None:
                steps.append(parsed)
        return steps, targets

    def step_name(self, item: object, loc: Loc) -> tuple[str, object] | None:
        """The name and raw options of a step item, or None (a problem was added)."""
        if isinstance(item, str):
            return item, {}
        if isinstance(item, Mapping) and len(item) == 1:
            name, options = next(iter(item.items()))
            return str(name), ({} if options is None else options)
        if isinstance(item, Mapping) and item:
            named = [k for k in item if k in STEPS]
            if len(named) == 1:
                others = ", ".join(repr(k) for k in item if k != named[0])
                self.add((*loc, named[0]), (
                    f"{others} must be options of step {named[0]!r}: indent them under "
                    f"'{named[0]}:'"
                ))  # fmt: skip
                return None
            keys = ", ".join(repr(str(k)) for k in item)
            self.add(loc, (
                f"a step is a mapping with one key, the step name (e.g. '- filter: "
                f"{{condition: ...}}'); this one has {len(item)}: {keys}"
            ))  # fmt: skip
            return None
        self.add(loc, (
            f"expected a step: a step name, or a mapping of a step name to its options; got "
            f"{show(item) if item != {} else 'an empty mapping'}"
        ))  # fmt: skip
        return None

    def check_step(
        self,
        item: object,
        loc: Loc,
        index: int,
        pipeline_error_target: object,
        targets: dict[str, Endpoint],
    ) -> tuple[str, dict[str, Any]] | None:
        named = self.step_name(item, loc)
        if named is None:
            return None
        name, raw_options = named
        name_loc = loc if isinstance(item, str) else (*loc, name)
        if name not in STEPS:
            known = [n for n in STEPS if n != "route"]
            hint = did_you_mean(name, known) or f"; known steps: {', '.join(sorted(known))}"
            self.add(name_loc, f"unknown step {name!r}{hint}")
            return None
        if name == "route":
            self.add(name_loc, (
                "'route' is not used as a step here: give the pipeline's 'routes' (with "
                "'default', 'unmatched', 'route_mode')"
            ))  # fmt: skip
            return None
        if not isinstance(raw_options, Mapping):
            self.add(name_loc, (
                f"expected the options of step {name!r} as a mapping, got {show(raw_options)}"
            ))  # fmt: skip
            return None
        options = dict(raw_options)
        before = len(self.problems)
        own = options.get("error_target")
        if own is not None:
            if not isinstance(own, Mapping):
                self.add((*name_loc, "error_target"), (
                    "expected an endpoint ({connection: ..., queue: ...}); leave it out to use "
                    "the pipeline's error_target"
                ))  # fmt: skip
            else:
                try:
                    endpoint = Endpoint.model_validate(own)
                except ValidationError as exc:
                    self.problems += validation_problems(
                        exc, (*name_loc, "error_target"), own, Endpoint
                    )
                else:
                    self.check_endpoint(endpoint, (*name_loc, "error_target"), "error target")
                    key = step_error_target_key(index)
                    targets[key] = endpoint
                    options["error_target"] = key
        elif options.get("on_error") == "route":
            if pipeline_error_target is None:
                self.add((*name_loc, "on_error"), (
                    "on_error 'route' needs an error target: set the pipeline's 'error_target' "
                    "(or this step's)"
                ))  # fmt: skip
            else:
                options["error_target"] = ERROR_TARGET_KEY
        if len(self.problems) > before:
            return None
        self.resolve_files(options)
        spec = STEPS[name]
        try:
            spec.options.model_validate(options)
        except ValidationError as exc:
            self.problems += validation_problems(exc, name_loc, options, spec.options)
            return None
        settings = _RecordingSettings(self.settings or {})
        try:
            build_step(name, options, StepContext(settings=settings))
        except StepConfigError as exc:
            if self.settings is not None or not settings.missing:
                self.add(name_loc, str(exc))
                return None
        except Exception as exc:  # a step's builder failing on its options
            self.add(name_loc, f"{type(exc).__name__}: {exc}")
            return None
        return name, options

    def resolve_files(self, options: dict[str, Any]) -> None:
        """``*_file`` options are paths relative to the pipeline file."""
        if self.base_dir is None:
            return
        for key, value in options.items():
            if key.endswith("_file") and isinstance(value, str) and value:
                path = Path(value)
                if not path.is_absolute():
                    options[key] = str(self.base_dir / path)
