"""The recovery point at a source: what losing it now would lose, in seconds and in messages.

Per source entity (a queue, or a topic's subscription) of a pipeline, ``RecoveryPointProbe``
peeks the head without locking anything (``com.microsoft:peek-message`` on the entity's
``$management`` node, through the failover-aware client: it reads wherever the source
resolves now) and reports

- ``replication_rpo_seconds``: the probe's clock minus the enqueued time of the oldest
  message still at the source, 0 when there is none;
- ``replication_rpo_messages``: how many messages are at the source;

labelled ``pipeline`` and ``source`` (the entity path: ``orders``,
``events/subscriptions/router``). A message is replicated once its copies were accepted and
it was completed at the source, so everything still there counts: what waits, what a
receiver holds locked (in flight: not replicated until it is completed), and deferred
messages (the pipeline never receives them, and they are lost with the source). Scheduled
messages do not count: they are not there yet (their time has not come, no receiver could
have replicated them; a peek of a queue shows them, marked scheduled), nor do expired ones
(they go at the next receive whatever anyone does), nor the dead-letter queue (not the
pipeline's to replicate: ``DeadletteredMessages`` alerts on it).

The age is the oldest enqueued time among the first ``HEAD_PAGE`` messages in sequence
order (not only the first: a scheduled message enqueued at its time has a lower sequence
number than those sent while it waited). The count comes, when the connection may ask, from
the entity's runtime properties (``ActiveMessageCount``, the management API:
``servicebus.runtime_properties``), which needs the **Manage** right; a connection without
it (the deployed app's rules have Listen only, as they should) counts by peeking, up to
``peek_limit`` messages: a count that reaches the limit is a lower bound ("at least",
``RecoveryPoint.at_least``), and each probe then reads that many message bodies, so keep the
limit modest. ``count="management"`` insists on the API, ``count="peek"`` never asks it.

A session-enabled source is peeked across its sessions (no session lock is taken): the
embedded broker answers that, and so does Service Bus (the .NET SDK peeks a session entity
without a session receiver), though the service does not promise it for every session state;
the count from the runtime properties does not depend on it.

Event hubs have no head to peek in this sense (an event stays until its retention ends,
replicated or not: what is not replicated yet is what lies past the consumer group's
checkpoint), so their sources are not probed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from .. import metrics
from ..clock import SYSTEM, Clock, now_ms, wait_event
from ..servicebus.client import AmqpSource, SourceError
from ..servicebus.endpoint import Endpoint
from ..servicebus.management import SCHEDULED, Management
from ..servicebus.runtime_properties import CountsRefused, entity_counts

if TYPE_CHECKING:
    from ..failover import Failover
    from ..ncrontab import Schedule

log = logging.getLogger("replication.tasks.recovery_point")

SCHEDULE_SETTING = "REPLICATION_RPO_SCHEDULE"
"""App setting: when to probe (NCRONTAB with seconds, or a TimeSpan); ``off`` for never."""
DEFAULT_SCHEDULE = "*/30 * * * * *"
PEEK_LIMIT_SETTING = "REPLICATION_RPO_PEEK_LIMIT"
"""App setting: the most messages counted by peeking (without the Manage right)."""
DEFAULT_PEEK_LIMIT = 100
HEAD_PAGE = 10
"""Messages peeked for the age when the count comes from the management API."""
OFF = frozenset({"off", "false", "no", "none", "disabled", "0"})

CountMethod = Literal["auto", "management", "peek"]


def schedule_setting(settings: Mapping[str, str]) -> str | None:
    """The probe schedule the app settings ask for (``DEFAULT_SCHEDULE`` when unset), or
    None when they turn the probe off."""
    text = (settings.get(SCHEDULE_SETTING) or "").strip()
    if text.lower() in OFF:
        return None
    return text or DEFAULT_SCHEDULE


def peek_limit_setting(settings: Mapping[str, str]) -> int:
    text = (settings.get(PEEK_LIMIT_SETTING) or "").strip()
    try:
        limit = int(text) if text else DEFAULT_PEEK_LIMIT
    except ValueError:
        raise ValueError(f"{PEEK_LIMIT_SETTING}={text!r} is not a whole number") from None
    if limit < 1:
        raise ValueError(f"{PEEK_LIMIT_SETTING}={text!r}: give at least 1")
    return limit


def source_path(entity: str, subscription: str | None = None) -> str:
    """A queue's name, or ``topic/subscriptions/name``: the ``source`` label."""
    return entity if subscription is None else f"{entity}/subscriptions/{subscription}"


@dataclass(frozen=True, slots=True)
class RecoveryPoint:
    seconds: float
    """Age of the oldest message at the source (0: none)."""
    messages: int
    at_least: bool = False
    """``messages`` were counted by peeking and the peek limit was reached: there may be
    more."""
    counted_by: Literal["management", "peek"] = "peek"


class RecoveryPointProbe:
    """Measures one source's recovery point (``measure``), records it in the gauges
    (``record``), or does so on a schedule until stopped (``run``). Keeps its connection
    between probes; ``close`` when done."""

    def __init__(
        self,
        pipeline: str,
        entity: str,
        subscription: str | None,
        client: str | Failover | Endpoint,
        *,
        clock: Clock = SYSTEM,
        count: CountMethod = "auto",
        peek_limit: int = DEFAULT_PEEK_LIMIT,
        timeout: float = 30.0,
    ) -> None:
        """``client``: the source namespace's connection string, its ``Failover`` (resolved
        at every probe), or an ``Endpoint``. ``clock``: what the age is measured on (the
        broker's, in tests) and what ``run`` waits on."""
        self.pipeline = pipeline
        self.source = source_path(entity, subscription)
        self.path = entity if subscription is None else f"{entity}/Subscriptions/{subscription}"
        self.client = client
        self.clock = clock
        self.count = count
        self.peek_limit = max(1, peek_limit)
        self.timeout = timeout
        self.last: RecoveryPoint | None = None
        self._namespace: AmqpSource | None = None
        self._connection_string: str | None = None
        self._management: Management | None = None
        self._no_manage = False
        self._failing = False

    def __repr__(self) -> str:
        return f"RecoveryPointProbe({self.pipeline!r}, {self.source!r})"

    async def measure(self) -> RecoveryPoint:
        """Peeks the source now (and asks its counts); ``SourceError`` or ``OSError`` when
        the namespace cannot be reached (the connection is then opened afresh next time)."""
        try:
            return await self._measure()
        except BaseException:
            await self._drop_connection()
            raise

    async def _measure(self) -> RecoveryPoint:
        management, endpoint = await self._open()
        counts = None
        if self.count == "management" or (self.count == "auto" and not self._no_manage):
            try:
                counts = await entity_counts(endpoint, self.path, timeout=self.timeout)
            except CountsRefused as exc:
                if self.count == "management" or not exc.no_manage_right:
                    raise SourceError(f"{self.source}: {exc}") from exc
                self._no_manage = True
                log.warning(
                    "%s: the connection to %s has no Manage right, so its messages are "
                    "counted by peeking, up to %d (%s)",
                    self.pipeline,
                    self.source,
                    self.peek_limit,
                    exc,
                )
        limit = HEAD_PAGE if counts is not None else self.peek_limit
        heads = await management.peek_heads(self.path, limit)
        now = now_ms(self.clock)
        waiting = [h for h in heads if h.state != SCHEDULED and not h.expired(now)]
        stamps = [h.enqueued_ms for h in waiting if h.enqueued_ms is not None]
        seconds = max(0.0, self.clock.time() - min(stamps) / 1000) if stamps else 0.0
        if counts is not None:
            # the counts trail the entity a little: never fewer than the peek saw
            return RecoveryPoint(seconds, max(counts.active, len(waiting)), False, "management")
        return RecoveryPoint(seconds, len(waiting), len(heads) >= limit, "peek")

    async def record(self) -> RecoveryPoint | None:
        """Measures and sets the gauges; a probe that fails is logged (once until one
        succeeds again) and leaves them as they were: the last known recovery point (a
        namespace that cannot be reached is the failover's business, and its alert's)."""
        try:
            point = await self.measure()
        except Exception as exc:  # a probe never stops what it runs beside (a pump, a host)
            if not self._failing:
                log.warning(
                    "%s: cannot probe %s (%s); the RPO shown is the last measured",
                    self.pipeline,
                    self.source,
                    exc,
                )
            self._failing = True
            failover = self._failover()
            if failover is not None:
                await failover.report_failure(exc)
            return None
        if self._failing:
            log.info("%s: probing %s again", self.pipeline, self.source)
        self._failing = False
        failover = self._failover()
        if failover is not None:
            failover.report_success()
        metrics.RPO_SECONDS.labels(self.pipeline, self.source).set(point.seconds)
        metrics.RPO_MESSAGES.labels(self.pipeline, self.source).set(point.messages)
        self.last = point
        return point

    async def run(self, stop: asyncio.Event, schedule: Schedule) -> None:
        """Records now (even when ``stop`` is already set: a run always leaves one
        measurement), then at each occurrence of ``schedule`` on the clock, until ``stop``."""
        try:
            while True:
                await self.record()
                due = schedule.next_after(self.clock.time())
                if await wait_event(stop, due - self.clock.time(), self.clock):
                    return
        finally:
            await self.close()

    async def close(self) -> None:
        await self._drop_connection()

    # ------------------------------------------------------------------ the connection

    def _failover(self) -> Failover | None:
        return None if isinstance(self.client, str | Endpoint) else self.client

    async def _open(self) -> tuple[Management, Endpoint]:
        """The management client on the namespace the source resolves to now (a new one
        after a failover switch, or when the connection was lost)."""
        client = self.client
        if isinstance(client, Endpoint):
            connection_string = client.namespace
        elif isinstance(client, str):
            connection_string = client
        else:
            connection_string = await client.connection_string()
        if connection_string != self._connection_string:
            await self._drop_connection()
        if self._namespace is None:
            endpoint = (
                client
                if isinstance(client, Endpoint)
                else Endpoint.from_connection_string(connection_string, clock=self.clock)
            )
            self._namespace = AmqpSource(endpoint, timeout=self.timeout)
            self._connection_string = connection_string
        connection = await self._namespace.connection()
        if self._management is None or self._management.connection is not connection:
            self._management = Management(connection)
        return self._management, self._namespace.endpoint

    async def _drop_connection(self) -> None:
        namespace, self._namespace, self._management = self._namespace, None, None
        self._connection_string = None
        if namespace is not None:
            try:
                await namespace.close()
            except Exception as exc:  # a connection already gone: nothing to close
                log.debug("%s: closing the probe's connection: %s", self.source, exc)
