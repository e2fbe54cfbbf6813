"""The failover runtime without a broker: connection strings, error kinds, when it re-resolves,
switch notification, and ``run_switching`` restarting a loop on the new namespace."""

from __future__ import annotations

import asyncio
import errno
import socket
import time

import pytest
from azure.servicebus.exceptions import (
    MessagingEntityDisabledError,
    ServiceBusAuthenticationError,
    ServiceBusConnectionError,
    ServiceBusError,
)

from replication import metrics
from replication.clock import ManualClock
from replication.failover import (
    Failover,
    FailoverError,
    Resolution,
    connection_for,
    parse_host_map,
    run_switching,
)
from replication.failover.runtime import points_elsewhere

BASE = "Endpoint=sb://primary.servicebus.windows.net/;SharedAccessKeyName=Send;SharedAccessKey=abc="


class Flip:
    """A resolver whose answer the test sets (or makes fail); counts the questions."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.error: str | None = None
        self.asked = 0
        self.invalidated = 0
        self.delay = 0.0

    def resolve(self) -> Resolution:
        self.asked += 1
        time.sleep(self.delay)
        if self.error:
            raise FailoverError(self.error)
        return Resolution(self.host, (f"flip {self.host}",))

    def invalidate(self) -> None:
        self.invalidated += 1

    def describe(self) -> str:
        return "flip"


def test_connection_for_replaces_only_the_endpoint() -> None:
    moved = connection_for(BASE, "sb2.servicebus.windows.net")
    assert moved == (
        "Endpoint=sb://sb2.servicebus.windows.net/;SharedAccessKeyName=Send;SharedAccessKey=abc="
    )


def test_connection_for_a_mapped_host_is_a_local_emulator() -> None:
    hosts = parse_host_map("SB1.servicebus.windows.net.=127.0.0.1:5672, sb2=127.0.0.1:5673")
    assert hosts == {"sb1.servicebus.windows.net": "127.0.0.1:5672", "sb2": "127.0.0.1:5673"}
    local = connection_for(BASE, "sb1.servicebus.windows.net", hosts)
    assert local.startswith("Endpoint=sb://127.0.0.1:5672/;")
    assert local.endswith(";UseDevelopmentEmulator=true")
    emulator = BASE + ";UseDevelopmentEmulator=false"
    assert connection_for(emulator, "sb2", hosts).count("UseDevelopmentEmulator") == 1


def test_bad_host_maps_and_connection_strings_are_refused() -> None:
    with pytest.raises(ValueError, match="'sb1' is not host=address"):
        parse_host_map("sb1")
    with pytest.raises(ValueError, match="no Endpoint"):
        connection_for("SharedAccessKeyName=a;SharedAccessKey=b", "sb1")


@pytest.mark.parametrize(
    ("error", "elsewhere"),
    [
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), True),
        (socket.gaierror(-2, "Name or service not known"), True),
        (ServiceBusAuthenticationError(message="bad key"), True),
        (MessagingEntityDisabledError(message="disabled"), True),
        (
            ServiceBusConnectionError(
                message="Failed to initiate the connection due to exception: [Errno 111] "
                "Connect call failed ('127.0.0.1', 5999)"
            ),
            True,
        ),
        (TimeoutError("slow"), False),
        (ServiceBusError(message="server busy"), False),
    ],
)
def test_which_errors_point_elsewhere(error: BaseException, elsewhere: bool) -> None:
    assert points_elsewhere(error) is elsewhere


def test_points_elsewhere_looks_into_exception_groups() -> None:
    group = ExceptionGroup("workers", [TimeoutError(), ConnectionRefusedError()])
    assert points_elsewhere(group)
    assert not points_elsewhere(ExceptionGroup("workers", [TimeoutError()]))


def test_points_elsewhere_follows_the_cause_chain() -> None:
    try:
        try:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "refused")
        except OSError as inner:
            raise RuntimeError("cannot connect to sb1:5671") from inner
    except RuntimeError as outer:
        assert points_elsewhere(outer)


async def test_failures_re_resolve_after_the_threshold_and_switch() -> None:
    resolver = Flip("sb1")
    failover = Failover("orders/target", resolver, BASE, failures=3, recheck_interval=3600)
    assert "sb://sb1/" in await failover.connection_string()
    seen: list[tuple[str, str]] = []
    failover.on_switch(lambda old, new: seen.append((old, new)))
    before = metrics.FAILOVERS.labels("orders/target").value()
    resolver.host = "sb2"
    busy = ServiceBusError(message="server busy")
    assert await failover.report_failure(busy) is False
    assert await failover.report_failure(busy) is False
    assert resolver.asked == 1  # two transient failures: not asked yet
    assert await failover.report_failure(busy) is True
    assert (resolver.asked, resolver.invalidated) == (2, 2)  # past the cache
    assert failover.host == "sb2" and failover.switches == 1
    assert "sb://sb2/" in await failover.connection_string()
    assert seen == [(connection_for(BASE, "sb1"), connection_for(BASE, "sb2"))]
    assert metrics.FAILOVERS.labels("orders/target").value() == before + 1


async def test_a_success_resets_the_count_and_refused_re_resolves_at_once() -> None:
    resolver = Flip("sb1")
    failover = Failover("t", resolver, BASE, failures=2, recheck_interval=3600)
    await failover.connection_string()
    assert await failover.report_failure(TimeoutError()) is False
    failover.report_success()
    assert await failover.report_failure(TimeoutError()) is False
    assert resolver.asked == 1
    assert await failover.report_failure(ConnectionRefusedError()) is False  # same answer
    assert resolver.asked == 2 and failover.switches == 0


async def test_periodic_recheck_notices_a_flip_without_errors() -> None:
    clock = ManualClock()
    resolver = Flip("sb1")
    failover = Failover("t", resolver, BASE, recheck_interval=30, clock=clock)
    await failover.connection_string()
    resolver.host = "sb2"
    clock.advance(29.999)
    assert "sb1" in await failover.connection_string()
    assert resolver.asked == 1
    clock.advance(0.001)
    assert "sb2" in await failover.connection_string()  # a quick re-check is waited for
    assert failover.host == "sb2" and resolver.asked == 2


async def test_many_senders_failing_together_resolve_once_and_all_move() -> None:
    resolver = Flip("sb1")
    failover = Failover("t", resolver, BASE, recheck_interval=3600)
    await failover.connection_string()
    resolver.host, resolver.delay = "sb2", 0.05
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "refused")
    moved = await asyncio.gather(*(failover.report_failure(refused) for _ in range(10)))
    assert moved == [True] * 10  # every caller hears it should retry on sb2
    assert resolver.asked == 2 and failover.switches == 1


async def test_a_slow_resolver_does_not_hold_sends_up() -> None:
    """Real time: the resolver takes 1.5 s in its thread (a slow DNS server), and a send
    waits for it at most ``RECHECK_WAIT`` on the loop's clock."""
    clock = ManualClock()
    resolver = Flip("sb1")
    failover = Failover("t", resolver, BASE, recheck_interval=30, clock=clock)
    await failover.connection_string()
    resolver.host, resolver.delay = "sb2", 1.5
    clock.advance(31.0)
    started = time.monotonic()
    assert "sb1" in await failover.connection_string()
    assert time.monotonic() - started < 1.0
    await asyncio.sleep(1.6)  # the re-check finishes in the background
    assert "sb2" in await failover.connection_string()


async def test_resolution_failures_keep_the_current_namespace() -> None:
    resolver = Flip("sb1")
    resolver.error = "no answer from DNS server 127.0.0.1:9"
    failover = Failover("t", resolver, BASE, failures=1)
    with pytest.raises(FailoverError, match="no answer"):
        await failover.connection_string()  # nothing to stay on: the caller hears it
    resolver.error = None
    await failover.connection_string()
    resolver.error = "no answer from DNS server 127.0.0.1:9"
    assert await failover.report_failure(ConnectionRefusedError()) is False
    assert failover.host == "sb1"


async def until_sleeping(clock: ManualClock) -> None:
    """Lets the tasks (and the resolver's thread) run until one sleeps on ``clock``: a poll,
    not a measured wait (a loaded machine takes longer, nothing fails)."""
    for _ in range(10_000):
        if clock.sleeping:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("nobody sleeps on the clock")


async def test_run_switching_restarts_the_loop_on_the_new_namespace() -> None:
    clock = ManualClock()
    resolver = Flip("sb1")
    failover = Failover("t", resolver, BASE, recheck_interval=30, clock=clock)
    stop = asyncio.Event()
    runs: list[str] = []

    async def run(connection_string: str, inner: asyncio.Event) -> None:
        runs.append(connection_string)
        if len(runs) == 1:
            resolver.host = "sb2"  # flipped while the loop works: the re-check stops it
            await until_sleeping(clock)  # the watcher waits for its re-check
            clock.advance(29.9)
            await asyncio.sleep(0)
            assert resolver.asked == 1 and not inner.is_set()
            clock.advance(0.1)
            await inner.wait()
        else:
            stop.set()

    await asyncio.wait_for(run_switching(failover, stop, run), 5)
    assert ["sb://sb1/" in runs[0], "sb://sb2/" in runs[1]] == [True, True]


async def test_run_switching_survives_errors_and_an_unresolvable_start() -> None:
    """An unresolvable start waits one ``pause`` (on the clock), then resolves; an error
    that switched the namespace goes on there at once, without a pause."""
    clock = ManualClock()
    resolver = Flip("sb1")
    resolver.error = "no answer"
    failover = Failover("t", resolver, BASE, failures=1, recheck_interval=3600, clock=clock)
    stop = asyncio.Event()
    calls: list[str] = []

    async def run(connection_string: str, inner: asyncio.Event) -> None:
        calls.append(connection_string)
        if len(calls) == 1:
            resolver.host = "sb2"
            raise ConnectionRefusedError(errno.ECONNREFUSED, "refused")
        stop.set()

    switching = asyncio.create_task(run_switching(failover, stop, run, pause=10.0))
    await until_sleeping(clock)  # the pause after "no answer"
    assert calls == [] and clock.next_wake() == 10.0
    resolver.error = None
    started = clock.monotonic()
    clock.advance(10.0)
    await asyncio.wait_for(switching, 5)
    assert len(calls) == 2 and "sb://sb2/" in calls[1]
    assert clock.monotonic() - started == 10.0  # the switch itself did not pause
