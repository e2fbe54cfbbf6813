"""The exported JSON Schema: valid, accepts the sample, refuses bad files, knows step options."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import jsonschema
import pytest
import yaml

from replication.pipeline import json_schema

from .conftest import REPO_ROOT


@pytest.fixture(scope="module")
def schema() -> dict:
    exported = json_schema()
    jsonschema.Draft202012Validator.check_schema(exported)
    return exported


@pytest.fixture(scope="module")
def sample() -> dict:
    return yaml.safe_load((REPO_ROOT / "pipelines.yaml").read_text())


def errors(schema: dict, document: object) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema)
    return [e.message for e in validator.iter_errors(document)]


def test_the_sample_validates(schema: dict, sample: dict) -> None:
    assert errors(schema, sample) == []
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert json.loads(json.dumps(schema)) == schema  # plain JSON


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["pipelines"][0]["source"].update(queu="x"),
        lambda d: d["pipelines"][0].pop("target"),
        lambda d: d["pipelines"][0].update(
            routes=[{"when": "a = 1", "target": d["pipelines"][0]["target"]}]
        ),
        lambda d: d["pipelines"][1]["steps"].append({"transcod": {}}),
        lambda d: d["pipelines"][1]["steps"][0]["transcode"].update({"from": "avro"}),
        lambda d: d["pipelines"][1]["steps"].append({"filter": {}, "dedupe": {}}),
        lambda d: d["pipelines"][2].update(unmatched="dead_letter"),
        lambda d: d["pipelines"][0].update(batch_size=0),
        lambda d: d["pipelines"][0].update(name="1st"),
        lambda d: d["pipelines"][0]["target"].pop("queue"),
        lambda d: d.update(extra=1),
        lambda d: d.update(pipelines=[]),
    ],
)
def test_bad_documents_do_not_validate(schema: dict, sample: dict, change) -> None:
    document = copy.deepcopy(sample)
    change(document)
    assert errors(schema, document)


def test_step_options_are_in_the_schema_for_completion(schema: dict) -> None:
    pipeline = schema["$defs"]["PipelineSpec"]
    variants = pipeline["properties"]["steps"]["items"]["oneOf"]
    by_step = {next(iter(v["properties"])): v for v in variants if "properties" in v}
    assert "route" not in by_step
    assert {"transcode", "filter", "dedupe", "enrich", "validate", "encrypt"} <= set(by_step)
    ref = by_step["transcode"]["properties"]["transcode"]["$ref"]
    options = schema["$defs"][ref.rsplit("/", 1)[-1]]
    assert {"from", "to", "schema", "schema_file", "on_error"} <= set(options["properties"])
    assert options["properties"]["error_target"]["$ref"] == "#/$defs/Endpoint"
    (bare,) = [v for v in variants if "enum" in v]
    assert "dedupe" in bare["enum"] and "filter" not in bare["enum"]


def test_a_bare_step_and_a_step_error_target_validate(schema: dict, sample: dict) -> None:
    document = copy.deepcopy(sample)
    document["pipelines"][0]["steps"] = [
        "dedupe",
        {"filter": {"condition": "a = 1", "on_error": "route",
                    "error_target": {"connection": "S", "queue": "e"}}},
    ]  # fmt: skip
    assert errors(schema, document) == []
    document["pipelines"][0]["steps"] = ["filter"]  # needs a condition
    assert errors(schema, document)


def test_schema_command_prints_it(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "replication", "schema"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json_schema()
    out = tmp_path / "schema.json"
    result = subprocess.run(
        [sys.executable, "-m", "replication", "schema", "-o", str(out)],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0 and json.loads(out.read_text()) == json_schema()
