"""What one Spark Python worker process keeps between tasks: a loop, senders, receivers.

Spark reuses Python workers (``spark.python.worker.reuse``, default true), one per running
task slot, so module globals live across the tasks a worker runs. Each worker keeps

- one asyncio loop in a daemon thread (``run_async``): Spark's callbacks are synchronous,
  and connections must stay on the loop that opened them; the first call also tunes the
  worker's cycle collector (``gc_tuning``: 9% less CPU per message);
- one ``SenderPool`` (and its ``Breakers``) per target set (``pool_for``): connecting and
  closing clients per partition cost about a second each micro-batch;
- one ``AmqpSource`` per source namespace (``source_for``): one connection, opened on first
  use and reopened when lost (``AmqpSource.connection``), that every receiver of the
  worker's tasks shares. A connection is keyed by its connection string, so after a
  failover the next assignment (which names the new namespace) opens a new one.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Coroutine, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

from ..servicebus.client import NoSessionAvailable, SourceError

if TYPE_CHECKING:
    from ..servicebus.client import AmqpReceiver, AmqpSource
    from ..tasks.breaker import Breakers
    from ..tasks.targets import SendBackend, SenderPool, Target
    from .intake import LoopThread

T = TypeVar("T")

SESSION_ACCEPT_WAIT = 0.2
"""Seconds to wait for one more next-available session once a slot has had one (the first
wait is the assignment's): sessions that are there come at once, and a slot whose entity
has no other free session should end, not idle."""

_LOOP: LoopThread | None = None
_POOLS: dict[Hashable, tuple[SenderPool, Breakers]] = {}
_SOURCES: dict[str, AmqpSource] = {}


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Runs a coroutine on this process's loop thread from Spark's synchronous callbacks."""
    global _LOOP
    if _LOOP is None:
        from ..gc_tuning import collect_garbage_for_throughput
        from .intake import LoopThread

        collect_garbage_for_throughput()  # pyspark and this package imported: set up
        _LOOP = LoopThread("servicebus-worker")
    return _LOOP.run(coro, timeout=None)


def pool_for(
    key: Hashable, targets: dict[str | None, Target], backend: SendBackend = "amqp"
) -> tuple[SenderPool, Breakers]:
    """This worker's sender pool (and breakers) for ``key``, made on first use. Call it on
    the loop (``run_async``)."""
    found = _POOLS.get(key)
    if found is None:
        from ..tasks.breaker import Breakers
        from ..tasks.targets import SenderPool

        found = _POOLS[key] = (SenderPool(targets, backend=backend), Breakers())
    return found


def source_for(connection_string: str) -> AmqpSource:
    """This worker's connection to a source namespace (opened on first use, reopened when
    lost). Call it on the loop (``run_async``)."""
    source = _SOURCES.get(connection_string)
    if source is None:
        from ..servicebus.client import AmqpSource

        source = _SOURCES[connection_string] = AmqpSource.from_connection_string(connection_string)
    return source


async def next_sessions(
    source: AmqpSource,
    path: str,
    prefetch: int,
    first_wait: float,
    failed: Callable[[SourceError, str], None],
) -> AsyncGenerator[AmqpReceiver]:
    """Next-available sessions of ``path``, one after another, until none comes in time or
    accepting one fails (``failed`` hears of it, and may raise); the caller stops when its
    share is taken, and closes or keeps each receiver."""
    wait = first_wait
    while True:
        try:
            receiver = await source.receiver(path, prefetch=prefetch, session=True, wait=wait)
        except NoSessionAvailable:
            return
        except SourceError as exc:
            failed(exc, "cannot accept a session of")
            return
        wait = SESSION_ACCEPT_WAIT
        yield receiver
