"""Per-message settlement: the generated functions settle each message through the real
``azurefunctions-extensions-bindings-servicebus`` client, against the host's Settlement
service, on a real broker. One poison message is dead-lettered alone, with its step's
reason; nothing healthy is dead-lettered or redelivered. The representative tests run over
both receive backends (a pipeline's ``backend``: our AMQP client, azure-servicebus)."""

from __future__ import annotations

import asyncio
import json
import time
import typing
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import azure.functions as func
import azurefunctions.extensions.bindings.servicebus as servicebus
import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azurefunctions.extensions.bindings.servicebus.serviceBusMessageActions import SettlementError

from replication.clock import SYSTEM, Clock, ManualClock
from replication.host.discovery import service_bus_triggers
from replication.host.trigger import TriggerRunner
from replication.host.worker import Worker
from replication.messages import Message
from replication.tasks.steps import STEPS, StepOptions, step
from replication.tasks.targets import BACKENDS
from tests.broker.conftest import BrokerHandle, make_config, receive_all
from tests.clock_steps import ticking

from .support import FAST, pipeline_app, run_app, run_until, settled, stats

pytestmark = pytest.mark.timeout(150)

SCHEMA = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
DEAD_LETTER = ServiceBusSubQueue.DEAD_LETTER
IN_DEAD_LETTER = "in/$DeadLetterQueue"
"""Read on the broker where only a count matters (an SDK receiver takes a second to open and
close)."""


def fill(broker: BrokerHandle, queue: str, count: int, bad_every: int = 25, **fields: Any) -> None:
    """``count`` JSON messages ``m0``... in batches of 10; every ``bad_every``-th is not JSON."""
    with broker.client() as client, client.get_queue_sender(queue) as sender:
        for start in range(0, count, 10):
            sender.send_messages([
                ServiceBusMessage(
                    b"not json" if n % bad_every == bad_every - 1 else json.dumps({"n": n}),
                    message_id=f"m{n}", **fields,
                )
                for n in range(start, min(start + 10, count))
            ])  # fmt: skip


def drain(broker: BrokerHandle, queue: str, sub_queue: Any = None) -> list[Any]:
    """Receives and completes everything in ``queue`` (or its dead-letter queue)."""
    return receive_all(broker, queue, sub_queue=sub_queue)


def ids(messages: list[Any]) -> list[str]:
    return [str(m.message_id) for m in messages]


def validating(extra: str = "", backend: str = "amqp") -> str:
    return f"""\
pipelines:
  - name: checked
    source: {{connection: Bus, queue: in}}
    steps:
      - validate: {{json_schema: {json.dumps(SCHEMA)}{extra}}}
    target: {{connection: Bus, queue: out}}
    backend: {backend}
"""


BAD = ["m24", "m49", "m74", "m99"]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_poison_message_is_dead_lettered_alone_with_the_steps_reason(
    broker_factory: Any, backend: str
) -> None:
    broker = broker_factory(make_config({"in": {"MaxDeliveryCount": 10}, "out": {}}))
    settings = {"Bus": broker.connection_string}
    fill(broker, "in", 100)
    app = pipeline_app(validating(backend=backend), settings)
    runners = await run_app(app, settings, until=settled(100))
    assert runners[0].options.backend == backend  # the pipeline's choice reached the trigger
    assert stats(runners) == {
        "received": 100, "completed": 96, "abandoned": 0, "dead_lettered": 4, "deferred": 0,
    }  # fmt: skip
    assert sorted(broker.message_ids("out")) == sorted(
        f"m{n}" for n in range(100) if f"m{n}" not in BAD
    )
    dead = drain(broker, "in", DEAD_LETTER)
    assert sorted(ids(dead)) == sorted(BAD)
    for message in dead:
        assert message.dead_letter_reason.startswith("validate:"), message.dead_letter_reason
        assert message.dead_letter_error_description
        assert message.delivery_count <= 1  # dead-lettered on its first delivery
    assert broker.count("in") == 0


async def test_on_error_route_sends_the_bad_ones_to_the_error_target(broker_factory: Any) -> None:
    broker = broker_factory(make_config({"in": {}, "out": {}, "errors": {}}))
    settings = {"Bus": broker.connection_string}
    text = validating(", on_error: route") + "    error_target: {connection: Bus, queue: errors}\n"
    fill(broker, "in", 50)
    runners = await run_app(pipeline_app(text, settings), settings, until=settled(50))
    assert stats(runners)["completed"] == 50 and stats(runners)["abandoned"] == 0
    errors = drain(broker, "errors")
    assert sorted(ids(errors)) == ["m24", "m49"]
    assert errors[0].application_properties[b"repl-error-step"] == b"validate"
    assert len(broker.message_ids("out")) == 48
    assert broker.count(IN_DEAD_LETTER) == 0


async def test_a_dead_letter_decision_with_an_error_target_goes_there(broker_factory: Any) -> None:
    broker = broker_factory(make_config({"in": {}, "out": {}, "errors": {}}))
    settings = {"Bus": broker.connection_string}
    text = validating() + "    error_target: {connection: Bus, queue: errors}\n"
    fill(broker, "in", 25)
    await run_app(pipeline_app(text, settings), settings, until=settled(25))
    (error,) = drain(broker, "errors")
    assert error.message_id == "m24"
    assert error.application_properties[b"DeadLetterReason"].startswith(b"validate:")
    assert len(broker.message_ids("out")) == 24
    assert broker.count(IN_DEAD_LETTER) == 0


async def test_a_router_dead_letters_the_one_message_nothing_matches(broker_factory: Any) -> None:
    broker = broker_factory(make_config({"in": {}, "eu": {}, "us": {}}))
    settings = {"Bus": broker.connection_string}
    text = """\
pipelines:
  - name: regions
    source: {connection: Bus, queue: in}
    routes:
      - {when: "region = 'eu'", target: {connection: Bus, queue: eu}}
      - {when: "region = 'us'", target: {connection: Bus, queue: us}}
    unmatched: dead-letter
"""
    with broker.client() as client, client.get_queue_sender("in") as sender:
        sender.send_messages([
            ServiceBusMessage(b"x", message_id=f"e{n}",
                              application_properties={"region": ["eu", "us", "mars"][n % 3]})
            for n in range(5)
        ])  # fmt: skip
    runners = await run_app(pipeline_app(text, settings), settings, until=settled(5))
    assert stats(runners)["dead_lettered"] == 1
    (dead,) = drain(broker, "in", DEAD_LETTER)
    assert dead.message_id == "e2" and "route" in dead.dead_letter_reason.lower()
    assert sorted(broker.message_ids("eu")) == ["e0", "e3"]
    assert sorted(broker.message_ids("us")) == ["e1", "e4"]


class NapOptions(StepOptions):
    seconds: float = 0.0


NAPS: list[float] = []
NAP_CLOCK: list[Clock] = [SYSTEM]
"""What the nap sleeps on (a test's ``ManualClock``)."""
NAPPED: list[float] = []


def _nap(options: NapOptions, context: Any) -> Any:
    """Sleeps once (the first message it sees) for ``seconds``: a batch slower than a lock."""

    def run(message: Message) -> list[Message]:
        if not NAPS:
            NAPS.append(options.seconds)
            # blocks the worker, not the host: locks are renewed
            NAP_CLOCK[0].blocking_sleep(options.seconds)
            NAPPED.append(options.seconds)
        return [message]

    return run


@pytest.fixture
def test_steps() -> Iterator[None]:
    """This file's steps, registered for one test only (the schema stays as shipped)."""
    step("test-nap", NapOptions)(_nap)
    step("test-bloat")(_bloat)
    yield
    for name in ("test-nap", "test-bloat"):
        STEPS.pop(name, None)


@pytest.mark.usefixtures("test_steps")
@pytest.mark.parametrize(
    ("sessions", "backend", "real_time"),
    [*((sessions, backend, False) for sessions in (False, True) for backend in BACKENDS),
     (False, "sdk", True)],
    ids=[*(f"{kind}-{backend}" for kind in ("queue", "sessions") for backend in BACKENDS),
         "queue-sdk-real-time"],
)  # fmt: skip
@pytest.mark.slow
async def test_a_batch_slower_than_the_lock_completes_without_redelivery(
    broker_factory: Any, sessions: bool, backend: str, real_time: bool
) -> None:
    """The function's first batch takes 12 s, the source's LockDuration is 5 s: the
    trigger keeps the locks, every message reaches the function once and arrives once.

    The broker, the trigger (its lock keeper) and the nap share a ``ManualClock``, stepped
    a second at a time (``tests.clock_steps``). One case is the real-time smoke test
    (6 s, a second past the 5 s lock: the keeper renewing on real time, and the SDK, which
    judges a message's lock by the real time, settling it after its first expiry)."""
    props = {"LockDuration": "PT5S", "MaxDeliveryCount": 3, "RequiresSession": sessions}
    # a minute ahead of the real time: the SDK judges locks by the real time, and the clock
    # stands still while the test sets up
    clock = None if real_time else ManualClock(time.time() + 60)
    config = make_config({"in": props, "out": {"RequiresSession": sessions}})
    broker = broker_factory(config, clock=clock)
    settings = {"Bus": broker.connection_string}
    nap = 6 if real_time else 12
    text = f"""\
pipelines:
  - name: slow
    source: {{connection: Bus, queue: in, sessions: {str(sessions).lower()}}}
    steps:
      - test-nap: {{seconds: {nap}}}
    target: {{connection: Bus, queue: out}}
    backend: {backend}
"""
    NAPS.clear()
    NAPPED.clear()
    fill(broker, "in", 40, bad_every=10**6, **({"session_id": "s1"} if sessions else {}))
    app = pipeline_app(text, settings)
    if clock is None:
        runners = await run_app(app, settings, until=settled(40))
    else:
        NAP_CLOCK[0] = clock
        worker = Worker()
        runners = [
            TriggerRunner(t, settings[t.connection], FAST.for_trigger(t), worker=worker,
                          clock=clock)
            for t in service_bus_triggers(app, settings)
        ]  # fmt: skip
        done = settled(40)
        finished = False

        def until(runners: list[TriggerRunner]) -> bool:
            nonlocal finished
            finished = done(runners)
            return finished

        def needs_time() -> bool:
            """The nap, and stopping (a session receiver waits for the next session on the
            broker's clock)."""
            return (bool(NAPS) and not NAPPED) or finished

        try:
            async with ticking(broker, "in", needs_time):
                await run_until(runners, worker, until, 60)
        finally:
            NAP_CLOCK[0] = SYSTEM
    assert [nap] == NAPS
    assert stats(runners)["received"] == 40  # none came twice
    assert stats(runners)["abandoned"] == 0
    assert broker.message_ids("out") == [f"m{n}" for n in range(40)]
    assert broker.count(IN_DEAD_LETTER) == 0
    deadline = time.monotonic() + 10
    while broker.count("in"):  # completed, not given back by a lock that ran out
        assert time.monotonic() < deadline, broker.message_ids("in")
        await asyncio.sleep(0.05)


@pytest.mark.usefixtures("test_steps")
@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_refused_message_holds_back_its_session_until_it_is_dead_lettered(
    broker_factory: Any, backend: str
) -> None:
    """A message its target refuses (here: too big once a step made it bigger) is
    abandoned with everything after it in its session, the session is given back, and it
    comes first again; after MaxDeliveryCount Service Bus dead-letters it, and its
    successors then follow in order. Other sessions are not held up."""
    source = {"RequiresSession": True, "MaxDeliveryCount": 3, "LockDuration": "PT5S"}
    broker = broker_factory(make_config({"in": source, "out": {"RequiresSession": True}}))
    settings = {"Bus": broker.connection_string}
    text = f"""\
pipelines:
  - name: ordered
    source: {{connection: Bus, queue: in, sessions: true}}
    steps:
      - test-bloat: {{}}
    target: {{connection: Bus, queue: out}}
    backend: {backend}
"""
    with broker.client() as client, client.get_queue_sender("in") as sender:
        for session in ("a", "b"):
            sender.send_messages([
                ServiceBusMessage(b"x", message_id=f"{session}{n}", session_id=session,
                                  application_properties={"lost": int(session == "a" and n == 3)})
                for n in range(8)
            ])  # fmt: skip
    await run_app(pipeline_app(text, settings), settings, until=lambda _: broker.count("out") >= 15)
    arrived = broker.message_ids("out")
    assert [i for i in arrived if i.startswith("a")] == ["a0", "a1", "a2", "a4", "a5", "a6", "a7"]
    assert [i for i in arrived if i.startswith("b")] == [f"b{n}" for n in range(8)]
    (dead,) = drain(broker, "in", DEAD_LETTER)
    assert dead.message_id == "a3"
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert dead.delivery_count == 3  # one per try, none for its successors' sake


def _bloat(options: StepOptions, context: Any) -> Any:
    """Makes a message with ``lost = 1`` bigger than any target takes (300 KiB)."""

    def run(message: Message) -> list[Message]:
        if message.application_properties.get("lost") == 1:
            return [message.copy(body=b"x" * 300 * 1024)]
        return [message]

    return run


# ---------------------------------------------------------------------- the actions themselves


def actions_app(queue: str, sessions: bool, seen: list[Any]) -> func.FunctionApp:
    """A function in the extension's own sample style: one message, explicit settlement."""
    app = func.FunctionApp()

    @app.service_bus_queue_trigger(
        arg_name="received", queue_name=queue, connection="Bus",
        is_sessions_enabled=sessions, auto_complete_messages=False,
    )  # fmt: skip
    def settle(
        received: servicebus.ServiceBusReceivedMessage,
        message_actions: servicebus.ServiceBusMessageActions,
    ) -> None:
        body = b"".join(received.body)
        seen.append((received.message_id, body, received.lock_token, received.delivery_count))
        if body == b"complete":
            message_actions.complete(received)
            time.sleep(0.2)  # the complete is out; the function's message is its own still
            with pytest.raises(SettlementError, match="not found"):
                message_actions.complete(received)  # settled already
        elif body == b"dead":
            message_actions.deadletter(received, "Custom", "told to")
        elif body == b"dead-reason-only":
            message_actions.deadletter(received, deadletter_reason="Reason only")
        elif body == b"dead-bare":
            message_actions.deadletter(received)
        elif body == b"defer":
            message_actions.defer(received)
        elif body == b"renew":
            message_actions.renew_message_lock(received)
            message_actions.complete(received)
        elif body == b"session":
            message_actions.set_session_state(received.session_id, b"state-1")
            until = message_actions.renew_session_lock(received.session_id)
            seen.append(("locked-until", until.ToDatetime()))
            message_actions.complete(received)
            message_actions.release_session(received.session_id)

    return app


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_dead_letter_reason_not_given_is_left_off(
    broker_factory: Any, backend: str
) -> None:
    """As the .NET SDK under Azure's host leaves off a reason or description the function
    did not give (the extension sends it unset), rather than setting it empty."""
    broker = broker_factory(make_config({"in": {}}))
    settings = {"Bus": broker.connection_string}
    seen: list[Any] = []
    with broker.client() as client, client.get_queue_sender("in") as sender:
        for body in (b"dead-reason-only", b"dead-bare"):
            sender.send_messages(ServiceBusMessage(body, message_id=body.decode()))
    await run_app(
        actions_app("in", False, seen),
        settings,
        until=lambda _: broker.count(IN_DEAD_LETTER) >= 2,
        options=replace(FAST, backend=backend),
    )
    dead = {m.message_id: m.application_properties or {} for m in drain(broker, "in", DEAD_LETTER)}
    assert dead == {
        "dead-reason-only": {b"DeadLetterReason": b"Reason only"},
        "dead-bare": {},
    }


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_extensions_actions_settle_each_message_as_told(
    broker_factory: Any, backend: str
) -> None:
    broker = broker_factory(make_config({"in": {}}))
    settings = {"Bus": broker.connection_string}
    seen: list[Any] = []
    with broker.client() as client, client.get_queue_sender("in") as sender:
        for n, what in enumerate([b"complete", b"dead", b"defer", b"renew"]):
            sender.send_messages(ServiceBusMessage(what, message_id=f"x{n}"))
    runners = await run_app(
        actions_app("in", False, seen), settings, until=lambda _: len(seen) >= 4,
        options=replace(FAST, backend=backend),
    )  # fmt: skip
    assert runners[0].stats.failed_calls == 0
    assert [(s[0], s[1]) for s in seen] == [
        ("x0", b"complete"),
        ("x1", b"dead"),
        ("x2", b"defer"),
        ("x3", b"renew"),
    ]
    # a lock token each; the first delivery, counted as the Functions host counts it (1)
    assert all(s[2] is not None and s[3] == 1 for s in seen)
    (dead,) = drain(broker, "in", DEAD_LETTER)
    assert (dead.message_id, dead.dead_letter_reason) == ("x1", "Custom")
    assert dead.dead_letter_error_description == "told to"
    with broker.client() as client, client.get_queue_receiver("in") as receiver:
        (deferred,) = receiver.peek_messages(max_message_count=5)
        assert (
            deferred.message_id == "x2" and str(deferred.state) == "ServiceBusMessageState.DEFERRED"
        )


@pytest.mark.parametrize("backend", BACKENDS)
async def test_session_state_and_lock_go_through_the_actions(
    broker_factory: Any, backend: str
) -> None:
    broker = broker_factory(make_config({"in": {"RequiresSession": True}}))
    settings = {"Bus": broker.connection_string}
    seen: list[Any] = []
    with broker.client() as client, client.get_queue_sender("in") as sender:
        sender.send_messages(ServiceBusMessage(b"session", message_id="s0", session_id="s"))
    await run_app(actions_app("in", True, seen), settings, until=lambda _: len(seen) >= 2,
                  options=replace(FAST, backend=backend))  # fmt: skip
    assert seen[1][0] == "locked-until" and seen[1][1].timestamp() > time.time()
    with broker.client() as client, client.get_queue_receiver("in", session_id="s") as receiver:
        assert receiver.session.get_state() == b"state-1"
        assert receiver.receive_messages(max_wait_time=1) == []


def test_options_come_from_host_json() -> None:
    from replication.host.trigger import HostOptions

    service_bus = {"maxAutoLockRenewalDuration": "00:10:00", "autoCompleteMessages": False}
    options = HostOptions.from_host_json({"extensions": {"serviceBus": service_bus}})
    assert options.max_auto_lock_renewal_duration == 600.0
    assert options.auto_complete_messages is False
    assert FAST.max_message_batch_size == 10


def test_the_generated_functions_take_the_sdk_types() -> None:
    from replication.host.discovery import service_bus_triggers

    text = validating()
    app = pipeline_app(text, {})
    (trigger,) = service_bus_triggers(app, {"Bus": "x"})
    # a plain source: the host completes what the function did not settle itself
    assert trigger.auto_complete is True
    sessions = pipeline_app(text.replace("queue: in}", "queue: in, sessions: true}"), {})
    (trigger_of_sessions,) = service_bus_triggers(sessions, {"Bus": "x"})
    assert trigger_of_sessions.auto_complete is False  # held-back messages stay unsettled
    assert trigger.settlement_arg == "message_actions"
    assert trigger.annotation == typing.List[servicebus.ServiceBusReceivedMessage]  # noqa: UP006
    hints = typing.get_type_hints(trigger.function)
    assert set(hints) == {"messages", "message_actions", "return"}


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_classic_function_still_gets_its_batch_settled_as_a_whole(
    broker_factory: Any, backend: str
) -> None:
    """``azure.functions.ServiceBusMessage`` and autoCompleteMessages (no SDK types): the
    host completes the batch when the function returns and abandons it when it raises."""
    broker = broker_factory(make_config({"in": {"MaxDeliveryCount": 2}}))
    settings = {"Bus": broker.connection_string}
    seen: list[tuple[str, int]] = []
    app = func.FunctionApp()

    @app.service_bus_queue_trigger(
        arg_name="batch", queue_name="in", connection="Bus", cardinality="many"
    )
    def classic(batch: list[func.ServiceBusMessage]) -> None:
        seen.extend((str(m.message_id), int(m.delivery_count or 0)) for m in batch)
        if any(m.get_body() == b"boom" for m in batch):
            raise RuntimeError("boom")

    sent: list[bytes] = []

    def send(body: bytes) -> None:
        with broker.client() as client, client.get_queue_sender("in") as sender:
            sender.send_messages([ServiceBusMessage(body, message_id=body.decode())])
        sent.append(body)

    def boom_after_ok(runners: list[Any]) -> bool:
        if runners[0].stats.completed == 1 and b"boom" not in sent:  # once, however slow
            send(b"boom")
        return runners[0].stats.abandoned >= 2

    send(b"ok")
    runners = await run_app(app, settings, until=boom_after_ok,
                            options=replace(FAST, backend=backend))  # fmt: skip
    assert seen == [("ok", 1), ("boom", 1), ("boom", 2)]  # as Azure's host counts them
    assert runners[0].stats.failed_calls == 2 and runners[0].stats.completed == 1
    (dead,) = drain(broker, "in", DEAD_LETTER)
    assert dead.message_id == "boom" and dead.dead_letter_reason == "MaxDeliveryCountExceeded"
