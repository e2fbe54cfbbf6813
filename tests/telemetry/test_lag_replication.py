"""Replication lag measured on real copies: the pump over a real broker and the real SDK,
the broker and the pump on one ManualClock, so the lag is exactly the time the test let
pass between the send and the replication."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import pytest
from azure.servicebus import ServiceBusMessage

from replication import metrics
from replication.clock import ManualClock
from replication.tasks.pump import PumpStats, Source
from replication.tasks.targets import Target
from replication.tasks.task import ReplicationTask
from replication.telemetry.lag import HOP, PATH
from tests.broker.conftest import BrokerHandle, make_config
from tests.tasks.test_replicate import running
from tests.waiting import until

pytestmark = pytest.mark.timeout(120)

CONFIG = make_config({"src": {}, "mid": {}, "dst": {}})


def pumping(
    broker: BrokerHandle, pipeline: str, source: str, target: str, clock: ManualClock
) -> AbstractAsyncContextManager[PumpStats]:
    """The pump of ``pipeline`` from ``source`` to ``target`` on ``clock`` (the task
    library tests' ``running``)."""
    task = ReplicationTask(f"{pipeline}-function", pipeline=pipeline)
    targets = {None: Target(broker.connection_string, target)}
    return running(task, broker.connection_string, Source(source), targets, clock=clock)


def send(broker: BrokerHandle, queue: str, count: int) -> None:
    with broker.client() as client, client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(count)])


async def test_every_copy_counts_once_with_the_time_it_waited(
    broker_factory: Callable[..., BrokerHandle],
) -> None:
    clock = ManualClock()
    broker = broker_factory(CONFIG, clock=clock)
    send(broker, "src", 25)
    broker.advance(7.25)  # the copies are accepted 7.25 s after the sends, on both clocks
    async with pumping(broker, "lag-one-hop", "src", "dst", clock) as stats:
        await until(lambda: stats.completed == 25, "25 copies")
    hop = metrics.LAG.totals()[("lag-one-hop", "target", HOP)]
    assert hop.count == 25 == stats.completed
    # the broker stamps whole milliseconds: each lag is 7.25 s plus under one
    assert 7.25 <= hop.minimum <= hop.maximum < 7.251
    assert ("lag-one-hop", "target", PATH) not in metrics.LAG.totals()  # one hop: no path
    assert hop.minimum <= metrics.LAG.last()[("lag-one-hop", "target", HOP)] <= hop.maximum


async def test_a_second_hop_reports_its_own_lag_and_the_path_s(
    broker_factory: Callable[..., BrokerHandle],
) -> None:
    clock = ManualClock()
    broker = broker_factory(CONFIG, clock=clock)
    send(broker, "src", 10)
    broker.advance(3.0)
    async with pumping(broker, "lag-first", "src", "mid", clock) as first:
        await until(lambda: first.completed == 10, "10 first-hop copies")
    broker.advance(2.0)
    async with pumping(broker, "lag-second", "mid", "dst", clock) as second:
        await until(lambda: second.completed == 10, "10 second-hop copies")
    totals = metrics.LAG.totals()
    hop, path = totals[("lag-second", "target", HOP)], totals[("lag-second", "target", PATH)]
    assert hop.count == path.count == 10
    assert 2.0 <= hop.minimum <= hop.maximum < 2.001  # mid's enqueue to dst's accept
    assert 5.0 <= path.minimum <= path.maximum < 5.001  # src's enqueue to dst's accept
