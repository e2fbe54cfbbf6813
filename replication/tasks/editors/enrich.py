"""Adding context to messages, the editor pattern's "enrich".

Messages from a source often need context the target's consumers rely on but the producer
did not write: which region or pipeline handled them, a tenant or environment name kept in
the app's settings, when the replica was processed. ``enrich`` sets application properties
and JSON body fields from static values or from settings, and can stamp the processing time.

Settings are read once when the step is built (a missing setting is a configuration error,
reported when the pipeline loads, not per message); their values are strings. The
processing timestamp is ISO 8601 UTC with seven fraction digits and ``Z`` (as
``repl-enqueue-time``), taken from the step context's clock. With ``overwrite: false`` a
property or body field that is already there is kept. Body fields need a JSON object body;
dotted paths create nested objects as needed.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, JsonValue, model_validator

from ...messages import Message
from ..stamping import iso_utc
from ..steps import Step, StepContext, StepOptions, step
from .transcode import dump_json
from .transform import MISSING, get_path, json_object, set_path, split_path


class EnrichOptions(StepOptions):
    """Properties and body fields to set; values static or from settings."""

    properties: dict[str, str | int | float | bool] = Field(default_factory=dict)
    """Property name -> value."""
    properties_from_settings: dict[str, str] = Field(default_factory=dict)
    """Property name -> setting name."""
    body: dict[str, JsonValue] = Field(default_factory=dict)
    """Dotted body path -> JSON value."""
    body_from_settings: dict[str, str] = Field(default_factory=dict)
    """Dotted body path -> setting name."""
    timestamp_property: str | None = None
    """Property that gets the processing time (ISO 8601 UTC)."""
    overwrite: bool = True
    """Replace properties and fields that are already there."""

    @model_validator(mode="after")
    def _something(self) -> EnrichOptions:
        for path in [*self.body, *self.body_from_settings]:
            split_path(path)
        if not (
            self.properties
            or self.properties_from_settings
            or self.body
            or self.body_from_settings
            or self.timestamp_property
        ):
            raise ValueError("nothing to do: give properties, body fields or timestamp_property")
        return self


@step("enrich", EnrichOptions)
def build_enrich(options: EnrichOptions, context: StepContext) -> Step:
    """Adds properties and JSON body fields (static, from settings, processing time) that
    the target's consumers need but the source did not send."""
    properties: dict[str, Any] = dict(options.properties)
    properties.update(
        {
            name: context.setting(setting)
            for name, setting in options.properties_from_settings.items()
        }
    )
    fields: dict[str, Any] = dict(options.body)
    fields.update(
        {path: context.setting(setting) for path, setting in options.body_from_settings.items()}
    )

    def run(message: Message) -> list[Message]:
        props = dict(message.application_properties)
        additions = dict(properties)
        if options.timestamp_property:
            additions[options.timestamp_property] = iso_utc(context.now())
        for name, value in additions.items():
            if options.overwrite or name not in props:
                props[name] = value
        changes: dict[str, Any] = {"application_properties": props}
        if fields:
            body = json_object(message)
            for path, value in fields.items():
                if options.overwrite or get_path(body, path) is MISSING:
                    set_path(body, path, value)
            changes["body"] = dump_json(body)
        return [message.copy(**changes)]

    return run
