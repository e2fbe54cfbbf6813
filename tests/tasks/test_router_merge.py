"""Router and merge end to end, and a task process killed mid-batch (at-least-once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage

from replication.servicebus.connection_string import namespace_of
from replication.tasks.registry import build_step
from replication.tasks.targets import Target
from replication.tasks.task import ReplicationTask
from tests.broker.conftest import REPO_ROOT, BrokerHandle, make_config
from tests.processes import Processes

from .test_replicate import receive_all, running, send, wait_until

pytestmark = pytest.mark.timeout(180)

CONFIG = make_config({
    "orders": {}, "eu": {}, "urgent": {}, "rest": {}, "merged": {}, "a": {}, "b": {},
    "crash-src": {"LockDuration": "PT5S"}, "crash-dst": {},
})  # fmt: skip


@pytest.mark.broker_config(CONFIG)
async def test_router_sends_by_ordered_conditions(broker: BrokerHandle) -> None:
    orders = [
        ("o1", {"region": "eu"}, {"priority": 9}),
        ("o2", {"region": "us"}, {"priority": 9}),
        ("o3", {"region": "us"}, {"priority": 1}),
        ("o4", {}, "not json"),
    ]
    send(broker, "orders", [
        ServiceBusMessage(
            json.dumps(body) if isinstance(body, dict) else body, message_id=mid,
            application_properties=props, content_type="application/json",
        )
        for mid, props, body in orders
    ])  # fmt: skip
    cs = broker.connection_string
    router = build_step("route", {
        "routes": [
            {"when": "region = 'eu'", "target": "eu"},
            {"when": "body.priority > 5", "target": "urgent"},
        ],
        "default": "rest",
    })  # fmt: skip
    targets = {name: Target(cs, name) for name in ("eu", "urgent", "rest")}
    task = ReplicationTask("router", steps=[router])
    async with running(task, cs, _source("orders"), targets) as stats:
        await wait_until(lambda: stats.completed == 4)
    got = {name: [m.message_id for m in receive_all(broker, name)] for name in targets}
    assert got == {"eu": ["o1"], "urgent": ["o2"], "rest": ["o3", "o4"]}


@pytest.mark.broker_config(CONFIG)
async def test_router_unmatched_dead_letters(broker: BrokerHandle) -> None:
    mars = ServiceBusMessage("x", message_id="lost", application_properties={"region": "mars"})
    send(broker, "orders", [mars])
    cs = broker.connection_string
    router = build_step("route", {"routes": [{"when": "region = 'eu'", "target": "eu"}]})
    task = ReplicationTask("router", steps=[router])
    async with running(task, cs, _source("orders"), {"eu": Target(cs, "eu")}) as stats:
        await wait_until(lambda: stats.dead_lettered == 1)
    from azure.servicebus import ServiceBusSubQueue

    (dead,) = receive_all(broker, "orders", sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    assert dead.message_id == "lost"
    assert dead.dead_letter_reason == "route: NoRoute"


async def test_merge_two_namespaces_into_one_target(broker_factory: Any) -> None:
    first, second = broker_factory(CONFIG), broker_factory(CONFIG)
    send(first, "a", [ServiceBusMessage(f"a{i}", message_id=f"a{i}") for i in range(20)])
    send(second, "b", [ServiceBusMessage(f"b{i}", message_id=f"b{i}") for i in range(20)])
    target = {None: Target(first.connection_string, "merged")}

    def merge(broker: BrokerHandle, queue: str) -> Any:
        task = ReplicationTask(
            f"merge-{queue}", source_namespace=namespace_of(broker.connection_string),
            target_namespaces={None: namespace_of(first.connection_string)}, loop_guard=True,
        )  # fmt: skip
        return running(task, broker.connection_string, _source(queue), target)

    async with merge(first, "a") as from_a, merge(second, "b") as from_b:
        await wait_until(lambda: from_a.completed == 20 and from_b.completed == 20)
    merged = receive_all(first, "merged")
    assert sorted(m.message_id for m in merged) == sorted(
        [f"a{i}" for i in range(20)] + [f"b{i}" for i in range(20)]
    )
    # order per source is kept (they share no session, but one source is one group)
    assert [m.message_id for m in merged if m.message_id.startswith("a")] == [
        f"a{i}" for i in range(20)
    ]


@pytest.mark.broker_config(CONFIG)
def test_task_killed_mid_batch_loses_nothing(broker: BrokerHandle, processes: Processes) -> None:
    """kill -9 the task process while it moves 2,000 messages, start it again: every source
    message reaches the target at least once (a few twice: accepted by the target, not yet
    completed at the source when the process died)."""
    total = 2_000
    messages = [ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(total)]
    send(broker, "crash-src", messages)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    argv = [
        sys.executable, str(REPO_ROOT / "tests" / "tasks" / "pump_process.py"),
        broker.connection_string, "crash-src", "crash-dst",
    ]  # fmt: skip
    first = processes.start(argv, env=env, stdout=subprocess.PIPE, text=True)
    assert first.stdout is not None
    for line in first.stdout:
        if int(line.split()[1]) >= 500:
            break
    first.kill()
    first.wait(10)
    second = processes.start(argv, env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while broker.count("crash-src") > 0:
        assert time.monotonic() < deadline, f"{broker.count('crash-src')} left at the source"
        time.sleep(0.5)
    second.kill()
    second.wait(10)
    counts = Counter(m.message_id for m in receive_all(broker, "crash-dst"))
    missing = {f"m{i}" for i in range(total)} - set(counts)
    assert not missing, f"{len(missing)} lost, e.g. {sorted(missing)[:5]}"
    duplicates = sum(n - 1 for n in counts.values())
    print(f"{total} replicated across a kill -9; {duplicates} duplicates at the target")
    assert duplicates <= 100  # at most the batches in flight at the kill


def _source(queue: str) -> Any:
    from replication.tasks.pump import Source

    return Source(queue)
