"""Schema validation, the editor pattern's "validate".

Data from external sources often has to be checked against a contract before it is passed
on. ``validate`` checks the body against a JSON Schema (``jsonschema``, the draft the schema's
``$schema`` names, 2020-12 by default) and/or an Avro schema, and passes the message on
unchanged when it conforms. A message that does not conform fails with a reason naming the
failing path and what is wrong (``$.order.qty: -1 is less than the minimum of 0``); the
step's ``on_error`` then decides: dead-letter with that reason (default), ``drop`` (logged),
or ``route`` to ``error_target`` with the reason in ``repl-error-*`` properties. The
description lists every violation found (up to ``max_errors``).

``body`` says how to read the body: ``json`` (default), or an Avro encoding (the Avro schema
decodes it; a JSON Schema then checks the decoded value in its JSON form, see ``transcode``).
For a JSON body, the Avro schema check asks "could ``transcode`` write this as Avro": the
same mapping and rules apply (extra fields are ignored, fields with defaults or nullable
unions may be missing).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fastavro.validation
from jsonschema import exceptions as jsonschema_errors
from jsonschema import validators
from pydantic import Field, model_validator

from ...messages import Message
from ..steps import Step, StepConfigError, StepContext, StepFailed, StepOptions, step
from .transcode import (
    AvroMismatch,
    AvroSchemaJson,
    Format,
    avro_to_json,
    decode_body,
    json_to_avro,
    load_avro_schema,
)

MAX_REASON = 300


class ValidateOptions(StepOptions):
    """A JSON Schema and/or an Avro schema (inline or in a file) the body must conform to."""

    json_schema: dict[str, Any] | bool | None = None
    json_schema_file: str | None = None
    avro_schema: AvroSchemaJson | None = None
    avro_schema_file: str | None = None
    body: Format = "json"
    """How the body is encoded (an Avro encoding needs the Avro schema, but a container)."""
    check_formats: bool = False
    """Also check JSON Schema ``format`` keywords (date-time, email, ...)."""
    max_errors: int = Field(10, ge=1)

    @model_validator(mode="after")
    def _schemas(self) -> ValidateOptions:
        if self.json_schema is not None and self.json_schema_file is not None:
            raise ValueError("give 'json_schema' or 'json_schema_file', not both")
        if self.avro_schema is not None and self.avro_schema_file is not None:
            raise ValueError("give 'avro_schema' or 'avro_schema_file', not both")
        has_json = self.json_schema is not None or self.json_schema_file is not None
        has_avro = self.avro_schema is not None or self.avro_schema_file is not None
        if not (has_json or has_avro):
            raise ValueError("give a JSON Schema or an Avro schema")
        if self.body in ("avro-binary", "avro-single-object") and not has_avro:
            raise ValueError(f"body {self.body} needs 'avro_schema' or 'avro_schema_file'")
        return self


def _load_json_schema(options: ValidateOptions) -> Any:
    schema: Any = options.json_schema
    if options.json_schema_file is not None:
        try:
            schema = json.loads(Path(options.json_schema_file).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise StepConfigError(
                f"cannot read JSON Schema {options.json_schema_file!r}: {exc}"
            ) from None
    if schema is None:
        return None
    cls = validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema_errors.SchemaError as exc:
        raise StepConfigError(f"invalid JSON Schema: {exc.message}") from None
    return cls(schema, format_checker=cls.FORMAT_CHECKER if options.check_formats else None)


def _short(text: str) -> str:
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


@step("validate", ValidateOptions)
def build_validate(options: ValidateOptions, context: StepContext) -> Step:
    """Passes on only messages whose body conforms to a JSON Schema or an Avro schema; the
    rest take the error path with the failing path and message as the reason."""
    json_validator = _load_json_schema(options)
    avro = load_avro_schema(options.avro_schema, options.avro_schema_file)

    def check_json_schema(value: Any) -> None:
        errors = sorted(json_validator.iter_errors(value), key=lambda e: list(e.absolute_path))
        if not errors:
            return
        best = jsonschema_errors.best_match(errors)
        details = [f"{e.json_path}: {e.message}" for e in errors[: options.max_errors]]
        if len(errors) > options.max_errors:
            details.append(f"... {len(errors) - options.max_errors} more")
        raise StepFailed(_short(f"{best.json_path}: {best.message}"), "\n".join(details))

    def check_avro(value: Any) -> None:
        assert avro is not None
        try:
            datum = json_to_avro(value, avro)
            fastavro.validation.validate(datum, avro.parsed, raise_errors=True)
        except AvroMismatch as exc:
            raise StepFailed(_short(str(exc)), "does not fit the Avro schema") from None
        except fastavro.validation.ValidationError as exc:
            raise StepFailed("$: does not fit the Avro schema", str(exc)) from None

    def run(message: Message) -> list[Message]:
        if options.body == "json":
            value, _ = decode_body(message.body, "json", None)
            if avro is not None:
                check_avro(value)
        else:
            datum, _ = decode_body(message.body, options.body, avro)  # decoding checks Avro
            value = avro_to_json(datum)
        if json_validator is not None:
            check_json_schema(value)
        return [message]

    return run
