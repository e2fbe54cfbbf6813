"""Entities in a headless browser, as an operator manages them on ``broker --ui``: create a
queue, a topic and a subscription from the form (a refused form first: the error beside
the field, nothing sent), read every setting, change settings and the status, add, change
and delete rules (bad SQL refused first), and delete an entity behind its typed name. Each
effect is read back with the unmodified SDK's ``ServiceBusAdministrationClient``; console
errors fail the test; screenshots of each view go to ``test-artifacts/dashboard/``.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.servicebus.management import (
    CorrelationRuleFilter,
    EntityStatus,
    ServiceBusAdministrationClient,
    SqlRuleFilter,
)

from tests.broker.conftest import connection_string
from tests.dashboard.test_browser import _errors, _open_entity, _shot, _text, _until
from tests.dashboard.test_browser import browser as browser  # the fixture, found by name
from tests.dashboard.test_explorer_browser import _click, _confirm, _type
from tests.processes import Processes

from .support import start_broker

pytestmark = pytest.mark.timeout(300)


def _choose(driver: Any, selector: str, value: str) -> None:
    driver.find_element("css selector", f"{selector} option[value='{value}']").click()


def _dialog_text(driver: Any) -> str:
    return str(
        _until(
            "the confirmation",
            lambda: driver.execute_script(
                "const d = document.getElementById('ask');"
                " return d.open && d.querySelector('#ask-text').textContent"
            ),
        )
    )


def _settings(driver: Any, namespace: str, path: str) -> None:
    """Opens the entity's Settings tab and waits for its settings (not the last one's)."""
    _open_entity(driver, namespace, path, "settings")
    _until(
        f"the settings of {path}",
        lambda: driver.find_elements("css selector", f"#tab-settings[data-entity='{path}']"),
    )


def _create(driver: Any, kind: str, name: str, settings: dict[str, str], topic: str = "") -> str:
    """Fills the create form as a person would; the confirmation's sentence."""
    _choose(driver, "#create-form [name=kind]", kind)
    if topic:
        _type(driver, "#create-form [name=topic]", topic)
    _until(
        f"the {kind} form",
        lambda: driver.find_elements("css selector", f"#create-fields[data-kind={kind}]"),
    )
    _type(driver, "#create-form [name=name]", name)
    for field, value in settings.items():
        _type(driver, f"#create-fields [name={field}]", value)
    _click(driver, "#create-form button[type=submit]")
    return _dialog_text(driver)


def test_entities_in_a_browser(browser: Any, tmp_path: Path, processes: Processes) -> None:
    amqp, port, _ = start_broker(processes, tmp_path, "--ui")
    namespace = f"127.0.0.1:{amqp}"
    admin = ServiceBusAdministrationClient.from_connection_string(
        connection_string(amqp),
        connection_verify=str(tmp_path / "data" / "tls" / "ca.pem"),
        retry_total=0,
    )
    browser.get(f"http://127.0.0.1:{port}/")
    _until("the namespace", lambda: _text(browser, "#namespaces h3") == namespace)
    _click(browser, "#create-box summary")

    # a lock duration the service would refuse: said beside the field, nothing sent
    _until(
        "the queue form",
        lambda: browser.find_elements("css selector", "#create-fields[data-kind=queue]"),
    )
    _type(browser, "#create-form [name=name]", "orders")
    _type(browser, "#create-fields [name=LockDuration]", "2")
    _click(browser, "#create-form button[type=submit]")
    error = _until("the refusal", lambda: _text(browser, "[data-testid=create-error]"))
    assert error == "LockDuration: must be between PT5S and PT5M, got PT2S"
    assert "invalid" in browser.find_element(
        "css selector", "#create-fields [name=LockDuration]"
    ).get_attribute("class")
    assert not browser.execute_script("return document.getElementById('ask').open")
    _shot(browser, "entities-1-refused-form")
    with pytest.raises(ResourceNotFoundError):
        admin.get_queue("orders")

    # the queue, created once the sentence saying what will be done is confirmed
    text = _create(browser, "queue", "orders", {"LockDuration": "30", "MaxDeliveryCount": "3"})
    assert text == (
        f"Create queue 'orders' in {namespace} with LockDuration = PT30S; MaxDeliveryCount = 3."
    )
    _shot(browser, "entities-2-create-confirm")
    with pytest.raises(ResourceNotFoundError):
        admin.get_queue("orders")  # not before the confirmation
    _confirm(browser)
    _until("created", lambda: _text(browser, "#create-result").startswith("Done: Create queue"))
    queue = admin.get_queue("orders")
    assert queue.lock_duration == timedelta(seconds=30) and queue.max_delivery_count == 3

    # a topic and its subscription, forwarding to the queue
    _create(browser, "topic", "events", {"DefaultMessageTimeToLive": "P1D"})
    _confirm(browser)
    _until("the topic", lambda: "Create topic 'events'" in _text(browser, "#create-result"))
    assert admin.get_topic("events").default_message_time_to_live == timedelta(days=1)
    text = _create(browser, "subscription", "eu", {"ForwardTo": "orders"}, topic="events")
    assert "subscription 'eu' of topic 'events'" in text and "ForwardTo = orders" in text
    _confirm(browser)
    _until("the subscription", lambda: "Create subscription" in _text(browser, "#create-result"))
    subscription = admin.get_subscription("events", "eu")
    assert subscription.forward_to is not None and subscription.forward_to.endswith("/orders")

    # every setting of the queue, as people read them
    _settings(browser, namespace, "orders")
    shown = browser.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#settings dd')]"
        ".map((dd) => [dd.dataset.setting, dd.textContent]))"
    )
    assert shown["LockDuration"] == "30 s (PT30S)" and shown["MaxDeliveryCount"] == "3"
    assert shown["DefaultMessageTimeToLive"] == "never" and shown["Status"] == "Active"
    assert shown["ForwardTo"] == "(none)" and shown["RequiresSession"] == "false"
    _shot(browser, "entities-3-settings")

    # edit: the lock duration; the settings Service Bus will not change cannot be touched
    _click(browser, "#entity-edit")
    assert not browser.find_element(
        "css selector", "#edit-form [name=RequiresSession]"
    ).is_enabled()
    _type(browser, "#edit-form [name=LockDuration]", "PT45S")
    _click(browser, "#edit-form button[type=submit]")
    assert _dialog_text(browser) == (
        f"Change queue 'orders' in {namespace}: LockDuration: PT30S → PT45S."
    )
    _confirm(browser)
    _until("the change", lambda: "Done: Change queue" in _text(browser, "#entity-result"))
    assert admin.get_queue("orders").lock_duration == timedelta(seconds=45)
    assert "45 s (PT45S)" in _text(browser, "#settings")

    # changed by someone else meanwhile: the service refuses the page's change, in its words
    _click(browser, "#entity-edit")
    queue = admin.get_queue("orders")
    queue.max_delivery_count = 7
    admin.update_queue(queue)
    _type(browser, "#edit-form [name=MaxDeliveryCount]", "4")
    _click(browser, "#edit-form button[type=submit]")
    assert _dialog_text(browser).endswith("MaxDeliveryCount: 7 → 4.")  # read again
    _confirm(browser)
    error = _until("the service's refusal", lambda: _text(browser, "[data-testid=edit-error]"))
    assert error == (
        "the service refused (412): The entity 'orders' has been modified since the ETag "
        "given in If-Match."
    )
    _shot(browser, "entities-4-service-refused")
    assert admin.get_queue("orders").max_delivery_count == 7
    refused = [e for e in _errors(browser) if "status of 412" in e]
    assert len(refused) == 1, refused  # the refused request, as Chrome logs it; nothing else
    browser.execute_script("document.querySelector(`.tabs button[data-tab='settings']`).click()")
    _until(
        "the settings again",
        lambda: _text(browser, "#settings dd[data-setting=MaxDeliveryCount]") == "7",
    )

    # the status switch
    _choose(browser, "#status-choice", "SendDisabled")
    _click(browser, "#status-apply")
    assert _dialog_text(browser).endswith("Status: Active → SendDisabled (receives only).")
    _shot(browser, "entities-5-status-switch")
    _confirm(browser)
    _until("the status", lambda: "SendDisabled" in _text(browser, "#entity-result"))
    assert admin.get_queue("orders").status == EntityStatus.SEND_DISABLED

    # rules of the subscription: bad SQL refused first, then a SQL rule, a correlation rule
    _settings(browser, namespace, "events/Subscriptions/eu")
    assert "$Default" in _text(browser, "#rules")
    _type(browser, "#rule-form [name=name]", "big")
    _type(browser, "#rule-form [name=filter]", "amount >")
    _click(browser, "#rule-submit")
    error = _until("the SQL error", lambda: _text(browser, "[data-testid=rule-error]"))
    assert error == "line 1, column 9: expected an expression but found end of input"
    assert {r.name for r in admin.list_rules("events", "eu")} == {"$Default"}
    _shot(browser, "entities-6-rule-refused")
    _type(browser, "#rule-form [name=filter]", "amount > 100")
    _type(browser, "#rule-form [name=action]", "SET tier = 'gold'")
    _click(browser, "#rule-submit")
    assert _dialog_text(browser) == (
        f"Add rule 'big' of subscription 'eu' of topic 'events' in {namespace}: "
        "filter amount > 100; action SET tier = 'gold'."
    )
    _confirm(browser)
    _until("the rule", lambda: "big" in _text(browser, "#rules"))
    rule = admin.get_rule("events", "eu", "big")
    assert isinstance(rule.filter, SqlRuleFilter) and rule.filter.sql_expression == "amount > 100"
    assert rule.action is not None and rule.action.sql_expression == "SET tier = 'gold'"

    _type(browser, "#rule-form [name=name]", "vip")
    _choose(browser, "#rule-form [name=filter_kind]", "correlation")
    _type(browser, "#rule-form [name=CorrelationId]", "c-1")
    _click(browser, "#rule-add-property")
    _type(browser, "#rule-properties .property [name=pname]", "priority")
    _choose(browser, "#rule-properties .property [name=ptype]", "int")
    _type(browser, "#rule-properties .property [name=pvalue]", "5")
    _shot(browser, "entities-7-correlation-rule")
    _click(browser, "#rule-submit")
    assert "filter correlation CorrelationId = 'c-1' AND priority = 5" in _dialog_text(browser)
    _confirm(browser)
    _until("the correlation rule", lambda: "vip" in _text(browser, "#rules"))
    assert "CorrelationId = 'c-1' AND priority = 5" in _text(browser, "#rules")  # an int
    vip = admin.get_rule("events", "eu", "vip")
    assert isinstance(vip.filter, CorrelationRuleFilter)
    assert (vip.filter.correlation_id, vip.filter.properties) == ("c-1", {"priority": 5})

    # a rule changed from its row's Edit, then deleted behind its typed name
    browser.execute_script(
        "[...document.querySelectorAll(\"#rules tr[data-rule='big'] button\")]"
        ".find((b) => b.textContent === 'Edit').click()"
    )
    sql = _until(
        "the rule's SQL",
        lambda: browser.find_element("css selector", "#rule-form [name=filter]").get_attribute(
            "value"
        ),
    )
    assert sql == "amount > 100"
    _type(browser, "#rule-form [name=filter]", "amount > 500")
    _click(browser, "#rule-submit")
    assert _dialog_text(browser).startswith("Change rule 'big'")
    _confirm(browser)
    _until("the changed rule", lambda: "amount > 500" in _text(browser, "#rules"))
    changed = admin.get_rule("events", "eu", "big").filter
    assert isinstance(changed, SqlRuleFilter) and changed.sql_expression == "amount > 500"
    _shot(browser, "entities-8-rules")
    browser.execute_script(
        "[...document.querySelectorAll(\"#rules tr[data-rule='big'] button\")]"
        ".find((b) => b.textContent === 'Delete…').click()"
    )
    assert _dialog_text(browser).startswith("Delete rule 'big' of subscription 'eu'")
    _type(browser, "#ask-fields [name=confirm]", "big")
    _confirm(browser)
    _until("the rule gone", lambda: "amount > 500" not in _text(browser, "#rules"))
    assert {r.name for r in admin.list_rules("events", "eu")} == {"$Default", "vip"}

    # the queue deleted: not until its name is typed exactly
    _settings(browser, namespace, "orders")
    _click(browser, "#entity-delete")
    assert _dialog_text(browser).startswith(f"Delete queue 'orders' in {namespace} and every ")
    _type(browser, "#ask-fields [name=confirm]", "order")
    _click(browser, "#ask-ok")
    _until("the refusal", lambda: "exactly" in _text(browser, "#ask-text"))
    assert admin.get_queue("orders").name == "orders"
    _type(browser, "#ask-fields [name=confirm]", "orders")
    _shot(browser, "entities-9-delete-confirm")
    _confirm(browser)
    _until("deleted", lambda: _text(browser, "#create-result").startswith("Done: Delete queue"))
    with pytest.raises(ResourceNotFoundError):
        admin.get_queue("orders")
    _until(
        "the row gone",
        lambda: not browser.find_elements("css selector", "tr[data-entity='orders']"),
    )
    admin.close()
    assert _errors(browser) == []
