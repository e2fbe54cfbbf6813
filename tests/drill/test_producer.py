"""The drill's producer on a ``ManualClock``: the schedule, what an outage does to it, and
the recovery time it leads to, all exact (a fake send: no broker, no real time)."""

from __future__ import annotations

import asyncio

import pytest

from replication.clock import ManualClock
from replication.drill.figures import Flip, compute
from replication.drill.producer import GIVE_UP_AFTER, Producer, Production
from replication.messages import Message

P, S = "primary", "secondary"


async def produce(producer: Producer, clock: ManualClock) -> Production:
    """Runs the producer to its end, moving the clock to each of its wake-ups once it sleeps
    (its sends answer at once, so a few turns of the loop take it to its next sleep)."""
    start = clock.monotonic()
    running = asyncio.create_task(producer.run(start))
    while True:
        for _ in range(5):
            await asyncio.sleep(0)
        if running.done():
            return running.result()
        wake = clock.next_wake()
        assert wake is not None, "the producer neither sleeps nor ends"
        clock.advance(wake)


async def test_messages_go_at_a_steady_rate_over_the_sessions() -> None:
    clock = ManualClock()
    sent: list[tuple[float, Message]] = []
    start = clock.monotonic()

    async def send(message: Message) -> str:
        sent.append((clock.monotonic() - start, message))
        return P

    producer = Producer("r1", send, clock, rate=4, duration=2, sessions=2)
    production = await produce(producer, clock)
    assert [at for at, _ in sent] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
    assert [m.message_id for _, m in sent] == [f"drill-r1-{n:06d}" for n in range(8)]
    assert [m.session_id for _, m in sent[:3]] == ["drill-r1-s0", "drill-r1-s1", "drill-r1-s0"]
    assert [a.elapsed for a in production.accepted] == [at for at, _ in sent]
    assert {a.namespace for a in production.accepted} == {P}
    assert production.unsent == []


async def test_an_outage_holds_the_producer_then_it_catches_up_on_the_new_namespace() -> None:
    """Sends fail from 1.0 s to 1.62 s; the one due at 1.0 s is retried every 0.05 s and
    taken at 1.65 s by the secondary, with the six that fell due meanwhile: a recovery time
    of 0.65 s after a flip at 1.0 s."""
    clock = ManualClock()
    start, started_at = clock.monotonic(), clock.time()

    async def send(message: Message) -> str:
        now = clock.monotonic() - start
        if 1.0 <= now < 1.62:
            raise ConnectionResetError("the primary went away")
        return P if now < 1.0 else S

    producer = Producer("r2", send, clock, rate=10, duration=3)
    production = await produce(producer, clock)
    by_id = {a.message_id: a for a in production.accepted}
    assert len(by_id) == 30 and production.unsent == []
    held = by_id["drill-r2-000010"]
    assert (held.namespace, held.attempts) == (S, 14)
    assert held.elapsed == pytest.approx(1.65)
    caught_up = [by_id[f"drill-r2-{n:06d}"] for n in range(11, 17)]
    assert [a.elapsed for a in caught_up] == pytest.approx([1.65] * 6)
    assert by_id["drill-r2-000017"].elapsed == pytest.approx(1.7)  # on schedule again
    figures = compute(production, Flip(1.0, started_at + 1.0), P, S, [])
    assert figures.rto == pytest.approx(0.65)
    assert figures.first_on_secondary == "drill-r2-000010"
    assert (figures.accepted_by_primary, figures.accepted_by_secondary) == (10, 20)


async def test_a_message_nobody_takes_is_given_up_after_the_end() -> None:
    clock = ManualClock()
    start = clock.monotonic()
    attempts: list[float] = []

    async def send(message: Message) -> str:
        attempts.append(clock.monotonic() - start)
        raise ConnectionRefusedError("nothing listens")

    production = await produce(Producer("r3", send, clock, rate=2, duration=0.5), clock)
    assert production.accepted == []
    assert production.unsent == ["drill-r3-000000"]
    assert attempts[-1] == pytest.approx(0.5 + GIVE_UP_AFTER, abs=0.05 + 1e-9)
