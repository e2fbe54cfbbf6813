"""Event hubs in the broker's config file: the Event Hubs emulator's own sample parses
unchanged, next to Service Bus entities; mistakes are named where they are."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

import pytest

from replication.broker.config import ConfigError, parse_config
from replication.broker.eventhubs.hub import EventHubSpec

from .eventhubs_support import eventhub_config

EMULATOR_SAMPLE: dict[str, Any] = {
    "UserConfig": {
        "NamespaceConfig": [{
            "Type": "EventHub", "Name": "emulatorNs1",
            "Entities": [{"Name": "eh1", "PartitionCount": "2",
                          "ConsumerGroups": [{"Name": "cg1"}]}],
        }],
        "LoggingConfig": {"Type": "File"},
    }
}  # fmt: skip
"""``EventHub-Emulator/Config/Config.json`` of Azure/azure-event-hubs-emulator-installer."""


def test_the_event_hubs_emulators_sample_parses_unchanged() -> None:
    config = parse_config(EMULATOR_SAMPLE)
    assert config.event_hubs == [EventHubSpec("eh1", 2, ("cg1",), timedelta(hours=24))]
    assert config.namespace.name == "emulatorNs1" and config.namespace.queues == []
    assert config.logging.to_file


def test_event_hubs_next_to_service_bus_entities() -> None:
    config = parse_config(eventhub_config(
        {"a": {"PartitionCount": 4, "RetentionTimeInHours": 2}}, queues={"q": {}}
    ))  # fmt: skip
    assert config.event_hubs == [EventHubSpec("a", 4, (), timedelta(hours=2))]
    assert config.queue("q") is not None


def _problems(config: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(config)
    return str(caught.value)


def test_mistakes_are_named_where_they_are() -> None:
    bad = copy.deepcopy(EMULATOR_SAMPLE)
    entity = bad["UserConfig"]["NamespaceConfig"][0]["Entities"][0]
    entity["PartitionCount"] = "0"
    entity["ConsumerGroups"] = [{"Name": "$Default"}]
    text = _problems(bad)
    assert "UserConfig.NamespaceConfig[0].Entities[0].PartitionCount" in text
    assert "$Default always exists" in text


def test_a_name_used_twice_is_refused() -> None:
    twice = eventhub_config({"dup": {"PartitionCount": 1}}, queues={"DUP": {}})
    assert "'dup' is also the name of a queue or topic" in _problems(twice)
    hubs = eventhub_config({"h": {"PartitionCount": 1}})
    hubs["UserConfig"]["NamespaceConfig"][0]["Entities"].append({"Name": "H", "PartitionCount": 1})
    assert "event hub 'H' is defined twice" in _problems(hubs)


def test_a_file_without_any_namespace_is_refused() -> None:
    text = _problems({"UserConfig": {"Logging": {"Type": "File"}}})
    assert "required property 'Namespaces' is missing (Service Bus), or NamespaceConfig" in text
