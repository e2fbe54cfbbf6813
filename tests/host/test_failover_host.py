"""The local host with failover endpoints: the same pipeline file, a host map in the local
settings, embedded brokers for every namespace of the set, and a flip of the share file
while messages flow."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient

from replication import metrics
from replication.host.app import Host, HostConfig
from replication.host.peek import peek
from tests.ports import port_for_settings

from .test_host import project

FAILING_OVER = """\
pipelines:
  - name: failing-over
    source:
      connection: PrimaryServiceBus
      queue: work
      failover: {static: primary.example.net}
    target:
      connection: SecondaryServiceBus
      queue: work
      failover: {file: {path: share/secondary.txt}, recheck_interval: 0.2}
"""


def emulator(port: int) -> str:
    return (
        f"Endpoint=sb://localhost:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
    )


@pytest.mark.slow
async def test_the_host_follows_a_flipped_file_to_the_other_namespace(tmp_path: Path) -> None:
    directory, settings = project(tmp_path, FAILING_OVER)
    # the host's embedded brokers, on the ports its settings name
    primary, east, west = port_for_settings(), port_for_settings(), port_for_settings()
    settings["REPLICATION_FAILOVER_HOSTS"] = (
        f"primary.example.net=127.0.0.1:{primary};east.example.net=127.0.0.1:{east};"
        f"west.example.net=127.0.0.1:{west}"
    )
    (directory / "local.settings.json").write_text(json.dumps({"Values": settings}))
    share = directory / "share" / "secondary.txt"
    share.parent.mkdir()
    share.write_text("east.example.net\n")
    total = 400
    host = Host(HostConfig(directory=directory, metrics_port=None, progress=False))
    host.config.stop_when = lambda h: metrics.counts("failing-over")["forwarded"] >= total
    run = asyncio.create_task(host.run())
    while not host.healthy:
        assert not run.done(), run.result()
        await asyncio.sleep(0.05)
    # brokers for every namespace the host map names, not only the configured ones
    assert {primary, east, west} <= {b.port for b in host.brokers}

    async def send(first: int) -> None:
        async with (
            ServiceBusClient.from_connection_string(emulator(primary)) as client,
            client.get_queue_sender("work") as sender,
        ):
            await sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}")
                                        for i in range(first, first + total // 2)])  # fmt: skip

    await send(0)
    while metrics.counts("failing-over")["forwarded"] < total // 2:
        assert not run.done(), run.result()
        await asyncio.sleep(0.05)
    share.write_text("# failed over to west\nwest.example.net\n")
    await asyncio.sleep(0.5)  # the re-check interval is 0.2 s
    await send(total // 2)
    assert await asyncio.wait_for(run, 120) == 0
    local = {**settings, "East": emulator(east), "West": emulator(west)}
    on_east = {p["message_id"] for p in await peek(directory, local, "East", "work", 1000)}
    on_west = {p["message_id"] for p in await peek(directory, local, "West", "work", 1000)}
    assert on_east == {f"m{i}" for i in range(total // 2)}
    assert on_west == {f"m{i}" for i in range(total // 2, total)}
    # the configured Secondary namespace itself got nothing: sends went where the file said
    assert await peek(directory, local, "SecondaryServiceBus", "work", 10) == []
    assert metrics.FAILOVERS.labels("failing-over/target").value() >= 1


async def test_functions_send_where_the_target_failover_points(
    broker_factory: object, tmp_path: Path
) -> None:
    """The Azure Functions path (the generated functions, run as the host runs them) sends
    to the namespace the file names, and follows a rewrite of the file."""
    from azure.servicebus import ServiceBusMessage as Outgoing

    from tests.broker.conftest import BrokerHandle, make_config

    from .support import pipeline_app, run_app

    east: BrokerHandle = broker_factory(make_config({"in": {}, "out": {}}))  # type: ignore[operator]
    west: BrokerHandle = broker_factory(make_config({"out": {}}))  # type: ignore[operator]
    share = tmp_path / "primary.txt"
    share.write_text("east.example.net\n")
    text = f"""\
pipelines:
  - name: fn
    source: {{connection: Source, queue: in}}
    target:
      connection: Target
      queue: out
      failover: {{file: {{path: {share}}}, recheck_interval: 0.1}}
"""
    settings = {
        "Source": east.connection_string, "Target": east.connection_string,
        "REPLICATION_FAILOVER_HOSTS": f"east.example.net=127.0.0.1:{east.port};"
        f"west.example.net=127.0.0.1:{west.port}",
    }  # fmt: skip

    def send(message_id: str) -> None:
        with east.client() as client, client.get_queue_sender("in") as sender:
            sender.send_messages(Outgoing(message_id, message_id=message_id))

    def flipped_once_m1_arrived(_: object) -> bool:
        if not share.read_text().startswith("west") and east.message_ids("out") == ["m1"]:
            share.write_text("west.example.net\n")
            time.sleep(0.3)  # past the recheck interval
            send("m2")
        return west.count("out") >= 1

    send("m1")
    await run_app(pipeline_app(text, settings), settings, until=flipped_once_m1_arrived)
    assert east.message_ids("out") == ["m1"]
    assert west.message_ids("out") == ["m2"]
