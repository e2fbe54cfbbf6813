"""What the local host's embedded brokers are given: every entity a pipeline can reach."""

from __future__ import annotations

import socket
from pathlib import Path

from replication.broker.config import parse_config
from replication.host.embedded import emulator_port, plan_brokers, start_brokers
from replication.pipeline import parse_pipelines
from tests.ports import unused_port

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


def test_a_functions_trigger_gets_its_entity() -> None:
    """A hand-written function's emulator connection gets a broker with what the trigger
    reads."""
    from replication.pipeline import Endpoint

    settings = {"Mine": LOCAL.format(5713)}
    functions = [
        (Endpoint(connection="Mine", queue="orders"), True),
        (Endpoint(connection="Mine", topic="news", subscription="all"), False),
        (Endpoint(connection="Mine", eventhub="readings", consumer_group="fn"), False),
    ]
    plan = plan_brokers([], settings, functions)
    assert list(plan) == [5713]
    mine = plan[5713]
    assert (mine.queues, mine.topics, mine.event_hubs) == (
        {"orders": True},
        {"news": {"all": False}},
        {"readings": {"fn"}},
    )


async def test_a_port_served_already_is_left_to_what_serves_it(tmp_path: Path) -> None:
    """A pipeline's or a function's emulator port something listens on already (the Service
    Bus emulator, a broker started by hand) is left to it: binding it again would end
    ``start`` with "address already in use". The other ports get their brokers."""
    settings = {"Mine": LOCAL.format(unused_port())}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        settings["Theirs"] = LOCAL.format(busy)
        pipelines = parse_pipelines("""\
pipelines:
  - name: across
    source: {connection: Theirs, queue: work}
    target: {connection: Mine, queue: work}
""")
        plan = plan_brokers(pipelines.pipelines, settings)
        assert sorted(plan) == sorted([busy, emulator_port(settings["Mine"])])
        brokers = await start_brokers(plan, tmp_path)
    try:
        assert [b.port for b in brokers] == [emulator_port(settings["Mine"])]
    finally:
        for broker in brokers:
            await broker.stop()
