"""Live-connection fuzz: hostile bytes on one connection never hurt the broker or anyone else.

Each example opens a TCP connection to a running broker, does a valid handshake by hand (SASL
PLAIN, open, begin, attach a sender to ``q``), then writes what hypothesis makes of it: random
garbage, valid frames with mutated / truncated / inserted bytes, frame headers that break the
framing rules, frame bodies that do not decode, sequences of well-formed performatives with
arbitrary fields, and a consumer that answers real deliveries with arbitrary dispositions,
flows and detaches. Then it reads everything the broker says until the broker closes the
socket, parsing it with our ``FrameReader``. Checked:

* whatever the broker writes is well-formed AMQP, and every error it reports (close, end,
  detach, rejected delivery) carries a known condition, never ``amqp:internal-error``;
* a framing violation gets a close with ``amqp:connection:framing-error`` and a body that does
  not decode gets ``amqp:decode-error``, and the broker drops the socket by itself;
* the broker never hangs a connection: once the fuzzer stops writing (half-close) it closes;
* nothing raises inside the broker (no ERROR log from its handlers or from asyncio);
* a well-behaved SDK client on other connections keeps sending and receiving throughout, no
  fuzzed connection stays behind in the broker's peer table, no lock outlives its connection,
  and the queue's ready set agrees with the store.

``BROKER_FUZZ_EXAMPLES`` sets the number of examples (default 200, 1000 when ``CI`` is set).
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replication.amqp.errors import AMQPError
from replication.amqp.frames import (
    AMQP_HEADER,
    EMPTY_FRAME,
    FRAME_AMQP,
    FRAME_SASL,
    SASL_HEADER,
    Frame,
    FrameReader,
    ProtocolHeader,
    encode_frame,
)
from replication.amqp.message import Message, Properties, encode_message
from replication.amqp.outcomes import Accepted, Modified, Rejected, Released
from replication.amqp.performatives import (
    ROLE_RECEIVER,
    ROLE_SENDER,
    SASL_OK,
    Attach,
    Begin,
    Close,
    Detach,
    Disposition,
    End,
    Error,
    Flow,
    Open,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    Transfer,
)
from replication.amqp.terminus import Source, Target
from replication.broker.auth import EMULATOR_KEY, EMULATOR_RULE_NAME
from replication.broker.store import STATE_ACTIVE

from .conftest import HOST, BrokerHandle, make_config

_default_examples = "1000" if os.environ.get("CI") else "200"
MAX_EXAMPLES = int(os.environ.get("BROKER_FUZZ_EXAMPLES", _default_examples))
BROKER_MAX_FRAME_SIZE = 256 * 1024
FUZZ_QUEUE = "q"
SDK_QUEUE = "ok"
CONFIG = make_config({FUZZ_QUEUE: {}, SDK_QUEUE: {}})

FRAMING_ERROR = "amqp:connection:framing-error"
DECODE_ERROR = "amqp:decode-error"
KNOWN_CONDITIONS = frozenset({
    DECODE_ERROR, FRAMING_ERROR,
    "amqp:illegal-state", "amqp:not-allowed", "amqp:invalid-field", "amqp:not-implemented",
    "amqp:not-found", "amqp:unauthorized-access", "amqp:resource-limit-exceeded",
    "amqp:resource-locked", "amqp:precondition-failed", "amqp:connection:forced",
    "amqp:session:window-violation", "amqp:session:errant-link",
    "amqp:session:handle-in-use", "amqp:session:unattached-handle",
    "amqp:link:detach-forced", "amqp:link:transfer-limit-exceeded",
    "amqp:link:message-size-exceeded", "amqp:link:stolen",
})  # fmt: skip
"""Every condition the broker may legitimately report to a misbehaving peer (spec 2.8.15-19);
``amqp:internal-error`` is not among them: it would mean the broker failed, not the peer."""


# ---------------------------------------------------------------------------- raw client


@dataclass
class Heard:
    """What the broker sent on one connection after the handshake."""

    frames: list[Frame] = field(default_factory=list)
    headers: list[ProtocolHeader] = field(default_factory=list)
    closed_by_broker: bool = False

    def errors(self) -> list[tuple[str, str]]:
        """(performative, condition) of every error the broker reported."""
        found = []
        for frame in self.frames:
            body = frame.body
            error = getattr(body, "error", None)
            if isinstance(body, Disposition):
                error = getattr(body.state, "error", None)
            if error is not None:
                found.append((type(body).__name__, str(error.condition)))
        return found

    @property
    def close(self) -> Close | None:
        closes = [f.body for f in self.frames if isinstance(f.body, Close)]
        return closes[-1] if closes else None


class RawClient:
    """A hand-driven AMQP client on a blocking socket (frames from ``replication.amqp``)."""

    def __init__(self, port: int, timeout: float = 5.0, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:  # before connecting: the TCP window is sized from it
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect((HOST, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = FrameReader()
        self.pending: list[Any] = []
        self.eof = False

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, deadline: float) -> bool:
        """Reads once; False on EOF."""
        self.sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.reader.feed(data)
        return True

    def next(self, timeout: float = 5.0) -> Any:
        """The next header or frame (None on EOF); fails after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            item = self.reader.next()
            if item is not None:
                return item
            if self.eof or not self._fill(deadline):
                return None

    def expect(self, kind: type, timeout: float = 5.0) -> Any:
        """Reads until a frame body (or header) of ``kind``; keeps the others in ``pending``."""
        while True:
            item = self.next(timeout)
            assert item is not None, f"connection closed while waiting for {kind.__name__}"
            if kind is ProtocolHeader and isinstance(item, ProtocolHeader):
                return item
            if isinstance(item, Frame) and isinstance(item.body, kind):
                return item.body
            self.pending.append(item)

    def collect(self, kind: type, count: int, timeout: float) -> int:
        """Reads (into ``pending``) until ``count`` frames of ``kind`` or ``timeout`` s passed;
        returns how many arrived."""
        deadline = time.monotonic() + timeout
        seen = 0
        while seen < count and not self.eof:
            item = self.reader.next()
            if item is None:
                if time.monotonic() >= deadline:
                    break
                try:
                    self._fill(deadline)
                except TimeoutError:
                    break
                continue
            self.pending.append(item)
            seen += isinstance(item, Frame) and isinstance(item.body, kind)
        return seen

    def sasl_plain(self) -> None:
        """The SASL layer: PLAIN with the emulator's key."""
        self.send(SASL_HEADER)
        assert self.expect(ProtocolHeader).to_bytes() == SASL_HEADER
        mechanisms = self.expect(SaslMechanisms)
        assert "PLAIN" in [str(m) for m in mechanisms.sasl_server_mechanisms]
        response = f"\0{EMULATOR_RULE_NAME}\0{EMULATOR_KEY}".encode()
        init = SaslInit(mechanism="PLAIN", initial_response=response, hostname="localhost")
        self.send(encode_frame(0, init, frame_type=FRAME_SASL))
        assert self.expect(SaslOutcome).code == SASL_OK
        self.reader.expect_header = True

    def handshake(self) -> None:
        """SASL PLAIN (the emulator's key), then open."""
        self.sasl_plain()
        self.send(AMQP_HEADER + encode_frame(0, Open(container_id="fuzzer", hostname="localhost")))
        assert self.expect(ProtocolHeader).to_bytes() == AMQP_HEADER
        self.expect(Open)

    def begin(self, channel: int = 0, incoming_window: int = 65536) -> Begin:
        self.send(encode_frame(channel, Begin(
            remote_channel=None, next_outgoing_id=0, incoming_window=incoming_window,
            outgoing_window=65536,
        )))  # fmt: skip
        return self.expect(Begin)

    def attach_sender(self, handle: int, address: str, channel: int = 0) -> Attach:
        self.send(encode_frame(channel, Attach(
            name=f"fuzz-sender-{handle}", handle=handle, role=ROLE_SENDER,
            source=Source(address=f"fuzz-{handle}"), target=Target(address=address),
            initial_delivery_count=0,
        )))  # fmt: skip
        return self.expect(Attach)

    def read_to_end(self, timeout: float = 5.0) -> Heard:
        """Everything the broker sends until it closes the socket (fails after ``timeout``)."""
        heard = Heard()
        for item in self.pending:
            (heard.headers if isinstance(item, ProtocolHeader) else heard.frames).append(item)
        self.pending = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                item = self.reader.next()
            except AMQPError as exc:  # the broker wrote something that is not AMQP
                raise AssertionError(f"the broker sent malformed data: {exc}") from exc
            if item is not None:
                (heard.headers if isinstance(item, ProtocolHeader) else heard.frames).append(item)
                continue
            if self.eof:
                assert self.reader.buffered == 0, "the broker's last frame was cut short"
                return heard
            if time.monotonic() > deadline:
                raise AssertionError(f"the broker kept the connection open for {timeout} s")
            try:
                self._fill(deadline)
            except TimeoutError:
                continue


def fuzz_connection(port: int) -> RawClient:
    """A connection in the state every example starts from: a sender attached to ``q``."""
    client = RawClient(port)
    try:
        client.handshake()
        client.begin()
        attach = client.attach_sender(0, FUZZ_QUEUE)
        assert attach.target is not None, "the broker refused the fuzzer's sender"
        client.expect(Flow)  # the broker's credit
    except BaseException:
        client.close()
        raise
    return client


# ---------------------------------------------------------------------------- strategies

uint = st.integers(0, 0xFFFFFFFF)
small = st.integers(0, 3)
channels = st.sampled_from([0] * 12 + [1, 7, 0xFFFF])  # mostly the open session's channel
handles = st.sampled_from([0] * 6 + [1, 2, 0xFFFFFFFF])  # mostly the attached sender
delivery_ids = st.one_of(st.integers(0, 3), st.integers(0, 3), uint)
tags = st.binary(min_size=0, max_size=40)
addresses = st.sampled_from(
    [FUZZ_QUEUE, "missing", "$cbs", "q/$management", "", "q/$DeadLetterQueue"]
)
outcomes = st.sampled_from([
    None, Accepted(), Released(), Rejected(), Rejected(error=Error(condition="x:y")),
    Modified(delivery_failed=True), Modified(undeliverable_here=True),
])  # fmt: skip


@st.composite
def message_payloads(draw: Any) -> bytes:
    if draw(st.integers(0, 4)) == 0:
        return draw(st.binary(max_size=200))  # not a message at all
    message = Message.from_bytes(
        draw(st.binary(max_size=200)),
        properties=Properties(message_id=draw(st.text(max_size=20))),
        application_properties=draw(
            st.dictionaries(st.text(max_size=8), st.integers(-(2**63), 2**63 - 1), max_size=3)
        ),
    )  # fmt: skip
    return encode_message(message)


@st.composite
def performatives(draw: Any) -> bytes:
    """One well-formed frame with arbitrary field values."""
    kind = draw(st.sampled_from([
        "transfer", "transfer", "transfer", "flow", "disposition", "attach", "detach", "begin",
        "end", "close", "heartbeat",
    ]))  # fmt: skip
    channel = draw(channels)
    if kind == "heartbeat":
        return EMPTY_FRAME
    if kind == "transfer":
        rare = st.integers(0, 3).map(lambda n: n == 0)  # True one time in four
        transfer = Transfer(
            handle=draw(handles), delivery_id=draw(st.one_of(delivery_ids, st.none())),
            delivery_tag=draw(st.one_of(tags, st.none())),
            message_format=draw(st.sampled_from([None, 0, 0, 0x80013700, 1])),
            settled=draw(st.sampled_from([None, False, True])), more=draw(rare),
            aborted=draw(rare) and draw(rare), state=draw(st.one_of(st.none(), outcomes)),
        )  # fmt: skip
        return encode_frame(channel, transfer, draw(message_payloads()))
    if kind == "flow":
        body: Any = Flow(
            next_incoming_id=draw(st.one_of(st.none(), small, uint)),
            incoming_window=draw(uint), next_outgoing_id=draw(st.one_of(small, uint)),
            outgoing_window=draw(uint), handle=draw(st.one_of(st.none(), handles)),
            delivery_count=draw(st.one_of(st.none(), small, uint)),
            link_credit=draw(st.one_of(st.none(), small, uint)),
            available=draw(st.one_of(st.none(), uint)), drain=draw(st.booleans()),
            echo=draw(st.booleans()),
        )  # fmt: skip
    elif kind == "disposition":
        first = draw(st.one_of(small, uint))
        body = Disposition(
            role=draw(st.sampled_from([ROLE_SENDER, ROLE_RECEIVER])), first=first,
            last=draw(st.one_of(st.none(), st.just(first + 1 & 0xFFFFFFFF), uint)),
            settled=draw(st.booleans()), state=draw(outcomes),
        )  # fmt: skip
    elif kind == "attach":
        address = draw(addresses)
        body = Attach(
            name=draw(st.sampled_from(["fuzz-sender-0", "other", ""])), handle=draw(handles),
            role=draw(st.sampled_from([ROLE_SENDER, ROLE_RECEIVER])),
            snd_settle_mode=draw(st.integers(0, 2)), rcv_settle_mode=draw(st.integers(0, 1)),
            source=draw(st.sampled_from([None, Source(address=address)])),
            target=draw(st.sampled_from([None, Target(address=address)])),
            initial_delivery_count=draw(st.one_of(st.none(), uint)),
            max_message_size=draw(st.sampled_from([None, 0, 1, 2**64 - 1])),
        )  # fmt: skip
    elif kind == "detach":
        body = Detach(
            handle=draw(handles), closed=draw(st.booleans()),
            error=draw(st.sampled_from([None, Error(condition="amqp:internal-error")])),
        )  # fmt: skip
    elif kind == "begin":
        body = Begin(
            remote_channel=draw(st.one_of(st.none(), small)), next_outgoing_id=draw(uint),
            incoming_window=draw(uint), outgoing_window=draw(uint), handle_max=draw(uint),
        )  # fmt: skip
    elif kind == "end":
        body = End(error=draw(st.sampled_from([None, Error(condition="x:y", description="d")])))
    else:
        body = Close(error=draw(st.sampled_from([None, Error(condition="x:y")])))
    return encode_frame(channel, body)


@st.composite
def mutated(draw: Any, frames: st.SearchStrategy[bytes]) -> bytes:
    """A valid frame with bytes overwritten, inserted, deleted, or the end cut off."""
    data = bytearray(draw(frames))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "flip", "insert", "delete", "truncate", "size"]))
        position = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[position] = draw(st.integers(0, 255))
        elif op == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and data:
            del data[position : position + draw(st.integers(1, 8))]
        elif op == "truncate":
            del data[position:]
        elif op == "size" and len(data) >= 4:
            struct.pack_into(">I", data, 0, draw(st.integers(0, len(data) + 16)))
    return bytes(data)


@st.composite
def framing_violations(draw: Any) -> bytes:
    """A frame header the framing rules forbid (spec 2.3.1); the body is irrelevant."""
    rule = draw(st.sampled_from(["short", "huge", "doff", "type"]))
    size, doff, frame_type = 8, 2, FRAME_AMQP
    if rule == "short":
        size = draw(st.integers(0, 7))
    elif rule == "huge":
        size = draw(st.integers(BROKER_MAX_FRAME_SIZE + 1, 0xFFFFFFFF))
    elif rule == "doff":
        size = draw(st.integers(8, 64))
        doff = draw(st.one_of(st.integers(0, 1), st.integers(size // 4 + 1, 255)))
    else:
        frame_type = draw(st.integers(2, 255))
    header = struct.pack(">IBBH", size, doff, frame_type, draw(channels))
    return header + draw(st.binary(max_size=64))


@st.composite
def undecodable_bodies(draw: Any) -> bytes:
    """A correctly framed AMQP frame whose body is not a described performative."""
    body = draw(st.binary(min_size=1, max_size=64).filter(lambda b: b[0] != 0x00))
    return struct.pack(">IBBH", 8 + len(body), 2, FRAME_AMQP, draw(channels)) + body


@dataclass(frozen=True)
class Case:
    kind: str
    data: bytes
    setup: bytes = b""
    """Written first; then the broker's answer is read (``deliveries`` transfers at most)."""
    deliveries: int = 0


def valid_message(n: int) -> bytes:
    return encode_message(Message.from_bytes(b"m%d" % n, properties=Properties(message_id=n)))


@st.composite
def consumer_cases(draw: Any) -> Case:
    """A consumer that misbehaves: publish a few messages, attach a receiver to ``q`` with
    some credit, read the deliveries, then answer them with arbitrary dispositions (any
    outcome, any range, settled or not), flows, detaches and broken frames."""
    published = draw(st.integers(0, 4))
    setup = bytearray()
    for n in range(published):
        setup += encode_frame(0, Transfer(
            handle=0, delivery_id=n, delivery_tag=b"p%d" % n, message_format=0, settled=False,
        ), valid_message(n))  # fmt: skip
    credit = draw(st.integers(1, 12))
    setup += encode_frame(0, Attach(
        name="fuzz-receiver", handle=1, role=ROLE_RECEIVER, source=Source(address=FUZZ_QUEUE),
        target=Target(address="fuzz-receiver"), snd_settle_mode=draw(st.integers(0, 2)),
        rcv_settle_mode=draw(st.integers(0, 1)),
    ))  # fmt: skip
    setup += encode_frame(0, Flow(
        next_incoming_id=0, incoming_window=65536, next_outgoing_id=published,
        outgoing_window=65536, handle=1, delivery_count=0, link_credit=credit,
    ))  # fmt: skip
    ids = st.integers(0, credit + 1)
    rejected = st.builds(Rejected, error=st.builds(
        Error, condition=st.sampled_from(["com.microsoft:dead-letter", "x:y"]),
        info=st.one_of(st.none(), st.dictionaries(
            st.sampled_from(["DeadLetterReason", "DeadLetterErrorDescription", "other"]),
            st.one_of(st.text(max_size=10), st.integers(0, 9), st.none()), max_size=2,
        )),
    ))  # fmt: skip
    modified = st.builds(Modified, delivery_failed=st.booleans(), undeliverable_here=st.booleans())
    answers = st.one_of(
        st.builds(
            lambda first, span, settled, state: encode_frame(
                0,
                Disposition(
                    role=ROLE_RECEIVER,
                    first=first,
                    last=None if span is None else first + span,
                    settled=settled,
                    state=state,
                ),
            ),
            ids,
            st.one_of(st.none(), st.integers(0, 4)),
            st.booleans(),
            st.one_of(outcomes, rejected, modified),
        ),
        st.builds(
            lambda credit, drain, echo: encode_frame(
                0,
                Flow(
                    next_incoming_id=credit,
                    incoming_window=65536,
                    next_outgoing_id=published,
                    outgoing_window=65536,
                    handle=1,
                    delivery_count=credit,
                    link_credit=credit,
                    drain=drain,
                    echo=echo,
                ),
            ),
            st.integers(0, 12),
            st.booleans(),
            st.booleans(),
        ),
        st.builds(lambda closed: encode_frame(0, Detach(handle=1, closed=closed)), st.booleans()),
        performatives(),
        mutated(performatives()),
    )
    data = b"".join(draw(st.lists(answers, min_size=1, max_size=6)))
    return Case("consumer", data, bytes(setup), credit)


fuzz_cases = st.one_of(
    st.builds(Case, st.just("garbage"), st.binary(min_size=1, max_size=300)),
    st.builds(Case, st.just("mutated"), mutated(performatives())),
    st.builds(
        Case, st.just("sequence"), st.lists(performatives(), min_size=1, max_size=8).map(b"".join)
    ),
    st.builds(
        Case,
        st.just("mutated-sequence"),
        st.lists(st.one_of(performatives(), mutated(performatives())), min_size=2, max_size=6).map(
            b"".join
        ),
    ),
    st.builds(Case, st.just("framing"), framing_violations()),
    st.builds(Case, st.just("decode"), undecodable_bodies()),
    consumer_cases(),
)
EXPECTED_CLOSE = {"framing": FRAMING_ERROR, "decode": DECODE_ERROR}


# ---------------------------------------------------------------------------- the test


def check_case(port: int, case: Case) -> Heard:
    client = fuzz_connection(port)
    try:
        if case.setup:
            client.send(case.setup)
            client.collect(Transfer, case.deliveries, timeout=0.3)
        client.send(case.data)
        expected = EXPECTED_CLOSE.get(case.kind)
        if expected is None:
            # the broker may rightly wait for more bytes: stop writing, it must then close
            client.sock.shutdown(socket.SHUT_WR)
        heard = client.read_to_end()
    finally:
        client.close()
    assert not heard.headers, f"a protocol header after the handshake: {heard.headers}"
    for performative, condition in heard.errors():
        assert condition in KNOWN_CONDITIONS, f"{performative} with {condition!r} for {case}"
    if expected is not None:
        assert heard.close is not None, f"no close frame for {case}"
        assert heard.close.error is not None
        assert str(heard.close.error.condition) == expected, heard.close.error
        assert isinstance(heard.frames[-1].body, Close), "frames after the close"
    return heard


def queue_state(broker: BrokerHandle, name: str) -> tuple[int, set[int], set[int]]:
    """(locks held, sequence numbers ready or held by a gone receiver's lock until it
    expires, sequence numbers stored as active) of a queue; call on the broker's loop.
    With no consumer around, the last two must agree."""
    assert broker.broker is not None
    queue = broker.broker.queues[name.lower()]
    rows = broker.broker.store.scan(queue.entity, 0, 1_000_000)
    active = {row.seq for row in rows if row.state == STATE_ACTIVE}
    held = {lock.seq for lock in queue.orphaned_locks.values()}
    return len(queue.locks), set(queue.ready) | held, active


def sdk_round_trip(sender: Any, receiver: Any, tag: str) -> None:
    """The well-behaved client: one message there and back on its long-lived links."""
    sender.send_messages(ServiceBusMessage(tag.encode(), message_id=tag))
    received = receiver.receive_messages(max_message_count=1, max_wait_time=10)
    assert [m.message_id for m in received] == [tag]


@pytest.mark.timeout(120)
def test_fuzzed_connections_never_hurt_the_broker(
    broker_factory: Callable[..., BrokerHandle], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    broker = broker_factory(CONFIG)
    client = broker.client(retry_total=0)
    sender = client.get_queue_sender(SDK_QUEUE)
    receiver = client.get_queue_receiver(
        SDK_QUEUE, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, prefetch_count=0
    )
    seen: dict[str, int] = {}
    try:
        sdk_round_trip(sender, receiver, "before")
        baseline_peers = broker.call(lambda: len(broker.broker.peers))  # type: ignore[union-attr]
        examples = [0]

        @settings(
            max_examples=MAX_EXAMPLES, deadline=None, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )  # fmt: skip
        @given(case=fuzz_cases)
        def run(case: Case) -> None:
            examples[0] += 1
            check_case(broker.port, case)
            seen[case.kind] = seen.get(case.kind, 0) + 1
            if examples[0] % 50 == 0:  # the other client keeps working throughout
                sdk_round_trip(sender, receiver, f"during-{examples[0]}")

        run()

        sdk_round_trip(sender, receiver, "after")  # the same connections, still fine
        with (
            broker.client() as fresh,
            fresh.get_queue_sender(SDK_QUEUE) as fresh_sender,
            fresh.get_queue_receiver(
                SDK_QUEUE, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
            ) as fresh_receiver,
        ):
            sdk_round_trip(fresh_sender, fresh_receiver, "fresh")
        deadline = time.monotonic() + 5
        while broker.call(lambda: len(broker.broker.peers)) > baseline_peers:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "fuzzed connections left behind in the broker"
            time.sleep(0.05)
        for name in (FUZZ_QUEUE, FUZZ_QUEUE + "/$DeadLetterQueue"):
            locks, ready, stored = broker.call(lambda name=name: queue_state(broker, name))
            assert locks == 0, f"{name}: the fuzzers' connections are gone, their locks are not"
            assert ready == stored, f"{name}: ready {sorted(ready ^ stored)[:10]} disagree"
    finally:
        receiver.close()
        sender.close()
        client.close()
    # every strategy got exercised (hypothesis mixes them; a bias would show up here)
    assert set(seen) == {
        "garbage", "mutated", "sequence", "mutated-sequence", "framing", "decode", "consumer",
    }  # fmt: skip
    failures = [
        r for r in caplog.records
        if r.levelno >= logging.ERROR and r.name.split(".")[0] in ("replication", "asyncio")
    ]  # fmt: skip
    assert not failures, "\n".join(r.getMessage() for r in failures[:5])


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("data", "condition"),
    [
        (struct.pack(">IBBH", 4, 2, 0, 0), FRAMING_ERROR),  # size below the header
        (struct.pack(">IBBH", 0x7FFFFFFF, 2, 0, 0), FRAMING_ERROR),  # over max-frame-size
        (struct.pack(">IBBH", 16, 1, 0, 0) + bytes(8), FRAMING_ERROR),  # doff below 2
        (struct.pack(">IBBH", 8, 2, 9, 0), FRAMING_ERROR),  # unknown frame type
        (encode_frame(0, None, frame_type=FRAME_SASL), FRAMING_ERROR),  # SASL after SASL
        (struct.pack(">IBBH", 10, 2, 0, 0) + b"\xa1\x00", DECODE_ERROR),  # a string, not a list
        (struct.pack(">IBBH", 9, 2, 0, 0) + b"\xff", DECODE_ERROR),  # an invalid constructor
        (encode_frame(0, Open(container_id="again")), "amqp:illegal-state"),  # open twice
        (
            encode_frame(5, Flow(incoming_window=1, next_outgoing_id=0, outgoing_window=1)),
            "amqp:not-allowed",
        ),  # a frame on a channel with no session
    ],
    ids=[
        "short",
        "huge",
        "doff",
        "type",
        "sasl",
        "string-body",
        "bad-constructor",
        "open-twice",
        "no-session",
    ],
)
def test_violation_closes_with_condition(
    broker_factory: Callable[..., BrokerHandle], data: bytes, condition: str
) -> None:
    """The examples the fuzzer must keep passing, spelled out: each gets exactly this close,
    then the broker drops the socket without waiting for the peer."""
    broker = broker_factory(CONFIG)
    client = fuzz_connection(broker.port)
    try:
        client.send(data)
        heard = client.read_to_end()
    finally:
        client.close()
    assert heard.close is not None and heard.close.error is not None
    assert str(heard.close.error.condition) == condition
    assert heard.errors() == [("Close", condition)]


@pytest.mark.timeout(60)
def test_session_and_link_errors_keep_the_connection(
    broker_factory: Callable[..., BrokerHandle],
) -> None:
    """Errors scoped to a link or a session end just that: the connection stays usable."""
    broker = broker_factory(CONFIG)
    client = fuzz_connection(broker.port)
    try:
        # a transfer without a delivery-id on a fresh delivery: detach that link
        client.send(encode_frame(0, Transfer(handle=0, delivery_tag=b"t"), b"\x00\x53\x77\x40"))
        detach = client.expect(Detach)
        assert detach.handle == 0 and str(detach.error.condition) == "amqp:invalid-field"
        client.send(encode_frame(0, Detach(handle=0, closed=True)))
        # a flow for a handle nobody attached: end the session
        client.send(encode_frame(0, Flow(
            next_incoming_id=0, incoming_window=10, next_outgoing_id=0, outgoing_window=10,
            handle=42, link_credit=1,
        )))  # fmt: skip
        end = client.expect(End)
        assert str(end.error.condition) == "amqp:session:unattached-handle"
        client.send(encode_frame(0, End()))
        # the connection still works: a new session, a new link, an accepted message
        client.begin(channel=1)
        assert client.attach_sender(0, FUZZ_QUEUE, channel=1).target is not None
        client.expect(Flow)
        payload = encode_message(Message.from_bytes(b"ok", properties=Properties(message_id="m")))
        client.send(encode_frame(1, Transfer(
            handle=0, delivery_id=0, delivery_tag=b"t0", message_format=0, settled=False,
        ), payload))  # fmt: skip
        disposition = client.expect(Disposition)
        assert disposition.settled and isinstance(disposition.state, Accepted)
        client.send(encode_frame(0, Close()))
        heard = client.read_to_end()
        assert heard.close is not None and heard.close.error is None
    finally:
        client.close()


NON_STRING_KEY = b"\x00\x53\x74\xc1\x0d\x04\xa1\x01aU\x01\xa0\x01b\xc0\x02\x01A"
"""Application properties {"a": 1, b"b": [True]}: a binary key, which the spec forbids."""


@pytest.mark.timeout(60)
def test_a_non_string_application_property_key_is_rejected_as_a_decode_error(
    broker_factory: Callable[..., BrokerHandle],
) -> None:
    """The codec fuzzer's find: such a message used to be stored, and a replicator reading it
    could not forward it. The broker rejects the transfer with ``amqp:decode-error``, naming
    the key; the link stays, and the queue holds only the next, valid message."""
    broker = broker_factory(CONFIG)
    client = fuzz_connection(broker.port)
    try:
        body = b"\x00\x53\x75\xa0\x01x"
        for delivery_id, payload in enumerate((NON_STRING_KEY + body, b"\x00\x53\x75\xa0\x01y")):
            transfer = Transfer(
                handle=0,
                delivery_id=delivery_id,
                delivery_tag=b"t%d" % delivery_id,
                message_format=0,
                settled=False,
            )
            client.send(encode_frame(0, transfer, payload))
            disposition = client.expect(Disposition)
            if delivery_id == 0:
                assert isinstance(disposition.state, Rejected)
                assert str(disposition.state.error.condition) == DECODE_ERROR
                assert "keys must be strings, got b'b'" in disposition.state.error.description
            else:
                assert isinstance(disposition.state, Accepted)
    finally:
        client.close()
    assert broker.count(FUZZ_QUEUE) == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("then", ["detach", "end", "close"])
def test_attach_withdrawn_in_the_same_write(
    broker_factory: Callable[..., BrokerHandle], caplog: pytest.LogCaptureFixture, then: str
) -> None:
    """The fuzzer's find: an attach followed at once (one read) by its detach, the session's
    end or the connection's close. The broker sees the attach only after the engine processed
    all of it, when the link is already gone; it must then not answer it (and not fail)."""
    caplog.set_level(logging.WARNING)
    broker = broker_factory(CONFIG)
    client = fuzz_connection(broker.port)
    try:
        for role, address in ((ROLE_SENDER, FUZZ_QUEUE), (ROLE_RECEIVER, FUZZ_QUEUE),
                              (ROLE_SENDER, "missing")):  # fmt: skip
            attach = Attach(
                name=f"withdrawn-{role}-{address}", handle=1, role=role,
                source=Source(address=address), target=Target(address=address),
                initial_delivery_count=0 if role == ROLE_SENDER else None,
            )  # fmt: skip
            withdraw = {
                "detach": encode_frame(0, Detach(handle=1, closed=True)),
                "end": encode_frame(0, End()),
                "close": encode_frame(0, Close()),
            }[then]
            client.send(encode_frame(0, attach) + withdraw)
            if then == "detach":
                client.expect(Detach)
            elif then == "end":
                client.expect(End)
                client.begin()
                assert client.attach_sender(0, FUZZ_QUEUE).target is not None
            else:
                client.expect(Close)
                break
        if then != "close":
            client.send(encode_frame(0, Close()))
        heard = client.read_to_end()
    finally:
        client.close()
    assert all(condition in KNOWN_CONDITIONS for _, condition in heard.errors())
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not failures, "\n".join(r.getMessage() for r in failures[:5])
    with broker.client() as client, client.get_queue_sender(FUZZ_QUEUE) as sender:
        sender.send_messages(ServiceBusMessage(b"still fine"))
