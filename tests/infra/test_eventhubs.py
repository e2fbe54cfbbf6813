"""Event Hubs in the deployment: the event hubs, consumer groups and least-privilege rules a
pipeline file's ``eventhub:`` endpoints need (replication/deploy/parameters.py), and what
infra/main.bicep makes of them (evaluated with bicep_eval.py, as in test_templates.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from replication.broker.auth import EMULATOR_KEY, EMULATOR_RULE_NAME
from replication.broker.eventhubs.partitioning import partition_for_key
from replication.deploy import DeployConfigError, bicep_parameters, required_app_settings
from replication.messages import Message
from replication.tasks.targets import SenderPool, Target
from tests.broker.conftest import BrokerHandle, broker_factory  # noqa: F401 (the fixture)
from tests.broker.eventhubs_support import HUB, eventhub_config, receive

from .bicep_eval import Instance, Unknown
from .support import app_settings, deployment, only

# Service Bus -> Event Hubs, Event Hubs -> Service Bus and Event Hubs -> Event Hubs: the
# primary Event Hubs connection reads one event hub (two consumer groups), the secondary one
# sends to two event hubs.
PIPELINES = """\
pipelines:
  - name: audit-to-stream
    source: {connection: PrimaryServiceBus, queue: audit, sessions: true}
    target: {connection: SecondaryEventHubs, eventhub: audit-stream}
  - name: clicks-to-queue
    source:
      connection: PrimaryEventHubs
      eventhub: clicks
      consumer_group: replication
      session_id_from: partition_key
    target: {connection: SecondaryServiceBus, queue: clicks}
  - name: clicks-copy
    source: {connection: PrimaryEventHubs, eventhub: clicks, consumer_group: copy}
    target: {connection: SecondaryEventHubs, eventhub: clicks}
  - name: clicks-default
    source: {connection: PrimaryEventHubs, eventhub: clicks}
    target: {connection: SecondaryServiceBus, queue: clicks-all}
"""


def write(tmp_path: Path, text: str = PIPELINES) -> Path:
    path = tmp_path / "pipelines.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def settings_of(main: Instance) -> dict[str, dict[str, Any]]:
    """The Function App module's app setting entries by name (where each value comes from)."""
    return {s["name"]: s for s in only(main.module("functionApp")).var("settings")}


def rules(namespace: Instance, symbol: str) -> list[tuple[str, list[str]]]:
    return [(r["name"], r["properties"]["rights"]) for r in namespace.resource(symbol)]


# ---------------------------------------------------------------------- parameters


def test_event_hubs_groups_and_connections_come_from_the_pipeline_file(tmp_path: Path) -> None:
    derived = bicep_parameters(write(tmp_path))
    assert derived["eventHubs"] == [
        {"namespace": "primary", "name": "clicks"},
        {"namespace": "secondary", "name": "audit-stream"},
        {"namespace": "secondary", "name": "clicks"},
    ]
    # $Default exists on every event hub: not created, not listed
    assert derived["consumerGroups"] == [
        {"namespace": "primary", "eventHub": "clicks", "name": "copy"},
        {"namespace": "primary", "eventHub": "clicks", "name": "replication"},
    ]
    assert derived["eventHubConnections"] == [
        {"name": "PrimaryEventHubs", "namespace": "primary", "eventHub": "clicks",
         "listen": True, "send": False},
        {"name": "SecondaryEventHubs", "namespace": "secondary", "eventHub": "",
         "listen": False, "send": True},  # two event hubs: a namespace rule
    ]  # fmt: skip
    assert derived["eventHubReceivers"] == [
        {"connection": "PrimaryEventHubs", "namespace": "primary", "eventHub": "clicks"}
    ]
    # the Service Bus side holds only Service Bus connections and entities
    assert [c["name"] for c in derived["connections"]] == [
        "PrimaryServiceBus", "SecondaryServiceBus",
    ]  # fmt: skip
    assert {q["name"] for q in derived["queues"]} == {"audit", "clicks", "clicks-all"}
    assert derived["topics"] == []


def test_a_file_without_event_hubs_asks_for_none(tmp_path: Path) -> None:
    derived = bicep_parameters(write(tmp_path, """\
pipelines:
  - name: orders
    source: {connection: PrimaryServiceBus, queue: orders}
    target: {connection: SecondaryServiceBus, queue: orders}
"""))  # fmt: skip
    for name in ("eventHubs", "consumerGroups", "eventHubConnections", "eventHubReceivers"):
        assert derived[name] == [], name


def test_a_connection_for_both_services_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, """\
pipelines:
  - name: to-queue
    source: {connection: PrimaryServiceBus, queue: orders}
    target: {connection: SecondaryServiceBus, queue: orders}
  - name: to-hub
    source: {connection: PrimaryServiceBus, queue: audit}
    target: {connection: SecondaryServiceBus, eventhub: audit}
""")  # fmt: skip
    with pytest.raises(
        DeployConfigError,
        match=r"pipeline 'to-hub': connection 'SecondaryServiceBus' is used for event hub "
        r"'audit' and, by pipeline 'to-queue', for Service Bus entity 'orders': .* use one "
        r"connection setting for each",
    ):
        bicep_parameters(path)


def test_an_event_hubs_connection_must_be_mapped(tmp_path: Path) -> None:
    path = write(tmp_path, """\
pipelines:
  - name: stream
    source: {connection: PrimaryServiceBus, queue: audit}
    target: {connection: AnalyticsHubs, eventhub: audit}
""")  # fmt: skip
    with pytest.raises(DeployConfigError, match="connection 'AnalyticsHubs' is not mapped"):
        bicep_parameters(path)
    derived = bicep_parameters(path, {"PrimaryServiceBus": "primary",
                                      "AnalyticsHubs": "secondary"})  # fmt: skip
    assert derived["eventHubConnections"] == [
        {"name": "AnalyticsHubs", "namespace": "secondary", "eventHub": "audit",
         "listen": False, "send": True},
    ]  # fmt: skip


# ---------------------------------------------------------------------- the template


def test_each_side_gets_its_event_hubs_groups_and_least_privilege_rules(tmp_path: Path) -> None:
    main = deployment(**bicep_parameters(write(tmp_path)))
    primary = only(main.module("primaryEventHubsNamespace"))
    namespace = only(primary.resource("namespace"))
    assert namespace["name"] == "eh1-test-example-com"
    assert namespace["properties"]["minimumTlsVersion"] == "1.2"
    assert namespace["properties"]["disableLocalAuth"] is False
    assert namespace["sku"] == {"name": "Standard", "tier": "Standard", "capacity": 1}
    hubs = primary.resource("eventHub")
    assert [h["name"] for h in hubs] == ["clicks"]
    assert hubs[0]["properties"] == {"partitionCount": 4, "messageRetentionInDays": 1}
    assert [g["name"] for g in primary.resource("consumerGroup")] == [
        "eh1-test-example-com/clicks/copy", "eh1-test-example-com/clicks/replication",
    ]  # fmt: skip
    # the source's connection: Listen on its one event hub, nothing namespace-wide
    assert rules(primary, "hubRule") == [
        ("eh1-test-example-com/clicks/repl-PrimaryEventHubs", ["Listen"])
    ]
    assert rules(primary, "namespaceRule") == []

    secondary = only(main.module("secondaryEventHubsNamespace"))
    assert secondary.param("name") == "eh2-test-example-com"
    assert [h["name"] for h in secondary.resource("eventHub")] == ["audit-stream", "clicks"]
    assert secondary.resource("consumerGroup") == []
    # the targets' connection reaches two event hubs: Send on the namespace, never Listen
    assert rules(secondary, "hubRule") == []
    assert rules(secondary, "namespaceRule") == [("repl-SecondaryEventHubs", ["Send"])]
    for side in (primary, secondary):
        for _, rights in rules(side, "hubRule") + rules(side, "namespaceRule"):
            assert "Manage" not in rights


def test_partitions_retention_and_tier_are_parameters(tmp_path: Path) -> None:
    main = deployment(**bicep_parameters(write(tmp_path)), eventHubsSku="Premium",
                      eventHubPartitionCount=8, eventHubRetentionDays=3)  # fmt: skip
    primary = only(main.module("primaryEventHubsNamespace"))
    assert only(primary.resource("namespace"))["sku"]["tier"] == "Premium"
    assert only(primary.resource("eventHub"))["properties"] == {
        "partitionCount": 8, "messageRetentionInDays": 3,
    }  # fmt: skip


def test_the_app_gets_each_connection_from_its_own_rule(tmp_path: Path) -> None:
    path = write(tmp_path)
    main = deployment(**bicep_parameters(path))
    names = [s["name"] for s in app_settings(main)]
    assert required_app_settings(path) <= set(names)
    values = {s["name"]: s["value"] for s in app_settings(main)}
    assert isinstance(values["PrimaryEventHubs"], Unknown)  # listKeys, at deployment
    entries = settings_of(main)
    assert entries["PrimaryEventHubs"] == {
        "name": "PrimaryEventHubs", "source": "eventHubSas", "value": "",
        "namespaceName": "eh1-test-example-com", "eventHubName": "clicks",
        "ruleName": "repl-PrimaryEventHubs",
    }  # fmt: skip
    assert entries["SecondaryEventHubs"]["source"] == "eventHubsSas"
    assert entries["SecondaryEventHubs"]["namespaceName"] == "eh2-test-example-com"
    assert entries["SecondaryEventHubs"]["eventHubName"] == ""
    assert entries["PrimaryServiceBus"]["source"] == "sas"
    assert entries["PrimaryServiceBus"]["namespaceName"] == "sb1-test-example-com"
    assert main.output("eventHubsNamespaceNames") == [
        "eh1-test-example-com", "eh2-test-example-com",
    ]  # fmt: skip


def test_managed_identity_reads_an_event_hub_with_a_hub_scoped_role(tmp_path: Path) -> None:
    main = deployment(**bicep_parameters(write(tmp_path)), authMode="managedIdentity")
    entries = settings_of(main)
    assert "PrimaryEventHubs" not in entries
    assert entries["PrimaryEventHubs__fullyQualifiedNamespace"]["value"] == (
        "eh1-test-example-com.servicebus.windows.net"
    )
    assert entries["SecondaryEventHubs"]["source"] == "eventHubsSas"  # a target keeps its key
    primary = only(main.module("primaryEventHubsNamespace"))
    assert rules(primary, "hubRule") == []
    assert only(primary.resource("namespace"))["properties"]["disableLocalAuth"] is True
    secondary = only(main.module("secondaryEventHubsNamespace"))
    assert only(secondary.resource("namespace"))["properties"]["disableLocalAuth"] is False
    receivers = only(main.module("primaryEventHubReceivers"))
    assert receivers.param("eventHubs") == ["clicks"]
    assert receivers.var("receiverRoleId") == "a638d3c7-ab3a-418d-83e6-5f17a39d4fde"
    (role,) = receivers.resource("eventHubReceiver")
    assert role["scope"] == Unknown("eventHub.0")
    assert role["properties"]["principalType"] == "ServicePrincipal"
    assert main.module("secondaryEventHubReceivers") == []  # nothing read there
    assert (
        deployment(**bicep_parameters(write(tmp_path))).module("primaryEventHubReceivers") == []
    )  # connection strings: no role


def test_no_event_hubs_namespace_without_event_hubs() -> None:
    # the example's pipelines have an event hub (the sample's audit-to-eventhub): none here
    main = deployment(eventHubs=[], consumerGroups=[], eventHubConnections=[],
                      eventHubReceivers=[])  # fmt: skip
    assert main.module("primaryEventHubsNamespace") == []
    assert main.module("secondaryEventHubsNamespace") == []
    assert main.module("primaryEventHubReceivers") == []
    assert main.output("eventHubsNamespaceNames") == []
    assert not any(s["source"].startswith("eventHub") for s in settings_of(main).values())


# ---------------------------------------------------------------------- the rule's string


@pytest.mark.parametrize("backend", ["amqp", "sdk"])
def test_the_replicator_sends_with_a_hub_rules_send_only_connection_string(
    broker_factory: Callable[..., BrokerHandle],  # noqa: F811
    backend: str,
) -> None:
    """What the app setting of a target that reaches one event hub holds: a Send-only rule's
    connection string with EntityPath. The embedded broker has namespace rules only, so the
    rule is one there; the string, its rights and the client code are Azure's shape."""
    config = eventhub_config()
    config["UserConfig"]["Namespaces"][0]["AuthorizationRules"] = [
        {"Name": EMULATOR_RULE_NAME, "Key": EMULATOR_KEY, "Rights": ["Manage"]},  # the reader
        {"Name": "repl-SecondaryEventHubs", "Key": "send-key", "Rights": ["Send"]},
    ]
    handle = broker_factory(config)
    setting = handle.connection_string_for("repl-SecondaryEventHubs", "send-key")
    setting += f"EntityPath={HUB}"

    async def replicate() -> None:
        pool = SenderPool({None: Target(setting, HUB, event_hub=True)}, backend=backend)  # type: ignore[arg-type]
        try:
            async with pool(None) as sender:
                await sender.send_messages([
                    Message(f"step {i}".encode(), session_id="customer-1") for i in range(3)
                ])  # fmt: skip
        finally:
            await pool.close()

    asyncio.run(replicate())
    partition = str(partition_for_key("customer-1", 2))
    events = receive(handle.port, 3, partition_id=partition, starting_position="-1")
    assert [e.body_as_str() for e in events] == ["step 0", "step 1", "step 2"]
    assert {e.partition_key for e in events} == {b"customer-1"}  # the SDK gives bytes
