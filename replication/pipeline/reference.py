"""The pipeline file reference in Markdown, generated from the JSON Schema.

``python -m replication schema --markdown`` prints it; ``docs/pipeline-reference.md`` is that
output (a test keeps the two equal), so the reference cannot drift from what the loader
accepts: every field, type, default, limit and description comes from the models.
"""

from __future__ import annotations

import json
from typing import Any

SECTIONS = [
    ("PipelineSpec", "Pipeline", "One item of `pipelines:`."),
    (
        "Endpoint",
        "Endpoint",
        "A `source`, `sources` item, `target`, route target or `error_target`.",
    ),
    ("RouteSpec", "Route", "One item of a pipeline's `routes`."),
    ("FailoverSpec", "Failover", "An endpoint's `failover`: where its namespace is now."),
    ("DnsFailover", "Failover: dns", "CNAME of the alias, then SRV records (port 5671)."),
    ("FileFailover", "Failover: file", "The first non-comment line of a file or URL."),
    ("KeySource", "Key", "A key that steps read from an app setting."),
]

TITLES = {name: title for name, title, _ in SECTIONS}


def markdown_reference(schema: dict[str, Any]) -> str:
    defs: dict[str, Any] = schema.get("$defs", {})
    anchors = {name: _anchor(title) for name, title, _ in SECTIONS}
    steps = _steps(schema, defs)
    anchors.update({options: _anchor(f"step {name}") for name, options, _ in steps})
    out = [
        "# Pipeline file reference",
        "",
        "Generated from the pipeline file's JSON Schema by `python -m replication schema "
        "--markdown`; do not edit by hand. The guide with examples is "
        "`replication/pipeline/README.md`; `python -m replication validate` checks a file "
        "against exactly this.",
        "",
        "## File",
        "",
        *_table(schema, defs, anchors),
    ]
    for name, title, intro in SECTIONS:
        if name in defs:
            out += [
                "",
                f"## {title}",
                "",
                intro,
                "",
                *_rules(defs[name]),
                *_table(defs[name], defs, anchors),
            ]
    out += [
        "",
        "## Steps",
        "",
        "Each item of `steps` is a one-key mapping, `step-name: {options}`; a step whose "
        "options are all optional may also be written as its bare name.",
        "",
    ]
    for name, options, description in steps:
        out += [f"### Step `{name}`", "", description, ""]
        if options in defs:
            out += [*_rules(defs[options]), *_table(defs[options], defs, anchors), ""]
    return "\n".join(out).rstrip() + "\n"


def _steps(schema: dict[str, Any], defs: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(step name, options model name, description) from the ``steps`` item variants."""
    pipeline = defs.get("PipelineSpec", {})
    items = pipeline.get("properties", {}).get("steps", {}).get("items", {})
    found = []
    for variant in items.get("oneOf", []):
        for name, value in variant.get("properties", {}).items():
            ref = _first_ref(value)
            description = " ".join(str(value.get("description", "")).split())
            found.append((name, ref or "", description.replace("``", "`")))
    return sorted(found)


def _rules(node: dict[str, Any]) -> list[str]:
    """'Exactly one of ...' lines for the model's oneOf / allOf(oneOf) groups."""
    groups = [node["oneOf"]] if "oneOf" in node else []
    groups += [part["oneOf"] for part in node.get("allOf", []) if "oneOf" in part]
    lines = []
    for group in groups:
        names = [" + ".join(f"`{n}`" for n in choice.get("required", [])) for choice in group]
        if all(names):
            lines.append("Exactly one of " + ", ".join(names) + ".")
    return [*lines, ""] if lines else []


def _table(node: dict[str, Any], defs: dict[str, Any], anchors: dict[str, str]) -> list[str]:
    properties: dict[str, Any] = node.get("properties", {})
    required = set(node.get("required", []))
    rows = ["| field | type | required | default | description |", "|---|---|---|---|---|"]
    for field, spec in properties.items():
        if field == "$schema":
            continue
        default = f"`{json.dumps(spec['default'])}`" if "default" in spec else ""
        if default == "`null`":
            default = ""
        kind = "list of [steps](#steps)" if field == "steps" else _type(spec, defs, anchors)
        rows.append(
            "| "
            + " | ".join(
                [
                    f"`{field}`",
                    kind,
                    "yes" if field in required else "",
                    default,
                    _describe(spec),
                ]
            )
            + " |"
        )
    return rows


def _type(spec: dict[str, Any], defs: dict[str, Any], anchors: dict[str, str]) -> str:
    if "$ref" in spec:
        name = str(spec["$ref"]).rsplit("/", 1)[-1]
        title = TITLES.get(name, name)
        return f"[{title}](#{anchors[name]})" if name in anchors else title
    for key in ("anyOf", "oneOf"):
        if key in spec:
            kinds = [_type(s, defs, anchors) for s in spec[key] if s.get("type") != "null"]
            return " or ".join(dict.fromkeys(k for k in kinds if k)) or "null"
    if "enum" in spec:
        return " \\| ".join(f"`{v}`" for v in spec["enum"])
    if "const" in spec:
        return f"`{spec['const']}`"
    kind = spec.get("type")
    if kind == "array":
        return f"list of {_type(spec.get('items', {}), defs, anchors) or 'any'}"
    if kind == "object":
        extra = spec.get("additionalProperties")
        return f"map of {_type(extra, defs, anchors)}" if isinstance(extra, dict) else "mapping"
    if isinstance(kind, list):
        return " or ".join(kind)
    return str(kind or "any")


def _describe(spec: dict[str, Any]) -> str:
    parts = []
    description = spec.get("description")
    if description is None:
        for key in ("anyOf", "oneOf"):
            for option in spec.get(key, []):
                description = description or option.get("description")
    if description:
        parts.append(" ".join(str(description).split()).replace("``", "`"))
    limits = {
        "minLength": "at least {} characters",
        "maxLength": "at most {} characters",
        "minimum": ">= {}",
        "maximum": "<= {}",
        "exclusiveMinimum": "> {}",
        "exclusiveMaximum": "< {}",
        "minItems": "at least {} item(s)",
        "pattern": "matches `{}`",
    }
    for key, text in limits.items():
        for source in (spec, *spec.get("anyOf", [])):
            if key in source:
                parts.append(text.format(source[key]))
                break
    text = ""
    for part in parts:
        text += ("" if not text else " " if text.endswith(".") else "; ") + part
    return text.replace("|", "\\|")


def _first_ref(value: dict[str, Any]) -> str | None:
    if "$ref" in value:
        return str(value["$ref"]).rsplit("/", 1)[-1]
    for option in value.get("anyOf", []):
        if "$ref" in option:
            return str(option["$ref"]).rsplit("/", 1)[-1]
    return None


def _anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, spaces to dashes, punctuation dropped."""
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")
