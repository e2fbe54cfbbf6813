"""The Event Hubs view's endpoints off loopback: the rights Event Hubs asks for (Listen to
see hubs and read events, Send to send), a token scoped to another hub refused, and the
requests it cannot do answered with what is wrong."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from replication.broker.auth import EMULATOR_KEY, EMULATOR_RULE_NAME
from replication.servicebus.sas import mint
from tests.broker.eventhubs_support import eventhub_config, receive
from tests.processes import Processes

from .support import start_broker

pytestmark = pytest.mark.timeout(120)

RULES = [
    {"Name": EMULATOR_RULE_NAME, "Key": EMULATOR_KEY, "Rights": ["Manage", "Send", "Listen"]},
    {"Name": "reader", "Key": "reader-key", "Rights": ["Listen"]},
    {"Name": "writer", "Key": "writer-key", "Rights": ["Send"]},
]


def _call(
    port: int, route: str, token: str, params: dict[str, Any], body: Any = None
) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"authorization": token, "content-type": "application/json"}
    try:
        connection.request(
            "GET" if body is None else "POST",
            f"/$dashboard/api/{route}?{urlencode(params)}",
            body=None if body is None else json.dumps(body),
            headers=headers,
        )
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_event_hub_rights_off_loopback(tmp_path: Path, processes: Processes) -> None:
    config = eventhub_config({"eh1": {"PartitionCount": "2"}, "other": {"PartitionCount": "1"}})
    config["UserConfig"]["Namespaces"][0]["AuthorizationRules"] = RULES
    amqp, port, _ = start_broker(processes, tmp_path, "--ui", "--host", "0.0.0.0", config=config)
    host = f"localhost:{amqp}"
    reader = mint(f"sb://{host}", "reader", "reader-key")[0]
    writer = mint(f"sb://{host}", "writer", "writer-key")[0]
    other_hub = mint(f"sb://{host}/other", EMULATOR_RULE_NAME, EMULATOR_KEY)[0]
    where = {"namespace": host, "hub": "eh1"}

    status, hubs = _call(port, "eventhubs", reader, {"namespace": host})
    assert status == 200 and [h["name"] for h in hubs["hubs"]] == ["eh1", "other"]
    assert hubs["hubs"][0]["consumer_groups"] == ["$Default"]
    status, refused = _call(port, "eventhubs", writer, {"namespace": host})
    assert status == 401 and "Listen claim required" in refused["error"]

    event = {"body": "hi", "partition_key": "k"}
    status, refused = _call(port, "eventhubs/send", reader, where, event)
    assert status == 401 and "Send claim required" in refused["error"]
    status, refused = _call(port, "eventhubs/send", other_hub, where, event)
    assert status == 401 and "does not cover" in refused["error"]
    status, sent = _call(port, "eventhubs/send", writer, where, event)
    assert status == 200 and sent["partition_key"] == "k"

    read = {**where, "partition": "0", "position": "sequence", "value": "0", "count": "5"}
    status, refused = _call(port, "eventhubs/events", writer, read)
    assert status == 401 and "Listen claim required" in refused["error"]
    events = []
    for partition in ("0", "1"):
        status, answer = _call(port, "eventhubs/events", reader, {**read, "partition": partition})
        assert status == 200, answer
        events += answer["events"]
    assert [(e["body"], e["partition_key"]) for e in events] == [("hi", "k")]
    (seen,) = receive(amqp, 1, partition_id=events[0]["partition_id"], starting_position="-1")
    assert seen.body_as_str() == "hi"

    # what cannot be done, said
    manage = mint(f"sb://{host}", EMULATOR_RULE_NAME, EMULATOR_KEY)[0]
    for route, params, body, status, said in (
        ("eventhubs/events", {**read, "partition": "7"}, None, 404, "no partition '7'"),
        ("eventhubs/events", {**read, "hub": "nope"}, None, 404, "no event hub 'nope'"),
        ("eventhubs/events", {**read, "count": "0"}, None, 400, "count: a whole number"),
        ("eventhubs/events", {**read, "position": "time", "value": "soon"}, None, 400, "ISO"),
        ("eventhubs/send", where, {"partition_key": "k", "partition_id": "0"}, 400, "not both"),
        ("eventhubs/send", where, {"session_id": "s"}, 400, "an event has no session_id"),
        ("eventhubs/send", where, {"partition_id": "9"}, 404, "no partition '9'"),
    ):
        got, answer = _call(port, route, manage, params, body)
        assert (got, said in answer["error"]) == (status, True), (route, params, answer)
