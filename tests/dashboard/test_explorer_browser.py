"""The explorer in a headless browser, as an operator uses it on ``broker --ui``: peek a page
and the next, search, receive under a lock and settle each way, take a deferred message by
sequence number, cancel a scheduled one, send typed properties and a batch, resend an
edited dead letter, purge behind a typed confirmation. Each effect is checked with the
unmodified ``azure-servicebus`` SDK; console errors fail the test; screenshots of each view
go to ``test-artifacts/dashboard/``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus import ServiceBusSubQueue as SubQueue

from tests.broker.conftest import connection_string
from tests.dashboard.test_browser import _errors, _open_entity, _shot, _text, _until
from tests.dashboard.test_browser import browser as browser  # the fixture, found by name
from tests.processes import Processes

from .support import start_broker

pytestmark = pytest.mark.timeout(300)


def _click(driver: Any, selector: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, selector).click()


def _type(driver: Any, selector: str, text: str) -> None:
    from selenium.webdriver.common.by import By

    field = driver.find_element(By.CSS_SELECTOR, selector)
    field.clear()
    field.send_keys(text)


def _confirm(driver: Any) -> None:
    _until(
        "the dialog", lambda: driver.execute_script("return document.getElementById('ask').open")
    )
    _click(driver, "#ask-ok")
    _until(
        "the dialog to close",
        lambda: not driver.execute_script("return document.getElementById('ask').open"),
    )


def _card_button(driver: Any, box: str, message_id: str, label: str) -> None:
    from selenium.webdriver.common.by import By

    card = driver.find_element(By.CSS_SELECTOR, f"#{box} .message[data-message-id='{message_id}']")
    next(b for b in card.find_elements(By.TAG_NAME, "button") if b.text == label).click()


def test_explorer_in_a_browser(browser: Any, tmp_path: Path, processes: Processes) -> None:
    amqp, port, _ = start_broker(processes, tmp_path, "--ui")
    namespace = f"127.0.0.1:{amqp}"
    client = ServiceBusClient.from_connection_string(connection_string(amqp))
    with client, client.get_queue_sender("work") as sender:
        sender.send_messages(
            [
                ServiceBusMessage(f"body {i}", message_id=f"m{i}", correlation_id=f"c{i % 2}")
                for i in range(6)
            ]
        )

    def peek_sdk(dead_letter: bool = False) -> list[Any]:
        queue = SubQueue.DEAD_LETTER if dead_letter else None
        with client.get_queue_receiver("work", sub_queue=queue) as receiver:
            return list(receiver.peek_messages(100))

    browser.get(f"http://127.0.0.1:{port}/")
    _open_entity(browser, namespace, "work", "messages")
    _until("the messages", lambda: "m5" in _text(browser, "#messages"))
    # no sessions on this queue: no Sessions tab; the heading names the namespace once
    assert not browser.find_element("css selector", "[data-tab=sessions]").is_displayed()
    assert _text(browser, "#namespaces h3") == namespace
    assert ".000" not in _text(browser, "#messages") and " UTC" in _text(browser, "#messages")

    # a page of two, then the next
    _type(browser, "#peek-form [name=count]", "2")
    _click(browser, "#peek-form button[type=submit]")
    _until("a page of two", lambda: _text(browser, "#peek-note") == "2 message(s) from #1")
    _click(browser, "#peek-next")
    _until("the next page", lambda: _text(browser, "#peek-note") == "2 message(s) from #3")
    assert "m2" in _text(browser, "#messages") and "m1" not in _text(browser, "#messages")
    _shot(browser, "explorer-1-peek-page")

    # search by correlation id, the limit stated
    _type(browser, "#peek-form [name=from]", "1")
    _type(browser, "#peek-form [name=count]", "20")
    _click(browser, "#search-box summary")
    _type(browser, "#search-form [name=correlation_id]", "c1")
    _click(browser, "#search-form button[type=submit]")
    _until("the matches", lambda: _text(browser, "#peek-note").startswith("3 match(es)"))
    assert "among 6 message(s)" in _text(browser, "#peek-note")
    assert "5000 at most" in _text(browser, "#peek-note")
    _shot(browser, "explorer-2-search")
    _click(browser, "#search-form button[type=reset]")

    # receive four under a lock, settle each a different way
    _type(browser, "#receive-count", "4")
    _click(browser, "#receive")
    _until("four locked", lambda: "4 message(s) locked" in _text(browser, "#held-note"))
    _shot(browser, "explorer-3-received")
    _card_button(browser, "held", "m0", "complete")
    assert "Complete 1 message(s) (#1) of work" in _text(browser, "#ask-text")
    _confirm(browser)
    _until("completed", lambda: _text(browser, "#op-result") == "complete: #1")
    _card_button(browser, "held", "m1", "abandon")
    _confirm(browser)
    _until("abandoned", lambda: _text(browser, "#op-result") == "abandon: #2")
    _card_button(browser, "held", "m2", "dead-letter")
    _type(browser, "#ask-fields [name=reason]", "Bad total")
    _type(browser, "#ask-fields [name=description]", "the sum is negative")
    _shot(browser, "explorer-4-dead-letter-reason")
    _confirm(browser)
    _until("dead-lettered", lambda: _text(browser, "#op-result") == "dead-letter: #3")
    _click(browser, "#held .message[data-message-id='m3'] .pick")
    _click(browser, "[data-settle=defer]")
    _confirm(browser)
    _until("deferred", lambda: _text(browser, "#op-result") == "defer: #4")
    active = {m.message_id: m for m in peek_sdk()}
    assert "m0" not in active and active["m1"].delivery_count == 1
    (dead,) = peek_sdk(dead_letter=True)
    assert (dead.message_id, dead.dead_letter_reason) == ("m2", "Bad total")
    assert dead.dead_letter_error_description == "the sum is negative"

    # the deferred one, by its sequence number, completed
    _type(browser, "#deferred-numbers", "4")
    _click(browser, "#receive-deferred")
    _until("the deferred message", lambda: "m3" in _text(browser, "#held"))
    _card_button(browser, "held", "m3", "complete")
    _confirm(browser)
    _until("completed", lambda: _text(browser, "#op-result") == "complete: #4")
    assert sorted(m.message_id for m in peek_sdk()) == ["m1", "m4", "m5"]

    # a scheduled message, cancelled
    with client.get_queue_sender("work") as sender:
        (number,) = sender.schedule_messages(
            ServiceBusMessage("later", message_id="later"), datetime(2099, 1, 1, tzinfo=UTC)
        )
    _type(browser, "#scheduled-numbers", str(number))
    _click(browser, "#cancel-scheduled")
    assert f"#{number} of work" in _text(browser, "#ask-text")
    _confirm(browser)
    _until("cancelled", lambda: _text(browser, "#op-result") == f"cancelled #{number}")
    assert "later" not in [m.message_id for m in peek_sdk()]

    # send: typed properties ("007" stays a string), correlation id, TTL, two copies
    browser.execute_script("document.querySelector(`.tabs button[data-tab='send']`).click()")
    _type(browser, "#send-form [name=body]", "typed hello")
    _type(browser, "#send-form [name=correlation_id]", "corr-7")
    _type(browser, "#send-form [name=time_to_live]", "600")
    _type(browser, "#send-form [name=copies]", "2")
    for name, kind, value in (("code", "string", "007"), ("n", "int", "42")):
        _click(browser, "#add-property")
        row = "#properties .property:last-child"
        _type(browser, f"{row} [name=name]", name)
        browser.find_element("css selector", f"{row} [name=type] option[value={kind}]").click()
        _type(browser, f"{row} [name=value]", value)
    _shot(browser, "explorer-5-send-form")
    _click(browser, "#send-form button[type=submit]")
    _until("the send", lambda: _text(browser, "#send-result") == "sent 2 messages to work")
    with client.get_queue_receiver("work") as receiver:
        got = [m for m in receiver.peek_messages(100) if m.correlation_id == "corr-7"]
    assert len(got) == 2 and got[0].message_id != got[1].message_id
    assert got[0].application_properties == {b"code": b"007", b"n": 42}
    assert got[0].time_to_live is not None and got[0].time_to_live.total_seconds() == 600

    # a batch from a JSON array
    _type(
        browser,
        "#send-form [name=batch]",
        '[{"body": "b1", "message_id": "batch-1"}, {"body": "b2", "message_id": "batch-2"}]',
    )
    _click(browser, "#send-form button[type=submit]")
    _until("the batch", lambda: _text(browser, "#send-result") == "sent 2 messages to work")
    assert {"batch-1", "batch-2"} <= {m.message_id for m in peek_sdk()}

    # the dead letter, edited and resent (the original stays)
    browser.execute_script(
        "document.querySelector(`.tabs button[data-tab='dead-letters']`).click()"
    )
    _until("the dead letter", lambda: "Bad total" in _text(browser, "#dead-letters"))
    _card_button(browser, "dead-letters", "m2", "Edit & resend")
    _type(browser, "#ask-fields [name=body]", "fixed body")
    _shot(browser, "explorer-6-edit-resend")
    _confirm(browser)
    _until("the copy", lambda: _text(browser, "#dl-result").startswith("sent a copy m2"))
    assert "fixed body" in [str(m) for m in peek_sdk() if m.message_id == "m2"]
    assert len(peek_sdk(dead_letter=True)) == 1

    # purge the active queue: only once its name is typed
    browser.execute_script("document.querySelector(`.tabs button[data-tab='messages']`).click()")
    _click(browser, "#purge")
    _type(browser, "#ask-fields [name=confirm]", "wrok")
    _click(browser, "#ask-ok")
    _until("the refusal", lambda: "exactly" in _text(browser, "#ask-text"))
    assert browser.execute_script("return document.getElementById('ask').open")
    assert len(peek_sdk()) > 0
    _type(browser, "#ask-fields [name=confirm]", "work")
    _shot(browser, "explorer-7-purge-confirm")
    _confirm(browser)
    _until("the purge", lambda: _text(browser, "#op-result").startswith("purged "))
    assert peek_sdk() == []
    assert len(peek_sdk(dead_letter=True)) == 1  # the dead-letter queue was not asked for
    _shot(browser, "explorer-8-purged")
    assert _errors(browser) == []
