"""The dashboard of the local host (in-process ``Host``, real embedded brokers): served on the
metrics port beside ``/metrics``, off with ``ui=False``, and a failover source's switch shown
as it happens (which resolver, what it resolved to, from where to where, and why)."""

from __future__ import annotations

import asyncio
import functools
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from replication.host.app import Host, HostConfig
from tests.host.test_host import project
from tests.ports import port_for_settings

pytestmark = pytest.mark.timeout(120)

WATCHED = """\
pipelines:
  - name: watched
    source:
      connection: PrimaryServiceBus
      queue: work
      failover: {file: {path: share/primary.txt}, recheck_interval: 0.2}
    target:
      connection: SecondaryServiceBus
      queue: work
      failover: {file: {path: share/secondary.txt}, recheck_interval: 0.2}
"""
PLAIN = """\
pipelines:
  - name: plain
    source: {connection: PrimaryServiceBus, queue: work}
    target: {connection: SecondaryServiceBus, queue: work}
"""


def _send(port: int, body: str) -> None:
    connection = (
        f"Endpoint=sb://localhost:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
    )
    client = ServiceBusClient.from_connection_string(connection)
    with client, client.get_queue_sender("work") as sender:
        sender.send_messages(ServiceBusMessage(body))


def _fetch(url: str, data: bytes | None = None, kind: str = "application/json") -> tuple[int, Any]:
    request = urllib.request.Request(url, data=data, headers={"content-type": kind})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            body = answer.read()
            status = answer.status
            content = answer.headers.get("content-type", "")
    except urllib.error.HTTPError as exc:
        body, status, content = exc.read(), exc.code, exc.headers.get("content-type", "")
    return status, json.loads(body) if content == "application/json" else body


async def _started(host: Host) -> asyncio.Task[int]:
    run = asyncio.create_task(host.run())
    while not host.healthy:
        assert not run.done(), run.result()
        await asyncio.sleep(0.05)
    return run


async def _until(what: str, check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := await asyncio.to_thread(check)):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)
    return result


@pytest.mark.slow
async def test_a_failover_switch_shows_where_from_where_to_and_why(tmp_path: Path) -> None:
    directory, settings = project(tmp_path, WATCHED)
    # the host's embedded brokers, on the ports its settings name
    east, west, north, south = (port_for_settings() for _ in range(4))
    settings["REPLICATION_FAILOVER_HOSTS"] = ";".join(
        f"{name}.example.net=127.0.0.1:{port}"
        for name, port in (("east", east), ("west", west), ("north", north), ("south", south))
    )
    (directory / "local.settings.json").write_text(json.dumps({"Values": settings}))
    share = directory / "share" / "primary.txt"
    share.parent.mkdir()
    share.write_text("east.example.net\n")
    secondary_share = directory / "share" / "secondary.txt"
    secondary_share.write_text("north.example.net\n")
    host = Host(HostConfig(directory=directory, metrics_port=0, progress=False))
    run = await _started(host)
    try:
        base = f"http://127.0.0.1:{host.config.metrics_port}"

        def pipeline() -> dict[str, Any]:
            (found,) = _fetch(f"{base}/$dashboard/api/overview")[1]["pipelines"]
            return dict(found)

        def source() -> dict[str, Any]:
            return dict(pipeline()["sources"][0])

        def target() -> dict[str, Any]:
            return dict(pipeline()["targets"][0])

        def sampled_since(at: float) -> bool:
            """The board took a sample at or after ``at`` (it watches failovers as it
            samples: one taken now sees the namespace resolved now)."""
            rows = [row for rows in _fetch(f"{base}/$dashboard/api/overview")[1]["history"]
                    .values() for row in rows]  # fmt: skip
            return any(row[0] >= at for row in rows)

        first = await _until("the first resolution", lambda: source()["failover"]["resolved"])
        assert first == "east.example.net"
        watched = await asyncio.to_thread(source)  # not on the loop: the host answers there
        assert watched["entity"] == "work" and watched["connection"] == "PrimaryServiceBus"
        assert watched["failover"]["resolver"].startswith("file ")
        assert watched["failover"]["switches"] == 0 and watched["failover"]["last_switch"] is None
        await _until("a sample that sees east", functools.partial(sampled_since, time.time()))
        share.write_text("west.example.net\n")
        switched = await _until("the switch", lambda: source()["failover"]["last_switch"])
        assert (switched["from"], switched["to"]) == ("east.example.net", "west.example.net")
        assert switched["why"] == [f"file {share} (line 1)"]  # how the resolver found it
        # the trigger reopens on the broker standing in for west once its batch is done
        await _until("the source on west", lambda: source()["namespace"] == f"127.0.0.1:{west}")
        now = await asyncio.to_thread(source)
        assert now["failover"]["switches"] == 1
        # every namespace of the set has an embedded broker, and the dashboard shows each
        overview = (await asyncio.to_thread(_fetch, f"{base}/$dashboard/api/overview"))[1]
        names = [n["name"] for n in overview["namespaces"]]
        assert f"127.0.0.1:{west}" in names and "SecondaryServiceBus" in names

        # a target's failover resolves when the pipeline first sends, and switches likewise
        assert (await asyncio.to_thread(target))["failover"]["resolved"] is None
        await asyncio.to_thread(_send, west, "first")
        await _until("the target on north", lambda: target()["failover"]["resolved"])
        sending = await asyncio.to_thread(target)
        assert sending["failover"]["resolved"] == "north.example.net"
        assert sending["namespace"] == f"127.0.0.1:{north}"
        await _until("a sample that sees north", functools.partial(sampled_since, time.time()))
        secondary_share.write_text("south.example.net\n")
        await asyncio.to_thread(_send, west, "second")
        moved = await _until("the target's switch", lambda: target()["failover"]["last_switch"])
        assert (moved["from"], moved["to"]) == ("north.example.net", "south.example.net")
        assert (await asyncio.to_thread(target))["namespace"] == f"127.0.0.1:{south}"
    finally:
        host.stop.set()
        assert await asyncio.wait_for(run, 60) == 0


@pytest.mark.starts_processes  # the host's worker
async def test_the_page_sits_beside_metrics_and_no_ui_turns_it_off(tmp_path: Path) -> None:
    directory, _ = project(tmp_path, PLAIN)
    for ui in (True, False):
        host = Host(HostConfig(directory=directory, metrics_port=0, progress=False, ui=ui))
        run = await _started(host)
        try:
            base = f"http://127.0.0.1:{host.config.metrics_port}"
            status, page = await asyncio.to_thread(_fetch, f"{base}/")
            assert status == (200 if ui else 404)
            assert (b"<!doctype html>" in page) is ui
            status, metrics_text = await asyncio.to_thread(_fetch, f"{base}/metrics")
            assert status == 200 and b"replication_received_messages" in metrics_text
            if not ui:
                continue
            status, answer = await asyncio.to_thread(
                _fetch, f"{base}/$dashboard/api/send?namespace=SecondaryServiceBus&entity=work",
                b'{"body": "hi"}', "text/plain",
            )  # fmt: skip
            assert status == 415 and "application/json" in answer["error"]
            status, answer = await asyncio.to_thread(
                _fetch, f"{base}/$dashboard/api/send?namespace=SecondaryServiceBus&entity=work",
                b'{"body": "hi", "message_id": "from-test"}',
            )  # fmt: skip
            assert status == 200
            assert (answer["sent"], answer["message_ids"], answer["entity"]) == (
                "from-test",
                ["from-test"],
                "work",
            )
            status, answer = await asyncio.to_thread(
                _fetch, f"{base}/$dashboard/api/messages?namespace=SecondaryServiceBus&entity=work"
            )  # fmt: skip
            assert [m["message_id"] for m in answer["messages"]] == ["from-test"]
        finally:
            host.stop.set()
            assert await asyncio.wait_for(run, 60) == 0
