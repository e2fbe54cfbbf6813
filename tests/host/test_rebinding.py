"""DNS rebinding (issue 38) on the local host's HTTP port (127.0.0.1 only): ``/metrics``,
``/health`` and the dashboard answer only for a loopback ``Host``, and a dashboard send from
another ``Origin`` is refused before it reaches the embedded broker.

An in-process ``Host`` with its embedded brokers; requests over real sockets on the port the
OS gave it, made off the loop (the host answers on it), the queue peeked with the SDK.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from replication.host.app import Host, HostConfig
from tests.host.test_host import project
from tests.loopback_http import LOOPBACK, REBOUND, peek_ids, request
from tests.waiting import until

pytestmark = [pytest.mark.timeout(120), pytest.mark.starts_processes]  # the host's worker

PLAIN = """\
pipelines:
  - name: plain
    source: {connection: PrimaryServiceBus, queue: work}
    target: {connection: SecondaryServiceBus, queue: work}
"""
PATHS = ("/metrics", "/health", "/", "/$dashboard/api/overview")
SEND = "/$dashboard/api/send?namespace=SecondaryServiceBus&entity=work"
JSON = {"content-type": "application/json"}


@contextlib.asynccontextmanager
async def _serving(tmp_path: Path) -> AsyncIterator[tuple[int, str]]:
    """The host running: its HTTP port, and the connection string of the secondary broker."""
    directory, settings = project(tmp_path, PLAIN)
    host = Host(HostConfig(directory=directory, metrics_port=0, progress=False))
    run = asyncio.create_task(host.run())
    try:
        await until(lambda: host.healthy or run.done(), "the host serving")
        assert not run.done()
        assert host.config.metrics_port is not None
        yield host.config.metrics_port, settings["SecondaryServiceBus"]
    finally:
        host.stop.set()
        assert await asyncio.wait_for(run, 60) == 0


@pytest.mark.parametrize("path", PATHS)
async def test_metrics_health_and_dashboard_answer_only_for_loopback_hosts(
    tmp_path: Path, path: str
) -> None:
    async with _serving(tmp_path) as (port, _):
        for name in REBOUND:
            status, body = await asyncio.to_thread(request, port, "GET", path, f"{name}:{port}")
            assert status == 421 and b"loopback" in body, (name, body)
        for name in LOOPBACK:
            status, body = await asyncio.to_thread(request, port, "GET", path, f"{name}:{port}")
            assert status == 200, (name, body)


async def test_a_send_from_another_origin_is_refused_and_sends_nothing(tmp_path: Path) -> None:
    async with _serving(tmp_path) as (port, secondary):
        for origin in ("http://evil.example", "null"):
            body = json.dumps({"body": "x", "message_id": origin}).encode()
            headers = {**JSON, "Origin": origin}
            status, answer = await asyncio.to_thread(
                request, port, "POST", SEND, f"localhost:{port}", headers, body
            )
            assert status == 403 and b"Origin" in answer, (origin, answer)
        assert await asyncio.to_thread(peek_ids, secondary, "work") == []
        body = json.dumps({"body": "x", "message_id": "from the page"}).encode()
        headers = {**JSON, "Origin": f"http://localhost:{port}"}
        status, answer = await asyncio.to_thread(
            request, port, "POST", SEND, f"localhost:{port}", headers, body
        )
        assert status == 200, answer
        assert await asyncio.to_thread(peek_ids, secondary, "work") == ["from the page"]
