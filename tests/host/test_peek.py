"""``peek``: a dead-letter queue is read as Service Bus names it, ``<queue>/$DeadLetterQueue``;
what went wrong is one line, not a traceback."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage

from replication.host.main import run_peek
from replication.host.peek import peek
from tests.broker.conftest import BrokerHandle, make_config

CONFIG = make_config({"work": {}})


async def test_peek_reads_the_dead_letter_queue(broker_factory: Any, tmp_path: Path) -> None:
    broker: BrokerHandle = broker_factory(CONFIG)
    with broker.client() as client:
        with client.get_queue_sender("work") as sender:
            sender.send_messages([ServiceBusMessage(b"x", message_id=f"m{i}") for i in range(3)])
        with client.get_queue_receiver("work", max_wait_time=2) as receiver:
            [first] = receiver.receive_messages(max_message_count=1)
            receiver.dead_letter_message(first, reason="bad", error_description="for the test")
    settings = {"Bus": broker.connection_string}
    dead = await peek(tmp_path, settings, "Bus", "work/$DeadLetterQueue", 10)
    assert [(d["message_id"], d["properties"].get("DeadLetterReason")) for d in dead] == [
        ("m0", "bad")
    ]
    live = await peek(tmp_path, settings, "Bus", "work", 10)
    assert [d["message_id"] for d in live] == ["m1", "m2"]


def test_a_failed_peek_says_why(
    broker_factory: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broker: BrokerHandle = broker_factory(CONFIG)
    (tmp_path / "local.settings.json").write_text(
        json.dumps({"Values": {"Bus": broker.connection_string}})
    )
    args = argparse.Namespace(
        dir=tmp_path, settings=None, connection="Bus", entity="nowhere", count=10, session=None,
        json=False,
    )  # fmt: skip
    assert run_peek(args) == 1
    error = capsys.readouterr().err
    assert error.startswith("error: cannot peek at nowhere: ") and "404" in error, error
