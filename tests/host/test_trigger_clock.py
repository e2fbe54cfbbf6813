"""The local host's trigger on a ``ManualClock``: its retry pause and its lock renewal are
exact and sleep-free (the real-time versions: test_host_settlement's killed source, and
test_settlement's slow batch)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

import azure.functions as func
import pytest
from azure.servicebus import ServiceBusMessage

from replication.clock import ManualClock
from replication.host.discovery import service_bus_triggers
from replication.host.trigger import BROKEN_PAUSE, TriggerRunner
from replication.host.worker import Worker
from tests.broker.conftest import BrokerHandle, make_config

from .support import FAST


async def until(condition: Callable[[], object], what: str) -> None:
    """Polls (the host's own work takes real time: a receive, a renew request); not a
    measured wait: a loaded machine takes longer, nothing fails."""
    for _ in range(3000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


def one_trigger(app: func.FunctionApp, settings: dict[str, str], clock: ManualClock,
                worker: Worker) -> TriggerRunner:  # fmt: skip
    (trigger,) = service_bus_triggers(app, settings)
    return TriggerRunner(trigger, settings[trigger.connection], FAST.for_trigger(trigger),
                         worker=worker, clock=clock)  # fmt: skip


async def test_a_source_that_cannot_work_is_tried_again_after_the_pause_on_the_clock(
    broker_factory: Callable[..., BrokerHandle], caplog: pytest.LogCaptureFixture
) -> None:
    broker = broker_factory(make_config({"in": {}}))
    settings = {"Bus": broker.connection_string}
    app = func.FunctionApp()

    @app.service_bus_queue_trigger(arg_name="message", queue_name="missing", connection="Bus")
    def never(message: func.ServiceBusMessage) -> None:  # pragma: no cover - no such queue
        raise AssertionError("nothing to receive")

    clock, worker, stop = ManualClock(), Worker(), asyncio.Event()
    runner = one_trigger(app, settings, clock, worker)

    def failures() -> list[str]:
        return [r.getMessage() for r in caplog.records if "receiver failed" in r.getMessage()]

    caplog.set_level(logging.WARNING, "replication.host")
    job = asyncio.create_task(runner.run(stop))
    try:
        await until(lambda: clock.sleeping and failures(), "the first failure and its pause")
        assert len(failures()) == 1 and f"retrying in {BROKEN_PAUSE:g} s" in failures()[0]
        clock.advance(BROKEN_PAUSE - 0.01)
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(failures()) == 1 and clock.sleeping == 1  # still pausing
        clock.advance(0.01)
        await until(lambda: len(failures()) == 2, "the second attempt")
    finally:
        stop.set()
        await asyncio.wait_for(job, 10)
        worker.stop()


async def test_the_trigger_keeps_a_lock_on_its_clock_while_the_function_works(
    broker_factory: Callable[..., BrokerHandle],
) -> None:
    """The broker and the trigger share a clock: the function holds its message for four
    lock durations (LockDuration 5 s), the trigger renews the lock as that time passes, and
    the message is neither delivered again nor dead-lettered."""
    clock = ManualClock()
    config = make_config({"in": {"LockDuration": "PT5S", "MaxDeliveryCount": 2}})
    broker = broker_factory(config, clock=clock)
    settings = {"Bus": broker.connection_string}
    app = func.FunctionApp()
    calls: list[tuple[str, int]] = []
    release = threading.Event()

    @app.service_bus_queue_trigger(arg_name="message", queue_name="in", connection="Bus")
    def slow(message: func.ServiceBusMessage) -> None:
        calls.append((str(message.message_id), int(message.delivery_count or 0)))
        assert release.wait(60), "the test never released the function"

    with broker.client() as client, client.get_queue_sender("in") as sender:
        sender.send_messages(ServiceBusMessage(b"slow", message_id="slow"))
    worker, stop = Worker(), asyncio.Event()
    runner = one_trigger(app, settings, clock, worker)
    job = asyncio.create_task(runner.run(stop))
    try:
        await until(lambda: calls and clock.sleeping, "the function holding its message")
        for second in range(20):  # the lock keeper looks once a second at most
            await asyncio.to_thread(broker.advance, 1.0)  # expires what was not renewed
            await until(lambda: (clock.next_wake() or 0) > 0, f"the keeper asleep ({second} s)")
        assert broker.count("in") == 1
        release.set()
        await until(lambda: runner.stats.completed == 1, "the message completed")
    finally:
        release.set()
        stop.set()
        await asyncio.wait_for(job, 10)
        worker.stop()
    assert calls == [("slow", 1)]  # its first delivery, as the Functions host counts
    assert broker.count("in") == 0 and broker.count("in/$DeadLetterQueue") == 0
