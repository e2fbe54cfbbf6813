"""OUR asyncio ``Client`` against a python-qpid-proton ``Container`` acting as the broker.

The broker below is a small ``MessagingHandler``: one FIFO per address, links get the address
the peer asked for, ``on_message`` enqueues (and records what proton decoded), ``on_sendable``
delivers, released/modified deliveries go back to the front. It runs in its own thread; the
test stops it through an ``EventInjector``. Our client runs on the test's event loop.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from replication.amqp import types as t
from replication.amqp.client import Client, LinkDetachedError
from replication.amqp.errors import ConnectionClosedError
from replication.amqp.message import BodyType, Header, Message, Properties
from replication.amqp.outcomes import Accepted
from replication.amqp.sasl import SaslClient

proton = pytest.importorskip("proton")

from proton import Condition, Delivery  # noqa: E402
from proton import Message as PMessage  # noqa: E402
from proton.handlers import MessagingHandler  # noqa: E402
from proton.reactor import ApplicationEvent, Container, EventInjector  # noqa: E402

HOST = "127.0.0.1"
TIMEOUT = 10
FORBIDDEN = "forbidden"


class ProtonBroker(MessagingHandler):
    """A queue-per-address broker on proton; state is touched only on the container thread,
    except for the append-only records the tests read after an outcome proves they are set."""

    def __init__(self, *, heartbeat: float | None = None) -> None:
        super().__init__(prefetch=0, auto_accept=False, auto_settle=True)
        self.queues: dict[str, collections.deque[PMessage]] = collections.defaultdict(
            collections.deque
        )
        self.senders: dict[str, list[Any]] = collections.defaultdict(list)
        self.unsettled: dict[tuple[str, Any], tuple[str, PMessage]] = {}
        self.received: list[PMessage] = []  # what proton decoded from our client
        self.received_settled: list[bool] = []
        self.outcomes: list[tuple[Any, int, Any]] = []  # (message id, state, condition)
        self.remote_containers: list[str] = []
        self.closed_connections = 0
        self.errors: list[str] = []
        self.heartbeat = heartbeat
        self.injector = EventInjector()
        self.connections: list[Any] = []
        self.container: Container | None = None
        self.acceptor: Any = None
        self.port = 0
        self.receiver_credit = 50

    # -- lifecycle, driven from the test thread through the injector

    def on_start(self, event: Any) -> None:
        event.container.selectable(self.injector)

    def on_stop_broker(self, event: Any) -> None:
        self.acceptor.close()
        self.injector.close()
        assert self.container is not None
        self.container.stop()

    def on_close_connections(self, event: Any) -> None:
        for conn in self.connections:
            if conn.state & proton.Endpoint.LOCAL_ACTIVE:
                conn.condition = Condition("amqp:connection:forced", "broker shutting down")
                conn.close()

    def on_end_sessions(self, event: Any) -> None:
        for conn in self.connections:
            session = conn.session_head(proton.Endpoint.LOCAL_ACTIVE)
            while session is not None:
                session.condition = Condition("amqp:session:errant-link", "unexpected frame")
                session.close()
                session = session.next(proton.Endpoint.LOCAL_ACTIVE)

    # -- connections and links

    def on_connection_init(self, event: Any) -> None:
        self.connections.append(event.connection)

    def on_connection_bound(self, event: Any) -> None:
        if self.heartbeat:
            event.transport.idle_timeout = self.heartbeat

    def on_connection_opened(self, event: Any) -> None:
        self.remote_containers.append(event.connection.remote_container)

    def on_connection_closed(self, event: Any) -> None:
        self.closed_connections += 1

    def on_transport_error(self, event: Any) -> None:
        self.errors.append(str(event.transport.condition))

    def on_link_opening(self, event: Any) -> None:
        # proton opens the link right after this returns, so refusals happen in on_link_opened
        link = event.link
        if link.is_sender:
            address = link.remote_source.address
            link.source.address = address
            if address != FORBIDDEN:
                self.senders[address].append(link)
        else:
            address = link.remote_target.address
            link.target.address = address
            if address != FORBIDDEN:
                link.flow(self.receiver_credit)

    def on_link_opened(self, event: Any) -> None:
        link = event.link
        address = link.source.address if link.is_sender else link.target.address
        if address == FORBIDDEN:
            link.condition = Condition("amqp:unauthorized-access", f"no access to {address}")
            link.close()

    def on_link_closing(self, event: Any) -> None:
        for links in self.senders.values():
            if event.link in links:
                links.remove(event.link)

    # -- messages

    def on_sendable(self, event: Any) -> None:
        self._deliver(event.link)

    def _deliver(self, link: Any) -> None:
        address = link.source.address
        queue = self.queues[address]
        while queue and link.credit > 0 and link.state & proton.Endpoint.LOCAL_ACTIVE:
            message = queue.popleft()
            delivery = link.send(message)
            self.unsettled[(link.name, delivery.tag)] = (address, message)

    def on_message(self, event: Any) -> None:
        link = event.receiver
        address = link.target.address
        message = event.message
        self.received.append(message)
        self.received_settled.append(event.delivery.settled)
        self.queues[address].append(message)
        if not event.delivery.settled:
            self.accept(event.delivery)
        if link.credit < self.receiver_credit // 2:
            link.flow(self.receiver_credit - link.credit)
        for sender in self.senders[address]:
            self._deliver(sender)

    def _outcome(self, event: Any) -> tuple[str, PMessage] | None:
        delivery = event.delivery
        entry = self.unsettled.pop((delivery.link.name, delivery.tag), None)
        if entry is not None:
            condition = delivery.remote.condition if delivery.remote else None
            self.outcomes.append((entry[1].id, delivery.remote_state, condition))
        return entry

    def on_accepted(self, event: Any) -> None:
        self._outcome(event)

    def on_rejected(self, event: Any) -> None:
        self._outcome(event)

    def on_released(self, event: Any) -> None:  # RELEASED and MODIFIED
        entry = self._outcome(event)
        if entry is not None:
            address, message = entry
            self.queues[address].appendleft(message)
            for sender in self.senders[address]:
                self._deliver(sender)

    # -- test-thread helpers

    def trigger(self, name: str) -> None:
        self.injector.trigger(ApplicationEvent(name))

    def seed(self, address: str, messages: list[PMessage]) -> None:
        """Queues messages before the container runs (not thread-safe afterwards)."""
        self.queues[address].extend(messages)


def _start_broker(broker: ProtonBroker) -> threading.Thread:
    container = Container(broker)
    broker.container = container
    broker.acceptor = container.listen(f"{HOST}:0")  # binds now, before run()
    broker.port = broker.acceptor._selectable.getsockname()[1]
    thread = threading.Thread(target=container.run, name="proton-broker", daemon=True)
    thread.start()
    return thread


def _stop_broker(broker: ProtonBroker, thread: threading.Thread) -> None:
    broker.trigger("stop_broker")
    thread.join(10)
    assert not thread.is_alive(), "proton broker thread did not stop"


@pytest.fixture
def broker() -> Iterator[ProtonBroker]:
    handler = ProtonBroker()
    thread = _start_broker(handler)
    try:
        yield handler
    finally:
        _stop_broker(handler, thread)
    assert not handler.errors, handler.errors


@pytest.fixture
def seeded_broker(request: pytest.FixtureRequest) -> Iterator[ProtonBroker]:
    """A broker with proton-made messages already queued (``request.param``: address -> list)."""
    handler = ProtonBroker()
    for address, messages in request.param.items():
        handler.seed(address, messages)
    thread = _start_broker(handler)
    try:
        yield handler
    finally:
        _stop_broker(handler, thread)
    assert not handler.errors, handler.errors


async def _connect(broker: ProtonBroker, sasl: str | None = "ANONYMOUS", **kw: Any) -> Client:
    return await Client.connect(
        HOST, broker.port, sasl=SaslClient(sasl) if sasl else None, timeout=TIMEOUT, **kw
    )


async def _wait_until(predicate: Any, timeout: float = TIMEOUT) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


# --------------------------------------------------------------------------------------------
# messages of ours, as proton reads them and as they come back


def our_message(i: int) -> Message:
    bodies: list[tuple[Any, BodyType]] = [
        ([f"data-{i}".encode()], BodyType.DATA),
        ([b"part-one-", f"{i}".encode()], BodyType.DATA),
        ({"n": i, "list": [1, "two", 3.0], "sym": t.symbol("v")}, BodyType.VALUE),
        (f"text-{i}", BodyType.VALUE),
        ([[i, "seq", t.int32(i), [t.symbol("nested")]]], BodyType.SEQUENCE),
    ]
    body, body_type = bodies[i % len(bodies)]
    return Message(
        body=body,
        body_type=body_type,
        header=Header(durable=i % 2 == 0, priority=t.ubyte(i % 10), ttl=t.uint(60_000 + i)),
        message_annotations={t.symbol("x-opt-seq"): i, t.symbol("x-opt-src"): "ours"},
        properties=Properties(
            message_id=[f"msg-{i}", t.ulong(i), uuid.UUID(int=i + 1), f"b{i}".encode()][i % 4],
            user_id=b"tester",
            to=f"to-{i}",
            subject=f"subject-{i}",
            reply_to=f"reply-{i}",
            correlation_id=f"corr-{i}",
            content_type=t.symbol("application/octet-stream"),
            content_encoding=t.symbol("identity"),
            absolute_expiry_time=t.timestamp(1_800_000_000_000 + i),
            creation_time=t.timestamp(1_700_000_000_000 + i),
            group_id=f"group-{i % 3}",
            group_sequence=t.uint(i),
            reply_to_group_id=f"rgroup-{i}",
        ),
        application_properties={
            "index": i,
            "int32": t.int32(-i - 1),
            "ulong": t.ulong(2**64 - 1 - i),
            "uint": t.uint(i),
            "ushort": t.ushort(i),
            "ubyte": t.ubyte(i % 256),
            "byte": t.byte(-(i % 128)),
            "short": t.short(-i),
            "double": 0.25 + i,
            "float32": t.float32(1.5),
            "bool": bool(i % 2),
            "string": f"ünïcødé-{i}",
            "symbol": t.symbol(f"s{i}"),
            "char": t.char("ß"),
            "timestamp": t.timestamp(1_600_000_000_000 + i),
            "uuid": uuid.UUID(int=2**100 + i),
            "binary": bytes([i % 256]) * 5,
            "null": None,
        },
    )


# proton's Python class for each of our marker types (what a proton app would see)
_PROTON_TYPES: dict[type, Any] = {
    t.int32: proton.int32, t.ulong: proton.ulong, t.uint: proton.uint, t.ushort: proton.ushort,
    t.ubyte: proton.ubyte, t.byte: proton.byte, t.short: proton.short, t.float32: proton.float32,
    t.symbol: proton.symbol, t.char: proton.char, t.timestamp: proton.timestamp,
}  # fmt: skip


def _plain(value: Any) -> Any:
    return bytes(value) if isinstance(value, memoryview) else value


def assert_proton_sees(ours: Message, theirs: PMessage) -> None:
    """What proton decoded from our encoding matches, type for type."""
    props = ours.properties
    assert props is not None and ours.header is not None
    assert _plain(theirs.id) == props.message_id
    if not isinstance(props.message_id, int):  # proton's Message.id hands a ulong out as int
        assert type(_plain(theirs.id)) is type(props.message_id)
    assert _plain(theirs.user_id) == props.user_id
    assert theirs.address == props.to
    assert theirs.subject == props.subject
    assert theirs.reply_to == props.reply_to
    assert theirs.correlation_id == props.correlation_id
    assert theirs.content_type == props.content_type
    assert theirs.content_encoding == props.content_encoding
    assert round(theirs.expiry_time * 1000) == props.absolute_expiry_time
    assert round(theirs.creation_time * 1000) == props.creation_time
    assert theirs.group_id == props.group_id
    assert theirs.group_sequence == props.group_sequence
    assert theirs.reply_to_group_id == props.reply_to_group_id
    assert theirs.durable == ours.header.durable
    assert theirs.priority == ours.header.priority
    assert round(theirs.ttl * 1000) == ours.header.ttl
    assert ours.application_properties is not None
    assert set(theirs.properties) == set(ours.application_properties)
    for key, value in ours.application_properties.items():
        got = _plain(theirs.properties[key])
        assert got == value, key
        expected = _PROTON_TYPES.get(type(value), type(value))
        assert type(got) is expected, (key, type(got), expected)
    assert dict(theirs.annotations) == ours.message_annotations
    assert all(type(k) is proton.symbol for k in theirs.annotations)
    if ours.body_type is BodyType.VALUE:
        assert theirs.body == ours.body and not theirs.inferred
    elif ours.body_type is BodyType.SEQUENCE:
        assert theirs.inferred and theirs.body == ours.body[0]
    else:  # data: proton's binary body, the last section when there are several
        assert theirs.inferred and _plain(theirs.body) == ours.body[-1]


def assert_same_message(sent: Message, got: Message) -> None:
    """Our message after a trip through proton: every section, every type."""
    assert got.header is not None and sent.header is not None
    assert (got.header.durable, got.header.priority, got.header.ttl) == (
        sent.header.durable, sent.header.priority, sent.header.ttl,
    )  # fmt: skip
    assert got.properties == sent.properties
    for name in ("message_id", "content_type", "absolute_expiry_time", "group_sequence"):
        assert type(getattr(got.properties, name)) is type(getattr(sent.properties, name)), name
    assert got.application_properties == sent.application_properties
    assert got.application_properties is not None and sent.application_properties is not None
    for key, value in sent.application_properties.items():
        assert type(got.application_properties[key]) is type(value), key
    assert got.message_annotations == sent.message_annotations
    assert got.body_type is sent.body_type
    assert got.body == sent.body


# --------------------------------------------------------------------------------------------
# tests


async def test_stop_credit_with_a_peer_that_does_not_answer(broker: ProtonBroker):
    """``stop_credit`` (what our Service Bus receiver does before it closes) takes the credit
    back and waits for the peer's answer. proton answers neither the drain nor the echo
    (Service Bus and our broker do): the wait ends at its timeout, the link stays usable,
    and a message queued after it is not sent."""
    client = await _connect(broker)
    try:
        sender = await client.sender("quiet")
        receiver = await client.receiver("quiet", credit=10)
        await sender.send(Message.from_bytes(b"first"))
        assert (await receiver.receive(TIMEOUT)).message.data == b"first"
        await receiver.stop_credit(timeout=0.5)
        assert receiver.link.drain and receiver.link.link_credit == 0  # no answer came
        await sender.send(Message.from_bytes(b"late"))
        with pytest.raises(TimeoutError, match=r"no message within 0\.3 s"):
            await receiver.receive(0.3)
        await receiver.close()
        assert receiver.detached.done()
    finally:
        await client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sasl", ["ANONYMOUS", None], ids=["sasl-anonymous", "no-sasl"])
async def test_send_accepted_and_receive_back_intact(broker: ProtonBroker, sasl: str | None):
    client = await _connect(broker, sasl, container_id="our-client")
    try:
        sender = await client.sender("rich")
        sent = [our_message(i) for i in range(40)]
        for message in sent:
            outcome = await sender.send(message)
            assert isinstance(outcome, Accepted)
        assert broker.remote_containers == ["our-client"]
        assert len(broker.received) == len(sent)
        for ours, theirs in zip(sent, broker.received, strict=True):
            assert_proton_sees(ours, theirs)
        receiver = await client.receiver("rich", credit=10)
        for message in sent:
            item = await receiver.receive(TIMEOUT)
            item.accept()
            if message.body_type is BodyType.DATA and len(message.body) > 1:
                # proton's Message keeps one body section (the last data section); the rest
                # of such a message must still be exact
                assert item.message.data == message.body[-1]
                item.message.body = message.body
            assert_same_message(message, item.message)
        await _wait_until(lambda: len(broker.outcomes) == len(sent))
        assert {state for _, state, _ in broker.outcomes} == {Delivery.ACCEPTED}
        await sender.close()
        await receiver.close()
    finally:
        await client.close()
    assert client.driver.closed.is_set()
    await _wait_until(lambda: broker.closed_connections == 1)


_SEEDED = [
    PMessage(
        id=i,
        body={"proton": i, "list": [proton.int32(1), proton.symbol("s")]},
        subject=f"from-proton-{i}",
        correlation_id=uuid.UUID(int=i),
        content_type="application/json",
        creation_time=1_700_000_000.5,
        priority=3,
        durable=True,
        ttl=12.5,
        properties={
            "int32": proton.int32(i),
            "ulong": proton.ulong(i),
            "symbol": proton.symbol("x"),
            "timestamp": proton.timestamp(1_234_567_890_123),
            "uuid": uuid.UUID(int=7),
            "binary": b"\x00\x01",
            "char": proton.char("z"),
            "float32": proton.float32(2.5),
            "short": proton.short(-2),
            "ubyte": proton.ubyte(9),
            "long": 2**50,
            "string": "s",
        },
        annotations={proton.symbol("x-opt-proton"): proton.ulong(i)},
    )
    for i in range(120)
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seeded_broker", [{"seeded": _SEEDED}], indirect=True)
@pytest.mark.parametrize("credit", [1, 3, 200])
async def test_receive_proton_encoded_messages_in_order(seeded_broker: ProtonBroker, credit: int):
    client = await _connect(seeded_broker)
    try:
        receiver = await client.receiver("seeded", credit=credit)
        for i, _ in enumerate(_SEEDED):
            item = await receiver.receive(TIMEOUT)
            item.accept()
            message = item.message
            assert receiver.link.link_credit <= credit
            assert message.body_type is BodyType.VALUE
            assert message.body == {"proton": i, "list": [1, "s"]}
            assert type(message.body["list"][0]) is t.int32
            assert type(message.body["list"][1]) is t.symbol
            props = message.properties
            assert props is not None and message.header is not None
            assert props.message_id == i and type(props.message_id) is t.ulong
            assert props.subject == f"from-proton-{i}"
            assert props.correlation_id == uuid.UUID(int=i)
            assert props.content_type == "application/json"
            assert props.creation_time == 1_700_000_000_500
            assert message.header.priority == 3 and message.header.durable
            assert message.header.ttl == 12_500
            app = message.application_properties
            assert app == {
                "int32": i, "ulong": i, "symbol": "x", "timestamp": 1_234_567_890_123,
                "uuid": uuid.UUID(int=7), "binary": b"\x00\x01", "char": "z", "float32": 2.5,
                "short": -2, "ubyte": 9, "long": 2**50, "string": "s",
            }  # fmt: skip
            kinds = {k: type(v) for k, v in app.items()}
            assert kinds == {
                "int32": t.int32, "ulong": t.ulong, "symbol": t.symbol,
                "timestamp": t.timestamp, "uuid": uuid.UUID, "binary": bytes, "char": t.char,
                "float32": t.float32, "short": t.short, "ubyte": t.ubyte, "long": int,
                "string": str,
            }  # fmt: skip
            assert message.message_annotations == {"x-opt-proton": i}
        with pytest.raises(TimeoutError, match=r"no message within 0\.3 s"):
            await receiver.receive(0.3)
        await _wait_until(lambda: len(seeded_broker.outcomes) == len(_SEEDED))
        assert [mid for mid, _, _ in seeded_broker.outcomes] == list(range(len(_SEEDED)))
    finally:
        await client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [1 << 20, 3 * (1 << 20) + 5])
async def test_large_messages_both_ways(broker: ProtonBroker, size: int):
    client = await _connect(broker)
    try:
        conn = client.driver.connection
        # proton's frames are 32 KiB and ours 256 KiB: both directions split the message
        assert conn.remote_max_frame_size * 2 < size
        assert conn.max_frame_size * 2 < size
        sender = await client.sender("large")
        receiver = await client.receiver("large", credit=2)
        payloads = [bytes(range(256)) * (size // 256) + b"end", b"\xa5" * size]
        for n, payload in enumerate(payloads):
            outcome = await sender.send(
                Message.from_bytes(payload, properties=Properties(message_id=f"big-{n}"))
            )
            assert isinstance(outcome, Accepted)
            assert _plain(broker.received[n].body) == payload
        for n, payload in enumerate(payloads):
            item = await receiver.receive(TIMEOUT)
            item.accept()
            assert item.message.properties is not None
            assert item.message.properties.message_id == f"big-{n}"
            assert item.message.data == payload
    finally:
        await client.close()


@pytest.mark.timeout(60)
async def test_release_reject_modify_outcomes_reach_proton(broker: ProtonBroker):
    client = await _connect(broker)
    try:
        sender = await client.sender("outcomes")
        receiver = await client.receiver("outcomes", credit=1)
        await sender.send(Message.from_bytes(b"a", properties=Properties(message_id="a")))

        item = await receiver.receive(TIMEOUT)
        assert item.message.data == b"a"
        item.release()
        item = await receiver.receive(TIMEOUT)  # the broker put it back in front
        assert item.message.data == b"a"
        item.modify(delivery_failed=True)
        item = await receiver.receive(TIMEOUT)
        assert item.message.data == b"a"
        item.reject("amqp:precondition-failed", "not today")
        with pytest.raises(TimeoutError, match=r"no message within 0\.3 s"):
            await receiver.receive(0.3)
        await _wait_until(lambda: len(broker.outcomes) == 3)
        states = [state for _, state, _ in broker.outcomes]
        assert states == [Delivery.RELEASED, Delivery.MODIFIED, Delivery.REJECTED]
        condition = broker.outcomes[-1][2]
        assert condition is not None
        assert condition.name == "amqp:precondition-failed"
        assert condition.description == "not today"
    finally:
        await client.close()


@pytest.mark.timeout(60)
async def test_presettled_sends(broker: ProtonBroker):
    client = await _connect(broker)
    try:
        sender = await client.sender("fire")
        for i in range(30):
            assert await sender.send(Message.from_bytes(b"%d" % i), settled=True) is None
        await _wait_until(lambda: len(broker.received) == 30)
        assert all(broker.received_settled)
        receiver = await client.receiver("fire", credit=5)
        got = []
        for _ in range(30):
            item = await receiver.receive(TIMEOUT)
            item.accept()
            got.append(item.message.data)
        assert got == [b"%d" % i for i in range(30)]
    finally:
        await client.close()


@pytest.mark.timeout(60)
async def test_refused_links_raise(broker: ProtonBroker):
    """Proton refuses by answering the attach (with a terminus) and detaching with an error
    right after, so the refusal surfaces at the first use of the link."""
    client = await _connect(broker)
    try:
        with pytest.raises(LinkDetachedError, match="no access to forbidden") as info:
            sender = await client.sender(FORBIDDEN)
            await asyncio.wait_for(sender.send(b"nope"), TIMEOUT)
        assert info.value.condition == "amqp:unauthorized-access"
        with pytest.raises(LinkDetachedError, match="no access to forbidden") as info:
            receiver = await client.receiver(FORBIDDEN)
            await receiver.receive(TIMEOUT)
        assert info.value.condition == "amqp:unauthorized-access"
        assert not broker.received
        # the connection and session survive a refused link
        sender = await client.sender("after-refusal")
        assert isinstance(await sender.send(b"still fine"), Accepted)
    finally:
        await client.close()


@pytest.mark.timeout(60)
async def test_sasl_plain_not_offered_fails_cleanly(broker: ProtonBroker):
    """Proton's built-in SASL server offers ANONYMOUS only: asking for PLAIN fails at once."""
    with pytest.raises(ConnectionClosedError, match="PLAIN"):
        await Client.connect(
            HOST, broker.port, sasl=SaslClient("PLAIN", username="u", password="p"),
            timeout=TIMEOUT,
        )  # fmt: skip
    # we can only drop the socket mid-SASL (there is no SASL abort frame); proton says so
    await _wait_until(lambda: len(broker.errors) == 1)
    assert "connection aborted" in broker.errors.pop()
    # and the broker is fine afterwards
    client = await _connect(broker)
    await client.close()


@pytest.mark.timeout(60)
async def test_broker_closing_the_connection_wakes_our_receiver(broker: ProtonBroker):
    client = await _connect(broker)
    try:
        receiver = await client.receiver("never", credit=5)
        waiting = asyncio.ensure_future(receiver.receive(TIMEOUT))
        await asyncio.sleep(0.1)
        broker.trigger("close_connections")
        with pytest.raises(LinkDetachedError, match="broker shutting down") as info:
            await waiting
        assert info.value.condition == "amqp:connection:forced"
        await asyncio.wait_for(client.driver.closed.wait(), TIMEOUT)
    finally:
        await client.close()


@pytest.mark.timeout(60)
async def test_a_session_ended_by_the_peer_says_why(broker: ProtonBroker):
    """The peer ends our session with an error: links waiting on it and every later attach
    fail with that error, not a bare "attach refused"."""
    client = await _connect(broker)
    try:
        receiver = await client.receiver("q", credit=5)
        broker.trigger("end_sessions")
        await asyncio.wait_for(receiver.detached, TIMEOUT)
        with pytest.raises(LinkDetachedError, match="the session ended: unexpected frame") as info:
            await client.sender("q")
        assert info.value.condition == "amqp:session:errant-link"
    finally:
        await client.close()


@pytest.mark.timeout(60)
async def test_heartbeats_both_ways():
    """Proton asks for a 1 s idle timeout (we must send empty frames); we ask for 1 s too."""
    handler = ProtonBroker(heartbeat=1.0)
    thread = _start_broker(handler)
    try:
        client = await _connect(handler, idle_timeout=1.0)
        try:
            assert client.driver.connection.remote is not None
            # proton advertises half its idle timeout, so we must beat every 250 ms
            assert 0 < client.driver.connection.remote.idle_time_out <= 1000
            await asyncio.sleep(3.0)
            assert not client.driver.closed.is_set()
            sender = await client.sender("alive")
            assert isinstance(await sender.send(b"still here"), Accepted)
        finally:
            await client.close()
    finally:
        _stop_broker(handler, thread)
    assert not handler.errors, handler.errors


@pytest.mark.timeout(60)
async def test_many_clients_concurrently(broker: ProtonBroker):
    async def worker(n: int) -> list[bytes]:
        client = await _connect(broker)
        try:
            sender = await client.sender(f"worker-{n}")
            receiver = await client.receiver(f"worker-{n}", credit=4)
            outcomes = await asyncio.gather(*(sender.send(b"%d-%d" % (n, i)) for i in range(25)))
            assert all(isinstance(o, Accepted) for o in outcomes)
            got = []
            for _ in range(25):
                item = await receiver.receive(TIMEOUT)
                item.accept()
                got.append(item.message.data)
            return got
        finally:
            await client.close()

    results = await asyncio.gather(*(worker(n) for n in range(5)))
    for n, got in enumerate(results):
        assert got == [b"%d-%d" % (n, i) for i in range(25)]
    await _wait_until(lambda: broker.closed_connections == 5)
