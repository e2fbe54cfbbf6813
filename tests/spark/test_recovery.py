"""The Spark driver's recovery point probes (``spark/recovery.py``), without Spark: they run
beside the streaming queries, in a thread of their own, on ``REPLICATION_RPO_SCHEDULE``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from azure.servicebus import ServiceBusMessage

from replication import metrics
from replication.clock import ManualClock
from replication.pipeline import parse_pipelines
from replication.spark.recovery import RecoveryPoints
from tests.broker.conftest import BrokerHandle, make_config
from tests.waiting import until

PIPELINES = """\
pipelines:
  - name: spark-rpo
    sources:
      - {connection: Bus, queue: orders}
      - {connection: Hubs, eventhub: audit}
    target: {connection: Bus, queue: copies}
"""


async def test_the_driver_probes_each_service_bus_source_on_the_schedule(
    broker_factory: Callable[..., BrokerHandle],
) -> None:
    clock = ManualClock(start=float(round(time.time())))
    broker = broker_factory(make_config({"orders": {}, "copies": {}}), clock=clock)
    with broker.client() as client, client.get_queue_sender("orders") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(4)])
    broker.advance(6.5)
    (pipeline,) = parse_pipelines(PIPELINES).pipelines
    settings = {"Bus": broker.connection_string, "Hubs": broker.connection_string}
    assert (
        RecoveryPoints.for_pipeline(
            pipeline, {**settings, "REPLICATION_RPO_SCHEDULE": "off"}, clock
        )
        is None
    )
    points = RecoveryPoints.for_pipeline(pipeline, settings, clock)
    assert points is not None
    assert [p.source for p in points.probes] == ["orders"]  # the event hub is not probed
    points.start()
    try:
        await until(
            lambda: metrics.RPO_MESSAGES.labels("spark-rpo", "orders").value() == 4,
            "the driver's first probe",
        )
        assert metrics.RPO_SECONDS.labels("spark-rpo", "orders").value() == 6.5
    finally:
        await asyncio.to_thread(points.stop)
    assert all(probe._namespace is None for probe in points.probes)  # connections closed
