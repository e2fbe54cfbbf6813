"""What the local host's embedded brokers are given: every entity a pipeline can reach."""

from __future__ import annotations

from replication.broker.config import parse_config
from replication.host.embedded import plan_brokers
from replication.pipeline import parse_pipelines

LOCAL = (
    "Endpoint=sb://localhost:{};SharedAccessKeyName=RootManageSharedAccessKey;"
    "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
)


def test_a_steps_own_error_target_gets_its_queue() -> None:
    settings = {"Near": LOCAL.format(5711), "Far": LOCAL.format(5712)}
    pipelines = parse_pipelines("""\
pipelines:
  - name: checked
    source: {connection: Near, queue: incoming}
    steps:
      - transcode:
          from: json
          to: json
          on_error: route
          error_target: {connection: Far, queue: bad-json}
    target: {connection: Far, queue: outgoing}
    error_target: {connection: Far, queue: errors}
""")  # fmt: skip
    plan = plan_brokers(pipelines.pipelines, settings)
    far = parse_config(plan[5712].config())
    assert sorted(q.name for q in far.namespace.queues) == ["bad-json", "errors", "outgoing"]


def test_a_functions_trigger_gets_its_entity_unless_its_port_is_served_already() -> None:
    """A hand-written function's emulator connection gets a broker with what the trigger
    reads; a port something listens on already (the Service Bus emulator, a broker started
    by hand) is left to it."""
    import socket

    from replication.pipeline import Endpoint

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        settings = {"Mine": LOCAL.format(5713), "Theirs": LOCAL.format(busy)}
        functions = [
            (Endpoint(connection="Mine", queue="orders"), True),
            (Endpoint(connection="Mine", topic="news", subscription="all"), False),
            (Endpoint(connection="Mine", eventhub="readings", consumer_group="fn"), False),
            (Endpoint(connection="Theirs", queue="orders"), False),
        ]
        plan = plan_brokers([], settings, functions)
    assert list(plan) == [5713]
    mine = plan[5713]
    assert (mine.queues, mine.topics, mine.event_hubs) == (
        {"orders": True},
        {"news": {"all": False}},
        {"readings": {"fn"}},
    )
