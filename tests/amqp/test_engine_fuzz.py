"""Hostile byte streams for the connection state machine.

A fresh ``Connection`` is fed (a) random bytes behind each kind of prefix and (b) the real byte
stream of a client (or server) captured from a working pair, mutated frame by frame (dropped,
repeated, swapped, edited frames) and byte by byte (bit flips, truncation, splices, huge size
fields, allocation bombs), in random chunk sizes; (c) well-typed but arbitrary performatives are
injected into one side of a live pair. Whatever arrives, ``receive_data`` must not raise (a
broken peer becomes events and a close), ``data_to_send`` must keep working and only ever produce
well-formed frames, and the whole run must stay bounded (``pytest-timeout``: a hang guard of
300 s a test, far above the CI run's 10,000 examples on a loaded machine, so only a loop that
never ends trips it).

``AMQP_FUZZ_EXAMPLES`` sets the total number of examples over the fuzz tests here (default 300,
or 10000 with ``CI`` set).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import hypothesis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replication.amqp import events as ev
from replication.amqp.connection import Connection
from replication.amqp.errors import MessageSizeExceededError
from replication.amqp.frames import AMQP_HEADER, SASL_HEADER
from replication.amqp.link import LinkState
from replication.amqp.outcomes import Accepted, Modified, Received, Rejected, Released
from replication.amqp.performatives import (
    Attach,
    Begin,
    Close,
    Detach,
    Disposition,
    End,
    Error,
    Flow,
    Open,
    Transfer,
)
from replication.amqp.sasl import SaslClient
from replication.amqp.terminus import Source, Target

from .engine_pair import PASSWORD, USER, frame_bytes, parse_wire, sasl_server

TOTAL_EXAMPLES = int(os.environ.get("AMQP_FUZZ_EXAMPLES", 10_000 if os.environ.get("CI") else 300))
SHARES = {"random": 0.15, "client_stream": 0.35, "server_stream": 0.2, "performatives": 0.3}


def fuzz_settings(share: str) -> settings:
    return settings(
        max_examples=max(1, int(TOTAL_EXAMPLES * SHARES[share])),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


pytestmark = pytest.mark.timeout(300)

MAX_FRAME = 512

# --------------------------------------------------------------------------- the peers' behaviour


def broker_react(event: Any) -> None:
    """What a broker does with an event: accept links, grant credit, answer deliveries."""
    if isinstance(event, ev.LinkAttachRequested):
        link = event.link
        if link.state is not LinkState.ATTACH_RECEIVED:
            return
        link.accept()
        if link.is_receiver:
            link.flow(20)
        else:
            for payload in (b"from the server", bytes(range(256)) * 5):  # the 2nd: many frames
                # a fuzzed attach may set a tiny max-message-size: the broker holds such
                # messages back, as a real one would, rather than crash
                with contextlib.suppress(MessageSizeExceededError):
                    link.send(payload)
    elif isinstance(event, ev.DeliveryReceived):
        event.delivery.update(Accepted())


def client_script(connection: Connection) -> None:
    """The client's own actions, replayable on a fresh client: open, session, two links, sends."""
    connection.open()
    session = connection.begin_session(incoming_window=4)
    sender = session.attach_sender("to-server", Target(address="q"))
    session.attach_receiver("from-server", Source(address="q"), credit=10)
    sender.send(b"hello")
    sender.send(b"x" * 1500)  # multi-frame at MAX_FRAME
    sender.send(b"settled", settled=True)


def client_react(event: Any) -> None:
    if isinstance(event, ev.DeliveryReceived):
        event.delivery.update(Accepted())


def react_all(connection: Connection, react: Callable[[Any], None]) -> list[Any]:
    events = connection.events()
    for event in events:
        react(event)
    return events


def new_client(sasl: bool) -> Connection:
    return Connection(
        container_id="client", max_frame_size=MAX_FRAME, idle_timeout=5.0,
        sasl=SaslClient("PLAIN", username=USER, password=PASSWORD) if sasl else None,
    )  # fmt: skip


def new_server(sasl: bool) -> Connection:
    if sasl:
        return sasl_server(max_frame_size=MAX_FRAME, idle_timeout=5.0)
    return Connection(server=True, container_id="server", max_frame_size=MAX_FRAME)


def converse(
    client: Connection,
    server: Connection,
    log: list[Any] | None = None,
    wire: tuple[bytearray, bytearray] | None = None,
) -> None:
    """Lets the two sides talk, reacting to their events, until both are quiet (bounded);
    what each writes must be well-formed frames. ``log`` collects the events of both, ``wire``
    the bytes each wrote (client, server)."""
    for _ in range(1000):
        moved = False
        for index, (this, other, react) in enumerate(
            ((client, server, broker_react), (server, client, client_react))
        ):
            data = this.data_to_send()
            if data:
                moved = True
                parse_wire(data)
                if wire is not None:
                    wire[index].extend(data)
                other.receive_data(data)
            events = react_all(other, react)
            if log is not None:
                log += events
        if not moved:
            return
    raise AssertionError("the two sides never went quiet")


def capture(sasl: bool) -> tuple[bytes, bytes]:
    """The bytes each side of a real, complete conversation wrote (client, server)."""
    client = new_client(sasl)
    server = new_server(sasl)
    wire = (bytearray(), bytearray())
    client_script(client)
    converse(client, server, wire=wire)
    assert client.is_open and server.is_open
    client.close()
    converse(client, server, wire=wire)
    assert client.is_terminated and server.is_terminated
    return bytes(wire[0]), bytes(wire[1])


STREAMS = {sasl: capture(sasl) for sasl in (False, True)}


def split_units(stream: bytes) -> list[bytes]:
    """A stream cut into its protocol headers and frames, going by their size fields (a bad
    size ends the cutting: the rest is one piece)."""
    units = []
    pos = 0
    while pos < len(stream):
        size = 8 if stream[pos : pos + 4] == b"AMQP" else int.from_bytes(stream[pos : pos + 4])
        if size < 8:
            size = len(stream) - pos
        units.append(stream[pos : pos + size])
        pos += size
    return units


def test_captured_streams_are_rich() -> None:
    for client_stream, server_stream in STREAMS.values():
        for stream in (client_stream, server_stream):
            kinds = {type(getattr(item, "body", None)) for item in parse_wire(stream)}
            assert {Open, Begin, Attach, Flow, Transfer, Disposition} <= kinds


# --------------------------------------------------------------------------- mutations

HUGE_SIZES = [0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, MAX_FRAME + 1, 7, 0, 8, 9]
BOMBS = [
    b"\xd0\xff\xff\xff\xff\xff\xff\xff\xff",  # list32 claiming 4 GiB, 4 G elements
    b"\xd1\xff\xff\xff\xf0\x00\x00\x10\x00",  # map32
    b"\xf0\x7f\xff\xff\xff\x7f\xff\xff\xff\x40",  # array32 of nulls
    b"\xb0\xff\xff\xff\xff",  # vbin32
    b"\xb1\x00\x01\x00\x00",  # str32 longer than the frame
    b"\x00" * 64,  # nested descriptors
    b"\x00\x53\x14" * 30,  # a transfer describing a transfer describing ...
]


def _resized(frame: bytes, body: bytes) -> bytes:
    """``frame`` with a new body and the size field to match (the frame stays well framed)."""
    return (8 + len(body)).to_bytes(4, "big") + frame[4:8] + body


@st.composite
def mutated_body(draw: st.DrawFn, frame: bytes) -> bytes:
    body = bytearray(frame[8:])
    pos = draw(st.integers(0, len(body)))
    edit = draw(st.sampled_from(["flip", "byte", "insert", "delete", "cut", "bomb"]))
    if edit == "flip" and pos < len(body):
        body[pos] ^= 1 << draw(st.integers(0, 7))
    elif edit == "byte" and pos < len(body):
        body[pos] = draw(st.integers(0, 255))
    elif edit == "insert":
        body[pos:pos] = draw(st.binary(min_size=1, max_size=16))
    elif edit == "delete":
        del body[pos : pos + draw(st.integers(1, 16))]
    elif edit == "cut":
        del body[pos:]
    else:
        body[pos:pos] = draw(st.sampled_from(BOMBS))
    return _resized(frame, bytes(body))


@st.composite
def mutated(draw: st.DrawFn, stream: bytes) -> bytes:
    """``stream`` after up to three frame-aware edits (drop, repeat or swap frames, edit one
    frame's body and fix its size, move it to another channel), which keep the framing valid so
    the state machines are reached, then in one case out of three a raw edit (bit flip,
    truncation, splice, huge size field, allocation bomb) that may break anything."""
    units = split_units(stream)
    handshake = next(i for i, unit in enumerate(units) if unit[8:11] == b"\x00\x53\x11") + 1
    raw = draw(st.integers(0, 2)) == 0
    for _ in range(draw(st.integers(0 if raw else 1, 3))):
        if not units:
            break
        # mostly past the handshake (header, SASL, open, begin), where the state lives
        first = 0 if draw(st.integers(0, 4)) == 0 else min(handshake, len(units) - 1)
        i = draw(st.integers(first, len(units) - 1))
        op = draw(st.sampled_from(["drop", "repeat", "swap", "body", "body", "channel"]))
        if op == "drop":
            del units[i]
        elif op == "repeat":
            units.insert(draw(st.integers(0, len(units))), units[i])
        elif op == "swap":
            j = draw(st.integers(first, len(units) - 1))
            units[i], units[j] = units[j], units[i]
        elif len(units[i]) >= 8 and units[i][:4] != b"AMQP":
            if op == "body":
                units[i] = draw(mutated_body(units[i]))
            else:
                channel = draw(st.sampled_from([1, 2, 0xFFFF]) | st.integers(0, 0xFFFF))
                units[i] = units[i][:6] + channel.to_bytes(2, "big") + units[i][8:]
    data = bytearray(b"".join(units))
    if not raw or not data:
        return bytes(data)
    pos = draw(st.integers(0, len(data) - 1))
    op = draw(st.sampled_from(["flip", "byte", "truncate", "insert", "delete", "duplicate",
                               "size", "bomb"]))  # fmt: skip
    if op == "flip":
        data[pos] ^= 1 << draw(st.integers(0, 7))
    elif op == "byte":
        data[pos] = draw(st.integers(0, 255))
    elif op == "truncate":
        del data[pos:]
    elif op == "insert":
        data[pos:pos] = draw(st.binary(min_size=1, max_size=32))
    elif op == "delete":
        del data[pos : pos + draw(st.integers(1, 64))]
    elif op == "duplicate":
        chunk = data[pos : pos + draw(st.integers(1, 256))]
        where = draw(st.integers(0, len(data)))
        data[where:where] = chunk
    elif op == "size":
        offsets = [0]
        for unit in units[:-1]:
            offsets.append(offsets[-1] + len(unit))
        at = draw(st.sampled_from(offsets))
        if at + 4 <= len(data):
            size = draw(st.sampled_from(HUGE_SIZES) | st.integers(0, 0xFFFFFFFF))
            data[at : at + 4] = size.to_bytes(4, "big")
    else:
        data[pos:pos] = draw(st.sampled_from(BOMBS))
    return bytes(data)


@st.composite
def chunked(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """``data`` cut into the pieces the socket happened to deliver: all at once, frame by frame
    (the peer reacts to each frame, as it would to a chatty client), frame by frame with frames
    split too, or at random cuts."""
    if not data:
        return []
    how = draw(st.sampled_from(["whole", "frames", "split frames", "split frames", "cuts"]))
    if how == "whole":
        return [data]
    units = split_units(data)
    if how == "frames":
        return units
    cuts = set(draw(st.lists(st.integers(1, len(data)), max_size=24)))
    if how == "split frames":
        position = 0
        for unit in units:
            position += len(unit)
            cuts.add(position)
    pieces = []
    start = 0
    for cut in [*sorted(cuts), len(data)]:
        if cut > start:
            pieces.append(data[start:cut])
            start = cut
    return pieces


def survive(connection: Connection, pieces: list[bytes], react: Callable[[Any], None]) -> list[Any]:
    """Feeds ``pieces`` one by one, reacting like a real peer; checks the engine's promises."""
    sent = bytearray()
    events: list[Any] = []
    now = 0.0
    for piece in pieces:
        connection.receive_data(piece)  # must never raise
        events += react_all(connection, react)
        sent += connection.data_to_send()
        now += 0.5
        connection.tick(now)
        sent += connection.data_to_send()
        if connection.is_terminated:
            connection.receive_data(b"\x00\x00\x00\x08\x02\x00\x00\x00")  # ignored
            assert connection.data_to_send() == b""
            assert connection.events() == []
            break
    # whatever happened, what we wrote is well-formed AMQP framing
    parse_wire(sent)
    assert sum(isinstance(e, ev.ConnectionClosed) for e in events) <= 1
    # the socket closing ends everything, at most once more reported
    connection.receive_data(b"")
    assert connection.is_terminated
    closed = [e for e in events + connection.events() if isinstance(e, ev.ConnectionClosed)]
    assert len(closed) <= 1 or all(c.by_peer for c in closed[1:])
    connection.data_to_send()
    connection.tick(now + 100.0)
    return events


def record(events: list[Any]) -> None:
    """How far each example got, for ``--hypothesis-show-statistics``."""
    closed = [e for e in events if isinstance(e, ev.ConnectionClosed)]
    for item in closed[:1]:
        hypothesis.event(f"closed: {item.error.condition if item.error else 'clean'}")
    delivered = sum(isinstance(e, ev.DeliveryReceived | ev.DeliveryUpdated) for e in events)
    hypothesis.event(f"deliveries received/updated: {'3+' if delivered > 3 else delivered}")


PREFIXES = [
    b"",
    AMQP_HEADER,
    SASL_HEADER,
    AMQP_HEADER + frame_bytes(0, Open(container_id="fuzz", max_frame_size=MAX_FRAME)),
]


@fuzz_settings("random")
@given(
    sasl=st.booleans(),
    prefix=st.sampled_from(PREFIXES),
    noise=st.binary(max_size=2048),
    data=st.data(),
)
def test_random_bytes(sasl: bool, prefix: bytes, noise: bytes, data: st.DataObject) -> None:
    server = new_server(sasl)
    record(survive(server, data.draw(chunked(prefix + noise)), broker_react))


@fuzz_settings("client_stream")
@given(sasl=st.booleans(), data=st.data())
def test_mutated_client_stream_into_a_server(sasl: bool, data: st.DataObject) -> None:
    stream = data.draw(mutated(STREAMS[sasl][0]))
    server = new_server(sasl)
    record(survive(server, data.draw(chunked(stream)), broker_react))


@fuzz_settings("server_stream")
@given(sasl=st.booleans(), data=st.data())
def test_mutated_server_stream_into_a_client(sasl: bool, data: st.DataObject) -> None:
    stream = data.draw(mutated(STREAMS[sasl][1]))
    client = new_client(sasl)
    client_script(client)
    client.data_to_send()
    record(survive(client, data.draw(chunked(stream)), client_react))


@pytest.mark.parametrize("sasl", [False, True])
def test_unmutated_streams_replay_cleanly(sasl: bool) -> None:
    """The harness itself: replaying the captured stream byte by byte ends in a clean close."""
    client_stream, server_stream = STREAMS[sasl]
    server = new_server(sasl)
    events = survive(server, [client_stream[i : i + 1] for i in range(len(client_stream))],
                     broker_react)  # fmt: skip
    (closed,) = [e for e in events if isinstance(e, ev.ConnectionClosed)]
    assert closed.error is None and closed.by_peer is True
    assert sum(isinstance(e, ev.DeliveryReceived) for e in events) == 3
    client = new_client(sasl)
    client_script(client)
    client.data_to_send()
    events = survive(client, [server_stream], client_react)
    assert sum(isinstance(e, ev.DeliveryReceived) for e in events) == 2


# --------------------------------------------------------------------------- random performatives

UINTS = st.sampled_from([0, 1, 2, 3, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF]) | st.integers(
    0, 0xFFFFFFFF
)
HANDLES = st.integers(0, 3) | UINTS
STATES = st.none() | st.sampled_from(
    [Accepted(), Released(), Rejected(error=Error(condition="amqp:x")), Modified(), Received(0, 0)]
)
ERRORS = st.none() | st.builds(Error, condition=st.sampled_from(["amqp:internal-error", "x:y"]))


def optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


FLOWS = st.builds(
    Flow, next_incoming_id=optional(UINTS), incoming_window=UINTS, next_outgoing_id=UINTS,
    outgoing_window=UINTS, handle=optional(HANDLES), delivery_count=optional(UINTS),
    link_credit=optional(UINTS), available=optional(UINTS), drain=st.booleans(),
    echo=st.booleans(),
)  # fmt: skip
TRANSFERS = st.builds(
    Transfer, handle=HANDLES, delivery_id=optional(UINTS),
    delivery_tag=optional(st.binary(max_size=32)), message_format=optional(UINTS),
    settled=optional(st.booleans()), more=st.booleans(),
    rcv_settle_mode=optional(st.sampled_from([0, 1])), state=STATES, resume=st.booleans(),
    aborted=st.booleans(),
)  # fmt: skip
DISPOSITIONS = st.builds(
    Disposition, role=st.booleans(), first=UINTS, last=optional(UINTS), settled=st.booleans(),
    state=STATES,
)  # fmt: skip
ATTACHES = st.builds(
    Attach, name=st.sampled_from(["to-server", "from-server", "new"]), handle=HANDLES,
    role=st.booleans(), snd_settle_mode=st.sampled_from([0, 1, 2]),
    rcv_settle_mode=st.sampled_from([0, 1]),
    source=optional(st.builds(Source, address=st.sampled_from(["q", "r"]))),
    target=optional(st.builds(Target, address=st.sampled_from(["q", "r"]))),
    initial_delivery_count=optional(UINTS), max_message_size=optional(st.integers(0, 2**64 - 1)),
)  # fmt: skip
ENDINGS = st.one_of(
    st.builds(Detach, handle=HANDLES, closed=st.booleans(), error=ERRORS),
    st.builds(End, error=ERRORS),
    st.builds(Close, error=ERRORS),
)
CONNECTION_LEVEL = st.one_of(
    st.builds(
        Begin, remote_channel=optional(st.integers(0, 3)), next_outgoing_id=UINTS,
        incoming_window=UINTS, outgoing_window=UINTS, handle_max=UINTS,
    ),
    st.builds(Open, container_id=st.just("again")),
)  # fmt: skip
# weighted towards the frames that move state without ending anything
PERFORMATIVES = st.one_of(
    FLOWS, FLOWS, FLOWS, TRANSFERS, TRANSFERS, TRANSFERS, DISPOSITIONS, DISPOSITIONS, ATTACHES,
    ENDINGS, CONNECTION_LEVEL,
)  # fmt: skip


def record_errors(events: list[Any]) -> None:
    """Which errors the injected frames caused, for ``--hypothesis-show-statistics``."""
    for event in events:
        ending = isinstance(event, ev.ConnectionClosed | ev.SessionEnded | ev.LinkDetached)
        if ending and event.error is not None:
            hypothesis.event(f"{type(event).__name__}: {event.error.condition}")


@fuzz_settings("performatives")
@given(
    to_server=st.booleans(),
    frames=st.lists(
        st.tuples(st.integers(0, 19), PERFORMATIVES, st.binary(max_size=300)), min_size=1,
        max_size=8,
    ),
)  # fmt: skip
def test_random_performatives_into_a_live_conversation(
    to_server: bool, frames: list[tuple[int, Any, bytes]]
) -> None:
    """Well-typed but arbitrary performatives injected into one side of a real conversation:
    nothing raises, both sides keep writing well-formed frames, the pair goes quiet after each
    injection (no endless back and forth), and it still ends with a clean close."""
    client = new_client(sasl=False)
    server = new_server(sasl=False)
    client_script(client)
    converse(client, server)
    assert client.is_open and server.is_open
    victim = server if to_server else client
    log: list[Any] = []
    for channel_pick, body, payload in frames:
        channel = 0 if channel_pick < 18 else channel_pick - 17  # mostly the live session
        victim.receive_data(frame_bytes(channel, body, payload if type(body) is Transfer else b""))
        log += react_all(victim, broker_react if to_server else client_react)
        converse(client, server, log)
        if victim.is_terminated:
            break
    record_errors(log)
    for side in (client, server):
        side.tick(1000.0)
        side.data_to_send()
    client.close()
    converse(client, server)
    server.receive_data(b"")
    client.receive_data(b"")
    assert client.is_terminated and server.is_terminated
