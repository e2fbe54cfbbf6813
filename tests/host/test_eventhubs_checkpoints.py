"""The local host's Event Hubs checkpointing: the SQLite store keeps what the SDK's
``CheckpointStore`` contract asks (optimistic ownership claims, checkpoints that survive a
reopen), and a batch whose function fails is run again, not checkpointed, under a retry
policy; without one it is checkpointed anyway, as Azure does."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import azure.functions as func
import pytest
from azure.eventhub import EventData

from replication.functions import EventsFailed
from replication.host.checkpoints import SqliteCheckpointStore
from replication.host.eventhubs import EventHubOptions, EventHubTriggerRunner, event_hub_triggers
from replication.host.worker import Worker
from tests.broker.eventhubs_support import eventhub_config

from .eventhubs_host import send_events
from .support import pipeline_app

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio]

NS, HUB, GROUP = "localhost:5672", "orders", "$Default"


async def run_runner(
    runner: EventHubTriggerRunner, worker: Worker, until: Callable[[EventHubTriggerRunner], bool]
) -> None:
    """Runs ``runner`` until ``until(runner)`` (30 s at most), then stops it, raising what
    it failed with, and ``worker``."""
    stop = asyncio.Event()
    job = asyncio.create_task(runner.run(stop))
    try:
        async with asyncio.timeout(30):
            while not until(runner):
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await job
        worker.stop()


def claim(partition: str, owner: str, etag: str | None = None) -> dict[str, Any]:
    return {
        "fully_qualified_namespace": NS, "eventhub_name": HUB, "consumer_group": GROUP,
        "partition_id": partition, "owner_id": owner, "etag": etag,
    }  # fmt: skip


async def test_ownership_is_claimed_with_the_etag_last_seen(tmp_path: Path) -> None:
    store = SqliteCheckpointStore.in_directory(tmp_path)
    (first,) = await store.claim_ownership([claim("0", "a")])
    assert first["owner_id"] == "a" and first["etag"]
    # b saw no owner (etag None) but a claimed it since: b's claim loses
    assert list(await store.claim_ownership([claim("0", "b")])) == []
    (taken,) = await store.claim_ownership([claim("0", "b", first["etag"])])
    assert taken["etag"] != first["etag"]
    assert list(await store.claim_ownership([claim("0", "a", first["etag"])])) == []
    owners = {o["partition_id"]: o["owner_id"] for o in await store.list_ownership(NS, HUB, GROUP)}
    assert owners == {"0": "b"}
    store.close()


async def test_checkpoints_survive_a_reopen_and_names_ignore_case(tmp_path: Path) -> None:
    store = SqliteCheckpointStore.in_directory(tmp_path)
    checkpoint = {**claim("1", ""), "offset": "4096", "sequence_number": 41}
    await store.update_checkpoint(checkpoint)
    await store.update_checkpoint({**checkpoint, "offset": "8192", "sequence_number": 83})
    store.close()
    again = SqliteCheckpointStore.in_directory(tmp_path)
    (found,) = await again.list_checkpoints(NS, "ORDERS", "$default")
    assert (found["partition_id"], found["offset"], found["sequence_number"]) == ("1", "8192", 83)
    again.close()


def failing_app(failures: int, retry: bool) -> tuple[func.FunctionApp, list[list[str]]]:
    """An app whose event hub function fails its first ``failures`` calls."""
    app = func.FunctionApp()
    calls: list[list[str]] = []

    async def copy(events: list[func.EventHubEvent]) -> None:
        calls.append([e.get_body().decode() for e in events])
        if len(calls) <= failures:
            raise RuntimeError(f"failure {len(calls)}")

    trigger = app.event_hub_message_trigger(
        arg_name="events", connection="EventHubs", event_hub_name="eh1",
        cardinality=func.Cardinality.MANY,
    )  # fmt: skip
    decorated = trigger(copy)
    if retry:
        decorated = app.retry("exponential_backoff", "-1", minimum_interval="00:00:01",
                              maximum_interval="00:00:04")(decorated)  # fmt: skip
    app.function_name("copy")(decorated)
    return app, calls


@pytest.mark.parametrize("retry", [True, False], ids=["retry-policy", "no-retry-policy"])
async def test_a_failing_batch_is_run_again_before_any_checkpoint(
    broker_factory: Any, tmp_path: Path, retry: bool
) -> None:
    broker = broker_factory(eventhub_config({"eh1": {"PartitionCount": "1"}}))
    settings = {"EventHubs": broker.connection_string}
    await send_events(broker.connection_string, "eh1", [
        (None, "0", EventData(f"e{i}")) for i in range(5)
    ])  # fmt: skip
    app, calls = failing_app(2, retry)
    (trigger,) = event_hub_triggers(app, settings)
    store = SqliteCheckpointStore.in_directory(tmp_path)
    waits: list[float] = []
    checkpointed_while_failing: list[object] = []

    async def sleep(seconds: float) -> None:  # the retry's wait: look at the store meanwhile
        waits.append(seconds)
        checkpointed_while_failing.extend(await store.list_checkpoints(
            f"localhost:{broker.port}", "eh1", "$Default"
        ))  # fmt: skip

    worker = Worker()
    runner = EventHubTriggerRunner(
        trigger, broker.connection_string, store, worker, EventHubOptions(10), sleep=sleep
    )  # fmt: skip
    await run_runner(runner, worker, lambda r: r.stats.checkpoints >= 1)
    (checkpoint,) = await store.list_checkpoints(f"localhost:{broker.port}", "eh1", "$Default")
    store.close()
    assert checkpoint["sequence_number"] == 4
    assert checkpointed_while_failing == []
    if retry:  # the same batch three times: two failures, then through
        assert calls == [[f"e{i}" for i in range(5)]] * 3
        assert len(waits) == 2 and 1.0 <= waits[0] <= 1.0 and 1.0 <= waits[1] <= 2.0
        assert runner.stats.events == 5
    else:  # Azure's behaviour without a retry policy: logged, checkpointed past it
        assert calls == [[f"e{i}" for i in range(5)]]
        assert waits == [] and runner.stats.events == 0


async def test_a_refused_copy_makes_the_pipeline_function_raise(broker_factory: Any) -> None:
    """The generated function raises when a target refused a copy, so its batch is not
    checkpointed (the host runs it again)."""
    broker = broker_factory(eventhub_config())
    settings = {"EventHubs": broker.connection_string, "ServiceBus": broker.connection_string}
    app = pipeline_app("""\
pipelines:
  - name: eh-to-missing
    source: {connection: EventHubs, eventhub: eh1}
    target: {connection: ServiceBus, queue: no-such-queue}
""", settings)  # fmt: skip
    (trigger,) = event_hub_triggers(app, settings)
    event = func.EventHubEvent(body=b"x", sequence_number=0, offset="0")
    with pytest.raises(EventsFailed, match="eh-to-missing: 1 of 1 events not sent"):
        await trigger.function(events=[event])


async def test_batch_checkpoint_frequency_checkpoints_every_nth_batch(
    broker_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """host.json ``batchCheckpointFrequency: 2``: a checkpoint after the 2nd, 4th, ... batch
    of the partition, at that batch's last event; the batches in between write none (a host
    killed then runs them again). The SDK hands over what has arrived (at most
    ``maxEventBatchSize``), so the batches are checked as they came, however they were cut."""
    broker = broker_factory(eventhub_config({"eh1": {"PartitionCount": "1"}}))
    await send_events(broker.connection_string, "eh1", [
        (None, "0", EventData(f"e{i}")) for i in range(6)
    ])  # fmt: skip
    app, calls = failing_app(0, retry=False)
    (trigger,) = event_hub_triggers(app, {"EventHubs": broker.connection_string})
    store = SqliteCheckpointStore.in_directory(tmp_path)
    written: list[tuple[int, int]] = []  # (batches run by then, checkpointed sequence number)
    update_checkpoint = store.update_checkpoint

    async def recording(checkpoint: dict[str, Any], **kwargs: Any) -> None:
        written.append((len(calls), checkpoint["sequence_number"]))
        await update_checkpoint(checkpoint, **kwargs)

    monkeypatch.setattr(store, "update_checkpoint", recording)
    options = EventHubOptions.from_host_json(
        {"extensions": {"eventHubs": {"maxEventBatchSize": 2, "batchCheckpointFrequency": 2}}}
    )
    worker = Worker()
    runner = EventHubTriggerRunner(trigger, broker.connection_string, store, worker, options)
    await run_runner(runner, worker, lambda r: r.stats.events >= 6)
    stored = await store.list_checkpoints(f"localhost:{broker.port}", "eh1", "$Default")
    store.close()
    assert [body for batch in calls for body in batch] == [f"e{i}" for i in range(6)]
    assert all(1 <= len(batch) <= 2 for batch in calls), calls
    assert len(calls) >= 3  # 6 events in batches of at most 2
    # e<i> has sequence number i: the last event of every second batch, right after it ran
    due = [(n, int(calls[n - 1][-1][1:])) for n in range(2, len(calls) + 1, 2)]
    assert written == due, calls
    assert runner.stats.checkpoints == len(due)
    assert [c["sequence_number"] for c in stored] == [due[-1][1]]  # the last one stays


async def test_a_stop_ends_a_retry_wait_without_a_checkpoint(
    broker_factory: Any, tmp_path: Path
) -> None:
    """A batch waiting for its next try when the host stops is not checkpointed (read
    again after a restart), and the stop does not wait out the retry interval."""
    broker = broker_factory(eventhub_config({"eh1": {"PartitionCount": "1"}}))
    await send_events(broker.connection_string, "eh1", [(None, "0", EventData("e0"))])
    app, calls = failing_app(10, retry=True)
    (trigger,) = event_hub_triggers(app, {"EventHubs": broker.connection_string})
    store = SqliteCheckpointStore.in_directory(tmp_path)
    waiting = asyncio.Event()

    async def sleep(_seconds: float) -> None:  # a retry interval longer than the test
        waiting.set()
        await asyncio.Event().wait()

    worker, stop = Worker(), asyncio.Event()
    runner = EventHubTriggerRunner(
        trigger, broker.connection_string, store, worker, EventHubOptions(10), sleep=sleep
    )  # fmt: skip
    job = asyncio.create_task(runner.run(stop))
    try:
        async with asyncio.timeout(30):
            await waiting.wait()
            stop.set()
            await job
    finally:
        stop.set()
        worker.stop()
    assert calls == [["e0"]] and runner.stats.checkpoints == 0
    assert list(await store.list_checkpoints(f"localhost:{broker.port}", "eh1", "$Default")) == []
    store.close()


async def test_cardinality_one_gets_each_event_in_turn(broker_factory: Any, tmp_path: Path) -> None:
    broker = broker_factory(eventhub_config({"eh1": {"PartitionCount": "1"}}))
    await send_events(broker.connection_string, "eh1", [
        (None, "0", EventData(f"e{i}")) for i in range(3)
    ])  # fmt: skip
    app = func.FunctionApp()
    seen: list[str] = []

    def one(event: func.EventHubEvent) -> None:
        seen.append(event.get_body().decode())

    trigger = app.event_hub_message_trigger(
        arg_name="event", connection="EventHubs", event_hub_name="eh1"
    )
    app.function_name("one")(trigger(one))
    (found,) = event_hub_triggers(app, {"EventHubs": broker.connection_string})
    assert not found.many
    store = SqliteCheckpointStore.in_directory(tmp_path)
    worker = Worker()
    runner = EventHubTriggerRunner(found, broker.connection_string, store, worker)
    try:
        await run_runner(runner, worker, lambda r: r.stats.checkpoints >= 1 and r.stats.events >= 3)
    finally:
        store.close()
    assert seen == ["e0", "e1", "e2"]


async def test_the_backlog_counts_what_was_not_run_through(
    broker_factory: Any, tmp_path: Path
) -> None:
    """The host's backlog metric for an event hub source: events after each partition's
    last one run through; a restarted runner starts counting at the checkpoints."""
    broker = broker_factory(eventhub_config({"eh1": {"PartitionCount": "2"}}))
    await send_events(broker.connection_string, "eh1", [
        (None, str(i % 2), EventData(f"e{i}")) for i in range(5)
    ])  # fmt: skip
    app, _ = failing_app(0, retry=False)
    (trigger,) = event_hub_triggers(app, {"EventHubs": broker.connection_string})
    partitions = broker.call(lambda: broker.broker.event_hubs.hubs["eh1"].partitions)
    store = SqliteCheckpointStore.in_directory(tmp_path)

    async def run(until: Callable[[EventHubTriggerRunner], bool]) -> EventHubTriggerRunner:
        worker = Worker()
        runner = EventHubTriggerRunner(trigger, broker.connection_string, store, worker)
        await run_runner(runner, worker, until)
        return runner

    idle = Worker()
    fresh = EventHubTriggerRunner(trigger, broker.connection_string, store, idle)
    idle.stop()
    assert broker.call(lambda: fresh.backlog(partitions)) == 5
    first = await run(lambda r: r.stats.checkpoints >= 2)
    assert broker.call(lambda: first.backlog(partitions)) == 0
    again = await run(lambda r: len(r.read_up_to) == 2)  # seeded from the checkpoints
    assert broker.call(lambda: again.backlog(partitions)) == 0
    store.close()


async def test_two_hosts_on_one_store_share_the_partitions(
    broker_factory: Any, tmp_path: Path
) -> None:
    """The SDK's load balancing over our store: two readers of one consumer group split the
    four partitions between them (each owns some), and every event is run through once."""
    broker = broker_factory(eventhub_config({"eh1": {"PartitionCount": "4"}}))
    app, calls = failing_app(0, retry=False)
    (trigger,) = event_hub_triggers(app, {"EventHubs": broker.connection_string})
    stores = [SqliteCheckpointStore.in_directory(tmp_path) for _ in range(2)]  # one file
    workers, stop = [Worker(), Worker()], asyncio.Event()
    runners = [
        EventHubTriggerRunner(trigger, broker.connection_string, store, worker)
        for store, worker in zip(stores, workers, strict=True)
    ]
    jobs = [asyncio.create_task(r.run(stop)) for r in runners]
    namespace = f"localhost:{broker.port}"
    try:
        async with asyncio.timeout(60):
            while True:  # both own partitions (balanced: two each)
                owners = [o["owner_id"] for o in await stores[0].list_ownership(
                    namespace, "eh1", "$Default"
                )]  # fmt: skip
                if len(owners) == 4 and sorted(owners.count(o) for o in set(owners)) == [2, 2]:
                    break
                await asyncio.sleep(0.2)
            await send_events(broker.connection_string, "eh1", [
                (None, str(i % 4), EventData(f"e{i}")) for i in range(40)
            ])  # fmt: skip
            while sum(r.stats.events for r in runners) < 40:
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.gather(*jobs)
        for worker in workers:
            worker.stop()
        for store in stores:
            store.close()
    seen = [body for batch in calls for body in batch]
    assert sorted(seen) == sorted(f"e{i}" for i in range(40))  # each once
    assert all(r.stats.events > 0 for r in runners)
