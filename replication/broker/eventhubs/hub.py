"""An event hub: its partitions' logs, consumer groups, retention, and the addresses that
name them (``<hub>``, ``<hub>/Partitions/<n>``, ``<hub>/ConsumerGroups/<cg>/Partitions/<n>``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from .log import EventLog, PartitionLog
from .partitioning import RoundRobin, partition_for_key

DEFAULT_CONSUMER_GROUP = "$Default"
DEFAULT_RETENTION = timedelta(days=1)
"""Azure's default for a new event hub (``messageRetentionInDays`` 1)."""
PARTITIONS = "partitions"
CONSUMER_GROUPS = "consumergroups"


@dataclass(frozen=True, slots=True)
class EventHubSpec:
    """An event hub as the config file defines it."""

    name: str
    partition_count: int
    consumer_groups: tuple[str, ...] = ()
    """Besides ``$Default``, which every event hub has."""
    retention: timedelta = DEFAULT_RETENTION


@dataclass(frozen=True, slots=True)
class Address:
    """What a link's address names: a hub, maybe one partition, maybe a consumer group
    (only receivers name one)."""

    hub: str
    partition: str | None = None
    consumer_group: str | None = None


def parse_address(path: str) -> Address | None:
    """``hub``, ``hub/Partitions/1`` or ``hub/ConsumerGroups/cg/Partitions/1`` (segment
    names in any case); None for any other shape."""
    parts = path.split("/")
    if len(parts) == 1 and parts[0]:
        return Address(parts[0])
    if len(parts) == 3 and parts[1].lower() == PARTITIONS:
        return Address(parts[0], parts[2])
    if len(parts) == 5 and parts[1].lower() == CONSUMER_GROUPS and parts[3].lower() == PARTITIONS:
        return Address(parts[0], parts[4], parts[2])
    return None


class EventHub:
    """One event hub's partitions and consumer groups."""

    def __init__(self, spec: EventHubSpec, log: EventLog, now_ms: int) -> None:
        self.spec = spec
        self.name = spec.name
        self.partitions: list[PartitionLog] = [
            log.partition(f"{spec.name}/Partitions/{index}", now_ms)
            for index in range(spec.partition_count)
        ]
        self.partition_ids = [str(index) for index in range(spec.partition_count)]
        self.consumer_groups = {DEFAULT_CONSUMER_GROUP.lower(): DEFAULT_CONSUMER_GROUP}
        for group in spec.consumer_groups:
            self.consumer_groups[group.lower()] = group
        self._round_robin = RoundRobin(spec.partition_count)

    @property
    def created_ms(self) -> int:
        return self.partitions[0].created_ms

    def partition(self, partition_id: str) -> PartitionLog | None:
        """The partition with this id (``"0"`` .. ``"<count - 1>"``), if there is one."""
        if partition_id in self.partition_ids:
            return self.partitions[int(partition_id)]
        return None

    def route(self, partition_key: str | None) -> PartitionLog:
        """Where an event sent to the hub goes: by its key's hash, else round-robin."""
        if partition_key is not None:
            return self.partitions[partition_for_key(partition_key, len(self.partitions))]
        return self.partitions[self._round_robin.next()]

    def trim(self, now_ms: int) -> int:
        """Retention: drops events older than the hub keeps them; returns how many."""
        cutoff = now_ms - int(self.spec.retention.total_seconds() * 1000)
        return sum(partition.trim(cutoff) for partition in self.partitions)
