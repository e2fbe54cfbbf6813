"""The JSON Schema of the pipeline file, with every step's options, for editors.

Point an editor at it (``# yaml-language-server: $schema=pipelines.schema.json`` in YAML,
``"$schema"`` in JSON) to get completion and checks of step options. The schema is generated
from the same pydantic models that validate the file, so the two cannot drift apart; the
loader still checks more than the schema can say (conditions parse, names are unique, ...).
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic.json_schema import models_json_schema

from ..tasks import registry
from .spec import Endpoint, FileSpec

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a pipeline file."""
    steps = {spec.name: spec for spec in registry.specs() if spec.name != "route"}
    models: list[Any] = [(FileSpec, "validation"), (Endpoint, "validation")]
    models += [(spec.options, "validation") for spec in steps.values()]
    refs, top = models_json_schema(models, ref_template="#/$defs/{model}")
    defs: dict[str, Any] = copy.deepcopy(top.get("$defs", {}))
    endpoint_ref = refs[(Endpoint, "validation")]["$ref"]

    def name_of(ref: dict[str, Any]) -> str:
        return str(ref["$ref"]).rsplit("/", 1)[-1]

    variants: list[dict[str, Any]] = []
    bare: list[str] = []
    for name, spec in steps.items():
        ref = refs[(spec.options, "validation")]
        options = defs[name_of(ref)]
        properties = options.get("properties", {})
        if "error_target" in properties:
            properties["error_target"] = {
                "$ref": endpoint_ref,
                "description": "Where this step's failed messages go with on_error: route "
                "(default: the pipeline's error_target).",
            }
        required = set(options.get("required", []))
        optional = not required and not _needs_something(spec.options)
        value: dict[str, Any] = {"anyOf": [ref, {"type": "null"}]} if optional else dict(ref)
        if spec.doc:
            value["description"] = spec.doc
        variants.append(
            {
                "type": "object",
                "properties": {name: value},
                "required": [name],
                "additionalProperties": False,
            }
        )
        if optional:
            bare.append(name)
    if bare:
        variants.append({"enum": bare, "description": "A step with its default options."})
    pipeline = defs["PipelineSpec"]
    pipeline["properties"]["steps"]["items"] = {"oneOf": variants}
    file_schema = defs.pop(name_of(refs[(FileSpec, "validation")]))
    file_schema.pop("title", None)
    return {
        "$schema": SCHEMA_DIALECT,
        "$id": "https://replication.local/schemas/pipelines.schema.json",
        "title": "Service Bus replication pipelines",
        "description": "pipelines.yaml: sources, editor steps and targets of each pipeline.",
        **file_schema,
        "$defs": defs,
    }


def _needs_something(options: Any) -> bool:
    """Options whose defaults alone do not validate (a model validator asks for more)."""
    try:
        options.model_validate({})
    except Exception:
        return True
    return False
