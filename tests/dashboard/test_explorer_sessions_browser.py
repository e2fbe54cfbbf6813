"""More of the explorer in a headless browser, checked with the unmodified ``azure-servicebus``
SDK: a session picked from the Sessions tab, received and settled in (its messages only,
the other session untouched); a deferred message of that session received by its sequence
number inside the session and completed; the dead-letter tab's "Next 100" over more than a
hundred dead letters. Console errors fail the tests; screenshots go to
``test-artifacts/dashboard/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus import ServiceBusSubQueue as SubQueue

from tests.broker.conftest import connection_string, make_config
from tests.dashboard.test_browser import _errors, _open_entity, _shot, _text, _until
from tests.dashboard.test_browser import browser as browser  # the fixture, found by name
from tests.dashboard.test_explorer_browser import _card_button, _click, _confirm, _type
from tests.processes import Processes

from .support import start_broker

pytestmark = pytest.mark.timeout(300)


def _held(driver: Any) -> list[str]:
    return list(
        driver.execute_script(
            "return [...document.querySelectorAll('#held .message')]"
            ".map((m) => m.dataset.messageId)"
        )
    )


def test_receive_and_settle_in_a_session(
    browser: Any, tmp_path: Path, processes: Processes
) -> None:
    config = make_config({"orders": {"RequiresSession": True}})
    amqp, port, _ = start_broker(processes, tmp_path, "--ui", config=config)
    client = ServiceBusClient.from_connection_string(connection_string(amqp))
    with client, client.get_queue_sender("orders") as sender:
        sender.send_messages(
            [ServiceBusMessage(f"a{i}", message_id=f"a{i}", session_id="s-a") for i in range(3)]
            + [ServiceBusMessage(f"b{i}", message_id=f"b{i}", session_id="s-b") for i in range(2)]
        )

    def in_session(session: str) -> list[Any]:
        with client.get_queue_receiver("orders", session_id=session) as receiver:
            return list(receiver.peek_messages(100))

    browser.get(f"http://127.0.0.1:{port}/")
    _open_entity(browser, f"127.0.0.1:{amqp}", "orders", "sessions")
    _until(
        "the sessions",
        lambda: (
            browser.execute_script(
                "return [...document.querySelectorAll('#sessions button')]"
                ".map((b) => b.textContent)"
            )
            == ["s-a", "s-b"]
        ),
    )
    browser.execute_script(
        "[...document.querySelectorAll('#sessions button')]"
        ".find((b) => b.textContent === 's-a').click()"
    )
    _until("the session's messages", lambda: "a2" in _text(browser, "#session-detail"))
    _shot(browser, "explorer-9-session")
    _click(browser, "#session-receive")
    _until("the session's messages, locked", lambda: len(_held(browser)) == 3)
    assert _held(browser) == ["a0", "a1", "a2"]
    browser.execute_script("document.getElementById('held-actions').scrollIntoView()")
    _shot(browser, "explorer-10-session-locked")
    assert (
        browser.find_element("css selector", "#peek-form [name=session]").get_attribute("value")
        == "s-a"
    )
    _card_button(browser, "held", "a1", "defer")
    _confirm(browser)
    _until("deferred", lambda: _text(browser, "#op-result").startswith("defer: #"))
    _card_button(browser, "held", "a0", "complete")
    _confirm(browser)
    _until("completed", lambda: _text(browser, "#op-result").startswith("complete: #"))
    _shot(browser, "explorer-11-session-settled")
    _click(browser, "#release")
    _until("released", lambda: _text(browser, "#op-result") == "released 1 (no delivery counted)")
    left = {m.message_id: m for m in in_session("s-a")}
    assert sorted(left) == ["a1", "a2"] and left["a2"].delivery_count == 0
    assert str(left["a1"].state).endswith("DEFERRED")
    assert sorted(m.message_id for m in in_session("s-b")) == ["b0", "b1"]

    # the deferred one, received by its number inside its session, completed
    number = left["a1"].sequence_number
    _type(browser, "#deferred-numbers", str(number))
    _click(browser, "#receive-deferred")
    _until("the deferred message", lambda: _held(browser) == ["a1"])
    assert "in session s-a" in _text(browser, "#op-result")
    _card_button(browser, "held", "a1", "complete")
    _confirm(browser)
    _until("completed", lambda: _text(browser, "#op-result") == f"complete: #{number}")
    assert [m.message_id for m in in_session("s-a")] == ["a2"]
    assert sorted(m.message_id for m in in_session("s-b")) == ["b0", "b1"]

    # without a session, the page says where deferred messages of a session entity are
    _type(browser, "#peek-form [name=session]", "")
    _click(browser, "#receive-deferred")
    _until("the reason", lambda: "in their session" in _text(browser, "#error"))
    assert _errors(browser) == []


def test_dead_letters_next_100(browser: Any, tmp_path: Path, processes: Processes) -> None:
    total = 130
    amqp, port, _ = start_broker(processes, tmp_path, "--ui")
    client = ServiceBusClient.from_connection_string(connection_string(amqp))
    with client:
        with client.get_queue_sender("work") as sender:
            sender.send_messages(
                [ServiceBusMessage(f"m{i}", message_id=f"m{i:03}") for i in range(total)]
            )
        with client.get_queue_receiver("work", max_wait_time=5) as receiver:
            done = 0
            while done < total:
                for message in receiver.receive_messages(50, max_wait_time=5):
                    receiver.dead_letter_message(message, "Paged", f"number {done}")
                    done += 1
        with client.get_queue_receiver("work", sub_queue=SubQueue.DEAD_LETTER) as receiver:
            dead = []
            while batch := receiver.peek_messages(
                100, sequence_number=(dead[-1].sequence_number + 1 if dead else 0)
            ):
                dead += batch
    assert len(dead) == total

    def shown() -> list[str]:
        return list(
            browser.execute_script(
                "return [...document.querySelectorAll('#dead-letters .message')]"
                ".map((m) => m.dataset.messageId)"
            )
        )

    browser.get(f"http://127.0.0.1:{port}/")
    _open_entity(browser, f"127.0.0.1:{amqp}", "work", "dead-letters")
    _until("the first page", lambda: len(shown()) == 100)
    assert shown() == [m.message_id for m in dead[:100]]
    assert browser.find_element("css selector", "#dl-next").is_displayed()
    _click(browser, "#dl-next")
    _until("the second page", lambda: len(shown()) == total - 100)
    assert shown() == [m.message_id for m in dead[100:]] == [f"m{i:03}" for i in range(100, total)]
    assert not browser.find_element("css selector", "#dl-next").is_displayed()
    _shot(browser, "explorer-12-dead-letters-page-2")
    assert _errors(browser) == []
