"""The Event Hubs view in a headless browser on ``broker --ui``: the hubs, each partition's
numbers as the unmodified ``azure-eventhub`` SDK's ``get_partition_properties`` gives them,
the consumer groups, events the SDK sent read back from a sequence number, an offset and an
enqueued time (with their numbers, keys and properties), and events sent from the page that
the SDK's consumer receives in the partition their key hashes to (or the one named).
Console errors fail the test; screenshots go to ``test-artifacts/dashboard/``.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from azure.eventhub import EventData

from replication.broker.eventhubs.partitioning import partition_for_key
from tests.broker.conftest import LoopThread
from tests.broker.eventhubs_support import eventhub_config, producer, receive
from tests.dashboard.test_browser import _errors, _shot, _text, _until
from tests.dashboard.test_browser import browser as browser  # the fixture, found by name
from tests.dashboard.test_explorer_browser import _click, _confirm, _type
from tests.processes import Processes

from .support import start_broker

pytestmark = pytest.mark.timeout(300)

PARTITIONS = 4


def _rows(driver: Any) -> dict[str, dict[str, str]]:
    """The partitions table: each partition's cells by field."""
    return dict(
        driver.execute_script(
            "return Object.fromEntries([...document.querySelectorAll('#partitions tbody tr')]"
            ".map((tr) => [tr.dataset.partition, Object.fromEntries([...tr.querySelectorAll("
            "'td[data-field]')].map((td) => [td.dataset.field, td.textContent]))]));"
        )
    )


def _shown(driver: Any) -> list[tuple[int, str]]:
    """The events shown: (sequence number, offset) each."""
    return [
        (int(s), o)
        for s, o in driver.execute_script(
            "return [...document.querySelectorAll('#events .event')]"
            ".map((e) => [e.dataset.sequence, e.dataset.offset]);"
        )
    ]


def _read(driver: Any, partition: str, position: str, value: str, count: int = 20) -> None:
    driver.execute_script(
        "const form = document.getElementById('read-form');"
        "form.partition.value = arguments[0]; form.position.value = arguments[1];",
        partition,
        position,
    )
    _type(driver, "#read-form [name=value]", value)
    _type(driver, "#read-form [name=count]", str(count))
    driver.execute_script("document.getElementById('read-note').textContent = ''")
    _click(driver, "#read-form button[type=submit]")
    _until("the events", lambda: _text(driver, "#read-note"))


def _utc(moment: Any) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def test_event_hubs_in_a_browser(browser: Any, tmp_path: Path, processes: Processes) -> None:
    hubs = {"telemetry": {"PartitionCount": str(PARTITIONS), "ConsumerGroups": [{"Name": "cg1"}]}}
    amqp, port, _ = start_broker(
        processes, tmp_path, "--ui", config=eventhub_config(hubs, queues={"work": {}})
    )
    namespace = f"127.0.0.1:{amqp}"
    keyed = str(partition_for_key("alpha", PARTITIONS))
    with producer(amqp, "telemetry") as sdk:
        for i in range(3):  # one at a time: each its own enqueued time
            batch = sdk.create_batch(partition_key="alpha")
            event = EventData(f"alpha {i}")
            event.properties = {"n": i}
            batch.add(event)
            sdk.send_batch(batch)
        sdk.send_batch([EventData("to one"), EventData("to one again")], partition_id="2")
        properties = {p: sdk.get_partition_properties(p) for p in sdk.get_partition_ids()}
    sent = receive(amqp, 3, hub="telemetry", partition_id=keyed, starting_position="-1")
    twos = receive(amqp, 2, hub="telemetry", partition_id="2", starting_position="-1")
    assert keyed not in ("0", "2")  # what the reads below expect (alpha hashes to 1 of 4)

    browser.get(f"http://127.0.0.1:{port}/")
    _until("the hub", lambda: "telemetry" in _text(browser, "#eventhubs"))
    assert _text(browser, "#eventhubs tr[data-hub=telemetry] [data-field=events]") == "5"
    assert _text(browser, "#eventhubs h3") == namespace
    _shot(browser, "eventhubs-1-hubs")
    browser.execute_script("document.querySelector('tr[data-hub=telemetry]').click()")
    _until("the partitions", lambda: len(_rows(browser)) == PARTITIONS)
    rows = _rows(browser)
    for partition, sdk_view in properties.items():
        row = rows[partition]
        assert row["begin"] == str(sdk_view["beginning_sequence_number"]), partition
        assert row["last"] == str(sdk_view["last_enqueued_sequence_number"]), partition
        assert row["offset"] == str(sdk_view["last_enqueued_offset"]), partition
        assert row["empty"] == ("yes" if sdk_view["is_empty"] else "no"), partition
        if not sdk_view["is_empty"]:
            assert row["time"] == _utc(sdk_view["last_enqueued_time_utc"]), partition
    assert _text(browser, "#consumer-groups") == "$Default, cg1"
    _shot(browser, "eventhubs-2-partitions")

    # a partition's row reads it from its start: the SDK's events with the SDK's numbers
    browser.execute_script(
        f"document.querySelector('#partitions tr[data-partition=\"{keyed}\"]').click()"
    )
    _until("the keyed events", lambda: len(_shown(browser)) == 3)
    assert _shown(browser) == [(e.sequence_number, str(e.offset)) for e in sent]
    cards = _text(browser, "#events .event")
    assert "partition key alpha" in cards and "alpha 2" in cards
    first = _text(browser, "#events .event:first-child")
    assert f"enqueued{_utc(sent[0].enqueued_time)}" in first and "n0" in first
    _shot(browser, "eventhubs-3-events")

    # from an offset; from an enqueued time; a count limit
    _read(browser, keyed, "offset", str(sent[1].offset))
    assert _shown(browser) == [(e.sequence_number, str(e.offset)) for e in sent[1:]]
    at = sent[2].enqueued_time
    _read(browser, keyed, "time", at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3])
    expected = [e for e in sent if e.enqueued_time >= at]
    assert _shown(browser) == [(e.sequence_number, str(e.offset)) for e in expected]
    _read(browser, "2", "sequence", "0", count=1)
    assert _shown(browser) == [(twos[0].sequence_number, str(twos[0].offset))]
    assert "1 event(s) of partition 2" in _text(browser, "#read-note")
    _read(browser, "0", "sequence", "0")
    assert _text(browser, "#events") == "no events there"
    assert _text(browser, "#read-note").endswith("the partition has had no events")

    # an event from the page with a key: the SDK finds it, keyed, where the key hashes
    beta = str(partition_for_key("beta", PARTITIONS))
    assert beta != "0"
    _type(browser, "#hub-send-form [name=body]", "from the page")
    _type(browser, "#hub-send-form [name=partition_key]", "beta")
    _type(browser, "#hub-send-form [name=properties]", "region:string=west\nn:int=7")
    _click(browser, "#hub-send-form button[type=submit]")
    assert 'partition key "beta"' in _text(browser, "#ask-text")
    assert "telemetry" in _text(browser, "#ask-text")
    _shot(browser, "eventhubs-4-send")
    _confirm(browser)
    _until(
        "the send",
        lambda: _text(browser, "#hub-send-result") == "sent to telemetry with partition key beta",
    )
    (got,) = receive(amqp, 1, hub="telemetry", partition_id=beta, starting_position="-1")
    assert got.body_as_str() == "from the page" and got.partition_key == b"beta"  # as SDK reads it
    assert got.properties == {b"region": b"west", b"n": 7}

    # to a partition by id, no key
    _type(browser, "#hub-send-form [name=partition_key]", "")
    browser.find_element("css selector", "#hub-send-form option[value='0']").click()
    _type(browser, "#hub-send-form [name=body]", "to partition 0")
    _click(browser, "#hub-send-form button[type=submit]")
    assert "to partition 0" in _text(browser, "#ask-text")
    _confirm(browser)
    _until(
        "the send", lambda: _text(browser, "#hub-send-result") == "sent to telemetry partition 0"
    )
    events = receive(amqp, 1, hub="telemetry", partition_id="0", starting_position="-1")
    assert [e.body_as_str() for e in events] == ["to partition 0"]
    assert events[0].partition_key is None
    # the page's numbers follow (the send refreshes them)
    _until("partition 0's count", lambda: _rows(browser)["0"]["last"] == "0")
    _shot(browser, "eventhubs-5-sent")
    assert _errors(browser) == []


class LateScriptRelay:
    """A TCP relay in front of the dashboard that holds the browser's request for ``late``
    until the overview's answer has gone back to it, and ``SETTLE`` s more: the order a busy
    machine or a slow link can give (a CI run's page never showed its hubs so). A page that
    asks for the overview only after its scripts ran gets the script after ``HOLD`` s (less
    than the server's 10 s for a request head). HTTP/1.1 without pipelining: what comes back
    on a connection after a request is its answer."""

    HOLD = 3.0
    SETTLE = 0.5

    def __init__(self, port: int, late: bytes = b"/static/eventhubs.js") -> None:
        self.port, self.late = port, late
        self._answered = asyncio.Event()  # bound to the loop that first waits on it
        self._loop = LoopThread("late-script-relay")
        server = self._loop.run(asyncio.start_server(self._relay, "127.0.0.1", 0))
        self.listening: int = server.sockets[0].getsockname()[1]

    async def _relay(self, browser: asyncio.StreamReader, back: asyncio.StreamWriter) -> None:
        dashboard, forth = await asyncio.open_connection("127.0.0.1", self.port)
        asked_overview = False

        async def requests() -> None:
            nonlocal asked_overview
            while data := await browser.read(65536):
                if self.late in data:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._answered.wait(), self.HOLD)
                    await asyncio.sleep(self.SETTLE)
                asked_overview = asked_overview or b"/api/overview" in data
                forth.write(data)
                await forth.drain()
            forth.close()

        async def answers() -> None:
            while data := await dashboard.read(65536):
                back.write(data)
                await back.drain()
                if asked_overview:
                    self._answered.set()
            back.close()

        with contextlib.suppress(ConnectionError):
            await asyncio.gather(requests(), answers())

    def close(self) -> None:
        """Ends the connections still relayed (the page's event stream), then the loop."""
        self._loop.close()


def test_the_hubs_show_when_the_overview_comes_before_the_last_script(
    browser: Any, tmp_path: Path, processes: Processes
) -> None:
    """The page's scripts run in order, but the overview app.js asks for may be answered
    while eventhubs.js is still on its way; its listener for the overview must still hear
    it. Before the fix the hubs' section stayed empty (a CI run on a fresh clone)."""
    hubs = {"telemetry": {"PartitionCount": str(PARTITIONS)}}
    _, port, _ = start_broker(processes, tmp_path, "--ui", config=eventhub_config(hubs))
    relay = LateScriptRelay(port)
    try:
        browser.get(f"http://127.0.0.1:{relay.listening}/")
        _until("the hub", lambda: "telemetry" in _text(browser, "#eventhubs"), timeout=60)
        assert _errors(browser) == []
    finally:
        relay.close()
