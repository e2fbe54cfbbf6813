"""infra/modules/alerts.bicep: the action group and the alert rules on the app's metrics.

The rules are evaluated through main.bicep with the example parameters (bicep_eval.py); the
metric names and dimensions are the ones the app exports to Application Insights (docs/alerts.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest

from .bicep_eval import Instance, Template, Unknown
from .support import INFRA, deployment, example_parameters, only

ALERT_PARAMETERS = {
    "deployAlerts": True,
    "alertEmail": "",
    "alertWebhookUrl": "",
    "alertLagSeconds": 60,
    "alertRpoSeconds": 300,
    "alertDeadLetteredMessages": 0,
    "alertFailedBatches": 0,
    "alertFailovers": 0,
    "alertDeadLetterQueueMessages": 0,
    "alertEvaluationFrequency": "PT5M",
    "alertWindowSize": "PT15M",
}
"""main.bicep's alert parameters and their defaults."""


@dataclass(frozen=True)
class Rule:
    metric: str
    parameter: str  # main.bicep's threshold parameter
    severity: int
    dimensions: list[str]  # one alert per series
    aggregation: str  # the query's summarize


RULES = {
    "replication-lag": Rule(
        "replication_lag_seconds", "alertLagSeconds", 2, ["pipeline", "target"], "max(valueMax)"
    ),
    "replication-rpo": Rule(
        "replication_rpo_seconds", "alertRpoSeconds", 1, ["pipeline", "source"], "max(value)"
    ),
    "replication-dead-letters": Rule(
        "replication_dead_lettered_messages",
        "alertDeadLetteredMessages",
        2,
        ["pipeline"],
        "sum(value)",
    ),
    "replication-failed-batches": Rule(
        "replication_failed_batches", "alertFailedBatches", 2, ["pipeline"], "sum(value)"
    ),
    "replication-failovers": Rule(
        "replication_failovers", "alertFailovers", 1, ["endpoint"], "sum(value)"
    ),
}
"""The log-search rules by name (after the appName prefix)."""


def alerts(**overrides: Any) -> Instance:
    return only(deployment(**overrides).module("alerts"))


def rules(module: Instance) -> dict[str, dict[str, Any]]:
    """The log-search rules by name, without the appName prefix."""
    return {r["name"].removeprefix("contosorepl-"): r for r in module.resource("logAlert")}


def resource_type(template: Template, symbol: str) -> str:
    return str(template.resources[symbol].children[2].children[0]).strip("'").split("@")[0]


def is_secure(template: Template, name: str) -> bool:
    decorators = template.params[name].children[0]
    return decorators is not None and any(d.data == "deco_secure" for d in decorators.children)


def test_the_alerts_are_deployed_unless_turned_off() -> None:
    assert len(deployment().module("alerts")) == 1
    assert deployment(deployAlerts=False).module("alerts") == []
    template = Template.load(INFRA / "modules" / "alerts.bicep")
    assert resource_type(template, "logAlert") == "Microsoft.Insights/scheduledQueryRules"
    assert resource_type(template, "actionGroup") == "Microsoft.Insights/actionGroups"
    assert resource_type(template, "deadLetterQueue") == "Microsoft.Insights/metricAlerts"


def test_main_has_the_alert_parameters_with_their_defaults_and_the_example_shows_them() -> None:
    example = example_parameters()
    without = {k: v for k, v in example.items() if k not in ALERT_PARAMETERS}
    main = Template.load(INFRA / "main.bicep").instance(without)
    for name, default in ALERT_PARAMETERS.items():
        assert main.param(name) == default, name
        assert example[name] == default, f"main.parameters.example.json: {name}"
    module = Template.load(INFRA / "modules" / "alerts.bicep").instance({})
    assert [
        module.param(p) for p in ("lagSeconds", "rpoSeconds", "evaluationFrequency", "windowSize")
    ] == [60, 300, "PT5M", "PT15M"]


@pytest.mark.parametrize("name", sorted(RULES))
def test_each_rule_queries_its_metric_in_application_insights(name: str) -> None:
    expected = RULES[name]
    metric, dimensions = expected.metric, expected.dimensions
    rule = rules(alerts())[name]
    assert rule["kind"] == "LogAlert"
    properties = rule["properties"]
    # the component the app exports to (monitoring.bicep's appInsights), not the workspace
    assert properties["scopes"] == [Unknown("appInsights.id")]
    monitoring = Template.load(INFRA / "modules" / "monitoring.bicep")
    assert resource_type(monitoring, "appInsights") == "Microsoft.Insights/components"
    assert properties["severity"] == expected.severity
    assert properties["enabled"] is True and properties["autoMitigate"] is True
    assert (properties["evaluationFrequency"], properties["windowSize"]) == ("PT5M", "PT15M")
    criterion = only(properties["criteria"]["allOf"])
    assert criterion["operator"] == "GreaterThan"
    assert criterion["threshold"] == ALERT_PARAMETERS[expected.parameter]
    lines = [line.strip() for line in criterion["query"].strip().splitlines()]
    assert lines[0] == "customMetrics"
    assert lines[1] == f'| where name == "{metric}"'
    extends = {d: f"tostring(customDimensions.{d})" for d in dimensions}
    assert lines[2] == "| extend " + ", ".join(f"{d} = {e}" for d, e in extends.items())
    measure = criterion["metricMeasureColumn"]
    assert lines[3] == f"| summarize {measure} = {expected.aggregation} by {', '.join(dimensions)}"
    assert len(lines) == 4
    assert [d["name"] for d in criterion["dimensions"]] == dimensions  # one alert per series
    assert all(d["operator"] == "Include" and d["values"] == ["*"] for d in criterion["dimensions"])
    assert criterion["failingPeriods"] == {
        "numberOfEvaluationPeriods": 1,
        "minFailingPeriodsToAlert": 1,
    }
    assert metric in properties["description"]


def test_thresholds_frequency_and_window_are_the_parameters() -> None:
    given = {
        "alertLagSeconds": 91,
        "alertRpoSeconds": 601,
        "alertDeadLetteredMessages": 3,
        "alertFailedBatches": 4,
        "alertFailovers": 5,
    }
    module = alerts(
        **given,
        alertEvaluationFrequency="PT15M",
        alertWindowSize="PT1H",
        alertDeadLetterQueueMessages=7,
    )
    found = rules(module)
    assert sorted(found) == sorted(RULES)
    for name, rule in RULES.items():
        properties = found[name]["properties"]
        assert only(properties["criteria"]["allOf"])["threshold"] == given[rule.parameter], name
        assert f"{given[rule.parameter]}" in properties["description"]  # the description says it
        assert (properties["evaluationFrequency"], properties["windowSize"]) == ("PT15M", "PT1H")
    for rule in module.resource("deadLetterQueue"):
        assert only(rule["properties"]["criteria"]["allOf"])["threshold"] == 7
        assert (rule["properties"]["evaluationFrequency"], rule["properties"]["windowSize"]) == (
            "PT15M",
            "PT1H",
        )


def test_the_dead_letter_queues_of_both_namespaces_are_watched() -> None:
    found = {r["name"]: r["properties"] for r in alerts().resource("deadLetterQueue")}
    assert sorted(found) == [
        "contosorepl-dead-letter-queue-sb1-test-example-com",
        "contosorepl-dead-letter-queue-sb2-test-example-com",
    ]
    for properties in found.values():
        criteria = properties["criteria"]
        assert (
            criteria["odata.type"] == "Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria"
        )
        criterion = only(criteria["allOf"])
        assert (criterion["metricNamespace"], criterion["metricName"]) == (
            "Microsoft.ServiceBus/namespaces",
            "DeadletteredMessages",
        )
        assert criterion["dimensions"] == [
            {"name": "EntityName", "operator": "Include", "values": ["*"]}
        ]
        assert (criterion["operator"], criterion["threshold"]) == ("GreaterThan", 0)
        assert properties["severity"] == 2 and properties["autoMitigate"] is True


@pytest.mark.parametrize(
    ("email", "webhook"),
    [
        ("ops@example.com", ""),
        ("", "https://hooks.example.com/x?token=t"),
        ("ops@example.com", "https://hooks.example.com/x?token=t"),
        ("", ""),
    ],
)
def test_the_receivers_are_the_parameters(email: str, webhook: str) -> None:
    module = alerts(alertEmail=email, alertWebhookUrl=webhook)
    groups = module.resource("actionGroup")
    if not email and not webhook:  # no action group: the alerts fire, nobody is notified
        assert groups == []
        for rule in module.resource("logAlert"):
            assert rule["properties"]["actions"] == {"actionGroups": []}
        for rule in module.resource("deadLetterQueue"):
            assert rule["properties"]["actions"] == []
        return
    group = only(groups)["properties"]
    assert group["enabled"] is True and len(group["groupShortName"]) <= 12
    assert [r["emailAddress"] for r in group["emailReceivers"]] == ([email] if email else [])
    assert [r["serviceUri"] for r in group["webhookReceivers"]] == ([webhook] if webhook else [])
    receivers = group["emailReceivers"] + group["webhookReceivers"]
    assert all(r["useCommonAlertSchema"] is True for r in receivers)
    for rule in module.resource("logAlert"):
        assert rule["properties"]["actions"] == {"actionGroups": [Unknown("actionGroup.id")]}
    for rule in module.resource("deadLetterQueue"):
        assert rule["properties"]["actions"] == [{"actionGroupId": Unknown("actionGroup.id")}]


def test_the_webhook_url_is_a_secure_parameter() -> None:
    """A webhook URL carries its own token (Teams, PagerDuty, Slack): not in the deployment's
    parameters as shown in the portal, not in an output."""
    assert is_secure(Template.load(INFRA / "main.bicep"), "alertWebhookUrl")
    assert is_secure(Template.load(INFRA / "modules" / "alerts.bicep"), "alertWebhookUrl")
    assert not is_secure(Template.load(INFRA / "main.bicep"), "alertEmail")


def test_the_descriptions_say_what_to_do() -> None:
    """Each rule's description is what the notification shows: what broke and where to look."""
    for name, rule in rules(alerts()).items():
        description = rule["properties"]["description"]
        assert len(description) >= 200, name
        assert re.search(r"\b(Check|Look|Peek|Find|Fix|check|look|peek|find|fix)\b", description)
    for rule in alerts().resource("deadLetterQueue"):
        assert "$DeadLetterQueue" in rule["properties"]["description"]
