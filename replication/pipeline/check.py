"""Loading a pipeline file: reading it and checking everything that can be checked without
a broker, every problem located in the file.

The structure (unknown properties with "did you mean"), every step's options with that
step's own options model (from the step registry), SQL conditions, cross-field rules (one of
``source``/``sources``, one of ``target``/``routes``, queue or topic + subscription, sessions
only on sources, names unique, no target that is its source, what a transaction needs, ...);
each step is built once so that e.g. an invalid Avro schema is reported now. With
``settings`` the connection setting names (and settings steps read) must be present too.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..configproblems import Loc, Positions, did_you_mean, read_text, show, validation_problems
from ..servicebus.connection_string import namespace_of
from ..tasks.registry import build_step, lookup, names
from ..tasks.steps import StepConfigError, StepContext
from .documents import parse_document
from .model import Origin, Pipeline, PipelineFile, Route, function_names
from .settings import FQNS_SUFFIX, SETTING_CUTOFF, RecordingSettings, setting_namespace
from .spec import (
    ERROR_TARGET_KEY,
    Endpoint,
    PipelineSpec,
    route_key,
    step_error_target_key,
)


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
        self.check_event_hub_readers(pipelines)
        return pipelines

    def check_event_hub_readers(self, pipelines: list[Pipeline]) -> None:
        """Two pipelines reading one event hub through one consumer group would share its
        partitions (each function owns some of them), so each would miss events."""
        readers: list[tuple[Endpoint, str]] = []
        for pipeline in pipelines:
            for index, source in enumerate(pipeline.sources):
                if not source.is_event_hub:
                    continue
                for other, name in readers:
                    same = (other.entity.lower(), other.group.lower()) == (
                        source.entity.lower(),
                        source.group.lower(),
                    )
                    if same and self.same_namespace(other.connection, source.connection):
                        self.add(
                            pipeline.source_loc(index),
                            (
                                f"pipeline {name!r} reads event hub {source.entity!r} with "
                                "consumer "
                                f"group {source.group!r} too: they would share its partitions and "
                                "each see only some events; give each its own consumer_group"
                            ),
                        )
                        break
                readers.append((source, pipeline.name))

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
                self.add(
                    loc,
                    (
                        f"duplicate pipeline name {name!r}: pipelines[{earlier[0]}] is already "
                        f"named {earlier[1]!r} (names are case-insensitive)"
                    ),
                )
                continue
            sources = item.get("sources")
            count = len(sources) if isinstance(sources, list) and sources else 1
            for function in function_names(name, count):
                first = functions.setdefault(function.lower(), (index, name))
                if first[0] != index:
                    self.add(
                        loc,
                        (
                            f"function name {function!r} of pipeline {name!r} is also the function "
                            f"name of pipeline {first[1]!r} (pipelines[{first[0]}]): rename one"
                        ),
                    )
                    break

    # ------------------------------------------------------------------ one pipeline

    def check_pipeline(self, item: object, loc: Loc) -> Pipeline | None:
        if not isinstance(item, Mapping):
            self.add(loc, f"expected a pipeline (a mapping with 'name'), got {show(item)}")
            return None
        before = len(self.problems)
        if "failover" in item:
            self.add(
                (*loc, "failover"),
                (
                    "'failover' goes on an endpoint: give it under 'source' (or each of 'sources') "
                    "and/or 'target', e.g. target: {connection: ..., queue: ..., failover: {dns: "
                    "{alias: ...}}}"
                ),
            )
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
            _origin=Origin(self.positions, loc, spec.source is not None),
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
            reader = endpoint.group.lower() if endpoint.is_event_hub else endpoint.subscription
            key = (endpoint.connection, endpoint.entity.lower(), reader)
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
        given = [k for k in ("queue", "topic", "eventhub") if getattr(endpoint, k) is not None]
        if len(given) > 1:
            self.add(
                (*loc, given[1]),
                f"give one of 'queue', 'topic' and 'eventhub', not "
                f"{' and '.join(repr(k) for k in given)}",
            )
        elif not given:
            if role == "source":
                self.add(
                    loc, ("the source needs 'queue', or 'topic' and 'subscription', or 'eventhub'")
                )
            else:
                self.add(loc, f"the {role} needs 'queue', 'topic' or 'eventhub'")
        if len(given) > 1:
            pass  # reported above
        elif endpoint.eventhub is not None:
            self.check_event_hub(endpoint, loc, role)
        elif role == "source":
            if endpoint.topic is not None and endpoint.subscription is None:
                self.add(
                    (*loc, "topic"),
                    (
                        f"reading from topic {endpoint.topic!r} needs 'subscription' (the "
                        "subscription of the topic to read)"
                    ),
                )
            if endpoint.queue is not None and endpoint.subscription is not None:
                self.add((*loc, "subscription"), "'subscription' goes with 'topic', not 'queue'")
        else:
            if endpoint.subscription is not None:
                self.add(
                    (*loc, "subscription"),
                    (f"a {role} is a queue or a topic: messages cannot be sent to a subscription"),
                )
            if endpoint.sessions:
                self.add(
                    (*loc, "sessions"),
                    (
                        "'sessions' is for sources (it makes the trigger read sessions); a "
                        f"{role} keeps each message's session id"
                    ),
                )
        if endpoint.eventhub is None:
            for name in ("consumer_group", "session_id_from"):
                if getattr(endpoint, name) is not None:
                    self.add(
                        (*loc, name),
                        (f"{name!r} is for event hub sources ('eventhub'), not queues or topics"),
                    )
        self.check_setting(
            endpoint.connection, (*loc, "connection"), role == "source", endpoint.is_event_hub
        )
        if endpoint.failover is not None:
            self.check_failover_settings((*loc, "failover"))

    def check_event_hub(self, endpoint: Endpoint, loc: Loc, role: str) -> None:
        """An event hub has partitions, not sessions or subscriptions; a consumer group is
        what a reader reads through, so only a source has one."""
        if endpoint.subscription is not None:
            self.add(
                (*loc, "subscription"),
                (
                    "'subscription' goes with 'topic'; an event hub source reads through a "
                    "consumer group ('consumer_group', default $Default)"
                ),
            )
        if endpoint.sessions:
            self.add(
                (*loc, "sessions"),
                (
                    "an event hub has no sessions: it keeps order per partition (events with the "
                    "same partition key); leave 'sessions' out"
                    + (
                        " (session_id_from: partition_key gives a Service Bus target sessions)"
                        if role == "source"
                        else ""
                    )
                ),
            )
        if role != "source":
            for name in ("consumer_group", "session_id_from"):
                if getattr(endpoint, name) is not None:
                    self.add(
                        (*loc, name),
                        (
                            f"{name!r} is for event hub sources: a {role} is sent to, not read "
                            "through a consumer group"
                            if name == "consumer_group"
                            else f"{name!r} is for event hub sources (it sets the session id of "
                            "what "
                            f"is read); a {role} keeps each message's session id"
                        ),
                    )
        if endpoint.failover is not None:
            self.add(
                (*loc, "failover"),
                (
                    "failover resolves Service Bus namespaces (SRV _azure_servicebus); an event "
                    "hub "
                    "endpoint cannot fail over yet: leave 'failover' out"
                ),
            )

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

    def check_setting(self, name: str, loc: Loc, source: bool, event_hub: bool = False) -> None:
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
            service = "an Event Hubs" if event_hub else "a Service Bus"
            self.add(loc, f"setting {name!r} does not hold {service} connection string: {exc}")

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
            self.add(
                (*loc, "unmatched"),
                (
                    "'unmatched' has no effect when 'default' is set (messages no route takes go "
                    "to the default)"
                ),
            )

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
                    self.add(
                        where,
                        (
                            f"the target is the source queue {source.queue!r}: every message would "
                            "come back"
                        ),
                    )
                elif source.topic is not None and out.topic is not None and not spec.loop_guard:
                    self.add(
                        where,
                        (
                            f"the target is the source topic {source.topic!r}: messages would come "
                            "back through the subscription (set loop_guard: true if that is meant)"
                        ),
                    )
                elif source.is_event_hub and out.is_event_hub and not spec.loop_guard:
                    self.add(
                        where,
                        (
                            f"the target is the source event hub {source.eventhub!r}: events would "
                            "come back through the consumer group (set loop_guard: true if that is "
                            "meant)"
                        ),
                    )

    def check_transactional(
        self,
        spec: PipelineSpec,
        sources: list[Endpoint],
        step_targets: dict[str, Endpoint],
        loc: Loc,
    ) -> None:
        """A transaction lives on one connection to one namespace, reaches a second entity
        only through a via entity (the source queue), and only our AMQP client runs one."""
        where: Loc = (*loc, "transactional")
        if spec.backend == "sdk":
            self.add(
                where,
                (
                    "transactional needs backend 'amqp': the transaction spans the source's "
                    "receiver and the targets' senders on one connection, which azure-servicebus "
                    "(backend 'sdk') cannot share or run a transaction on"
                ),
            )
        for index, source in enumerate(sources):
            source_loc: Loc = (
                (*loc, "source")
                if spec.source is not None
                else (
                    *loc,
                    "sources",
                    index,
                )
            )
            if source.is_event_hub:
                self.add(
                    source_loc,
                    (
                        "transactional needs a Service Bus queue source: an event hub has no "
                        "transactions (its reader checkpoints after each batch: at-least-once)"
                    ),
                )
            elif source.queue is None:
                self.add(
                    source_loc,
                    (
                        "transactional needs a queue source: the copies are sent via the source "
                        "entity in the same transaction as its completes, and a subscription "
                        "cannot be sent through"
                    ),
                )
            if source.failover is not None:
                self.add(
                    (*source_loc, "failover"),
                    (
                        "transactional pipelines cannot fail over: a transaction and its targets "
                        "are bound to the one namespace the source is on"
                    ),
                )
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
            if out.is_event_hub:
                self.add(
                    (*out_loc, "eventhub"),
                    (
                        "transactional: a Service Bus transaction cannot include a send to an "
                        f"event hub ({out.eventhub!r}); drop transactional, or send to a queue or "
                        "topic"
                    ),
                )
            if out.failover is not None:
                self.add(
                    (*out_loc, "failover"),
                    (
                        "transactional pipelines cannot fail over: a transaction and its targets "
                        "are bound to the one namespace the source is on"
                    ),
                )
            for source in sources:
                if self.other_namespace(out.connection, source.connection):
                    self.add(
                        (*out_loc, "connection"),
                        (
                            f"transactional: the target {out.entity!r} is on another namespace "
                            f"than the source ({out.connection!r} vs {source.connection!r}); a "
                            "Service Bus transaction cannot span namespaces (put the target in "
                            "the source's namespace, or drop transactional)"
                        ),
                    )
                    break

    def other_namespace(self, first: str, second: str) -> bool:
        """Known to be different namespaces (False when the settings cannot tell: then
        ``Pipeline.build`` checks it)."""
        if first == second or self.settings is None:
            return False
        try:
            one = setting_namespace(self.settings, first)
            other = setting_namespace(self.settings, second)
        except ValueError:  # not a connection string: reported on its own
            return False
        return bool(one) and bool(other) and one != other

    def same_namespace(self, first: str, second: str) -> bool:
        if first == second:
            return True
        if self.settings is None:
            return False
        try:
            namespace = setting_namespace(self.settings, first)
            return bool(namespace) and namespace == setting_namespace(self.settings, second)
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
            named = [k for k in item if lookup(str(k)) is not None]
            if len(named) == 1:
                others = ", ".join(repr(k) for k in item if k != named[0])
                self.add(
                    (*loc, named[0]),
                    (
                        f"{others} must be options of step {named[0]!r}: indent them under "
                        f"'{named[0]}:'"
                    ),
                )
                return None
            keys = ", ".join(repr(str(k)) for k in item)
            self.add(
                loc,
                (
                    f"a step is a mapping with one key, the step name (e.g. '- filter: "
                    f"{{condition: ...}}'); this one has {len(item)}: {keys}"
                ),
            )
            return None
        self.add(
            loc,
            (
                f"expected a step: a step name, or a mapping of a step name to its options; got "
                f"{show(item) if item != {} else 'an empty mapping'}"
            ),
        )
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
        spec = lookup(name)
        if spec is None:
            known = [n for n in names() if n != "route"]
            hint = did_you_mean(name, known) or f"; known steps: {', '.join(sorted(known))}"
            self.add(name_loc, f"unknown step {name!r}{hint}")
            return None
        if name == "route":
            self.add(
                name_loc,
                (
                    "'route' is not used as a step here: give the pipeline's 'routes' (with "
                    "'default', 'unmatched', 'route_mode')"
                ),
            )
            return None
        if not isinstance(raw_options, Mapping):
            self.add(
                name_loc,
                (f"expected the options of step {name!r} as a mapping, got {show(raw_options)}"),
            )
            return None
        options = dict(raw_options)
        before = len(self.problems)
        own = options.get("error_target")
        if own is not None:
            if not isinstance(own, Mapping):
                self.add(
                    (*name_loc, "error_target"),
                    (
                        "expected an endpoint ({connection: ..., queue: ...}); leave it out to use "
                        "the pipeline's error_target"
                    ),
                )
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
                self.add(
                    (*name_loc, "on_error"),
                    (
                        "on_error 'route' needs an error target: set the pipeline's 'error_target' "
                        "(or this step's)"
                    ),
                )
            else:
                options["error_target"] = ERROR_TARGET_KEY
        if len(self.problems) > before:
            return None
        self.resolve_files(options)
        try:
            spec.options.model_validate(options)
        except ValidationError as exc:
            self.problems += validation_problems(exc, name_loc, options, spec.options)
            return None
        settings = RecordingSettings(self.settings or {})
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
