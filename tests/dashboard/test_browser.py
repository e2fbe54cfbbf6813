"""The dashboard in a real headless browser (Debian's chromium, driven by selenium through its
chromedriver) over ``python -m replication start`` running the sample pipelines.

What a user does: watch the demo's pipelines count, read why a message was dead-lettered,
follow a replica's stamps back to its source, resubmit a dead letter and see it arrive,
send a test message. Any JavaScript error (console error, uncaught exception, failed
request) fails the test; screenshots go to ``test-artifacts/dashboard/`` (not committed).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from replication.host.demo import produce
from replication.pipeline import load_pipelines
from tests.broker.conftest import REPO_ROOT
from tests.host.test_host import project
from tests.processes import Processes

pytestmark = pytest.mark.timeout(300)

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS = REPO_ROOT / "test-artifacts" / "dashboard"
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1400,1000",
)  # fmt: skip
WAIT = 120.0
"""How long a page gets to show what the host did: a guard against a hang, not a speed
check. 30 s ran out in a CI run beside two CPU burners (the audit pipeline's 20 events)."""
DASHBOARD = re.compile(r"dashboard on (http://127\.0\.0\.1:\d+/)")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install -y chromium "
                    "chromium-driver; .ci/run installs them)")  # fmt: skip
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def host(tmp_path: Path, processes: Processes) -> Iterator[tuple[str, dict[str, str], Path]]:
    """``python -m replication start`` over the sample project: the dashboard's URL, the
    settings and the project folder."""
    (tmp_path / "project").mkdir()
    directory, settings = project(tmp_path / "project")
    log = tmp_path / "host.log"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    with log.open("ab") as out:
        process = processes.start(
            [sys.executable, "-m", "replication", "start", "--dir", str(directory),
             "--metrics-port", "0", "--no-progress"],
            cwd=directory, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while not (found := DASHBOARD.search(log.read_text())):
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"no dashboard in the log: {log.read_text()}"
        time.sleep(0.1)
    yield found.group(1), settings, directory
    process.terminate()  # a clean stop: the dashboard's stream ends with the host
    assert process.wait(60) == 0, log.read_text()[-3000:]


def _until(what: str, check: Callable[[], Any], timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
        except Exception as exc:  # e.g. an element replaced by a live update meanwhile
            result, error = None, exc
        else:
            error = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out waiting for {what}" + (f": {error!r}" if error else "")
            )
        time.sleep(0.2)


def _api(url: str, route: str, **params: Any) -> Any:
    query = f"?{urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{url}$dashboard/api/{route}{query}", timeout=10) as answer:
        return json.loads(answer.read())


def _cells(driver: Any, pipeline: str) -> dict[str, str]:
    return driver.execute_script(
        "const row = document.querySelector(`#pipelines tr[data-pipeline='${arguments[0]}']`);"
        "if (!row) return {};"
        "return Object.fromEntries([...row.querySelectorAll('td[data-field]')]"
        ".map((td) => [td.dataset.field, td.textContent]));",
        pipeline,
    )


def _open_entity(driver: Any, namespace: str, entity: str, tab: str) -> None:
    """Clicks an entity's row (found anew: live updates redraw the table), then a tab."""
    selector = f"tr[data-namespace='{namespace}'][data-entity='{entity}']"
    _until(f"{entity} in {namespace}", lambda: driver.execute_script(
        "const row = document.querySelector(arguments[0]); if (row) row.click(); return !!row;",
        selector,
    ))  # fmt: skip
    driver.execute_script("document.querySelector(`.tabs button[data-tab='${arguments[0]}']`)"
                          ".click()", tab)  # fmt: skip


def _text(driver: Any, selector: str) -> str:
    return str(driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((e) => e.textContent)"
        ".join('\\n')", selector,
    ))  # fmt: skip


def _shot(driver: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def _errors(driver: Any) -> list[str]:
    """Console errors, uncaught exceptions and failed requests the page logged."""
    return [entry["message"] for entry in driver.get_log("browser")
            if entry["level"] in ("SEVERE", "ERROR")]  # fmt: skip


def test_dashboard_in_a_browser(browser: Any, host: tuple[str, dict[str, str], Path]) -> None:
    url, settings, directory = host
    primary, secondary = settings["PrimaryServiceBus"], settings["SecondaryServiceBus"]
    pipelines = load_pipelines(directory / "pipelines.yaml", settings=settings)
    asyncio.run(produce(pipelines, settings))
    # a body the telemetry pipeline cannot read as Avro: it dead-letters it, saying why
    with (
        ServiceBusClient.from_connection_string(primary) as client,
        client.get_queue_sender("telemetry-avro") as sender,
    ):
        sender.send_messages(ServiceBusMessage(b"not avro", message_id="broken-1"))
    _until("the demo to move", lambda: _api(url, "overview")["pipelines"] and all(
        p["counts"]["backlog"] == 0 and p["counts"]["received"] > 0
        for p in _api(url, "overview")["pipelines"]
    ), 90)  # fmt: skip

    browser.get(url)
    _until("the live badge", lambda: _text(browser, "#live") == "live")
    _until("the demo's counts", lambda: _cells(browser, "orders-to-secondary").get("forwarded")
           == "200")  # fmt: skip
    assert _cells(browser, "orders-to-secondary")["received"] == "200"
    assert _cells(browser, "events-router")["forwarded"] == "30"
    assert _cells(browser, "mirror-primary-to-secondary")["filtered"] == "5"
    _until("the dead-lettered count", lambda: _cells(browser, "telemetry-to-json")
           .get("dead_lettered") == "1")  # fmt: skip
    assert _cells(browser, "telemetry-to-json")["forwarded"] == "50"
    # how far behind each pipeline is: its copies' lag (last / largest in the window)
    lag = _api(url, "overview")["pipelines"]
    orders = next(p for p in lag if p["name"] == "orders-to-secondary")["lag"]
    assert orders["last"] is not None and 0 <= orders["last"] <= orders["max"] < 60
    shown = _cells(browser, "orders-to-secondary")["lag"]
    assert re.fullmatch(r"[\d.]+ (ms|s) / [\d.]+ (ms|s)", shown), shown
    _shot(browser, "1-pipelines")

    # the pipeline's dead letter, with the reason and the description the step gave
    _open_entity(browser, "PrimaryServiceBus", "telemetry-avro", "dead-letters")
    reason = _until("the dead letter's reason", lambda: _text(
        browser, "#dead-letters [data-testid=dead-letter-reason]"))  # fmt: skip
    assert reason.startswith("transcode: "), reason
    assert _text(browser, "#dead-letters [data-testid=dead-letter-description]").strip()
    assert "broken-1" in _text(browser, "#dead-letters .message")
    _shot(browser, "2-dead-letter-reason")

    # a replica's stamps: the hop from the primary, then where it is now
    _open_entity(browser, "SecondaryServiceBus", "orders", "messages")
    path = _until("a stamp path", lambda: _text(browser, "#messages [data-testid=path]"))
    primary_host = re.search(r"localhost:\d+", primary)
    assert primary_host is not None and primary_host.group(0) in path, path
    assert "#1" in path and "here seq" in path
    _shot(browser, "3-stamps")

    # a consumer of the replica gives up on one: resubmitting it makes it arrive again
    with (
        ServiceBusClient.from_connection_string(secondary) as client,
        client.get_queue_receiver("telemetry-json", max_wait_time=5) as receiver,
    ):
        (given_up,) = receiver.receive_messages(1, max_wait_time=5)
        body = str(given_up)
        receiver.dead_letter_message(given_up, "Rejected downstream", "humidity out of range")
    _open_entity(browser, "SecondaryServiceBus", "telemetry-json", "dead-letters")
    _until("the downstream reason", lambda: "Rejected downstream" in _text(
        browser, "#dead-letters [data-testid=dead-letter-reason]"))  # fmt: skip
    assert "humidity out of range" in _text(browser, "#dead-letters")
    browser.execute_script("document.querySelector('#dead-letters .pick').click()")
    browser.execute_script("document.getElementById('dl-resubmit').click()")
    _until("the confirmation", lambda: browser.execute_script(
        "return document.getElementById('confirm').open"))  # fmt: skip
    # the sample entities detect duplicates: the page offers (and ticks) new message ids
    assert browser.execute_script("return document.getElementById('confirm-new-ids').checked")
    assert "PT10M" in _text(browser, "#confirm-dedupe-text")
    _shot(browser, "4-confirm-resubmit")
    browser.execute_script("document.getElementById('confirm-ok').click()")
    _until("the resubmit's result", lambda: _text(browser, "#dl-result") == "resubmitted 1")
    _until("an empty dead-letter queue",
           lambda: "no dead letters" in _text(browser, "#dead-letters"))  # fmt: skip
    arrived = _api(url, "messages", namespace="SecondaryServiceBus", entity="telemetry-json",
                   count=100)["messages"]  # fmt: skip
    assert len(arrived) == 50 and arrived[-1]["body"] == body
    assert arrived[-1]["dead_letter_reason"] is None
    _shot(browser, "5-resubmitted")

    # a test message, sent from the page and peeked back
    _open_entity(browser, "SecondaryServiceBus", "events-other", "send")
    browser.execute_script("""
        const form = document.getElementById('send-form');
        form.body.value = 'hello from the page';
        form.subject.value = 'smoke';
        addProperty('kind', 'string', 'test');
        addProperty('priority', 'int', '3');
        form.requestSubmit();
    """)
    _until("the send's result", lambda: _text(browser, "#send-result").startswith("sent "))
    browser.execute_script("document.querySelector(`.tabs button[data-tab='messages']`).click()")
    _until("the test message", lambda: "hello from the page" in _text(browser, "#messages"))
    assert "priority" in _text(browser, "#messages") and "smoke" in _text(browser, "#messages")
    _shot(browser, "6-sent")

    # a session and its state (the replica's sessions: nobody holds them)
    _open_entity(browser, "SecondaryServiceBus", "orders", "sessions")
    _until("the session list", lambda: "customer-3" in _text(browser, "#sessions"))
    browser.execute_script(
        "[...document.querySelectorAll('#sessions button')]"
        ".find((b) => b.textContent === 'customer-3').click()"
    )
    _until("the session's state", lambda: _text(browser, "[data-testid=session-state]"))
    assert _text(browser, "[data-testid=session-state]") == "state: (no state)"
    assert "order-3-0" in _text(browser, "#session-detail")
    _shot(browser, "7-session")

    # the pipeline's dead letter, deleted for good (behind the confirmation, too)
    _open_entity(browser, "PrimaryServiceBus", "telemetry-avro", "dead-letters")
    _until("the dead letter", lambda: "broken-1" in _text(browser, "#dead-letters"))
    browser.execute_script("document.getElementById('dl-delete-all').click()")
    _until("the confirmation", lambda: "Delete all 1 dead letter(s)" in _text(
        browser, "#confirm-text"))  # fmt: skip
    # no new-ids choice for a delete
    assert browser.execute_script("return document.getElementById('confirm-dedupe').hidden")
    browser.execute_script("document.getElementById('confirm-ok').click()")
    _until("the delete's result", lambda: _text(browser, "#dl-result") == "deleted 1")
    assert _api(url, "messages", namespace="PrimaryServiceBus", entity="telemetry-avro",
                dead_letter=1)["messages"] == []  # fmt: skip

    # the event hub the audit pipeline fills, on the secondary's broker
    hub = "#eventhubs tr[data-hub=order-audit-stream]"
    _until("the event hub", lambda: _text(browser, f"{hub} [data-field=events]") == "20")

    assert _errors(browser) == []


def test_broker_ui_asks_for_a_token_off_loopback(
    browser: Any, tmp_path: Path, processes: Processes
) -> None:
    """``broker --ui --host 0.0.0.0``: the page asks for a SAS token, and with one shows the
    namespace, live."""
    from replication.servicebus.sas import mint

    from .support import start_broker

    amqp, port, _ = start_broker(processes, tmp_path, "--ui", "--host", "0.0.0.0")
    browser.get(f"http://127.0.0.1:{port}/")
    _until("the token field", lambda: browser.execute_script(
        "return !document.getElementById('token-form').hidden"))  # fmt: skip
    assert "SAS token is required" in _text(browser, "#error")
    # the page's two first requests (overview, events) are refused, as expected: wait for
    # both before forgetting them, or the second one's 401 may land after (it raced)
    refused: list[str] = []

    def both_refused() -> bool:
        refused.extend(entry["message"] for entry in browser.get_log("browser"))
        return all(any(f"api/{path} " in m for m in refused) for path in ("overview", "events"))

    _until("both first requests refused", both_refused)
    token = mint(f"sb://localhost:{amqp}", "RootManageSharedAccessKey", "SAS_KEY_VALUE")[0]
    browser.execute_script(
        "document.getElementById('token').value = arguments[0];"
        "document.getElementById('token-form').requestSubmit();", token,
    )  # fmt: skip
    _until("the namespace", lambda: "work" in _text(browser, "#namespaces"))
    _until("the live badge", lambda: _text(browser, "#live") == "live")
    assert browser.execute_script("return document.getElementById('pipelines-section').hidden")
    assert not _text(browser, "#error")
    _shot(browser, "8-broker-ui")
    assert _errors(browser) == []
