"""One drill from start to report: the timeline.

1. The namespaces start (embedded brokers, the alias or file naming the primary), the
   pipeline's replication starts, the producer resolves its namespace once.
2. ``t = 0``: the producer starts; at ``flip_after`` the flip (or kill + flip) happens,
   timed once it is done; at ``duration`` the producer makes no new message.
3. Settling: the secondary is read until it holds every message the primary accepted, or
   gains nothing for ``QUIET`` seconds, or ``settle`` seconds passed.
4. The replication stops (its batch in flight finished), the secondary is read once more,
   and the figures are computed from that and the producer's accepts.

Time is the ``clock``'s: the producer's schedule, the moment of the flip, the waits while
settling, and the failover's re-checks.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..clock import SYSTEM, Clock
from ..host.embedded import Entities
from ..messages import Message
from ..pipeline import PipelineConfigError, load_pipelines
from ..pipeline.model import Pipeline
from ..tasks.targets import SenderPool, Target
from .figures import Figures, Flip, compute
from .inventory import Copy, read_copies
from .namespaces import EmbeddedNamespaces, GivenNamespaces, Namespaces
from .options import DrillError, DrillOptions
from .producer import Producer, Production, id_prefix, session_id
from .replicator import Replicator, check_pipeline

log = logging.getLogger("replication.drill")

SESSIONS = 4
"""Sessions the producer spreads its messages over, for a source that requires sessions."""
POLL = 0.5
"""Seconds between reads of the secondary while settling."""
QUIET = 2.0
"""Seconds without a new message at the secondary after which settling ends."""


@dataclass(frozen=True, slots=True)
class DrillResult:
    options: DrillOptions
    run_id: str
    pipeline: str
    entity: str
    failover_source: str
    primary: str
    """The primary's namespace host (as the failover source names it)."""
    secondary: str
    started_at: float
    """Wall time of ``t = 0``."""
    flip: Flip
    production: Production
    """What the producer was told: each accept (which namespace, when), what it gave up on."""
    figures: Figures


def load_pipeline(options: DrillOptions) -> Pipeline:
    try:
        pipeline = load_pipelines(options.pipelines_file).get(options.pipeline)
    except (PipelineConfigError, KeyError, OSError) as exc:
        raise DrillError(f"{options.pipelines_file}: {exc}") from exc
    check_pipeline(pipeline)
    return pipeline


def broker_config(pipeline: Pipeline) -> dict[str, Any]:
    """The embedded namespaces' Config.json: the pipeline's queue, as ``start`` makes it
    (duplicate detection on), the same on both (a failover set is structurally identical)."""
    entities = Entities()
    source = pipeline.sources[0]
    assert pipeline.target is not None
    entities.add(source, source.sessions)
    entities.add(pipeline.target, source.sessions)
    return entities.config()


async def run_drill(
    options: DrillOptions, clock: Clock = SYSTEM, run_id: str | None = None
) -> DrillResult:
    options.check()
    pipeline = load_pipeline(options)
    run_id = run_id or uuid.uuid4().hex[:8]
    async with AsyncExitStack() as stack:
        namespaces: Namespaces
        if options.embedded:
            folder = options.data_dir
            if folder is None:
                folder = Path(tempfile.mkdtemp(prefix="replication-drill-"))
                stack.callback(shutil.rmtree, folder, True)
            embedded = EmbeddedNamespaces(
                folder, broker_config(pipeline), options.via, options.dns_ttl
            )
            namespaces = await embedded.start()
        else:
            namespaces = await GivenNamespaces(options).start(clock)
        stack.push_async_callback(namespaces.close)
        return await _drill(options, pipeline, namespaces, clock, run_id, stack)


async def _drill(
    options: DrillOptions,
    pipeline: Pipeline,
    namespaces: Namespaces,
    clock: Clock,
    run_id: str,
    stack: AsyncExitStack,
) -> DrillResult:
    source = pipeline.sources[0]
    entity = source.entity
    failover = namespaces.failover(options, clock)
    await failover.connection_string()  # resolved before t = 0: the drill times the flip
    pool = SenderPool({None: Target(namespaces.primary_connection, entity, failover)})
    stack.push_async_callback(pool.close)
    replicator = None
    if options.replicate:
        replicator = Replicator(
            pipeline, namespaces.primary_connection, namespaces.secondary_connection, clock
        )
        stack.push_async_callback(replicator.close)
        replicator.start()

    async def send(message: Message) -> str:
        async with pool(None) as sender:
            await sender.send_messages([message])
            return str(sender.accepted_by)

    sessions = SESSIONS if source.sessions else 0
    producer = Producer(
        run_id, send, clock, rate=options.rate, duration=options.duration, sessions=sessions
    )
    session_ids: list[str | None] = [session_id(run_id, k) for k in range(sessions)]

    async def secondary_copies() -> list[Copy]:
        connection = namespaces.secondary_connection
        return await read_copies(connection, entity, id_prefix(run_id), session_ids or [None])

    start, started_at = clock.monotonic(), clock.time()
    flipping = asyncio.create_task(_flip_at(namespaces, options, clock, start))
    try:
        production = await producer.run(start)
        flip = await flipping
    finally:
        flipping.cancel()
    primary = namespaces.primary_host
    expected = {a.message_id for a in production.accepted if a.namespace == primary}
    await _settle(secondary_copies, expected, options.settle, clock)
    if replicator is not None:
        await replicator.close()
    copies = await secondary_copies()
    figures = compute(production, flip, namespaces.primary_host, namespaces.secondary_host, copies)
    return DrillResult(
        options,
        run_id,
        pipeline.name,
        entity,
        namespaces.describe(),
        namespaces.primary_host,
        namespaces.secondary_host,
        started_at,
        flip,
        production,
        figures,
    )


async def _flip_at(
    namespaces: Namespaces, options: DrillOptions, clock: Clock, start: float
) -> Flip:
    """At ``flip_after``: the kill (timed as the signal goes) and the flip, or the flip alone
    (timed once done: a command that flips a real alias takes a while)."""
    wait = start + options.flip_after - clock.monotonic()
    if wait > 0:
        await clock.sleep(wait)
    if options.mode == "kill":
        moment = Flip(clock.monotonic() - start, clock.time())
        await namespaces.kill_primary()
        await namespaces.flip()
    else:
        await namespaces.flip()
        moment = Flip(clock.monotonic() - start, clock.time())
    log.info("drill: %s at %.3f s", options.mode, moment.elapsed)
    return moment


async def _settle(
    read: Callable[[], Awaitable[list[Copy]]], expected: set[str], limit: float, clock: Clock
) -> None:
    """Until the secondary holds ``expected`` (what the primary took), gains nothing for
    ``QUIET`` seconds, or ``limit`` seconds passed."""
    began = quiet_since = clock.monotonic()
    held = -1
    while clock.monotonic() - began < limit:
        copies = await read()
        if expected <= {c.message_id for c in copies}:
            return
        if len(copies) != held:
            held, quiet_since = len(copies), clock.monotonic()
        elif clock.monotonic() - quiet_since >= QUIET:
            return
        await clock.sleep(POLL)
