"""``@azure/service-bus``'s published JavaScript samples, as scenarios, against the broker.

``tests/interop_js/samples.mjs`` does what each sample in the SDK's ``samples/v7/javascript``
does (through the same SDK calls, with the samples' environment variables) and checks the
outcome. The samples themselves were run unchanged against the broker too; README.md lists
which run and why two cannot offline. ``deleteMessages`` needs the 7.10 beta SDK (installed
beside 7.9.5 as ``@azure/service-bus-beta``).
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from .conftest import BrokerHandle, connection_string, make_config
from .test_js_client import JS_DIR, NODE_TIMEOUT, js_node  # noqa: F401 (js_node: a fixture)

pytestmark = pytest.mark.timeout(300)

QUEUE, SESSION_QUEUE = "samples-queue", "samples-session-queue"
KEYS = {
    "RootManageSharedAccessKey": ("SAS_KEY_VALUE", ["Manage", "Send", "Listen"]),
    "listener": ("listen-key", ["Listen"]),
    "sender": ("send-key", ["Send"]),
}
"""The emulator's root key, and two narrower ones for the rule manager (Listen suffices)."""
CONFIG = make_config(
    {QUEUE: {}, SESSION_QUEUE: {"RequiresSession": True}},
    [{"Name": name, "Key": key, "Rights": rights} for name, (key, rights) in KEYS.items()],
)

SCENARIOS = [
    "sendMessages", "receiveMessagesLoop", "receiveMessagesStreaming", "browseMessages",
    "exceedMaxDeliveryCount", "scheduledMessages", "deferral", "movingMessagesToDLQ",
    "processMessageFromDLQ", "session", "sessionState", "sessionRoundRobin",
    "topicSubscriptionWithRuleOperationsSample", "ruleManager", "listingEntities",
    "administrationClient", "usingNamedKeyCredential", "useProxy", "deleteMessages",
]  # fmt: skip


def run_sample(node: str, scenario: str, broker: BrokerHandle) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "NODE_OPTIONS")}
    env.update(
        SERVICEBUS_CONNECTION_STRING=broker.connection_string,
        QUEUE_NAME=QUEUE,
        QUEUE_NAME_WITH_SESSIONS=SESSION_QUEUE,
        SERVICEBUS_FQDN=f"localhost:{broker.port}",  # no UseDevelopmentEmulator: AMQPS
        SERVICEBUS_SAS_POLICY="RootManageSharedAccessKey",
        SERVICEBUS_SAS_KEY="SAS_KEY_VALUE",
        SERVICEBUS_LISTEN_CONNECTION_STRING=connection_string(
            broker.port, "listener", "listen-key"
        ),
        SERVICEBUS_SEND_CONNECTION_STRING=connection_string(broker.port, "sender", "send-key"),
        NODE_EXTRA_CA_CERTS=str(broker.data_dir / "tls" / "ca.pem"),
    )
    proc = subprocess.run(
        [node, str(JS_DIR / "samples.mjs"), scenario], cwd=JS_DIR, capture_output=True,
        text=True, timeout=NODE_TIMEOUT, env=env,
    )  # fmt: skip
    lines = proc.stdout.strip().splitlines()
    assert lines, f"samples.mjs {scenario}: exit {proc.returncode}, no result\n{proc.stderr}"
    result: dict[str, Any] = json.loads(lines[-1])
    assert result["ok"], f"{scenario}: {result.get('error')}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0
    return result


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.broker_config(CONFIG)
def test_js_sample(js_node: str, broker: BrokerHandle, scenario: str) -> None:  # noqa: F811
    result = run_sample(js_node, scenario, broker)
    assert result["scenario"] == scenario
    assert broker.count(QUEUE) == 0 or scenario in ("sendMessages", "browseMessages")
