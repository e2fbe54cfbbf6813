"""The recovery point in Functions and the local host: ``register_pipelines`` adds a timer
function per Service Bus source, and the local host runs timer triggers on its clock, as the
Functions host does; the timer's probe sets the RPO gauges."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import azure.functions as func
import pytest

from replication import metrics
from replication.clock import ManualClock
from replication.functions import register_pipelines
from replication.host.discovery import DiscoveryError
from replication.host.embedded import plan_brokers
from replication.host.timer import TimerRunner, timer_triggers
from replication.host.worker import Worker
from replication.ncrontab import ScheduleError, parse_schedule
from replication.pipeline import parse_pipelines
from tests.broker.conftest import BrokerHandle
from tests.waiting import until

from .test_host import project

pytestmark = pytest.mark.timeout(120)

MIXED = """\
pipelines:
  - name: orders
    source: {connection: Bus, topic: orders, subscription: copy}
    target: {connection: Other, queue: orders}
  - name: audit
    source: {connection: Hubs, eventhub: audit}
    target: {connection: Other, queue: audit}
"""


def timers(app: func.FunctionApp) -> dict[str, dict[str, object]]:
    """The app's timer functions' bindings (``get_functions`` may be called once per app)."""
    bindings = {
        str(f.get_function_name()): f.get_trigger().get_dict_repr() for f in app.get_functions()
    }
    return {name: b for name, b in bindings.items() if b.get("type") == "timerTrigger"}


def test_each_service_bus_source_gets_a_recovery_point_timer() -> None:
    app = func.FunctionApp()
    names = register_pipelines(app, parse_pipelines(MIXED), settings={})
    assert names == ["orders", "orders_rpo", "audit"]  # an event hub source has no head
    found = timers(app)
    assert list(found) == ["orders_rpo"]
    timer = found["orders_rpo"]
    assert timer["schedule"] == "*/30 * * * * *"
    assert (timer["runOnStartup"], timer["useMonitor"], timer["name"]) == (False, False, "timer")


def test_the_schedule_is_an_app_setting_and_off_turns_the_timers_off() -> None:
    app = func.FunctionApp()
    register_pipelines(app, parse_pipelines(MIXED), {"REPLICATION_RPO_SCHEDULE": "0 */5 * * * *"})
    assert timers(app)["orders_rpo"]["schedule"] == "0 */5 * * * *"
    quiet = func.FunctionApp()
    assert register_pipelines(quiet, parse_pipelines(MIXED), {"REPLICATION_RPO_SCHEDULE": "off"})
    assert timers(quiet) == {}
    identity = func.FunctionApp()  # no key to sign the probe with: no timer
    settings = {"Bus__fullyQualifiedNamespace": "ns.servicebus.windows.net"}
    assert register_pipelines(identity, parse_pipelines(MIXED), settings) == ["orders", "audit"]
    with pytest.raises(ScheduleError, match="has 5 field"):
        register_pipelines(
            func.FunctionApp(), parse_pipelines(MIXED), {"REPLICATION_RPO_SCHEDULE": "* * * * *"}
        )


# ---------------------------------------------------------------------- the host's timers


async def test_a_timer_fires_on_the_clock_one_at_a_time_and_says_when_it_is_late() -> None:
    clock = ManualClock(start=1_700_000_000.0)  # 22:13:20 UTC
    app = func.FunctionApp()
    calls: list[tuple[float, func.TimerRequest]] = []
    hold = threading.Event()

    @app.timer_trigger(arg_name="tick", schedule="%TICKS%", run_on_startup=True)
    def ticking(tick: func.TimerRequest) -> None:
        calls.append((clock.time(), tick))
        assert hold.wait(30), "the test never let the function return"

    (trigger,) = timer_triggers(app, {"TICKS": "*/10 * * * * *"})
    assert (trigger.name, trigger.expression, trigger.run_on_startup) == (
        "ticking",
        "*/10 * * * * *",
        True,
    )
    worker, stop = Worker(), asyncio.Event()
    runner = TimerRunner(trigger, worker, clock)
    job = asyncio.create_task(runner.run(stop))
    try:
        await until(lambda: len(calls) == 1, "the startup invocation")
        assert calls[0][0] == 1_700_000_000.0 and not calls[0][1].past_due
        clock.advance(25.0)  # :30 and :40 pass while the first invocation still runs
        await asyncio.sleep(0.05)
        assert len(calls) == 1  # one at a time: none started beside it
        hold.set()
        await until(lambda: clock.wakes() == [5.0], "then asleep until :50")
        clock.advance(5.0)
        await until(lambda: len(calls) == 2, "the invocation at :50")
        on_time = calls[1][1]
        assert calls[1][0] == 1_700_000_030.0 and not on_time.past_due
        assert on_time.schedule_status["Last"] == "2023-11-14T22:13:20Z"
        assert on_time.schedule_status["Next"] == "2023-11-14T22:14:00Z"
        await until(lambda: clock.wakes() == [10.0], "asleep until :00")
        clock.advance(35.0)  # the clock jumps past :00 and :10
        await until(lambda: len(calls) == 3, "the late invocation")
        late = calls[2][1]
        assert calls[2][0] == 1_700_000_065.0 and late.past_due  # one for both
        assert late.schedule_status["Next"] == "2023-11-14T22:14:30Z"
    finally:
        hold.set()
        stop.set()
        await asyncio.wait_for(job, 10)
        worker.stop()
    assert (runner.stats.invocations, runner.stats.past_due, runner.stats.failures) == (3, 1, 0)


def test_a_timer_with_a_wrong_schedule_is_refused_by_name() -> None:
    app = func.FunctionApp()

    @app.timer_trigger(arg_name="tick", schedule="every minute")
    def sloppy(tick: func.TimerRequest) -> None:  # pragma: no cover - never run
        pass

    with pytest.raises(DiscoveryError, match="function sloppy: schedule 'every minute'"):
        timer_triggers(app, {})


COPY = """\
pipelines:
  - name: copy
    source: {connection: PrimaryServiceBus, queue: work}
    target: {connection: SecondaryServiceBus, queue: work}
"""


async def test_the_local_host_runs_the_rpo_timer_on_its_clock(
    tmp_path: Path, broker_factory: Callable[..., BrokerHandle]
) -> None:
    """Two deferred messages sit at the source (the trigger cannot receive them, and a
    primary lost now would lose them): the host's ``copy_rpo`` timer fires at its schedule's
    next occurrence on the host's clock and reports exactly their age, and /metrics shows
    it."""
    from replication.host.app import Host, HostConfig

    directory, settings = project(tmp_path, COPY)
    settings["REPLICATION_RPO_SCHEDULE"] = "*/20 * * * * *"
    (directory / "local.settings.json").write_text(json.dumps({"Values": settings}))
    clock = ManualClock(start=float(round(time.time())))
    start = clock.time()
    # the source's broker, on its data folder, before the host starts it there again
    port = int(settings["PrimaryServiceBus"].split("localhost:")[1].split(";")[0])
    entities = plan_brokers(parse_pipelines(COPY).pipelines, settings)[port]
    before = broker_factory(
        entities.config(),
        data_dir=directory / ".replication" / f"broker-{port}",
        port=port,
        clock=clock,
    )
    with before.client() as client:
        with client.get_queue_sender("work") as sender:
            sender.send_messages([func_message("a"), func_message("b")])
        with client.get_queue_receiver("work") as receiver:
            received = receiver.receive_messages(max_message_count=2, max_wait_time=5)
            assert len(received) == 2
            for message in received:
                receiver.defer_message(message)
    before.advance(3.0)
    before.stop()

    host = Host(
        HostConfig(directory=directory, metrics_port=0, progress=False, ui=False, clock=clock)
    )
    run = asyncio.create_task(host.run())
    try:
        await until(lambda: host.healthy or run.done(), "the host started")
        assert [t.trigger.name for t in host.timers] == ["copy_rpo"]
        due = parse_schedule("*/20 * * * * *").next_after(clock.time())
        wait = due - clock.time()
        await until(lambda: any(abs(w - wait) < 1e-6 for w in clock.wakes()), "timer asleep")
        assert metrics.RPO_SECONDS.labels("copy", "work").value() == 0.0  # not probed yet
        clock.advance(wait)
        await until(lambda: host.timers[0].stats.invocations == 1, "the timer fired")
        await until(lambda: metrics.RPO_MESSAGES.labels("copy", "work").value() == 2, "probed")
        assert metrics.RPO_SECONDS.labels("copy", "work").value() == due - start
        url = f"http://127.0.0.1:{host.config.metrics_port}/metrics"
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
        assert f'replication_rpo_seconds{{pipeline="copy",source="work"}} {due - start}' in (
            body.decode()
        )
        assert host.timers[0].stats.failures == 0
    finally:
        host.stop.set()
        assert await asyncio.wait_for(run, 60) == 0


def func_message(message_id: str) -> object:
    from azure.servicebus import ServiceBusMessage

    return ServiceBusMessage(message_id, message_id=message_id)
