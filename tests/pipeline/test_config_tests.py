"""`python -m replication test`: config tests pass when the pipeline does what they say and
fail (with a diff) when it does not."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from replication.pipeline import PipelineConfigError
from replication.pipeline.testing import find_test_files, run_test_file

from .conftest import REPO_ROOT

PIPELINES = """\
pipelines:
  - name: router
    source: {connection: PrimaryServiceBus, topic: events, subscription: router}
    steps:
      - filter: {condition: "NOT EXISTS(drop)"}
      - enrich: {properties: {seen: true}}
    routes:
      - when: "region = 'eu'"
        target: {connection: SecondaryServiceBus, queue: events-eu}
    unmatched: dead-letter
  - name: json-only
    source: {connection: PrimaryServiceBus, queue: in}
    steps:
      - validate: {json_schema: {type: object, required: [id]}}
    target: {connection: SecondaryServiceBus, queue: out}
"""


def write(folder: Path, tests: str, pipelines: str = PIPELINES) -> Path:
    (folder / "pipelines.yaml").write_text(pipelines)
    path = folder / "pipelines_test.yaml"
    path.write_text(textwrap.dedent(tests))
    return path


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replication", "test", *args],
        capture_output=True, text=True, cwd=cwd, timeout=120,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def test_the_sample_tests_pass() -> None:
    suite = run_test_file(REPO_ROOT / "pipelines_test.yaml")
    assert suite.pipelines_file == REPO_ROOT / "pipelines.yaml"
    assert len(suite.cases) == 8
    assert [c.name for c in suite.failed] == []
    assert suite.passed


def test_the_sample_tests_pass_from_the_command_line() -> None:
    result = run_cli(cwd=REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "8 passed, 0 failed" in result.stdout


def test_passing_and_failing_cases(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        tests:
          - name: eu goes to events-eu
            pipeline: router
            input: [{message_id: a, body: x, properties: {region: eu}}]
            expect:
              - {message_id: a, target: events-eu, body: x, properties: {region: eu, seen: true}}
          - name: wrong expectation
            pipeline: router
            input: [{message_id: b, body: x, properties: {region: eu}}]
            expect: [{message_id: b, target: events-us, body: y}]
          - name: unmatched is dead-lettered
            pipeline: router
            input: [{message_id: c, properties: {region: us}}]
            expect_dead_letter: NoRoute
          - name: filtered
            pipeline: router
            input: [{message_id: d, properties: {drop: 1}}]
            expect_nothing: true
          - name: expected nothing but got a message
            pipeline: router
            input: [{message_id: e, properties: {region: eu}}]
            expect_nothing: true
          - name: some pass, some are dead-lettered
            pipeline: json-only
            input:
              - {message_id: f1, json: {id: 1}}
              - {message_id: f2, body: "not json"}
              - {message_id: f3, json: {other: 1}}
            expect: [{message_id: f1, json: {id: 1}, target: target}]
            expect_dead_letter: ["validate: invalid JSON body", "validate: something else"]
    """,
    )
    suite = run_test_file(path)
    assert [(c.name, c.passed) for c in suite.cases] == [
        ("eu goes to events-eu", True),
        ("wrong expectation", False),
        ("unmatched is dead-lettered", True),
        ("filtered", True),
        ("expected nothing but got a message", False),
        ("some pass, some are dead-lettered", False),
    ]
    wrong = suite.cases[1]
    assert wrong.line == 7
    assert wrong.diff.splitlines()[:2] == ["--- expected", "+++ actual"]
    assert '-      "body": "y",' in wrong.diff
    assert '+      "body": "x",' in wrong.diff
    assert '-      "target": "events-us"' in wrong.diff
    assert '+      "target": "SecondaryServiceBus/events-eu"' in wrong.diff
    nothing = suite.cases[4]
    assert '+      "message_id": "e",' in nothing.diff
    # the first input passes, the second dead-letter reason does not match
    mixed = suite.cases[5]
    assert '-    "validate: something else"' in mixed.diff
    assert "+    \"validate: $: 'id' is a required property\"" in mixed.diff
    assert '     "validate: invalid JSON body",' in mixed.diff  # matched: not a change
    assert len(mixed.notes) == 2 and mixed.notes[0].startswith("dead-lettered: validate:")


def test_repl_properties_compared_only_when_named(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        settings:
          PrimaryServiceBus: "Endpoint=sb://one.test/;SharedAccessKeyName=a;SharedAccessKey=b"
        tests:
          - name: unnamed stamps are ignored
            pipeline: json-only
            input: [{json: {id: 1}, sequence_number: 5}]
            expect: [{properties: {}}]
          - name: named stamps are compared
            pipeline: json-only
            input: [{json: {id: 1}, sequence_number: 5}]
            expect: [{properties: {repl-sequence: "5", repl-path: one.test}}]
          - name: a wrong stamp fails
            pipeline: json-only
            input: [{json: {id: 1}, sequence_number: 5}]
            expect: [{properties: {repl-sequence: "6"}}]
    """,
    )
    assert [c.passed for c in run_test_file(path).cases] == [True, True, False]


def test_the_command_line_fails_and_shows_the_diff(tmp_path: Path) -> None:
    write(
        tmp_path,
        """\
        tests:
          - name: passes
            pipeline: router
            input: [{body: x, properties: {region: eu}}]
            expect: [{target: events-eu}]
          - name: fails
            pipeline: router
            input: [{body: x, properties: {region: eu}}]
            expect: [{target: events-eu, body: z}]
    """,
    )
    result = run_cli(cwd=tmp_path)
    assert result.returncode == 1
    assert f"FAIL  fails ({Path('pipelines_test.yaml')}:6, pipeline router)" in result.stdout
    assert '-      "body": "z",' in result.stdout
    assert "1 passed, 1 failed" in result.stdout
    # the pipeline file, the test file and the directory all name the same tests
    for arg in ("pipelines.yaml", "pipelines_test.yaml", "."):
        assert run_cli(arg, cwd=tmp_path).returncode == 1
    (tmp_path / "pipelines_test.yaml").write_text(
        (tmp_path / "pipelines_test.yaml").read_text().replace("body: z", "body: x")
    )
    assert run_cli("-v", cwd=tmp_path).returncode == 0


def test_no_test_files_is_an_error(tmp_path: Path) -> None:
    result = run_cli(cwd=tmp_path)
    assert result.returncode == 1
    assert "no test files" in result.stderr


def test_bad_test_files_are_configuration_errors(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        tests:
          - name: unknown pipeline
            pipeline: routr
            input: [{body: x}]
            expect: []
          - name: nothing expected
            pipeline: router
            source: 1
            input: [{body: x, json: 1, target: somewhere}]
          - name: two expectations
            pipeline: router
            input: [{body: x}]
            expect: [{enqueued_time: 2024-01-01T00:00:00Z}]
            expect_nothing: true
    """,
    )
    with pytest.raises(PipelineConfigError, match="no pipeline named 'routr'") as caught:
        run_test_file(path)
    file = str(path)
    assert str(caught.value).splitlines() == [
        f"{file}:3:5: tests[0].pipeline: no pipeline named 'routr' (did you mean 'router'?)",
        f"{file}:6:5: tests[1]: say what to expect: 'expect', 'expect_dead_letter' or "
        "'expect_nothing'",
        f"{file}:8:5: tests[1].source: pipeline 'router' has 1 source(s); source 1 does not exist "
        "(sources count from 0)",
        f"{file}:9:23: tests[1].input[0].json: give one of body, json, body_base64, avro, not both",
        f"{file}:9:32: tests[1].input[0].target: 'target' is for expected messages",
        f"{file}:13:15: tests[2].expect[0].enqueued_time: 'enqueued_time' is for input messages",
        f"{file}:14:5: tests[2].expect_nothing: goes alone, not with 'expect'",
    ]
    path.write_text("tests:\n  - name: x\n    pipelin: router\n")
    with pytest.raises(
        PipelineConfigError, match="required property 'pipeline' is missing"
    ) as caught:
        run_test_file(path)
    assert str(caught.value).splitlines() == [
        f"{file}:2:5: tests[0].pipeline: required property 'pipeline' is missing",
        f"{file}:2:5: tests[0].input: required property 'input' is missing",
        f"{file}:3:5: tests[0].pipelin: unknown property 'pipelin' (did you mean 'pipeline'?)",
    ]
    result = run_cli(cwd=tmp_path)
    assert result.returncode == 1
    assert "did you mean 'pipeline'?" in result.stderr


def test_avro_bodies_in_and_out(tmp_path: Path) -> None:
    schema = '{"type": "record", "name": "R", "fields": [{"name": "n", "type": "int"}]}'
    pipelines = f"""\
pipelines:
  - name: to-avro
    source: {{connection: P, queue: in}}
    steps:
      - transcode: {{from: json, to: avro-single-object, schema: '{schema}'}}
    target: {{connection: S, queue: out}}
"""
    path = write(
        tmp_path,
        """\
        tests:
          - name: json in, avro out
            pipeline: to-avro
            input: [{json: {n: 7}}]
            expect:
              - avro: {value: {n: 7}, format: avro-single-object}
                content_type: avro/single-object
          - name: wrong value
            pipeline: to-avro
            input: [{json: {n: 7}}]
            expect: [{avro: {value: {n: 8}, format: avro-single-object}}]
          - name: not avro-binary
            pipeline: to-avro
            input: [{json: {n: 7}}]
            expect: [{avro: {value: {n: 7}}}]
          - name: fails to fit the schema
            pipeline: to-avro
            input: [{json: {n: "seven"}}]
            expect_dead_letter: value does not fit the Avro schema
    """,
        pipelines,
    )
    cases = run_test_file(path).cases
    assert [c.passed for c in cases] == [True, False, False, True]
    assert '+      "avro": {\n+        "n": 7' not in cases[1].diff
    assert '-        "n": 8' in cases[1].diff and '+        "n": 7' in cases[1].diff


def test_find_test_files(tmp_path: Path) -> None:
    write(tmp_path, "tests: []\n")
    (tmp_path / "other_test.json").write_text("{}")
    assert find_test_files(tmp_path) == [
        tmp_path / "other_test.json", tmp_path / "pipelines_test.yaml",
    ]  # fmt: skip
    assert find_test_files(tmp_path / "pipelines.yaml") == [tmp_path / "pipelines_test.yaml"]
    shutil.rmtree(tmp_path)
