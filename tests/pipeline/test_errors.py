"""Bad pipeline files: every problem named with file, line, field path and a clear reason."""

from __future__ import annotations

import json
import textwrap

import pytest

from replication.pipeline import PipelineConfigError, load_pipelines, parse_pipelines

from .conftest import SETTINGS, problems

GOOD = """\
pipelines:
  - name: orders
    source: {connection: PrimaryServiceBus, queue: orders}
    target: {connection: SecondaryServiceBus, queue: orders}
"""


def test_a_good_file_loads() -> None:
    loaded = parse_pipelines(GOOD, "pipelines.yaml", settings=SETTINGS)
    assert [p.name for p in loaded.pipelines] == ["orders"]


def test_unknown_property_suggests_the_right_one() -> None:
    assert problems("""\
        pipelines:
          - name: orders
            source:
              connection: PrimaryServiceBus
              queu: orders
            target: {connection: SecondaryServiceBus, queue: orders}
    """) == [
        "pipelines.yaml:5:7: pipelines[0].source.queu: unknown property 'queu' "
        "(did you mean 'queue'?)"
    ]


def test_misspelt_step_name_suggests_the_step() -> None:
    assert problems("""\
        pipelines:
          - name: orders
            source: {connection: PrimaryServiceBus, queue: orders}
            steps:
              - filter: {condition: "a = 1"}
              - transcod: {from: avro-binary, to: json}
            target: {connection: SecondaryServiceBus, queue: orders}
    """) == [
        "pipelines.yaml:6:9: pipelines[0].steps[1].transcod: unknown step 'transcod' "
        "(did you mean 'transcode'?)"
    ]


def test_unknown_step_without_a_near_name_lists_the_steps() -> None:
    (line,) = problems("""\
        pipelines:
          - name: orders
            source: {connection: PrimaryServiceBus, queue: orders}
            steps: [zzz]
            target: {connection: SecondaryServiceBus, queue: orders}
    """)
    assert line.startswith("pipelines.yaml:4:13: pipelines[0].steps[0]: unknown step 'zzz'; known")
    assert "transcode" in line and "route" not in line.split("known steps:")[1]


def test_step_options_are_checked_by_the_steps_own_model() -> None:
    assert problems("""\
        pipelines:
          - name: orders
            source: {connection: PrimaryServiceBus, queue: orders}
            steps:
              - filter: {condition: "a = 1"}
              - transcode:
                  from: avro
                  to: json
                  schema: 5
              - transcode: {from: json, to: avro-binary}
              - dedupe: {windw: PT1M}
            target: {connection: SecondaryServiceBus, queue: orders}
    """) == [
        "pipelines.yaml:7:11: pipelines[0].steps[1].transcode.from: 'avro' is not one of 'json', "
        "'avro-binary', 'avro-single-object', 'avro-container'",
        "pipelines.yaml:9:11: pipelines[0].steps[1].transcode.schema: expected a mapping, a list "
        "or a string, got 5",
        "pipelines.yaml:10:9: pipelines[0].steps[2].transcode: avro-binary needs 'schema' or "
        "'schema_file'",
        "pipelines.yaml:11:18: pipelines[0].steps[3].dedupe.windw: unknown property 'windw' "
        "(did you mean 'window'?)",
    ]


def test_step_options_indented_wrongly() -> None:
    assert problems("""\
        pipelines:
          - name: orders
            source: {connection: PrimaryServiceBus, queue: orders}
            steps:
              - transcode:
                from: json
                to: avro-binary
            target: {connection: SecondaryServiceBus, queue: orders}
    """) == [
        "pipelines.yaml:5:9: pipelines[0].steps[0].transcode: 'from', 'to' must be options of "
        "step 'transcode': indent them under 'transcode:'"
    ]


def test_a_route_step_and_a_bad_condition() -> None:
    assert problems("""\
        pipelines:
          - name: router
            source: {connection: PrimaryServiceBus, topic: events, subscription: router}
            steps:
              - route: {routes: []}
            routes:
              - when: "region = = 'eu'"
                target: {connection: SecondaryServiceBus, queue: eu}
    """) == [
        "pipelines.yaml:5:9: pipelines[0].steps[0].route: 'route' is not used as a step here: give "
        "the pipeline's 'routes' (with 'default', 'unmatched', 'route_mode')",
        "pipelines.yaml:7:9: pipelines[0].routes[0].when: invalid condition: line 1, column 10: "
        "expected an expression but found '='",
    ]


def test_sources_and_targets_must_be_well_formed() -> None:
    assert problems("""\
        pipelines:
          - name: a
            source: {connection: PrimaryServiceBus, topic: events}
            target: {connection: SecondaryServiceBus, queue: x, sessions: true}
            routes:
              - when: "x = 1"
                target: {connection: SecondaryServiceBus, topic: t, subscription: s}
          - name: b
            source: {connection: PrimaryServiceBus, queue: q, topic: t}
            default: {connection: SecondaryServiceBus, queue: d}
            target: {connection: SecondaryServiceBus}
          - name: c
            sources: []
    """) == [
        "pipelines.yaml:3:45: pipelines[0].source.topic: reading from topic 'events' needs "
        "'subscription' (the subscription of the topic to read)",
        "pipelines.yaml:4:57: pipelines[0].target.sessions: 'sessions' is for sources (it makes "
        "the trigger read sessions); a target keeps each message's session id",
        "pipelines.yaml:5:5: pipelines[0].routes: give 'target' or 'routes', not both",
        "pipelines.yaml:7:61: pipelines[0].routes[0].target.subscription: a route target is a "
        "queue or a topic: messages cannot be sent to a subscription",
        "pipelines.yaml:9:55: pipelines[1].source.topic: give one of 'queue', 'topic' and "
        "'eventhub', not 'queue' and 'topic'",
        "pipelines.yaml:10:5: pipelines[1].default: 'default' goes with 'routes'",
        "pipelines.yaml:11:5: pipelines[1].target: the target needs 'queue', 'topic' or 'eventhub'",
        # a pipeline with a structural problem gets its other checks once that is fixed
        "pipelines.yaml:13:5: pipelines[2].sources: must not be empty",
    ]


def test_names_must_be_valid_and_unique() -> None:
    assert problems("""\
        pipelines:
          - name: orders
            source: {connection: PrimaryServiceBus, queue: a}
            target: {connection: SecondaryServiceBus, queue: a}
          - name: Orders
            source: {connection: PrimaryServiceBus, queue: b}
            target: {connection: SecondaryServiceBus, queue: b}
          - name: merge
            sources:
              - {connection: PrimaryServiceBus, queue: c}
              - {connection: SecondaryServiceBus, queue: c}
            target: {connection: SecondaryServiceBus, queue: merged}
          - name: merge-2
            source: {connection: PrimaryServiceBus, queue: d}
            target: {connection: SecondaryServiceBus, queue: d}
          - name: 2nd
            source: {connection: PrimaryServiceBus, queue: e}
            target: {connection: SecondaryServiceBus, queue: e}
    """) == [
        "pipelines.yaml:5:5: pipelines[1].name: duplicate pipeline name 'Orders': pipelines[0] is "
        "already named 'orders' (names are case-insensitive)",
        "pipelines.yaml:13:5: pipelines[3].name: function name 'merge_2' of pipeline 'merge-2' is "
        "also the function name of pipeline 'merge' (pipelines[2]): rename one",
        "pipelines.yaml:16:5: pipelines[4].name: '2nd' is not a valid pipeline name: a letter, "
        "then letters, digits, '-' or '_', at most 100 characters",
    ]


def test_connections_are_setting_names_not_secrets() -> None:
    assert problems("""\
        pipelines:
          - name: orders
            source:
              connection: "Endpoint=sb://x.servicebus.windows.net/;SharedAccessKey=abc"
              queue: orders
            target: {connection: "", queue: orders}
    """) == [
        "pipelines.yaml:4:7: pipelines[0].source.connection: give the NAME of the app setting that "
        "holds the connection string, not the connection string itself (keep secrets out of "
        "this file)",
        "pipelines.yaml:6:14: pipelines[0].target.connection: must name the app setting that holds "
        "the connection string",
    ]


def test_error_routes_need_an_error_target() -> None:
    assert problems("""\
        pipelines:
          - name: orders
            source: {connection: PrimaryServiceBus, queue: orders}
            steps:
              - validate: {json_schema: {type: object}, on_error: route}
              - filter: {condition: "a = 1", on_error: route, error_target: errors}
            target: {connection: SecondaryServiceBus, queue: orders}
    """) == [
        "pipelines.yaml:5:49: pipelines[0].steps[0].validate.on_error: on_error 'route' needs an "
        "error target: set the pipeline's 'error_target' (or this step's)",
        "pipelines.yaml:6:55: pipelines[0].steps[1].filter.error_target: expected an endpoint "
        "({connection: ..., queue: ...}); leave it out to use the pipeline's error_target",
    ]


def test_routing_options_that_contradict_each_other() -> None:
    assert problems("""\
        pipelines:
          - name: router
            source: {connection: PrimaryServiceBus, topic: events, subscription: router}
            routes:
              - when: "region = 'eu'"
                target: {connection: SecondaryServiceBus, queue: eu}
            default: {connection: SecondaryServiceBus, queue: other}
            unmatched: dead_letter
          - name: router2
            source: {connection: PrimaryServiceBus, topic: events, subscription: router2}
            routes:
              - when: "region = 'eu'"
                target: {connection: SecondaryServiceBus, queue: eu}
            default: {connection: SecondaryServiceBus, queue: other}
            unmatched: drop
    """) == [
        "pipelines.yaml:8:5: pipelines[0].unmatched: 'dead_letter' is not one of 'drop', "
        "'dead-letter' (did you mean 'dead-letter'?)",
        "pipelines.yaml:15:5: pipelines[1].unmatched: 'unmatched' has no effect when 'default' is "
        "set (messages no route takes go to the default)",
    ]


def test_a_target_that_is_the_source_would_loop() -> None:
    assert problems("""\
        pipelines:
          - name: same-queue
            source: {connection: PrimaryServiceBus, queue: orders}
            target: {connection: PrimaryServiceBus, queue: Orders}
          - name: same-topic
            source: {connection: PrimaryServiceBus, topic: t, subscription: s}
            target: {connection: PrimaryServiceBus, topic: t}
          - name: same-topic-guarded
            source: {connection: PrimaryServiceBus, topic: t, subscription: s2}
            target: {connection: PrimaryServiceBus, topic: t}
            loop_guard: true
    """) == [
        "pipelines.yaml:4:5: pipelines[0].target: the target is the source queue 'orders': every "
        "message would come back",
        "pipelines.yaml:7:5: pipelines[1].target: the target is the source topic 't': messages "
        "would come back through the subscription (set loop_guard: true if that is meant)",
    ]


def test_same_namespace_under_two_setting_names_is_found_with_settings() -> None:
    text = """\
        pipelines:
          - name: same-queue
            source: {connection: PrimaryServiceBus, queue: orders}
            target: {connection: AlsoPrimary, queue: orders}
    """
    settings = {**SETTINGS, "AlsoPrimary": SETTINGS["PrimaryServiceBus"]}
    assert problems(text, settings=settings) == [
        "pipelines.yaml:4:5: pipelines[0].target: the target is the source queue 'orders': every "
        "message would come back"
    ]
    parse_pipelines(textwrap.dedent(text), "pipelines.yaml")  # unknown without settings


def test_settings_are_checked_when_given() -> None:
    text = """\
        pipelines:
          - name: orders
            source: {connection: PrimaryServiceBos, queue: orders}
            steps:
              - encrypt: {key_setting: OrdersKey, key_id: k1}
            target: {connection: Secondary, queue: orders}
            error_target: {connection: NotAConnectionString, queue: errors}
    """
    settings = {**SETTINGS, "NotAConnectionString": "hello"}
    assert problems(text, settings=settings) == [
        "pipelines.yaml:3:14: pipelines[0].source.connection: setting 'PrimaryServiceBos' is not "
        "set (did you mean 'PrimaryServiceBus'?)",
        "pipelines.yaml:5:9: pipelines[0].steps[0].encrypt: setting 'OrdersKey': not base64: "
        "setting 'OrdersKey' is not set",
        "pipelines.yaml:6:14: pipelines[0].target.connection: setting 'Secondary' is not set",
        "pipelines.yaml:7:20: pipelines[0].error_target.connection: setting 'NotAConnectionString' "
        "does not hold a Service Bus connection string: Connection string is either blank or "
        "malformed: every part is key=value.",
    ]
    # without settings, setting names are not checked (they are read when the app runs)
    parse_pipelines(textwrap.dedent(text), "pipelines.yaml")


def test_identity_based_source_connections_count_as_set() -> None:
    settings = {
        "PrimaryServiceBus__fullyQualifiedNamespace": "primary.servicebus.windows.net",
        "SecondaryServiceBus": SETTINGS["SecondaryServiceBus"],
    }
    parse_pipelines(GOOD, "pipelines.yaml", settings=settings)


def test_step_missing_a_required_option_and_a_bad_avro_schema() -> None:
    assert problems("""\
        pipelines:
          - name: orders
            source: {connection: PrimaryServiceBus, queue: orders}
            steps:
              - encrypt: {key_setting: K}
              - transcode:
                  from: avro-binary
                  to: json
                  schema: {type: record, name: R, fields: [{name: a, type: nosuchtype}]}
            target: {connection: SecondaryServiceBus, queue: orders}
    """) == [
        "pipelines.yaml:5:9: pipelines[0].steps[0].encrypt.key_id: required property 'key_id' is "
        "missing",
        "pipelines.yaml:6:9: pipelines[0].steps[1].transcode: invalid Avro schema: "
        "UnknownType: nosuchtype",
    ]


def test_schema_files_are_relative_to_the_pipeline_file(tmp_path) -> None:
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "r.avsc").write_text(
        json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]})
    )
    path = tmp_path / "pipelines.yaml"
    path.write_text(
        textwrap.dedent("""\
        pipelines:
          - name: orders
            source: {connection: PrimaryServiceBus, queue: orders}
            steps:
              - transcode: {from: avro-binary, to: json, schema_file: schemas/r.avsc}
              - transcode: {from: json, to: avro-binary, schema_file: schemas/missing.avsc}
            target: {connection: SecondaryServiceBus, queue: orders}
    """)
    )
    with pytest.raises(PipelineConfigError, match="cannot read Avro schema file") as caught:
        load_pipelines(path)
    (problem,) = caught.value.problems
    assert (problem.file, problem.line, problem.column) == (str(path), 6, 9)
    assert problem.path == "pipelines[0].steps[1].transcode"
    assert problem.reason.startswith(
        f"cannot read Avro schema file '{tmp_path / 'schemas' / 'missing.avsc'}'"
    )
    path.write_text(path.read_text().replace("missing.avsc", "r.avsc"))
    (pipeline,) = load_pipelines(path).pipelines
    assert pipeline.steps[0][1]["schema_file"] == str(tmp_path / "schemas" / "r.avsc")


def test_document_level_problems() -> None:
    assert problems("") == [
        "pipelines.yaml: the file is empty: expected a mapping with 'pipelines'"
    ]
    assert problems("- a\n- b\n") == [
        "pipelines.yaml:1:1: expected a mapping with 'pipelines', got a list"
    ]
    assert problems("pipeline: []\n") == [
        "pipelines.yaml:1:1: pipeline: unknown property 'pipeline' (did you mean 'pipelines'?)",
        "pipelines.yaml:1:1: pipelines: required property 'pipelines' is missing",
    ]
    assert problems("pipelines: []\n") == [
        "pipelines.yaml:1:1: pipelines: no pipelines: give at least one"
    ]
    assert problems("pipelines:\n  - name: a\n   source: x\n") == [
        "pipelines.yaml:3:4: invalid YAML: expected <block end>, but found '<block mapping start>'"
    ]


def test_duplicate_keys_are_reported_not_collapsed() -> None:
    assert problems("""\
        pipelines:
          - name: orders
            source: {connection: PrimaryServiceBus, queue: orders}
            target: {connection: SecondaryServiceBus, queue: orders}
            target: {connection: SecondaryServiceBus, queue: other}
    """) == ["pipelines.yaml:5:5: pipelines[0].target: property 'target' appears more than once"]


def test_json_files_report_lines_too() -> None:
    text = json.dumps(
        {
            "pipelines": [
                {
                    "name": "orders",
                    "source": {"connection": "PrimaryServiceBus", "queue": "orders"},
                    "steps": [{"transcod": {}}, {"filter": {"condition": "a ="}}],
                    "target": {"connection": "SecondaryServiceBus", "queue": "orders"},
                    "batch_size": 0,
                }
            ]
        },
        indent=2,
    )
    assert problems(text, "pipelines.json") == [
        "pipelines.json:11:11: pipelines[0].steps[0].transcod: unknown step 'transcod' "
        "(did you mean 'transcode'?)",
        "pipelines.json:14:11: pipelines[0].steps[1].filter: line 1, column 4: expected an "
        "expression but found end of input",
        "pipelines.json:23:7: pipelines[0].batch_size: must be at least 1, got 0",
    ]
    assert problems('{"pipelines": [}', "pipelines.json") == [
        "pipelines.json:1:16: invalid JSON: Expecting value"
    ]
    assert problems('{"pipelines": [], "pipelines": []}', "pipelines.json") == [
        "pipelines.json:1:19: pipelines: property 'pipelines' appears more than once"
    ]


def test_problems_carry_their_parts() -> None:
    with pytest.raises(PipelineConfigError, match="unknown property 'queu'") as caught:
        parse_pipelines("pipelines:\n  - {name: a, source: {connection: P, queu: q}}\n", "f.yaml")
    (problem,) = caught.value.problems
    assert isinstance(caught.value, ValueError)
    assert (problem.file, problem.line, problem.column) == ("f.yaml", 2, 39)
    assert problem.path == "pipelines[0].source.queu"
    assert problem.reason == "unknown property 'queu' (did you mean 'queue'?)"


def test_an_unreadable_file() -> None:
    with pytest.raises(
        PipelineConfigError,
        match=r"^/nonexistent/pipelines\.yaml: cannot read the file: No such file or directory$",
    ):
        load_pipelines("/nonexistent/pipelines.yaml")
