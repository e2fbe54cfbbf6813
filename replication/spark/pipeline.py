"""A configured pipeline on Spark as rows: the same steps over the one message model.

The streaming runner does not go through rows any more (its executors receive, process,
send and settle themselves: ``executor.py``); this is for rows that have no source to settle
on, Capture replay (``runner.SparkPipeline.replay``) and DataFrames of one's own.

``plan_function`` is what ``mapInArrow`` runs on executors: each input row becomes a
``Message`` (source facts included, for the stamp), goes through the pipeline's task
(``ReplicationTask.plan``: steps, loop guard, ``repl-path``, the stamp) and comes out as
zero or more rows with a ``target`` column naming where it goes (``""``: the pipeline's
target, ``route:0``, ``default``, ``error_target``, ...). Rows keep their partition's order,
so a session (kept in one partition) leaves in the order it arrived.

A row cannot be dead-lettered (there is no source message), so, as in Azure Functions, a
step's dead-letter decision sends it to the pipeline's ``error_target`` with
``DeadLetterReason`` / ``DeadLetterErrorDescription`` properties; without an error target
the partition fails with that reason.

Executors rebuild the pipeline from its file text, name and settings once per process.
Stateful steps (``dedupe``, ``chain``) keep their state per executor process.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .rows import COLUMNS, SCHEMA, from_row, to_row

if TYPE_CHECKING:
    from ..pipeline import BuiltPipeline

OUTPUT_SCHEMA = SCHEMA + ", target string"
ERROR_TARGET = "error_target"


@functools.lru_cache(maxsize=8)
def built_pipeline(text: str, name: str, settings_json: str, base_dir: str | None) -> BuiltPipeline:
    """The built pipeline for this process (cached: built once per executor)."""
    from pathlib import Path

    from ..pipeline import parse_pipelines

    settings = json.loads(settings_json)
    loaded = parse_pipelines(text, "<pipelines>", base_dir=Path(base_dir) if base_dir else None)
    return loaded.get(name).build(settings)


class PipelineRef:
    """What executors need to rebuild a pipeline (picklable, small)."""

    def __init__(
        self, text: str, name: str, settings: Mapping[str, str], base_dir: str | None = None
    ) -> None:
        self.text = text
        self.name = name
        self.settings_json = json.dumps(dict(settings), sort_keys=True)
        self.base_dir = base_dir

    def build(self) -> BuiltPipeline:
        return built_pipeline(self.text, self.name, self.settings_json, self.base_dir)


class DeadLetterWithoutErrorTarget(RuntimeError):
    """A step said dead-letter, and for rows that needs the pipeline's error_target."""


def plan_rows(
    ref: PipelineRef, rows: list[dict[str, Any]], source: int = 0
) -> list[tuple[Any, ...]]:
    """Runs rows through the pipeline's task; the output rows (``OUTPUT_SCHEMA``)."""
    built = ref.build()
    task = built.tasks[source]
    out: list[tuple[Any, ...]] = []
    for row in rows:
        message = from_row(row)
        outcome = task.plan(message)
        if outcome.dead_letter is not None:
            reason, description = outcome.dead_letter
            if ERROR_TARGET not in built.targets:
                raise DeadLetterWithoutErrorTarget(
                    f"pipeline {ref.name!r}: message {message.message_id!r} must be "
                    f"dead-lettered ({reason}: {description}) but the pipeline has no "
                    "error_target (rows cannot be dead-lettered: dead-letter decisions go there)"
                )
            props = dict(message.application_properties)
            props["DeadLetterReason"] = reason
            props["DeadLetterErrorDescription"] = description
            out.append((*to_row(message.copy(application_properties=props)), ERROR_TARGET))
            continue
        out.extend((*to_row(output), output.target or "") for output in outcome.outputs)
    return out


def plan_function(ref: PipelineRef, source: int = 0) -> Any:
    """The ``mapInArrow`` function: record batches in, planned record batches out."""

    def plan(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        schema: Any = None
        for batch in batches:
            rows = plan_rows(ref, batch.to_pylist(), source)
            if not rows:
                continue
            if schema is None:
                schema = _arrow_schema()
            columns = [
                [list(v.items()) if isinstance(v, dict) else v for v in col]
                for col in zip(*rows, strict=True)
            ]
            arrays = [pa.array(col, type=f.type) for col, f in zip(columns, schema, strict=True)]
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)

    return plan


def _arrow_schema() -> Any:
    """The Arrow schema of a planned batch: the read row's columns (``rows.COLUMNS``)
    and ``target``."""
    import pyarrow as pa

    types = {
        "binary": pa.binary(),
        "string": pa.string(),
        "long": pa.int64(),
        "int": pa.int32(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "map<string,string>": pa.map_(pa.string(), pa.string()),
    }
    return pa.schema(
        [(column, types[kind]) for column, kind in COLUMNS] + [("target", pa.string())]
    )
