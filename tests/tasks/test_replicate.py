"""Replicate and merge end to end: real brokers, the real SDK, the task library's pump.

Each test starts the pump on the test's event loop against one or two embedded brokers
(two brokers = two namespaces), feeds the source with the SDK, and checks the target:
identity and properties kept, the stamp right, per-session order under concurrency,
multi-hop stamping, no loop in an active/active mirror, and at-least-once when sends fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient

from replication.servicebus.connection_string import namespace_of
from replication.tasks.pump import PumpStats, Source, pump
from replication.tasks.stamping import ENQUEUE_TIME, SEQUENCE, iso_utc
from replication.tasks.targets import BACKENDS, SendBackend, SenderPool, Target
from replication.tasks.task import PATH, ReplicationTask
from tests.broker.conftest import BrokerHandle, make_config, receive_all, take_all

pytestmark = pytest.mark.timeout(180)

send_backend: SendBackend = "amqp"
"""The pool's send backend; every test here runs over both (``over_both_send_backends``)."""


@pytest.fixture(autouse=True, params=BACKENDS)
def over_both_send_backends(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.modules[__name__], "send_backend", request.param)


CONFIG = make_config({
    "src": {}, "dst": {}, "hop2": {}, "hop3": {},
    "s-src": {"RequiresSession": True}, "s-dst": {"RequiresSession": True},
    "fragile": {"MaxDeliveryCount": 2, "LockDuration": "PT5S"},
})  # fmt: skip


@contextlib.asynccontextmanager
async def running(
    task: ReplicationTask,
    connection_string: str,
    source: Source,
    targets: dict[str | None, Target],
    **options: Any,
) -> AsyncIterator[PumpStats]:
    """Runs the pump in the background while the block runs; stops and closes after."""
    stop = asyncio.Event()
    stats = PumpStats()
    pool = SenderPool(targets, backend=send_backend)
    client = ServiceBusClient.from_connection_string(connection_string)
    job = asyncio.create_task(pump(task, client, source, pool, stop, stats=stats, **options))
    try:
        yield stats
    finally:
        stop.set()
        await asyncio.wait_for(job, 30)
        await pool.close()
        await client.close()


def send(broker: BrokerHandle, queue: str, messages: list[ServiceBusMessage]) -> None:
    with broker.client() as client, client.get_queue_sender(queue) as sender:
        for start in range(0, len(messages), 100):
            sender.send_messages(messages[start : start + 100])


async def wait_until(predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


@pytest.mark.broker_config(CONFIG)
async def test_replicate_keeps_identity_and_stamps(broker: BrokerHandle) -> None:
    sent = ServiceBusMessage(
        b"\x00payload\xff", message_id="m-1", correlation_id="c-1", subject="orders",
        content_type="application/octet-stream", reply_to="replies", to="someone",
        time_to_live=timedelta(hours=1), partition_key="pk",
        application_properties={"region": "eu", "count": 7, "ratio": 0.5, "ok": True},
    )  # fmt: skip
    send(broker, "src", [sent])
    with broker.client() as client, client.get_queue_receiver("src") as receiver:
        (source_view,) = receiver.peek_messages(max_message_count=1)
    task = ReplicationTask("copy")
    targets = {None: Target(broker.connection_string, "dst")}
    async with running(task, broker.connection_string, Source("src"), targets) as stats:
        await wait_until(lambda: stats.completed == 1)
    (copy,) = receive_all(broker, "dst")
    assert broker.count("src") == 0
    assert b"".join(copy.body) == b"\x00payload\xff"
    assert (copy.message_id, copy.correlation_id, copy.subject) == ("m-1", "c-1", "orders")
    assert copy.content_type == "application/octet-stream"
    assert (copy.reply_to, copy.to) == ("replies", "someone")
    assert copy.partition_key == "pk"
    assert copy.time_to_live == timedelta(hours=1)
    props = {k.decode(): v for k, v in copy.application_properties.items()}
    assert props["region"] == b"eu" and props["count"] == 7 and props["ratio"] == 0.5
    assert props["ok"] is True
    assert props[ENQUEUE_TIME] == iso_utc(source_view.enqueued_time_utc).encode()
    assert props[SEQUENCE] == str(source_view.sequence_number).encode()


@pytest.mark.broker_config(CONFIG)
async def test_multi_hop_stamping_appends(broker: BrokerHandle) -> None:
    send(broker, "src", [ServiceBusMessage("hop", message_id="h")])
    cs = broker.connection_string
    async with (
        running(ReplicationTask("one"), cs, Source("src"), {None: Target(cs, "hop2")}) as a,
        running(ReplicationTask("two"), cs, Source("hop2"), {None: Target(cs, "hop3")}) as b,
    ):
        await wait_until(lambda: a.completed == 1 and b.completed == 1)
    (message,) = receive_all(broker, "hop3")
    props = {k.decode(): v.decode() for k, v in message.application_properties.items()}
    times, sequences = props[ENQUEUE_TIME].split(";"), props[SEQUENCE].split(";")
    assert len(times) == len(sequences) == 2
    assert sequences == ["1", "1"]  # the first message of src, then of hop2
    assert times[0] <= times[1]


@pytest.mark.slow
@pytest.mark.broker_config(CONFIG)
async def test_sessions_keep_their_order_under_concurrency(broker: BrokerHandle) -> None:
    """20 interleaved sessions x 500 messages, 4 session workers: each session arrives in
    the order it was sent."""
    sessions, per_session = 20, 500
    messages = [
        ServiceBusMessage(f"{s}:{i}", session_id=f"s{s}", message_id=f"s{s}-{i}")
        for i in range(per_session) for s in range(sessions)
    ]  # fmt: skip
    send(broker, "s-src", messages)
    cs = broker.connection_string
    task = ReplicationTask("sessions")
    async with running(
        task,
        cs,
        Source("s-src", sessions=True),
        {None: Target(cs, "s-dst")},
        session_workers=4,
        max_batch=50,
    ) as stats:
        await wait_until(lambda: stats.completed == sessions * per_session, timeout=150)
    assert stats.abandoned == 0
    # the target's order (a session receiver gets its session's messages in it), read on the
    # broker: twenty SDK session receivers took 30 s to open, drain and close
    received: dict[str, list[int]] = defaultdict(list)
    for message_id in broker.message_ids("s-dst"):
        session, n = str(message_id).split("-")
        received[session].append(int(n))
    for s in range(sessions):
        assert received[f"s{s}"] == list(range(per_session)), f"session s{s} out of order"


async def test_active_active_mirror_does_not_loop(broker_factory: Any) -> None:
    """Two namespaces, each with a topic ``events`` and a subscription ``mirror`` that a merge
    task copies to the other namespace's topic: every message ends up once in each
    namespace (in ``local``), and nothing comes back."""
    config = make_config({}, topics={"events": {"Subscriptions": {"mirror": {}, "local": {}}}})
    east, west = broker_factory(config), broker_factory(config)
    mirrors = "events/Subscriptions/mirror"  # the merge tasks' source, in each namespace
    east_ns, west_ns = namespace_of(east.connection_string), namespace_of(west.connection_string)
    for broker, text in ((east, "from east"), (west, "from west")):
        with broker.client() as client, client.get_topic_sender("events") as sender:
            sender.send_messages(ServiceBusMessage(text, message_id=text))

    def mirror(here: BrokerHandle, there: BrokerHandle, name: str) -> Any:
        task = ReplicationTask(
            name, source_namespace=namespace_of(here.connection_string),
            target_namespaces={None: namespace_of(there.connection_string)}, loop_guard=True,
        )  # fmt: skip
        return running(
            task, here.connection_string, Source("events", "mirror"),
            {None: Target(there.connection_string, "events")},
        )  # fmt: skip

    async with mirror(east, west, "east->west") as e2w, mirror(west, east, "west->east") as w2e:
        await wait_until(lambda: e2w.completed == 2 and w2e.completed == 2)
        # each read its own message and the other's copy; a copy sent on again (a loop) was
        # sent before its source was completed, so it waits in a mirror subscription now
        assert (east.count(mirrors), west.count(mirrors)) == (0, 0)
        assert (e2w.completed, w2e.completed) == (2, 2)

    for broker, home in ((east, east_ns), (west, west_ns)):
        with (
            broker.client() as client,
            client.get_subscription_receiver("events", "local", prefetch_count=10) as r,
        ):
            got = {message.message_id: message for message in take_all(r)}
        assert sorted(got) == ["from east", "from west"]
        other = "from west" if home == east_ns else "from east"
        path = got[other].application_properties[PATH.encode()].decode()
        assert path == (west_ns if home == east_ns else east_ns)


@pytest.mark.broker_config(CONFIG)
async def test_failed_sends_abandon_until_dead_lettered(broker: BrokerHandle) -> None:
    """A target that does not exist: nothing is completed; the source's MaxDeliveryCount
    (2) dead-letters the message instead of losing it."""
    send(broker, "fragile", [ServiceBusMessage("stuck", message_id="stuck")])
    cs = broker.connection_string
    task = ReplicationTask("broken")
    async with running(task, cs, Source("fragile"), {None: Target(cs, "no-such-queue")}) as stats:
        await wait_until(lambda: broker.count("fragile/$DeadLetterQueue") == 1, timeout=90)
        assert stats.completed == 0 and stats.abandoned >= 1
    (dead,) = receive_all(broker, "fragile", sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    assert dead.message_id == "stuck"
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"


@pytest.mark.broker_config(CONFIG)
async def test_editor_steps_end_to_end(broker: BrokerHandle) -> None:
    """JSON -> Avro + gzip + AES-GCM on the way out, and back on a second hop; a message
    whose body is not JSON is dead-lettered at the source with the step's reason."""
    import base64
    import json

    from replication.tasks.registry import build_step
    from replication.tasks.steps import StepContext

    schema = {"type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "int"}, {"name": "item", "type": "string"},
    ]}  # fmt: skip
    context = StepContext(settings={"KEY": base64.b64encode(bytes(range(32))).decode()})
    out = [
        build_step("transcode", {"from": "json", "to": "avro-binary", "schema": schema,
                                 "compress": "gzip"}, context),
        build_step("encrypt", {"key_setting": "KEY", "key_id": "k1"}, context),
    ]  # fmt: skip
    back = [
        build_step("decrypt", {"keys": {"k1": "KEY"}}, context),
        build_step("transcode", {"from": "avro-binary", "to": "json", "schema": schema,
                                 "decompress": "gzip"}, context),
    ]  # fmt: skip
    orders = [{"id": i, "item": f"thing {i}"} for i in range(5)]
    send(broker, "src", [
        *(ServiceBusMessage(json.dumps(o), message_id=f"o{o['id']}") for o in orders),
        ServiceBusMessage("not json", message_id="bad"),
    ])  # fmt: skip
    cs = broker.connection_string
    async with (
        running(ReplicationTask("out", steps=out), cs, Source("src"),
                {None: Target(cs, "hop2")}) as a,
        running(ReplicationTask("back", steps=back), cs, Source("hop2"),
                {None: Target(cs, "hop3")}) as b,
    ):  # fmt: skip
        await wait_until(lambda: a.completed == 5 and a.dead_lettered == 1 and b.completed == 5)
    arrived = receive_all(broker, "hop3")
    assert [json.loads(b"".join(m.body)) for m in arrived] == orders
    assert all(m.content_type == "application/json" for m in arrived)
    (dead,) = receive_all(broker, "src", sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    assert dead.message_id == "bad"
    assert dead.dead_letter_reason.startswith("transcode: invalid JSON body")
