"""Errors on the wire: refused and detached links, ended sessions, closed connections, and peers
that break the protocol (each must get a close, end or detach with the matching condition).

Misbehaving peers are simulated by feeding hand-made frames (``encode_frame``) or raw bytes to
a real ``Connection``; what it answers is parsed back from ``data_to_send()``.
"""

from __future__ import annotations

import struct

import pytest

from replication.amqp import events as ev
from replication.amqp.connection import Connection
from replication.amqp.errors import MessageSizeExceededError
from replication.amqp.frames import AMQP_HEADER, FRAME_SASL, SASL_HEADER, encode_frame
from replication.amqp.link import LinkState
from replication.amqp.outcomes import Accepted, Released
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
    SaslChallenge,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    SaslResponse,
    Transfer,
)
from replication.amqp.session import SessionState
from replication.amqp.terminus import Target

from .engine_pair import (
    bodies,
    close_error,
    frame_bytes,
    frames,
    of,
    plain_client,
    sasl_server,
    sender_pair,
    session_pair,
)

# ----------------------------------------------------------------------------- links


def test_refused_attach_gives_null_terminus_then_detach_with_the_error() -> None:
    pair, session = session_pair(auto_accept=False)
    sender = session.attach_sender("nowhere", Target(address="missing"))
    pair.pump()
    (request,) = of(pair.server_events, ev.LinkAttachRequested)
    request.link.refuse(Error(condition="amqp:not-found", description="no such queue"))
    pair.pump()
    link_events = ev.LinkAttached | ev.LinkDetached
    attached, detached = (e for e in pair.client_events if isinstance(e, link_events))
    assert isinstance(attached, ev.LinkAttached) and attached.link is sender
    assert sender.remote_target is None and sender.remote_source is None
    assert isinstance(detached, ev.LinkDetached)
    assert detached.error.condition == "amqp:not-found"
    assert detached.by_peer is True and detached.closed is True
    # the wire: an attach with a null target, then the detach
    attach, detach = (b for b in bodies(pair.s2c, Attach) + bodies(pair.s2c, Detach))
    assert attach.target is None and attach.source is None
    assert detach.error.condition == "amqp:not-found"
    # the client answered the detach, so both ends forgot the link
    assert sender.state is LinkState.DETACHED
    assert session.links == {} and pair.server_session().links == {}
    (server_side,) = of(pair.server_events, ev.LinkDetached)
    assert server_side.by_peer is False


def test_sending_on_a_refused_link_is_an_error() -> None:
    pair, session = session_pair(auto_accept=False)
    sender = session.attach_sender("nowhere", Target(address="missing"))
    pair.pump()
    of(pair.server_events, ev.LinkAttachRequested)[0].link.refuse(Error(condition="amqp:not-found"))
    pair.pump()
    with pytest.raises(Exception, match="detached"):
        sender.send(b"lost")


def test_remote_detach_is_answered_automatically() -> None:
    pair, sender, receiver = sender_pair(credit=3)
    sender.detach(Error(condition="amqp:internal-error", description="bye"))
    pair.pump()
    (server_event,) = of(pair.server_events, ev.LinkDetached)
    assert server_event.link is receiver
    assert server_event.error.condition == "amqp:internal-error"
    assert server_event.by_peer is True and server_event.closed is True
    (client_event,) = of(pair.client_events, ev.LinkDetached)
    assert client_event.error is None and client_event.by_peer is False
    assert len(bodies(pair.s2c, Detach)) == 1  # the automatic answer
    assert sender.state is LinkState.DETACHED and receiver.state is LinkState.DETACHED
    assert sender.session.links == {} and receiver.session.links == {}
    # the name can be reused for a new link
    again = sender.session.attach_sender("out", Target(address="q"))
    pair.pump()
    assert again.is_open


def test_suspending_detach_is_answered_in_kind() -> None:
    pair, sender, receiver = sender_pair()
    sender.detach(closed=False)
    pair.pump()
    (server_event,) = of(pair.server_events, ev.LinkDetached)
    assert server_event.closed is False and server_event.by_peer is True
    ours, answer = bodies(pair.c2s, Detach)[-1], bodies(pair.s2c, Detach)[-1]
    assert ours.closed is False and answer.closed is False
    assert receiver.state is LinkState.DETACHED


def test_detach_drops_the_senders_queue() -> None:
    pair, sender, _receiver = sender_pair()
    sender.send(b"a")
    sender.send(b"b")
    sender.detach()
    pair.pump()
    assert sender.queued == 0
    assert bodies(pair.c2s, Transfer) == []


def test_detach_of_an_unknown_handle_ends_the_session() -> None:
    pair, session = session_pair()
    pair.server.receive_data(frame_bytes(session.channel, Detach(handle=42, closed=True)))
    (end,) = bodies(pair.server.data_to_send(), End)
    assert end.error.condition == "amqp:session:unattached-handle"


# ----------------------------------------------------------------------------- sessions


def test_session_end_with_error_reaches_the_peer() -> None:
    pair, sender, receiver = sender_pair()
    session = sender.session
    server_session = receiver.session
    session.end(Error(condition="amqp:internal-error", description="done"))
    pair.pump()
    (ended,) = of(pair.server_events, ev.SessionEnded)
    assert ended.session is server_session
    assert ended.error.condition == "amqp:internal-error" and ended.by_peer is True
    (detached,) = of(pair.server_events, ev.LinkDetached)
    assert detached.link is receiver
    (answer,) = of(pair.client_events, ev.SessionEnded)
    assert answer.error is None and answer.by_peer is False
    assert pair.client.sessions == {} and pair.server.sessions == {}
    assert session.state is SessionState.UNMAPPED
    assert pair.client.is_open and pair.server.is_open  # the connection lives on
    again = pair.client.begin_session()
    pair.pump()
    assert again.is_open and again.channel == 0


def test_server_ends_a_session() -> None:
    pair, session = session_pair()
    pair.server_session().end(Error(condition="amqp:resource-limit-exceeded"))
    pair.pump()
    (ended,) = of(pair.client_events, ev.SessionEnded)
    assert ended.session is session and ended.by_peer is True
    assert ended.error.condition == "amqp:resource-limit-exceeded"
    assert pair.client.sessions == {} and pair.server.sessions == {}


# ----------------------------------------------------------------------------- connections


def test_close_with_error_while_links_are_attached() -> None:
    pair, _sender, _receiver = sender_pair()
    pair.server.close(Error(condition="amqp:connection:forced", description="restart"))
    pair.pump()
    kinds = [type(e) for e in pair.client_events]
    assert kinds == [ev.LinkDetached, ev.SessionEnded, ev.ConnectionClosed]
    closed = pair.client_events[-1]
    assert closed.error.condition == "amqp:connection:forced" and closed.by_peer is True
    assert close_error(pair.s2c).description == "restart"
    assert pair.client.is_terminated and pair.server.is_terminated


def test_nothing_but_close_is_processed_after_we_sent_close() -> None:
    pair, _sender, _receiver = sender_pair()
    pair.server.close()
    pair.server.data_to_send()
    # frames still in flight from the client are discarded (spec 2.4.3)
    pair.server.receive_data(frame_bytes(0, Begin(next_outgoing_id=0, incoming_window=1,
                                                  outgoing_window=1)))  # fmt: skip
    assert not of(pair.server.events(), ev.SessionBegun)
    pair.server.receive_data(frame_bytes(0, Close()))
    assert pair.server.is_terminated


# ----------------------------------------------------------------------------- protocol violations


def opened_server(**kwargs: object) -> Connection:
    """A server that has read a plain AMQP header and an open, with its answers drained."""
    server = Connection(server=True, container_id="s", **kwargs)  # type: ignore[arg-type]
    server.receive_data(AMQP_HEADER + frame_bytes(0, Open(container_id="peer")))
    server.data_to_send()
    server.events()
    assert server.is_open
    return server


def assert_closed_with(server: Connection, condition: str) -> None:
    """The server answered with a close carrying ``condition`` and reported the same."""
    sent = server.data_to_send()
    assert close_error(sent).condition == condition
    closed = of(server.events(), ev.ConnectionClosed)
    assert len(closed) == 1
    assert closed[0].error.condition == condition
    assert closed[0].by_peer is False
    assert server.is_terminated
    server.receive_data(b"\x00" * 64)  # everything after is ignored
    assert server.data_to_send() == b""


def test_garbage_body_is_a_decode_error() -> None:
    server = opened_server()
    server.receive_data(b"\x00\x00\x00\x10\x02\x00\x00\x00" + b"\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8")
    assert_closed_with(server, "amqp:decode-error")


def test_body_that_is_not_a_performative_is_a_decode_error() -> None:
    server = opened_server()
    server.receive_data(struct.pack(">IBBH", 10, 2, 0, 0) + b"\x52\x07")  # smalluint 7
    assert_closed_with(server, "amqp:decode-error")


def test_truncated_performative_is_a_decode_error() -> None:
    whole = frame_bytes(0, Begin(next_outgoing_id=0, incoming_window=5, outgoing_window=5))
    body = whole[8:-2]
    server = opened_server()
    server.receive_data(struct.pack(">IBBH", 8 + len(body), 2, 0, 0) + body)
    assert_closed_with(server, "amqp:decode-error")


@pytest.mark.parametrize(
    "header",
    [
        struct.pack(">IBBH", 4, 2, 0, 0),  # size below the 8-byte frame header
        struct.pack(">IBBH", 8, 1, 0, 0),  # doff < 2
        struct.pack(">IBBH", 8, 0, 0, 0),  # doff 0
        struct.pack(">IBBH", 12, 4, 0, 0),  # doff beyond the frame
        struct.pack(">IBBH", 8, 2, 7, 0),  # unknown frame type
        struct.pack(">IBBH", 513, 2, 0, 0),  # larger than our max-frame-size
        struct.pack(">IBBH", 0xFFFFFFFF, 2, 0, 0),  # ... much larger
    ],
    ids=["size<8", "doff=1", "doff=0", "doff>size", "type", "too-big", "huge"],
)
def test_bad_frame_header_is_a_framing_error(header: bytes) -> None:
    server = opened_server(max_frame_size=512)
    server.receive_data(header)
    assert_closed_with(server, "amqp:connection:framing-error")


def test_frame_larger_than_max_frame_size_is_refused_before_buffering() -> None:
    server = opened_server(max_frame_size=512)
    server.receive_data(struct.pack(">IBBH", 600, 2, 0, 0))  # no body yet: refused at once
    assert_closed_with(server, "amqp:connection:framing-error")


@pytest.mark.parametrize(
    ("garbage", "condition"),
    [
        (struct.pack(">IBBH", 12, 2, 0, 0) + b"\xde\xad\xbe\xef", "amqp:decode-error"),
        (b"GARBAGE!GARBAGE!", "amqp:connection:framing-error"),  # "GARB" is a 1.2 GB size
    ],
    ids=["bad-body", "bad-frame-header"],
)
def test_garbage_right_after_the_header(garbage: bytes, condition: str) -> None:
    server = Connection(server=True, container_id="s")
    server.receive_data(AMQP_HEADER + garbage)
    sent = server.data_to_send()
    assert sent.startswith(AMQP_HEADER)
    assert [type(f.body) for f in frames(sent)] == [Open, Close]
    assert_closed_with_frames(sent, server, condition)


def test_garbage_instead_of_the_amqp_header_after_sasl() -> None:
    server = sasl_server()
    server.receive_data(SASL_HEADER)
    init = SaslInit(mechanism="PLAIN", initial_response=b"\0u\0p")
    server.receive_data(encode_frame(0, init, frame_type=FRAME_SASL))
    server.data_to_send()
    assert of(server.events(), ev.SaslCompleted)
    server.receive_data(b"GET / HTTP/1.1\r\n")
    assert server.data_to_send() == AMQP_HEADER  # SASL is done: the AMQP header is what we speak
    (closed,) = of(server.events(), ev.ConnectionClosed)
    assert closed.error.condition == "amqp:connection:framing-error"
    assert server.is_terminated


def test_first_frame_not_open_is_illegal_state() -> None:
    server = Connection(server=True, container_id="s")
    server.receive_data(AMQP_HEADER)
    assert server.data_to_send() == AMQP_HEADER
    server.receive_data(frame_bytes(0, Begin(next_outgoing_id=0, incoming_window=1,
                                             outgoing_window=1)))  # fmt: skip
    sent = server.data_to_send()
    assert [type(f.body) for f in frames(sent)] == [Open, Close]  # a close must follow an open
    assert_closed_with_frames(sent, server, "amqp:illegal-state")


def assert_closed_with_frames(sent: bytes, server: Connection, condition: str) -> None:
    assert close_error(sent).condition == condition
    (closed,) = of(server.events(), ev.ConnectionClosed)
    assert closed.error.condition == condition and closed.by_peer is False
    assert server.is_terminated


def test_second_open_is_illegal_state() -> None:
    server = opened_server()
    server.receive_data(frame_bytes(0, Open(container_id="again")))
    assert_closed_with(server, "amqp:illegal-state")


def test_open_without_container_id_is_a_decode_error() -> None:
    for body in (b"\x00\x53\x10\x45", b"\x00\x53\x10\xc0\x02\x01\x40"):  # [] and [null]
        server = Connection(server=True, container_id="s")
        server.receive_data(AMQP_HEADER)
        server.data_to_send()
        server.receive_data(struct.pack(">IBBH", 8 + len(body), 2, 0, 0) + body)
        sent = server.data_to_send()
        assert_closed_with_frames(sent, server, "amqp:decode-error")
        assert server.remote is None


def test_begin_without_mandatory_fields_is_a_decode_error() -> None:
    server = opened_server()
    body = b"\x00\x53\x11\x45"  # begin with an empty field list
    server.receive_data(struct.pack(">IBBH", 8 + len(body), 2, 0, 0) + body)
    assert_closed_with(server, "amqp:decode-error")


def test_frame_on_a_channel_without_session_is_not_allowed() -> None:
    server = opened_server()
    server.receive_data(frame_bytes(5, Attach(name="x", handle=0, role=False)))
    assert_closed_with(server, "amqp:not-allowed")


def test_begin_answering_a_session_we_never_began_is_not_allowed() -> None:
    server = opened_server()
    server.receive_data(frame_bytes(0, Begin(remote_channel=3, next_outgoing_id=0,
                                             incoming_window=1, outgoing_window=1)))  # fmt: skip
    assert_closed_with(server, "amqp:not-allowed")


def test_begin_beyond_channel_max_is_a_framing_error() -> None:
    server = opened_server(channel_max=2)
    server.receive_data(frame_bytes(3, Begin(next_outgoing_id=0, incoming_window=1,
                                             outgoing_window=1)))  # fmt: skip
    assert_closed_with(server, "amqp:connection:framing-error")


def test_sasl_frame_after_sasl_is_a_framing_error() -> None:
    server = opened_server()
    server.receive_data(encode_frame(0, SaslInit(mechanism="PLAIN"), frame_type=FRAME_SASL))
    assert_closed_with(server, "amqp:connection:framing-error")


def test_amqp_frame_during_sasl_terminates_without_close() -> None:
    server = sasl_server()
    server.receive_data(SASL_HEADER)
    server.data_to_send()
    server.receive_data(frame_bytes(0, Open(container_id="sneaky")))
    assert server.data_to_send() == b""  # no close is possible before the AMQP layer
    (closed,) = of(server.events(), ev.ConnectionClosed)
    assert closed.error.condition == "amqp:connection:framing-error"
    assert server.is_terminated and server.remote is None


def test_transfers_in_flight_when_the_receiver_lowers_its_credit_are_taken() -> None:
    """Spec 2.6.7: a flow takes effect when the sender reads it. Transfers it sent under the
    old grant, crossing our lower one on the wire, are accepted (up to what was taken
    back); one more than that is an overrun and detaches the link."""
    pair, sender, receiver = sender_pair(credit=3)
    channel = receiver.session.remote_channel
    receiver.flow(0)  # on its way to the sender, which meanwhile sends under credit 3
    pair.server.data_to_send()
    for n in range(3):
        transfer = Transfer(handle=sender.handle, delivery_id=n, delivery_tag=b"%d" % n)
        pair.server.receive_data(frame_bytes(channel, transfer, b"m"))
    assert len(of(pair.server.events(), ev.DeliveryReceived)) == 3
    assert receiver.is_open and receiver.link_credit == 0
    transfer = Transfer(handle=sender.handle, delivery_id=3, delivery_tag=b"3")
    pair.server.receive_data(frame_bytes(channel, transfer, b"m"))
    (detach,) = bodies(pair.server.data_to_send(), Detach)
    assert detach.error.condition == "amqp:link:transfer-limit-exceeded"


def test_transfer_without_credit_detaches_the_link() -> None:
    pair, sender, receiver = sender_pair()  # the server granted no credit
    channel = receiver.session.remote_channel
    pair.server.receive_data(
        frame_bytes(channel, Transfer(handle=sender.handle, delivery_id=0, delivery_tag=b"x"), b"m")
    )
    (detach,) = bodies(pair.server.data_to_send(), Detach)
    assert detach.handle == receiver.handle
    assert detach.error.condition == "amqp:link:transfer-limit-exceeded"
    events = pair.server.events()
    assert not of(events, ev.DeliveryReceived)
    assert receiver.state is LinkState.DETACH_SENT
    assert pair.server.is_open  # only the link pays


def test_transfer_on_an_unattached_handle_ends_the_session() -> None:
    pair, session = session_pair()
    mark = pair.mark()
    pair.server.receive_data(
        frame_bytes(session.channel, Transfer(handle=9, delivery_id=0, delivery_tag=b"x"), b"m")
    )
    pair.server_events.extend(pair.server.events())
    pair.pump()
    (end,) = bodies(pair.sent_by_server(mark), End)
    assert end.error.condition == "amqp:session:unattached-handle"
    (ended,) = of(pair.client_events, ev.SessionEnded)
    assert ended.session is session and ended.by_peer is True
    assert ended.error.condition == "amqp:session:unattached-handle"
    assert pair.server.sessions == {} and pair.client.sessions == {}
    assert pair.server.is_open


def test_frames_after_an_ended_session_error_are_discarded_until_end() -> None:
    pair, session = session_pair()
    server_session = pair.server_session()
    channel = session.channel
    pair.server.receive_data(frame_bytes(channel, Transfer(handle=9, delivery_id=0,
                                                           delivery_tag=b"x")))  # fmt: skip
    assert server_session.state is SessionState.DISCARDING
    pair.server.receive_data(frame_bytes(channel, Flow(incoming_window=1, next_outgoing_id=0,
                                                       outgoing_window=1, handle=77)))  # fmt: skip
    assert pair.server.is_open and server_session.state is SessionState.DISCARDING
    pair.server.receive_data(frame_bytes(channel, End()))
    assert server_session.state is SessionState.UNMAPPED
    assert pair.server.sessions == {}


def test_transfer_on_a_link_the_peer_receives_on_is_errant() -> None:
    pair, session = session_pair()
    receiver = session.attach_receiver("in", "q")  # the server sends on this link
    pair.pump()
    pair.server.receive_data(
        frame_bytes(session.channel, Transfer(handle=receiver.handle, delivery_id=0,
                                              delivery_tag=b"x"))
    )  # fmt: skip
    (end,) = bodies(pair.server.data_to_send(), End)
    assert end.error.condition == "amqp:session:errant-link"


def test_attach_with_a_handle_in_use_ends_the_session() -> None:
    pair, sender, receiver = sender_pair()
    channel = receiver.session.remote_channel
    pair.server.receive_data(frame_bytes(channel, Attach(name="other", handle=sender.handle,
                                                         role=False)))  # fmt: skip
    (end,) = bodies(pair.server.data_to_send(), End)
    assert end.error.condition == "amqp:session:handle-in-use"


def test_attach_of_a_link_name_in_use_is_refused_on_its_own_handle() -> None:
    pair, _, receiver = sender_pair()
    channel = receiver.session.remote_channel
    requests_before = len(of(pair.server_events, ev.LinkAttachRequested))
    namesake = Attach(name="out", handle=7, role=False, target=Target(address="q"))
    pair.server.receive_data(frame_bytes(channel, namesake))
    out = pair.server.data_to_send()
    (attach,) = bodies(out, Attach)
    (detach,) = bodies(out, Detach)
    assert bodies(out, End) == []
    assert attach.name == "out" and attach.target is None and attach.source is None
    assert attach.handle != receiver.handle and detach.handle == attach.handle
    assert detach.closed is True
    assert detach.error.condition == "amqp:resource-locked"
    assert "'out' is already in use" in detach.error.description
    # the broker above never hears of it, and the link already attached goes on
    assert len(of(pair.server_events, ev.LinkAttachRequested)) == requests_before
    assert receiver.state is LinkState.ATTACHED
    # while that refusal waits for the peer's detach, another namesake ends the session
    pair.server.receive_data(frame_bytes(channel, Attach(name="out", handle=8, role=False)))
    (end,) = bodies(pair.server.data_to_send(), End)
    assert end.error.condition == "amqp:not-allowed"


def test_a_refused_namesake_detached_by_the_peer_leaves_the_original() -> None:
    pair, sender, receiver = sender_pair(credit=1)
    channel = receiver.session.remote_channel
    pair.server.receive_data(frame_bytes(channel, Attach(name="out", handle=7, role=False)))
    (attach,) = bodies(pair.server.data_to_send(), Attach)
    assert attach.handle != receiver.handle
    pair.server.receive_data(frame_bytes(channel, Detach(handle=7, closed=True)))
    assert pair.server.data_to_send() == b""  # the detach answered ours: nothing more to say
    server_session = receiver.session
    assert set(server_session.links) == {receiver.handle}
    # the original keeps its name: a namesake is refused again rather than ending the session
    pair.server.receive_data(frame_bytes(channel, Attach(name="out", handle=9, role=False)))
    (detach,) = bodies(pair.server.data_to_send(), Detach)
    assert detach.error.condition == "amqp:resource-locked"
    # and the original still carries messages
    sender.send(b"still here")
    pair.pump()
    (received,) = of(pair.server_events, ev.DeliveryReceived)
    assert received.link is receiver


def test_message_over_max_message_size_detaches_the_link() -> None:
    pair, session = session_pair(
        auto_accept=False,
        client_kwargs={"max_frame_size": 512}, server_kwargs={"max_frame_size": 512},
    )  # fmt: skip
    sender = session.attach_sender("big", Target(address="q"))
    # queued before the sender learns the limit, so only the receiver can enforce it
    sender.send(b"s" * 1000)  # exactly the limit: fine
    sender.send(b"b" * 1001)  # one byte over, spread over several frames
    pair.pump()
    (request,) = of(pair.server_events, ev.LinkAttachRequested)
    request.link.accept(max_message_size=1000)
    pair.pump()
    assert sender.remote.max_message_size == 1000
    receiver = request.link
    pair.clear_events()
    receiver.flow(5)
    pair.pump()
    received = of(pair.server_events, ev.DeliveryReceived)
    assert [len(e.delivery.payload) for e in received] == [1000]
    detach = [d for d in bodies(pair.s2c, Detach) if d.error is not None]
    assert len(detach) == 1
    assert detach[0].error.condition == "amqp:link:message-size-exceeded"
    (client_event,) = of(pair.client_events, ev.LinkDetached)
    assert client_event.error.condition == "amqp:link:message-size-exceeded"
    assert client_event.by_peer is True
    assert pair.client.is_open and session.is_open


def test_message_over_max_message_size_in_one_frame() -> None:
    pair, session = session_pair(auto_accept=False)
    sender = session.attach_sender("big", Target(address="q"))
    sender.send(b"x" * 101)  # queued before the limit is known
    pair.pump()
    (request,) = of(pair.server_events, ev.LinkAttachRequested)
    request.link.accept(max_message_size=100)
    request.link.flow(1)
    pair.pump()
    assert not of(pair.server_events, ev.DeliveryReceived)
    (detached,) = of(pair.client_events, ev.LinkDetached)
    assert detached.error.condition == "amqp:link:message-size-exceeded"


def test_sender_refuses_a_message_over_the_receivers_max_message_size() -> None:
    pair, session = session_pair(auto_accept=False)
    sender = session.attach_sender("big", Target(address="q"))
    pair.pump()
    (request,) = of(pair.server_events, ev.LinkAttachRequested)
    request.link.accept(max_message_size=100)
    request.link.flow(5)
    pair.pump()
    with pytest.raises(MessageSizeExceededError, match="101 bytes exceeds"):
        sender.send(b"x" * 101)
    sender.send(b"x" * 100)
    pair.pump()
    assert [len(e.delivery.payload) for e in of(pair.server_events, ev.DeliveryReceived)] == [100]
    assert sender.is_open


def test_repeated_updates_before_a_flush_send_one_disposition() -> None:
    pair, sender, _receiver = sender_pair(credit=1)
    sender.send(b"x")
    pair.pump()
    (received,) = of(pair.server_events, ev.DeliveryReceived)
    mark = pair.mark()
    received.delivery.update(Accepted(), settled=False)
    received.delivery.update(Accepted(), settled=True)
    pair.pump()
    (disposition,) = bodies(pair.sent_by_server(mark), Disposition)
    assert disposition.settled is True


def test_a_settlement_made_before_a_detach_goes_out_before_it() -> None:
    """Dispositions wait for the next flush; a detach right after a release (a receiver
    giving back what it held as it closes) must not overtake it: a broker that has seen the
    detach has no link to take the release on, and Service Bus keeps the message locked."""
    pair, sender, receiver = sender_pair(credit=1)
    sender.send(b"x")
    pair.pump()
    (received,) = of(pair.server_events, ev.DeliveryReceived)
    received.delivery.update(Released(), settled=True)
    receiver.detach()
    kinds = [type(f.body) for f in frames(pair.server.data_to_send())]
    assert kinds == [Disposition, Detach]


def test_server_close_before_open_sends_open_then_close() -> None:
    server = Connection(server=True, container_id="s")
    server.receive_data(AMQP_HEADER)
    server.data_to_send()
    server.close(Error(condition="amqp:internal-error"))
    sent = server.data_to_send()
    assert [type(f.body) for f in frames(sent)] == [Open, Close]
    assert close_error(sent).condition == "amqp:internal-error"


# ----------------------------------------------------------------------------- SASL, client side


def sasl_client_after_mechanisms() -> Connection:
    """A PLAIN client that has read the server's SASL header and mechanisms (and sent its init)."""
    client = plain_client()
    client.open()
    client.data_to_send()
    client.receive_data(
        SASL_HEADER + encode_frame(0, SaslMechanisms(sasl_server_mechanisms=("PLAIN",)),
                                   frame_type=FRAME_SASL)
    )  # fmt: skip
    assert len(bodies(client.data_to_send(), SaslInit)) == 1
    return client


def test_challenge_to_a_plain_client_fails_the_connection() -> None:
    client = sasl_client_after_mechanisms()
    client.receive_data(encode_frame(0, SaslChallenge(challenge=b"?"), frame_type=FRAME_SASL))
    (closed,) = of(client.events(), ev.ConnectionClosed)
    assert closed.error.condition == "amqp:unauthorized-access"
    assert client.is_terminated
    assert bodies(client.data_to_send(), SaslResponse) == []


@pytest.mark.parametrize("code", [1, 2, 3, 4])
def test_sasl_outcome_failure_codes_close_the_client(code: int) -> None:
    client = sasl_client_after_mechanisms()
    client.receive_data(encode_frame(0, SaslOutcome(code=code), frame_type=FRAME_SASL))
    (closed,) = of(client.events(), ev.ConnectionClosed)
    assert closed.error.condition == "amqp:unauthorized-access"
    assert closed.by_peer is True
    assert client.is_terminated
    assert client.data_to_send() == b""  # no AMQP header, no open


def test_server_frame_other_than_sasl_init_is_a_framing_error() -> None:
    server = sasl_server()
    server.receive_data(SASL_HEADER)
    server.data_to_send()
    server.receive_data(encode_frame(0, SaslResponse(response=b"x"), frame_type=FRAME_SASL))
    (closed,) = of(server.events(), ev.ConnectionClosed)
    assert closed.error.condition == "amqp:connection:framing-error"
    assert server.is_terminated
