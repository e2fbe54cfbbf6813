"""Event hub endpoints in pipeline files: what fits (sources with a consumer group, targets),
what does not (sessions, subscriptions, a consumer group on a target, transactions), and
what building makes of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from replication.pipeline import PipelineConfigError, parse_pipelines
from replication.pipeline.testing import run_test_file

from .conftest import SETTINGS, problems

HUBS = "Endpoint=sb://hubs.example/;SharedAccessKeyName=k;SharedAccessKey=s"
EH_SETTINGS = {**SETTINGS, "EventHubs": HUBS}


def load(text: str) -> object:
    return parse_pipelines(text, "pipelines.yaml", settings=EH_SETTINGS)


def test_each_direction_loads_and_describes_itself() -> None:
    loaded = parse_pipelines(
        """\
pipelines:
  - name: sb-to-eh
    source: {connection: PrimaryServiceBus, queue: orders, sessions: true}
    target: {connection: EventHubs, eventhub: orders}
  - name: eh-to-sb
    source: {connection: EventHubs, eventhub: orders, consumer_group: replication,
             session_id_from: partition_key}
    target: {connection: SecondaryServiceBus, queue: orders}
  - name: eh-to-eh
    source: {connection: EventHubs, eventhub: telemetry}
    target: {connection: SecondaryServiceBus, eventhub: telemetry}
""",
        "pipelines.yaml",
        settings=EH_SETTINGS,
    )
    sb_to_eh, eh_to_sb, eh_to_eh = loaded.pipelines
    assert sb_to_eh.target is not None and sb_to_eh.target.is_event_hub
    assert eh_to_sb.sources[0].group == "replication"
    assert eh_to_eh.sources[0].group == "$Default"  # the default consumer group
    assert eh_to_sb.describe() == (
        "eh-to-sb: event hub orders consumer group replication (EventHubs) -> queue orders "
        "(SecondaryServiceBus)"
    )
    built = eh_to_sb.build(EH_SETTINGS)
    assert built.task.session_id_from_key
    assert not built.targets[None].event_hub
    assert sb_to_eh.build(EH_SETTINGS).targets[None].event_hub
    assert eh_to_eh.build(EH_SETTINGS).task.source_namespace == "hubs.example"


def test_what_an_event_hub_has_not_is_refused_where_it_is_written() -> None:
    assert problems("""\
        pipelines:
          - name: a
            source: {connection: EventHubs, eventhub: orders, sessions: true}
            target: {connection: SecondaryServiceBus, queue: orders}
          - name: b
            source: {connection: EventHubs, eventhub: orders, subscription: s}
            target: {connection: SecondaryServiceBus, eventhub: o, consumer_group: cg}
          - name: c
            source: {connection: PrimaryServiceBus, queue: q, consumer_group: cg}
            target: {connection: SecondaryServiceBus, eventhub: o, session_id_from: partition_key}
          - name: d
            source: {connection: EventHubs, eventhub: orders, queue: orders}
            target: {connection: SecondaryServiceBus, eventhub: o, sessions: true}
    """) == [
        "pipelines.yaml:3:55: pipelines[0].source.sessions: an event hub has no sessions: it "
        "keeps order per partition (events with the same partition key); leave 'sessions' out "
        "(session_id_from: partition_key gives a Service Bus target sessions)",
        "pipelines.yaml:6:55: pipelines[1].source.subscription: 'subscription' goes with "
        "'topic'; an event hub source reads through a consumer group ('consumer_group', "
        "default $Default)",
        "pipelines.yaml:7:60: pipelines[1].target.consumer_group: 'consumer_group' is for "
        "event hub sources: a target is sent to, not read through a consumer group",
        "pipelines.yaml:9:55: pipelines[2].source.consumer_group: 'consumer_group' is for event "
        "hub sources ('eventhub'), not queues or topics",
        "pipelines.yaml:10:60: pipelines[2].target.session_id_from: 'session_id_from' is for "
        "event hub sources (it sets the session id of what is read); a target keeps each "
        "message's session id",
        "pipelines.yaml:12:37: pipelines[3].source.eventhub: give one of 'queue', 'topic' and "
        "'eventhub', not 'queue' and 'eventhub'",
        "pipelines.yaml:13:60: pipelines[3].target.sessions: an event hub has no sessions: it "
        "keeps order per partition (events with the same partition key); leave 'sessions' out",
    ]


def test_event_hubs_cannot_be_transactional_or_fail_over() -> None:
    assert problems("""\
        pipelines:
          - name: a
            source: {connection: EventHubs, eventhub: orders}
            target: {connection: PrimaryServiceBus, queue: orders}
            transactional: true
          - name: b
            source: {connection: PrimaryServiceBus, queue: orders}
            target: {connection: PrimaryServiceBus, eventhub: orders}
            transactional: true
          - name: c
            source: {connection: EventHubs, eventhub: x, failover: {static: h.example}}
            target: {connection: PrimaryServiceBus, queue: orders}
    """) == [
        "pipelines.yaml:3:5: pipelines[0].source: transactional needs a Service Bus queue "
        "source: an event hub has no transactions (its reader checkpoints after each batch: "
        "at-least-once)",
        "pipelines.yaml:8:45: pipelines[1].target.eventhub: transactional: a Service Bus "
        "transaction cannot include a send to an event hub ('orders'); drop transactional, or "
        "send to a queue or topic",
        "pipelines.yaml:11:50: pipelines[2].source.failover: failover resolves Service Bus "
        "namespaces (SRV _azure_servicebus); an event hub endpoint cannot fail over yet: leave "
        "'failover' out",
    ]


def test_an_event_hub_that_is_its_own_target_needs_the_loop_guard() -> None:
    text = """\
pipelines:
  - name: a
    source: {connection: EventHubs, eventhub: orders}
    target: {connection: EventHubs, eventhub: orders}
"""
    with pytest.raises(PipelineConfigError, match="the target is the source event hub 'orders'"):
        load(text)
    load(text + "    loop_guard: true\n")


def test_two_sources_differ_by_consumer_group() -> None:
    text = """\
pipelines:
  - name: a
    sources:
      - {connection: EventHubs, eventhub: orders}
      - {connection: EventHubs, eventhub: orders, consumer_group: %s}
    target: {connection: PrimaryServiceBus, queue: orders}
"""
    load(text % "second")
    with pytest.raises(PipelineConfigError, match=r"sources\[1\]: the same source as sources"):
        load(text % "$Default")


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("eventhub", "-orders", "is not an event hub name"),
        ("eventhub", "a/b", "is not an event hub name"),
        ("consumer_group", "$default2", "is not a consumer group name"),
    ],
)
def test_names_follow_event_hubs_rules(field: str, value: str, reason: str) -> None:
    source = {"connection": "EventHubs", "eventhub": "orders", field: value}
    text = (
        "pipelines:\n  - name: a\n    source: "
        + str(source).replace("'", '"')
        + "\n    target: {connection: PrimaryServiceBus, queue: q}\n"
    )
    with pytest.raises(PipelineConfigError, match=reason):
        load(text)


def test_a_wrong_connection_setting_says_event_hubs() -> None:
    text = """\
pipelines:
  - name: a
    source: {connection: EventHubs, eventhub: orders}
    target: {connection: PrimaryServiceBus, queue: q}
"""
    with pytest.raises(
        PipelineConfigError, match="'EventHubs' does not hold an Event Hubs connection string"
    ):
        parse_pipelines(text, "pipelines.yaml", settings={**SETTINGS, "EventHubs": "x=1"})


def test_config_tests_take_an_events_offset_and_partition(tmp_path: Path) -> None:
    """``python -m replication test`` inputs may be events: their key becomes the session
    (``session_id_from``), their offset a ``repl-offset`` stamp."""
    (tmp_path / "pipelines.yaml").write_text("""\
pipelines:
  - name: eh-to-sb
    source: {connection: Hubs, eventhub: telemetry, session_id_from: partition_key}
    target: {connection: Bus, queue: telemetry}
""")  # fmt: skip
    case = """\
tests:
  - name: an event's key becomes its session, its offset a stamp
    pipeline: eh-to-sb
    input:
      - {message_id: e1, partition_key: device-1, body: hi, offset: "4096", sequence_number: 3,
         partition_id: "1"}
    expect:
      - {message_id: e1, session_id: device-1, target: telemetry,
         properties: {repl-offset: "%s", repl-sequence: "3"}}
"""
    (tmp_path / "pipelines_test.yaml").write_text(case % "4096")
    assert run_test_file(tmp_path / "pipelines_test.yaml").passed
    (tmp_path / "pipelines_test.yaml").write_text(case % "8192")
    (failed,) = run_test_file(tmp_path / "pipelines_test.yaml").failed
    assert '-        "repl-offset": "8192",' in failed.diff
    assert '+        "repl-offset": "4096",' in failed.diff


def test_validate_warns_when_an_event_hub_source_can_dead_letter(tmp_path: Path) -> None:
    """An event hub has no dead-letter queue: without an error_target what a step would
    dead-letter is only logged, and ``validate`` says so (no warning with one)."""
    from replication.host.checks import event_hub_warnings

    text = """\
pipelines:
  - name: hub-filter
    source: {connection: EventHubs, eventhub: telemetry}
    steps:
      - validate: {json_schema: {type: object}}
    target: {connection: PrimaryServiceBus, queue: q}
"""
    (warning,) = event_hub_warnings(parse_pipelines(text))
    assert warning.startswith(
        "pipeline 'hub-filter' reads event hub(s) 'telemetry' and can dead-letter (step validate)"
    )
    guarded = text + "    error_target: {connection: PrimaryServiceBus, queue: errors}\n"
    assert event_hub_warnings(parse_pipelines(guarded)) == []


def test_two_pipelines_cannot_read_one_event_hub_through_one_consumer_group() -> None:
    text = """\
pipelines:
  - name: a
    source: {connection: EventHubs, eventhub: orders}
    target: {connection: PrimaryServiceBus, queue: orders}
  - name: b
    source: {connection: EventHubs, eventhub: Orders, consumer_group: %s}
    target: {connection: SecondaryServiceBus, queue: orders}
"""
    load(text % "audit")  # its own consumer group: fine
    assert problems(text % "$Default", settings=EH_SETTINGS) == [
        "pipelines.yaml:6:5: pipelines[1].source: pipeline 'a' reads event hub 'Orders' with "
        "consumer group '$Default' too: they would share its partitions and each see only some "
        "events; give each its own consumer_group"
    ]
