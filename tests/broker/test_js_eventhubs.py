"""``@azure/event-hubs`` (JavaScript) against the broker's Event Hubs face, through
``tests/interop_js/eventhubs.mjs``: properties read on ``$management`` with a connection
string, sends by partition key and to a partition, and ``EventHubConsumerClient.subscribe``
over every partition. The JavaScript SDK puts its management token for
``<hub>/$management``, where the Python SDK puts one for the hub."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from .conftest import BrokerHandle
from .eventhubs_support import eventhub_config, eventhub_connection_string
from .test_js_client import JS_DIR, NODE_TIMEOUT, js_node  # noqa: F401 (js_node: a fixture)

pytestmark = pytest.mark.timeout(180)


@pytest.mark.broker_config(eventhub_config())
def test_the_javascript_sdk_sends_reads_and_subscribes(
    js_node: str,  # noqa: F811
    broker: BrokerHandle,
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "NODE_OPTIONS")}
    env["EVENTHUB_CONNECTION_STRING"] = eventhub_connection_string(broker.port)
    proc = subprocess.run(
        [js_node, str(JS_DIR / "eventhubs.mjs")],
        cwd=JS_DIR,
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT,
        env=env,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, f"eventhubs.mjs: exit {proc.returncode}, no result\n{proc.stderr[-4000:]}"
    result = json.loads(lines[-1])
    assert result["ok"], f"{result.get('error')}\n{proc.stderr[-4000:]}"
    assert result["partitionIds"] == ["0", "1"]
    assert len(result["bodies"]) == 15
