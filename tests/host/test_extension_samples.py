"""The extension package's own published samples (shipped in its wheel under ``samples/``),
unmodified, run by the local host against the embedded broker: every message is settled."""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage

from replication.host.discovery import load_app
from tests.broker.conftest import BrokerHandle, make_config

from .support import run_app

SAMPLES = Path(sysconfig.get_paths()["purelib"]) / "samples"
CONFIG = make_config(
    {"QUEUE_NAME": {}},
    topics={"TOPIC_NAME": {"Subscriptions": {"SUBSCRIPTION_NAME": {}}}},
)


@pytest.mark.parametrize(
    "sample, entities",
    [
        ("servicebus_samples_single", 2),
        ("servicebus_samples_batch", 2),
        ("servicebus_samples_settlement", 1),
    ],
)
async def test_the_extensions_sample_runs_unchanged(
    broker_factory: Any, sample: str, entities: int
) -> None:
    path = SAMPLES / sample / "function_app.py"
    assert path.is_file(), f"the extension no longer ships {path}"
    broker: BrokerHandle = broker_factory(CONFIG)
    settings = {"SERVICEBUS_CONNECTION": broker.connection_string}
    with broker.client() as client:
        with client.get_queue_sender("QUEUE_NAME") as sender:
            sender.send_messages([ServiceBusMessage(f"q{n}", message_id=f"q{n}") for n in range(3)])
        with client.get_topic_sender("TOPIC_NAME") as sender:
            sender.send_messages([ServiceBusMessage(f"t{n}", message_id=f"t{n}") for n in range(3)])
    runners = await run_app(
        load_app(path), settings,
        until=lambda rs: sum(r.stats.completed for r in rs) >= 3 * entities,
    )  # fmt: skip
    assert sum(r.stats.failed_calls for r in runners) == 0
    assert broker.count("QUEUE_NAME") == 0


@pytest.mark.starts_processes  # the host's worker
async def test_the_host_runs_a_function_app_without_a_pipeline_file(
    broker_factory: Any, tmp_path: Path
) -> None:
    """``python -m replication start`` on the settlement sample's folder, as ``func start``
    would run it: no pipelines.yaml, the connection in local.settings.json."""
    import json
    import shutil

    from replication.host.app import Host, HostConfig

    broker: BrokerHandle = broker_factory(CONFIG)
    shutil.copy(SAMPLES / "servicebus_samples_settlement" / "function_app.py", tmp_path)
    (tmp_path / "local.settings.json").write_text(
        json.dumps({"Values": {"SERVICEBUS_CONNECTION": broker.connection_string}})
    )
    with broker.client() as client, client.get_queue_sender("QUEUE_NAME") as sender:
        sender.send_messages(ServiceBusMessage(b"hello", message_id="h"))
    host = Host(HostConfig(directory=tmp_path, metrics_port=None, progress=False))
    host.config.stop_when = lambda h: h.runners[0].stats.completed >= 1
    assert await host.run() == 0
    assert broker.count("QUEUE_NAME") == 0
