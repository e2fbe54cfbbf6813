"""Config tests: a pipeline's steps and routes run in-process on given messages, no broker.

A test file (``pipelines_test.yaml`` next to ``pipelines.yaml``; JSON when it ends in
``.json``) lists cases like ``rpk connect test`` does::

    pipelines: pipelines.yaml        # optional: default is this file's name without _test
    settings: {...}                  # optional: connection strings and keys steps read
    now: 2024-01-01T00:00:00Z        # optional: the clock steps and stamping see
    tests:
      - name: eu events go to events-eu
        pipeline: events-router
        source: 0                    # optional: which of the pipeline's sources (merge)
        input:
          - {message_id: e1, json: {id: 1}, properties: {region: eu}}
        expect:
          - {message_id: e1, target: events-eu, json: {id: 1}}

``expect`` lists the outputs of all inputs in order; ``expect_dead_letter`` the dead-letter
reason (a string: every input is dead-lettered with it; a list: one per dead-lettered input;
``true``: every input, any reason); ``expect_nothing: true`` means no outputs and nothing
dead-lettered (filtered or dropped). ``expect`` and ``expect_dead_letter`` may go together.

An expected message checks only the fields it names; ``properties`` is compared whole, except
the ``repl-*`` stamp properties, which are compared only when named. See README.md.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from ..configproblems import (
    ConfigError,
    Loc,
    Positions,
    did_you_mean,
    read_text,
    show,
    validation_problems,
)
from ..messages import Message
from ..tasks.editors.transcode import (
    AvroSchema,
    AvroSchemaJson,
    avro_to_json,
    decode_body,
    encode_body,
    load_avro_schema,
)
from ..tasks.steps import StepConfigError, StepContext, StepFailed
from ..tasks.targets import DEFAULT_TARGET_NAME
from .check import load_pipelines
from .documents import Document, parse_document
from .model import Pipeline, PipelineFile

DEFAULT_NOW = datetime(2024, 1, 1, tzinfo=UTC)
STAMP_PREFIX = "repl-"
TEST_SUFFIXES = ("_test.yaml", "_test.yml", "_test.json")

PropertyValue = str | int | float | bool | datetime | None


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class AvroBody(_Spec):
    """A body in Avro: ``value`` (its JSON form) written with the schema."""

    value: JsonValue
    schema_: AvroSchemaJson | None = Field(None, alias="schema")
    schema_file: str | None = None
    format: Literal["avro-binary", "avro-single-object", "avro-container"] = "avro-binary"


class MessageSpec(_Spec):
    """A message in a test: an input, or an expected output (fields named are checked)."""

    body: str | None = None
    json_: JsonValue = Field(None, alias="json")
    body_base64: str | None = None
    avro: AvroBody | None = None
    message_id: str | None = None
    session_id: str | None = None
    partition_key: str | None = None
    correlation_id: str | None = None
    subject: str | None = None
    content_type: str | None = None
    reply_to: str | None = None
    reply_to_session_id: str | None = None
    to: str | None = None
    time_to_live: timedelta | None = None
    scheduled_enqueue_time: datetime | None = None
    properties: dict[str, PropertyValue] | None = None
    # inputs only: facts of the source delivery
    enqueued_time: datetime | None = None
    sequence_number: int | None = None
    delivery_count: int | None = None
    offset: str | None = None
    """An event's offset (an event hub source: stamped as ``repl-offset``)."""
    partition_id: str | None = None
    """The partition an event was read from (where a keyless event goes in a target hub)."""
    # expected outputs only
    target: str | None = None


_BODY_FIELDS = ("body", "json", "body_base64", "avro")
_INPUT_ONLY = (
    "enqueued_time",
    "sequence_number",
    "delivery_count",
    "offset",
    "partition_id",
)
_SIMPLE_FIELDS = (
    "message_id",
    "session_id",
    "partition_key",
    "correlation_id",
    "subject",
    "content_type",
    "reply_to",
    "reply_to_session_id",
    "to",
    "time_to_live",
    "scheduled_enqueue_time",
)


class CaseSpec(_Spec):
    name: str = Field(min_length=1)
    pipeline: str
    source: int = Field(0, ge=0)
    input: list[MessageSpec] = Field(min_length=1)
    expect: list[MessageSpec] | None = None
    expect_dead_letter: str | bool | list[str] | None = None
    expect_nothing: bool = False


class TestFileSpec(_Spec):
    __test__ = False  # not a pytest class

    pipelines: str | None = None
    settings: dict[str, str] = Field(default_factory=dict)
    now: datetime = DEFAULT_NOW
    tests: list[CaseSpec] = Field(min_length=1)


# ---------------------------------------------------------------------- results


@dataclass(slots=True)
class CaseResult:
    name: str
    pipeline: str
    line: int | None
    passed: bool
    diff: str = ""
    """A unified diff, expected -> actual, when it failed."""
    notes: list[str] = field(default_factory=list)
    """Dead-letter descriptions and the like, to help read the diff."""


@dataclass(slots=True)
class SuiteResult:
    file: Path
    pipelines_file: Path
    cases: list[CaseResult]

    @property
    def passed(self) -> bool:
        return all(case.passed for case in self.cases)

    @property
    def failed(self) -> list[CaseResult]:
        return [case for case in self.cases if not case.passed]


# ---------------------------------------------------------------------- finding files


def find_test_files(path: str | Path) -> list[Path]:
    """The test files ``path`` stands for: a directory's ``*_test.yaml|yml|json``, a test
    file itself, or a pipeline file's ``<name>_test.yaml`` (or .yml/.json) next to it."""
    path = Path(path)
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.name.endswith(TEST_SUFFIXES))
    if path.name.endswith(TEST_SUFFIXES) or not path.exists():
        return [path]
    siblings = [path.with_name(path.stem + suffix) for suffix in TEST_SUFFIXES]
    return [p for p in siblings if p.exists()] or [siblings[0]]


def _pipelines_file(test_file: Path, named: str | None) -> Path:
    if named is not None:
        return test_file.parent / named
    for suffix in TEST_SUFFIXES:
        if test_file.name.endswith(suffix):
            stem = test_file.name[: -len(suffix)]
            for ext in (".yaml", ".yml", ".json"):
                candidate = test_file.with_name(stem + ext)
                if candidate.exists():
                    return candidate
            return test_file.with_name(stem + suffix[len("_test") :])
    return test_file.with_name("pipelines.yaml")


# ---------------------------------------------------------------------- running


def run_test_file(path: str | Path) -> SuiteResult:
    """Loads a test file and its pipeline file and runs every case. Problems with either
    file raise ``ConfigError``; a failing case is a result, not an exception."""
    path = Path(path)
    document = parse_document(read_text(path), str(path))
    spec = _validate(document)
    pipelines_path = _pipelines_file(path, spec.pipelines)
    pipelines = load_pipelines(pipelines_path)
    _check_cases(spec, pipelines, document.positions)
    settings = _settings(spec, pipelines)
    results = []
    for index, case in enumerate(spec.tests):
        pipeline = pipelines.get(case.pipeline)
        line, _ = document.positions.find(("tests", index))
        try:
            result = _run_case(case, pipeline, settings, spec.now, path.parent)
        except ConfigError:
            raise
        except (StepConfigError, StepFailed, ValueError) as exc:  # a bad input message
            loc: Loc = ("tests", index, "input")
            raise document.positions.error([(loc, f"cannot build the input: {exc}")]) from None
        result.line = line
        results.append(result)
    return SuiteResult(path, pipelines_path, results)


def _validate(document: Document) -> TestFileSpec:
    data = document.data
    if not isinstance(data, Mapping):
        raise document.positions.error([((), f"expected a mapping with 'tests', got {show(data)}")])
    try:
        return TestFileSpec.model_validate(data)
    except ValidationError as exc:
        problems = validation_problems(exc, (), data, TestFileSpec)
        raise document.positions.error(problems) from None


def _check_cases(spec: TestFileSpec, pipelines: PipelineFile, positions: Positions) -> None:
    problems: list[tuple[Loc, str]] = []
    for index, case in enumerate(spec.tests):
        loc: Loc = ("tests", index)
        names = pipelines.names
        if case.pipeline not in names:
            hint = did_you_mean(case.pipeline, names) or f"; pipelines: {', '.join(names)}"
            problems.append(((*loc, "pipeline"), f"no pipeline named {case.pipeline!r}{hint}"))
            continue
        pipeline = pipelines.get(case.pipeline)
        if case.source >= len(pipeline.sources):
            problems.append(
                (
                    (*loc, "source"),
                    (
                        f"pipeline {case.pipeline!r} has {len(pipeline.sources)} source(s); source "
                        f"{case.source} does not exist (sources count from 0)"
                    ),
                )
            )
        given = [k for k in ("expect", "expect_dead_letter") if getattr(case, k) is not None]
        if case.expect_nothing and given:
            problems.append(((*loc, "expect_nothing"), f"goes alone, not with {given[0]!r}"))
        elif not case.expect_nothing and not given:
            problems.append(
                (loc, "say what to expect: 'expect', 'expect_dead_letter' or 'expect_nothing'")
            )
        for i, message in enumerate(case.input):
            where = (*loc, "input", i)
            problems += _check_message(message, where, expected=False)
        for i, message in enumerate(case.expect or []):
            problems += _check_message(message, (*loc, "expect", i), expected=True)
    if problems:
        raise positions.error(problems)


def _check_message(message: MessageSpec, loc: Loc, *, expected: bool) -> list[tuple[Loc, str]]:
    problems: list[tuple[Loc, str]] = []
    bodies = [name for name in _BODY_FIELDS if _named(message, name)]
    if len(bodies) > 1:
        problems.append(((*loc, bodies[1]), f"give one of {', '.join(_BODY_FIELDS)}, not both"))
    if expected:
        problems.extend(
            ((*loc, name), f"{name!r} is for input messages")
            for name in _INPUT_ONLY
            if getattr(message, name) is not None
        )
    elif message.target is not None:
        problems.append(((*loc, "target"), "'target' is for expected messages"))
    if message.avro is not None and message.avro.schema_ is not None and message.avro.schema_file:
        problems.append(((*loc, "avro"), "give 'schema' or 'schema_file', not both"))
    return problems


def _named(message: MessageSpec, name: str) -> bool:
    attribute = "json_" if name == "json" else name
    return attribute in message.model_fields_set


def _settings(spec: TestFileSpec, pipelines: PipelineFile) -> dict[str, str]:
    """The test file's settings, plus a placeholder connection string for each connection
    it does not give (``Endpoint=sb://<name in lower case>.test/``)."""
    settings = dict(spec.settings)
    for pipeline in pipelines.pipelines:
        endpoints = [*pipeline.sources, *pipeline.target_endpoints().values()]
        for endpoint in endpoints:
            settings.setdefault(
                endpoint.connection,
                f"Endpoint=sb://{endpoint.connection.lower()}.test/;"
                "SharedAccessKeyName=test;SharedAccessKey=test",
            )
    return settings


def _run_case(
    case: CaseSpec, pipeline: Pipeline, settings: dict[str, str], now: datetime, base: Path
) -> CaseResult:
    context = StepContext(settings=settings, now=lambda: now)
    built = pipeline.build(settings, context)
    task = built.tasks[case.source]
    inputs = [_input_message(m, pipeline, base) for m in case.input]
    outputs: list[Message] = []
    dead: list[tuple[str, str]] = []
    for message in inputs:
        outcome = task.plan(message, now=now)
        outputs += outcome.outputs
        if outcome.dead_letter is not None:
            dead.append(outcome.dead_letter)
    names = _target_names(pipeline)
    expected_outputs = [] if case.expect_nothing else list(case.expect or [])
    want = {
        "outputs": [_expected_view(m) for m in expected_outputs],
        "dead_letters": _expected_dead(case, len(inputs)),
    }
    got_outputs = []
    for i, output in enumerate(outputs):
        like = expected_outputs[i] if i < len(expected_outputs) else None
        got_outputs.append(_actual_view(output, like, names, pipeline, base))
    got_dead = []
    for i, (reason, _) in enumerate(dead):
        wanted = want["dead_letters"][i] if i < len(want["dead_letters"]) else None
        got_dead.append(wanted if _reason_matches(wanted, reason) else reason)
    got = {"outputs": got_outputs, "dead_letters": got_dead}
    notes = [f"dead-lettered: {reason}: {description}" for reason, description in dead]
    if want == got:
        return CaseResult(case.name, case.pipeline, None, True)
    diff = "\n".join(
        difflib.unified_diff(
            _render(want).splitlines(),
            _render(got).splitlines(),
            "expected",
            "actual",
            lineterm="",
        )
    )
    return CaseResult(case.name, case.pipeline, None, False, diff, notes)


def _render(view: Any) -> str:
    return json.dumps(view, indent=2, sort_keys=True, ensure_ascii=False, default=_plain)


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return f"PT{value.total_seconds():g}S"
    if isinstance(value, bytes):
        return "base64:" + base64.b64encode(value).decode("ascii")
    return str(value)


def _expected_dead(case: CaseSpec, inputs: int) -> list[Any]:
    wanted = case.expect_dead_letter
    if wanted is None or wanted is False:
        return []
    if wanted is True:
        return ["(any reason)"] * inputs
    if isinstance(wanted, str):
        return [wanted] * inputs
    return list(wanted)


def _reason_matches(wanted: Any, reason: str) -> bool:
    """Matches the full reason (``transcode: invalid Avro body``) or the part after the
    step name; ``(any reason)`` matches any."""
    if wanted is None:
        return False
    if wanted == "(any reason)":
        return True
    return wanted in (reason, reason.partition(": ")[2])


# ---------------------------------------------------------------------- messages


def _avro_schema(avro: AvroBody, pipeline: Pipeline, base: Path) -> AvroSchema:
    """The message's own schema, else the first Avro schema of the pipeline's steps."""
    if avro.schema_ is not None or avro.schema_file is not None:
        schema_file = str(base / avro.schema_file) if avro.schema_file else None
        schema = load_avro_schema(avro.schema_, schema_file)
    else:
        schema = None
        for _, options in pipeline.steps:
            for inline, path in (("schema", "schema_file"), ("avro_schema", "avro_schema_file")):
                if options.get(inline) is not None or options.get(path) is not None:
                    schema = load_avro_schema(options.get(inline), options.get(path))
                    break
            if schema is not None:
                break
    if schema is None:
        raise ValueError("an 'avro' body needs 'schema' (no step of the pipeline has one)")
    return schema


def _input_message(spec: MessageSpec, pipeline: Pipeline, base: Path) -> Message:
    if spec.body is not None:
        body = spec.body.encode("utf-8")
    elif _named(spec, "json"):
        body = json.dumps(spec.json_, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    elif spec.body_base64 is not None:
        try:
            body = base64.b64decode(spec.body_base64, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"body_base64 is not base64: {exc}") from None
    elif spec.avro is not None:
        schema = _avro_schema(spec.avro, pipeline, base)
        body = encode_body(spec.avro.value, spec.avro.format, schema)
    else:
        body = b""
    fields = {name: getattr(spec, name) for name in (*_SIMPLE_FIELDS, *_INPUT_ONLY)}
    return Message(body=body, application_properties=dict(spec.properties or {}), **fields)


def _target_names(pipeline: Pipeline) -> dict[str | None, list[str]]:
    """What an expected ``target`` may say for each target: its key (``target`` for the
    single one), its entity, or ``connection/entity``."""
    names: dict[str | None, list[str]] = {}
    for key, endpoint in pipeline.target_endpoints().items():
        names[key] = [
            f"{endpoint.connection}/{endpoint.entity}",
            DEFAULT_TARGET_NAME if key is None else key,
            endpoint.entity,
        ]
    return names


def _expected_view(spec: MessageSpec) -> dict[str, Any]:
    view: dict[str, Any] = {}
    for name in spec.model_fields_set:
        key = "json" if name == "json_" else name
        value = getattr(spec, name)
        if key == "avro":
            view["avro"] = value.value
        elif key == "properties":
            view["properties"] = dict(value or {})
        else:
            view[key] = value
    return view


def _actual_view(
    message: Message,
    like: MessageSpec | None,
    names: dict[str | None, list[str]],
    pipeline: Pipeline,
    base: Path,
) -> dict[str, Any]:
    """The output as the expected message it is compared with names its fields (all the
    usual ones when there is none)."""
    if like is not None:
        fields = {"json" if n == "json_" else n for n in like.model_fields_set}
    else:
        fields = {"target", "message_id", "session_id", "properties"}
        fields.add("json" if _json_or_none(message.body) is not None else "body")
    view: dict[str, Any] = {}
    for name in fields:
        if name == "target":
            aliases = names.get(message.target, [repr(message.target)])
            wanted = like.target if like is not None else None
            view["target"] = wanted if wanted in aliases else aliases[0]
        elif name == "body":
            try:
                view["body"] = message.body.decode("utf-8")
            except UnicodeDecodeError:
                view["body"] = "base64:" + base64.b64encode(message.body).decode("ascii")
        elif name == "json":
            view["json"] = _json_or_none(message.body, show_error=True)
        elif name == "body_base64":
            view["body_base64"] = base64.b64encode(message.body).decode("ascii")
        elif name == "avro":
            view["avro"] = _avro_view(message, like, pipeline, base)
        elif name == "properties":
            named = set((like.properties or {}) if like is not None else {})
            view["properties"] = {
                k: v
                for k, v in message.application_properties.items()
                if not k.startswith(STAMP_PREFIX) or k in named
            }
        else:
            view[name] = getattr(message, name)
    return view


def _json_or_none(body: bytes, *, show_error: bool = False) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        return f"<not JSON: {exc}>" if show_error else None


def _avro_view(message: Message, like: MessageSpec | None, pipeline: Pipeline, base: Path) -> Any:
    assert like is not None and like.avro is not None
    try:
        schema = _avro_schema(like.avro, pipeline, base)
        value, _ = decode_body(message.body, like.avro.format, schema)
    except (StepFailed, StepConfigError, ValueError) as exc:
        return f"<not {like.avro.format}: {exc}>"
    return avro_to_json(value)


__all__ = [
    "CaseResult",
    "SuiteResult",
    "find_test_files",
    "run_test_file",
]
