"""From a loaded pipeline to runnable tasks: names, targets, namespaces, steps and routes."""

from __future__ import annotations

import json
import textwrap

import pytest

from replication.messages import Message
from replication.pipeline import PipelineConfigError, load_pipelines, parse_pipelines
from replication.tasks.steps import ERROR_REASON, StepContext
from replication.tasks.targets import Target

from .conftest import PRIMARY, REPO_ROOT, SECONDARY, SETTINGS


def load(text: str):
    return parse_pipelines(textwrap.dedent(text), "pipelines.yaml")


def test_the_sample_file_loads_with_stable_function_names() -> None:
    loaded = load_pipelines(REPO_ROOT / "pipelines.yaml", settings=SETTINGS)
    assert loaded.path == REPO_ROOT / "pipelines.yaml"
    assert [(p.name, p.function_names()) for p in loaded.pipelines] == [
        ("orders-to-secondary", ["orders_to_secondary"]),
        ("telemetry-to-json", ["telemetry_to_json"]),
        ("events-router", ["events_router"]),
        ("mirror-primary-to-secondary", ["mirror_primary_to_secondary"]),
        ("mirror-secondary-to-primary", ["mirror_secondary_to_primary"]),
        ("audit-to-eventhub", ["audit_to_eventhub"]),
    ]
    orders = loaded.get("orders-to-secondary")
    (source,) = orders.sources
    assert (source.connection, source.queue, source.sessions, source.entity) == (
        "PrimaryServiceBus", "orders", True, "orders",
    )  # fmt: skip
    assert not source.is_subscription
    events = loaded.get("events-router").sources[0]
    assert (events.topic, events.subscription, events.entity, events.is_subscription) == (
        "events", "router", "events", True,
    )  # fmt: skip
    with pytest.raises(KeyError, match="did you mean 'events-router'"):
        loaded.get("event-router")


def test_replicate_builds_one_task_and_the_single_target() -> None:
    (pipeline,) = load("""\
        pipelines:
          - name: orders-to-secondary
            source: {connection: PrimaryServiceBus, queue: orders, sessions: true}
            target: {connection: SecondaryServiceBus, queue: orders}
            batch_size: 50
            concurrency: 4
    """).pipelines
    built = pipeline.build(SETTINGS)
    assert built.targets == {None: Target(SECONDARY, "orders")}
    assert built.sources == pipeline.sources
    (task,) = built.tasks
    assert task is built.task
    assert task.name == "orders_to_secondary"
    assert task.steps == []
    assert task.source_namespace == "primary.example"
    assert task.target_namespaces == {None: "secondary.example:5673"}
    assert task.loop_guard is False
    assert (pipeline.batch_size, pipeline.concurrency) == (50, 4)
    assert built.targets[None].failover is None and built.source_failovers == [None]
    assert pipeline.backend == "amqp"


def test_the_sdk_backend_is_chosen_per_pipeline() -> None:
    from replication.functions import PipelineRuntime

    text = """\
        pipelines:
          - name: through-the-sdk
            source: {connection: PrimaryServiceBus, queue: orders}
            target: {connection: SecondaryServiceBus, queue: orders}
            backend: sdk
    """
    (pipeline,) = load(text).pipelines
    assert pipeline.backend == "sdk"
    assert PipelineRuntime(pipeline, SETTINGS)._pool.backend == "sdk"
    with pytest.raises(PipelineConfigError, match="backend"):
        load(text.replace("backend: sdk", "backend: uamqp"))


def test_routes_become_a_route_step_with_stable_target_names() -> None:
    (pipeline,) = load("""\
        pipelines:
          - name: router
            source: {connection: PrimaryServiceBus, topic: events, subscription: router}
            steps:
              - validate: {json_schema: {type: object, required: [id]}, on_error: route}
            routes:
              - when: "region = 'eu'"
                target: {connection: SecondaryServiceBus, queue: events-eu}
              - when: "body.priority > 5"
                target: {connection: PrimaryServiceBus, topic: urgent}
            default: {connection: SecondaryServiceBus, queue: events-other}
            error_target: {connection: SecondaryServiceBus, queue: errors}
    """).pipelines
    assert [(r.key, r.when, r.target.entity) for r in pipeline.routes] == [
        ("route:0", "region = 'eu'", "events-eu"),
        ("route:1", "body.priority > 5", "urgent"),
    ]
    assert pipeline.steps == [
        ("validate", {"json_schema": {"type": "object", "required": ["id"]},
                      "on_error": "route", "error_target": "error_target"}),
    ]  # fmt: skip
    built = pipeline.build(SETTINGS)
    assert built.targets == {
        "route:0": Target(SECONDARY, "events-eu"),
        "route:1": Target(PRIMARY, "urgent"),
        "default": Target(SECONDARY, "events-other"),
        "error_target": Target(SECONDARY, "errors"),
    }
    assert [s.name for s in built.task.steps] == ["validate", "route"]
    assert built.task.target_namespaces == {
        "route:0": "secondary.example:5673",
        "route:1": "primary.example",
        "default": "secondary.example:5673",
        "error_target": "secondary.example:5673",
    }

    def run(**fields) -> list[tuple[str | None, str]]:
        outcome = built.task.plan(Message(**fields))
        assert outcome.dead_letter is None
        return [(m.target, m.body.decode()) for m in outcome.outputs]

    body = json.dumps({"id": 1, "priority": 9}).encode()
    assert run(body=body, application_properties={"region": "eu"}) == [("route:0", body.decode())]
    assert run(body=body) == [("route:1", body.decode())]
    assert run(body=b'{"id": 2}') == [("default", '{"id": 2}')]
    (failed,) = built.task.plan(Message(body=b"{}")).outputs  # no id: the error route
    assert failed.target == "error_target"
    assert failed.application_properties[ERROR_REASON]


def test_unmatched_and_route_mode() -> None:
    (pipeline,) = load("""\
        pipelines:
          - name: fanout
            source: {connection: PrimaryServiceBus, queue: in}
            routes:
              - {when: "a = 1", target: {connection: SecondaryServiceBus, queue: x}}
              - {when: "b = 1", target: {connection: SecondaryServiceBus, queue: y}}
            route_mode: all
            unmatched: drop
    """).pipelines
    task = pipeline.build(SETTINGS).task
    both = task.plan(Message(application_properties={"a": 1, "b": 1}))
    assert [m.target for m in both.outputs] == ["route:0", "route:1"]
    none = task.plan(Message(application_properties={"a": 2}))
    assert none.outputs == [] and none.dead_letter is None
    assert pipeline.route_options() == {
        "routes": [{"when": "a = 1", "target": "route:0"}, {"when": "b = 1", "target": "route:1"}],
        "default": None,
        "unmatched": "drop",
        "mode": "all",
    }


def test_a_steps_own_error_target() -> None:
    (pipeline,) = load("""\
        pipelines:
          - name: p
            source: {connection: PrimaryServiceBus, queue: in}
            steps:
              - filter: {condition: "a = 1"}
              - transcode:
                  from: json
                  to: json
                  on_error: route
                  error_target: {connection: SecondaryServiceBus, queue: bad-json}
            target: {connection: SecondaryServiceBus, queue: out}
    """).pipelines
    assert pipeline.steps[1][1]["error_target"] == "error_target:1"
    built = pipeline.build(SETTINGS)
    assert built.targets["error_target:1"] == Target(SECONDARY, "bad-json")
    (out,) = built.task.plan(Message(body=b"nope", application_properties={"a": 1})).outputs
    assert out.target == "error_target:1"


def test_a_merge_has_one_task_and_function_per_source() -> None:
    (pipeline,) = load("""\
        pipelines:
          - name: merge-orders
            sources:
              - {connection: PrimaryServiceBus, queue: orders}
              - {connection: SecondaryServiceBus, topic: orders, subscription: merge}
            steps: [dedupe]
            target: {connection: SecondaryServiceBus, queue: all-orders}
            loop_guard: true
    """).pipelines
    assert pipeline.function_names() == ["merge_orders_1", "merge_orders_2"]
    built = pipeline.build(SETTINGS)
    first, second = built.tasks
    assert (first.name, second.name) == ("merge_orders_1", "merge_orders_2")
    assert (first.source_namespace, second.source_namespace) == (
        "primary.example", "secondary.example:5673",
    )  # fmt: skip
    assert first.loop_guard and second.loop_guard
    assert first.steps[0] is second.steps[0]  # one dedupe state for the merged stream
    assert first.plan(Message(message_id="x", sequence_number=1)).outputs
    assert not second.plan(Message(message_id="x", sequence_number=2)).outputs
    # a message that already passed the target namespace is not sent back there
    looped = Message(message_id="y", application_properties={"repl-path": "secondary.example:5673"})
    assert first.plan(looped).outputs == []


def test_each_build_has_fresh_step_state() -> None:
    (pipeline,) = load("""\
        pipelines:
          - name: p
            source: {connection: PrimaryServiceBus, queue: in}
            steps: [dedupe]
            target: {connection: SecondaryServiceBus, queue: out}
    """).pipelines
    message = Message(message_id="same")
    assert pipeline.build(SETTINGS).task.plan(message).outputs
    assert pipeline.build(SETTINGS).task.plan(message).outputs


def test_build_names_missing_settings() -> None:
    text = """\
        pipelines:
          - name: p
            source: {connection: PrimaryServiceBus, queue: in}
            steps:
              - enrich: {properties_from_settings: {region: Region}}
            target: {connection: SecondaryServiceBus, queue: out}
    """
    (pipeline,) = load(text).pipelines
    with pytest.raises(PipelineConfigError, match="'PrimaryServiceBus' is not set") as caught:
        pipeline.build({"SecondaryServiceBus": "no endpoint here"})
    assert str(caught.value).splitlines() == [
        "pipelines.yaml:3:14: pipelines[0].source.connection: setting 'PrimaryServiceBus' is not "
        "set",
        "pipelines.yaml:5:9: pipelines[0].steps[0].enrich: setting 'Region' is not set",
        "pipelines.yaml:6:14: pipelines[0].target.connection: setting 'SecondaryServiceBus' does "
        "not hold a Service Bus connection string (no 'Endpoint=')",
    ]
    built = pipeline.build({**SETTINGS, "Region": "westeurope"})
    (out,) = built.task.plan(Message()).outputs
    assert out.application_properties["region"] == "westeurope"
    # a given context supplies the settings steps read
    context = StepContext(settings={"Region": "eastus"})
    (out,) = pipeline.build(SETTINGS, context).task.plan(Message()).outputs
    assert out.application_properties["region"] == "eastus"


def test_identity_based_source_connection() -> None:
    (pipeline,) = load("""\
        pipelines:
          - name: p
            source: {connection: Primary, queue: in}
            target: {connection: SecondaryServiceBus, queue: out}
    """).pipelines
    settings = {
        "Primary__fullyQualifiedNamespace": "Primary.ServiceBus.Windows.Net",
        "SecondaryServiceBus": SECONDARY,
    }
    assert pipeline.build(settings).task.source_namespace == "primary.servicebus.windows.net"


def test_json_file_gives_the_same_model(tmp_path) -> None:
    yaml_text = (REPO_ROOT / "pipelines.yaml").read_text()
    import yaml

    path = tmp_path / "pipelines.json"
    path.write_text(json.dumps(yaml.safe_load(yaml_text), indent=2))
    from_json = load_pipelines(path)
    from_yaml = load_pipelines(REPO_ROOT / "pipelines.yaml")
    assert [p.describe() for p in from_json.pipelines] == [
        p.describe() for p in from_yaml.pipelines
    ]
    assert [p.steps for p in from_json.pipelines] == [p.steps for p in from_yaml.pipelines]


def test_bare_and_empty_step_options() -> None:
    (pipeline,) = load("""\
        pipelines:
          - name: p
            source: {connection: PrimaryServiceBus, queue: in}
            steps:
              - dedupe
              - dedupe:
              - dedupe: {}
            target: {connection: SecondaryServiceBus, queue: out}
    """).pipelines
    assert pipeline.steps == [("dedupe", {}), ("dedupe", {}), ("dedupe", {})]
