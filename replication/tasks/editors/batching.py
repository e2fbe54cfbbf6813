"""Many messages into one and back, the editor pattern's "batching".

A source may deliver many small messages that the target should get as one (fewer, larger
transfers), or batches that the target should get one record per message. ``unbatch`` is an
ordinary step: one message in, one message per element out. ``batch`` cannot be one: it
needs several messages at once. So ``build_step("batch", ...)`` returns a ``BatchStep`` whose
``accepts_list`` is True and which the runner calls with a whole received batch (the
outputs of the per-message steps before it, in arrival order):

* ``step.batch(messages) -> BatchResult``: the batched ``outputs``, for each output the
  ``members`` (indexes into ``messages``) it holds, so the runner settles exactly those
  source messages once the output is sent, and the ``failures`` (index, ``StepFailed``) of
  messages that could not be batched; the runner applies the step's ``on_error`` to them.
* ``step(messages: list) -> list[Message]``: the same, with ``on_error`` applied here:
  ``drop`` logs and skips, ``route`` adds a copy with ``repl-error-*`` properties addressed
  to ``error_target`` after the batches; ``dead-letter`` raises ``BatchFailed`` carrying the
  ``BatchResult`` (the outputs are still good to send; dead-letter the failed members).
* ``step(message: Message)``, as ``run_chain`` calls it: a batch of one (failures raise
  ``StepFailed``, so the chain's error path applies). Harmless, but batches nothing.

Grouping keeps order and never mixes what must stay apart: messages are grouped by
(target, session id, partition key); a batch holds messages of one group only, in arrival
order; groups come out in order of their first message, and consecutive batches of a group
in order. A batch closes at ``max_messages`` or when adding a message would pass
``max_bytes`` of body (a single message larger than that forms a batch of its own).

The batched message is a copy of the group's first message (so its source facts, e.g.
enqueued time and sequence number for stamping, are the first member's) with: the new body
and content type (``application/json`` or ``avro/container``); a message id derived from the
members' ids (the same members always give the same id, so duplicate detection at the target
still works on redelivery); the application properties all members share with equal values,
plus ``batch_count_property`` (the number of members); correlation id, subject, reply-to,
to, time to live and scheduled time only if all members agree, else unset.

Formats: ``json`` writes a JSON array of the member bodies (each must be JSON); with
``include_metadata`` each element is an envelope ``{"body": <JSON>}`` (or ``"body_base64"``
for a body that is not JSON) with ``message_id``, ``correlation_id``, ``subject``,
``content_type`` and ``properties`` (string/number/boolean values; others as strings), which
``unbatch`` with ``include_metadata`` restores. ``avro-container`` writes one Avro object
container with a record per member (``item_format`` says how member bodies are encoded:
JSON or an Avro encoding with ``schema``); ``unbatch`` gives each record as ``item_format``.
Compressed bodies must be decompressed first (``transcode``).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from ...messages import Message
from ..steps import (
    ERROR_DESCRIPTION,
    ERROR_REASON,
    ERROR_STEP,
    Step,
    StepContext,
    StepFailed,
    StepOptions,
    step,
)
from .transcode import (
    CONTENT_ENCODING,
    CONTENT_TYPES,
    AvroSchema,
    AvroSchemaJson,
    avro_to_json,
    decode_body,
    dump_json,
    encode_body,
    load_avro_schema,
    parse_json,
    read_container,
)

log = logging.getLogger("replication.tasks")

ItemFormat = Literal["json", "avro-binary", "avro-single-object"]
_BATCH_ID_NAMESPACE = uuid.UUID("8f3c5a9e-2d41-4c6b-9a57-1b0e7d2c4f68")
_CONTAINER_OVERHEAD = 128
"""Approximate bytes an Avro container adds besides the schema and the records."""
MAX_ID_LENGTH = 128


class _BatchFormatOptions(StepOptions):
    format: Literal["json", "avro-container"] = "json"
    include_metadata: bool = False
    """JSON only: elements are envelopes with the body and the message's metadata."""
    item_format: ItemFormat = "json"
    """Avro container only: how member bodies are (batch) / become (unbatch) encoded."""
    schema_: AvroSchemaJson | None = Field(None, alias="schema")
    schema_file: str | None = None
    batch_count_property: str | None = "batch-count"

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True)

    @model_validator(mode="after")
    def _consistent(self) -> _BatchFormatOptions:
        if self.schema_ is not None and self.schema_file is not None:
            raise ValueError("give 'schema' or 'schema_file', not both")
        if self.format == "json" and self.item_format != "json":
            raise ValueError("'item_format' is for format avro-container")
        if self.format == "avro-container" and self.include_metadata:
            raise ValueError("'include_metadata' is for format json")
        return self

    @property
    def has_schema(self) -> bool:
        return self.schema_ is not None or self.schema_file is not None


class BatchOptions(_BatchFormatOptions):
    """How many messages go into one, and in which format."""

    max_messages: int = Field(100, ge=1)
    max_bytes: int | None = Field(200_000, ge=1)
    """Body size a batch stays under (approximate for Avro); None: no limit."""

    @model_validator(mode="after")
    def _schema_needed(self) -> BatchOptions:
        if self.format == "avro-container" and not self.has_schema:
            raise ValueError("format avro-container needs 'schema' or 'schema_file'")
        return self


class UnbatchOptions(_BatchFormatOptions):
    """The format of the batches to split (an Avro container carries its own schema;
    ``schema`` then reads it with that reader schema)."""

    @model_validator(mode="after")
    def _schema_needed(self) -> UnbatchOptions:
        if self.item_format != "json" and not self.has_schema:
            raise ValueError(f"item_format {self.item_format} needs 'schema' or 'schema_file'")
        return self


# ---------------------------------------------------------------------- batch


@dataclass
class BatchResult:
    outputs: list[Message] = field(default_factory=list)
    members: list[list[int]] = field(default_factory=list)
    """For each output, the indexes of the input messages it holds."""
    failures: list[tuple[int, StepFailed]] = field(default_factory=list)
    """Inputs that could not be batched: (index, failure)."""


class BatchFailed(StepFailed):
    """Some messages of a list could not be batched and the policy is to dead-letter them;
    ``result`` still has the good outputs."""

    def __init__(self, result: BatchResult) -> None:
        first = result.failures[0][1]
        super().__init__(first.reason, f"{len(result.failures)} message(s) failed")
        self.result = result


def _element(message: Message, options: BatchOptions, schema: AvroSchema | None) -> Any:
    """The value that stands for ``message`` in the batch; ``StepFailed`` if it cannot."""
    if message.application_properties.get(CONTENT_ENCODING):
        raise StepFailed("body is compressed", "decompress before batching")
    if options.format == "avro-container":
        value, _ = decode_body(message.body, options.item_format, schema)
        return value
    if not options.include_metadata:
        return parse_json(message.body)
    envelope: dict[str, Any] = {}
    try:
        envelope["body"] = parse_json(message.body)
    except StepFailed:
        envelope["body_base64"] = base64.b64encode(message.body).decode("ascii")
    for name in ("message_id", "correlation_id", "subject", "content_type"):
        value = getattr(message, name)
        if value is not None:
            envelope[name] = value
    if message.application_properties:
        envelope["properties"] = {
            key: value
            if isinstance(value, str | int | float | bool) or value is None
            else str(value)
            for key, value in message.application_properties.items()
        }
    return envelope


def _element_size(value: Any, options: BatchOptions, schema: AvroSchema | None) -> int:
    if options.format == "avro-container":
        assert schema is not None
        return len(encode_body(value, "avro-binary", schema))
    return len(dump_json(value)) + 1  # the comma


def _batch_id(members: Sequence[Message]) -> str:
    parts = [
        m.message_id if m.message_id is not None else hashlib.sha256(m.body).hexdigest()
        for m in members
    ]
    return str(uuid.uuid5(_BATCH_ID_NAMESPACE, "\n".join(parts)))


_SHARED_FIELDS = (
    "correlation_id",
    "subject",
    "reply_to",
    "reply_to_session_id",
    "to",
    "time_to_live",
    "scheduled_enqueue_time",
)


def _combine(
    members: Sequence[Message], values: list[Any], options: BatchOptions, schema: AvroSchema | None
) -> Message:
    first = members[0]
    shared = {
        name: value
        for name, value in first.application_properties.items()
        if all(
            name in m.application_properties and m.application_properties[name] == value
            for m in members[1:]
        )
    }
    if options.batch_count_property:
        shared[options.batch_count_property] = len(members)
    changes: dict[str, Any] = {
        name: getattr(first, name)
        if all(getattr(m, name) == getattr(first, name) for m in members)
        else None
        for name in _SHARED_FIELDS
    }
    if options.format == "avro-container":
        body = encode_body(values, "avro-container", schema)
    else:
        body = dump_json(values)
    return first.copy(
        body=body,
        content_type=CONTENT_TYPES[options.format],
        message_id=_batch_id(members),
        application_properties=shared,
        **changes,
    )


def batch_messages(
    messages: Sequence[Message], options: BatchOptions, schema: AvroSchema | None = None
) -> BatchResult:
    """Batches ``messages`` (see the module doc): pure, order-keeping, never mixing
    (target, session id, partition key) groups."""
    if schema is None and options.format == "avro-container":
        schema = load_avro_schema(options.schema_, options.schema_file)
    result = BatchResult()
    groups: dict[tuple[str | None, str | None, str | None], list[tuple[int, Any, int]]] = {}
    for index, message in enumerate(messages):
        try:
            value = _element(message, options, schema)
            size = _element_size(value, options, schema)
        except StepFailed as exc:
            result.failures.append((index, exc))
            continue
        key = (message.target, message.session_id, message.partition_key)
        groups.setdefault(key, []).append((index, value, size))
    base = 2 if options.format == "json" else _container_base(schema)
    for items in groups.values():
        for chunk in _chunks(items, options, base):
            indexes = [index for index, _, _ in chunk]
            try:
                output = _combine(
                    [messages[i] for i in indexes], [v for _, v, _ in chunk], options, schema
                )
            except StepFailed as exc:  # cannot happen for checked elements; keep it honest
                result.failures.extend((i, exc) for i in indexes)
                continue
            result.outputs.append(output)
            result.members.append(indexes)
    return result


def _container_base(schema: AvroSchema | None) -> int:
    return _CONTAINER_OVERHEAD + (len(str(schema.parsed)) if schema else 0)


def _chunks(
    items: list[tuple[int, Any, int]], options: BatchOptions, base: int
) -> Iterable[list[tuple[int, Any, int]]]:
    chunk: list[tuple[int, Any, int]] = []
    size = base
    for item in items:
        too_big = options.max_bytes is not None and size + item[2] > options.max_bytes
        if chunk and (len(chunk) >= options.max_messages or too_big):
            yield chunk
            chunk, size = [], base
        chunk.append(item)
        size += item[2]
    if chunk:
        yield chunk


@dataclass(frozen=True)
class BatchStep:
    """The built ``batch`` step: call it with a list (see the module doc)."""

    options: BatchOptions
    schema: AvroSchema | None
    accepts_list: bool = True

    def batch(self, messages: Sequence[Message]) -> BatchResult:
        return batch_messages(messages, self.options, self.schema)

    def __call__(self, messages: Message | Sequence[Message]) -> list[Message]:
        if isinstance(messages, Message):
            result = self.batch([messages])
            if result.failures:
                raise result.failures[0][1]
            return result.outputs
        result = self.batch(messages)
        if not result.failures:
            return result.outputs
        if self.options.on_error == "dead-letter":
            raise BatchFailed(result)
        outputs = list(result.outputs)
        for index, failure in result.failures:
            message = messages[index]
            if self.options.on_error == "drop":
                log.warning("step batch dropped message %s: %s", message.message_id, failure)
                continue
            props = dict(message.application_properties)
            props[ERROR_STEP] = "batch"
            props[ERROR_REASON] = failure.reason
            props[ERROR_DESCRIPTION] = failure.description[:1024]
            outputs.append(
                message.copy(application_properties=props, target=self.options.error_target)
            )
        return outputs


@step("batch", BatchOptions)
def build_batch(options: BatchOptions, context: StepContext) -> BatchStep:
    """Combines the messages of a received batch into fewer messages (JSON array or Avro
    container), per session/partition group and in order; call the built step with a list."""
    schema = load_avro_schema(options.schema_, options.schema_file)
    return BatchStep(options, schema)


# ---------------------------------------------------------------------- unbatch


def _part_id(batch_id: str | None, index: int) -> str | None:
    if batch_id is None:
        return None
    candidate = f"{batch_id}:{index}"
    if len(candidate) <= MAX_ID_LENGTH:
        return candidate
    return str(uuid.uuid5(_BATCH_ID_NAMESPACE, candidate))


def _restore(envelope: Any, index: int) -> dict[str, Any]:
    if not isinstance(envelope, dict) or ("body" in envelope) == ("body_base64" in envelope):
        raise StepFailed(
            "invalid batch element", f"element {index} is not an envelope with one body"
        )
    changes: dict[str, Any] = {}
    if "body" in envelope:
        changes["body"] = dump_json(envelope["body"])
    else:
        try:
            changes["body"] = base64.b64decode(envelope["body_base64"], validate=True)
        except (ValueError, TypeError):
            raise StepFailed("invalid batch element", f"element {index}: bad base64") from None
    changes["content_type"] = envelope.get("content_type")
    for name in ("message_id", "correlation_id", "subject"):
        if name in envelope:
            changes[name] = envelope[name]
    props = envelope.get("properties") or {}
    if not isinstance(props, dict):
        raise StepFailed("invalid batch element", f"element {index}: properties not an object")
    changes["application_properties"] = props
    return changes


@step("unbatch", UnbatchOptions)
def build_unbatch(options: UnbatchOptions, context: StepContext) -> Step:
    """Splits a batch message (JSON array or Avro container) into one message per element,
    for targets whose consumers handle one record at a time."""
    schema = load_avro_schema(options.schema_, options.schema_file)

    def run(message: Message) -> list[Message]:
        if message.application_properties.get(CONTENT_ENCODING):
            raise StepFailed("body is compressed", "decompress before unbatching")
        used = schema
        if options.format == "avro-container":
            elements, used = read_container(message.body, schema)
        else:
            elements = parse_json(message.body)
            if not isinstance(elements, list):
                raise StepFailed("batch body is not a JSON array", "cannot unbatch")
        base_props = dict(message.application_properties)
        if options.batch_count_property:
            base_props.pop(options.batch_count_property, None)
        outputs = []
        for index, element in enumerate(elements):
            changes: dict[str, Any] = {
                "message_id": _part_id(message.message_id, index),
                "content_type": CONTENT_TYPES[options.item_format],
            }
            if options.include_metadata:
                changes.update(_restore(element, index))
                changes["application_properties"] = {
                    **base_props,
                    **changes["application_properties"],
                }
            elif options.format == "avro-container" and options.item_format != "json":
                changes["body"] = encode_body(element, options.item_format, used)
            else:
                changes["body"] = dump_json(avro_to_json(element))
            changes.setdefault("application_properties", dict(base_props))
            outputs.append(message.copy(**changes))
        return outputs

    return run
