"""The sans-IO engine driven by real bytes: headers, SASL, open/close, flow, transfers, settlement.

Every test pairs a client and a server ``Connection`` in memory (``engine_pair.Pair``) or feeds
hand-made frames to one side, then checks both the events and the bytes that crossed the wire.
"""

from __future__ import annotations

import itertools

import pytest

from replication.amqp import events as ev
from replication.amqp.connection import Connection
from replication.amqp.frames import (
    AMQP_HEADER,
    FRAME_SASL,
    SASL_HEADER,
    ProtocolHeader,
    encode_frame,
)
from replication.amqp.outcomes import Accepted, Modified, Rejected, Released
from replication.amqp.performatives import (
    SASL_AUTH,
    SASL_OK,
    SND_SETTLED,
    Begin,
    Disposition,
    Error,
    Flow,
    Open,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    Transfer,
)
from replication.amqp.sasl import ANONYMOUS, MSSBCBS, PLAIN, SaslClient, SaslServer
from replication.amqp.terminus import Source

from .engine_pair import (
    HEARTBEAT,
    PASSWORD,
    USER,
    Pair,
    bodies,
    close_error,
    frame_bytes,
    frame_sizes,
    frames,
    make_pair,
    of,
    parse_wire,
    plain_client,
    receiver_pair,
    sasl_server,
    sender_pair,
    session_pair,
)

# ----------------------------------------------------------------------------- protocol headers


def test_plain_amqp_header_exchange_without_sasl() -> None:
    pair = make_pair(sasl=False)
    assert pair.sent_by_client().startswith(AMQP_HEADER)
    assert pair.sent_by_server().startswith(AMQP_HEADER)
    assert SASL_HEADER not in pair.c2s + pair.s2c
    assert of(pair.client_events, ev.ConnectionOpened)[0].remote.container_id == "server"
    assert of(pair.server_events, ev.ConnectionOpened)[0].remote.container_id == "client"
    assert not of(pair.client_events + pair.server_events, ev.SaslCompleted)


def test_sasl_then_amqp_header_exchange() -> None:
    pair = make_pair(sasl=True)
    client_wire = parse_wire(pair.c2s)
    server_wire = parse_wire(pair.s2c)
    # client: SASL header, sasl-init, AMQP header, open
    assert client_wire[0] == ProtocolHeader(3, 1, 0, 0)
    assert type(client_wire[1].body) is SaslInit
    assert client_wire[2] == ProtocolHeader(0, 1, 0, 0)
    assert type(client_wire[3].body) is Open
    # server: SASL header, mechanisms, outcome ok, AMQP header, open
    assert server_wire[0] == ProtocolHeader(3, 1, 0, 0)
    assert type(server_wire[1].body) is SaslMechanisms
    assert type(server_wire[2].body) is SaslOutcome and server_wire[2].body.code == SASL_OK
    assert server_wire[3] == ProtocolHeader(0, 1, 0, 0)
    assert type(server_wire[4].body) is Open
    (done,) = of(pair.server_events, ev.SaslCompleted)
    assert done.mechanism == PLAIN
    assert (done.credentials.username, done.credentials.password) == (USER, PASSWORD)
    assert pair.server.sasl_credentials == done.credentials


def test_server_with_optional_sasl_accepts_a_plain_amqp_header() -> None:
    pair = make_pair(sasl=False, server_kwargs={"sasl": SaslServer(), "require_sasl": False})
    assert pair.sent_by_server().startswith(AMQP_HEADER)
    assert pair.server.is_open


def test_server_requiring_sasl_answers_amqp_header_with_sasl_header_and_terminates() -> None:
    server = sasl_server()
    server.receive_data(AMQP_HEADER)
    assert server.data_to_send() == SASL_HEADER
    assert server.is_terminated
    (closed,) = of(server.events(), ev.ConnectionClosed)
    assert closed.error.condition == "amqp:not-implemented"
    assert closed.by_peer is False


def test_client_gives_up_when_the_server_answers_with_another_protocol() -> None:
    client = plain_client()
    client.open()
    assert client.data_to_send() == SASL_HEADER
    client.receive_data(AMQP_HEADER)  # a server that does not speak SASL
    assert client.is_terminated
    (closed,) = of(client.events(), ev.ConnectionClosed)
    assert closed.error.condition == "amqp:not-implemented"


@pytest.mark.parametrize(
    "header",
    [b"AMQP\x01\x01\x00\x00", b"AMQP\x00\x01\x00\x01", b"AMQP\x00\x02\x00\x00", b"HTTP/1.1"],
    ids=["tls-like", "revision", "major", "http"],
)
@pytest.mark.parametrize("with_sasl", [False, True], ids=["no-sasl", "sasl"])
def test_bogus_header_gets_our_header_back_and_terminates(header: bytes, with_sasl: bool) -> None:
    server = sasl_server() if with_sasl else Connection(server=True, container_id="s")
    server.receive_data(header)
    assert server.data_to_send() == (SASL_HEADER if with_sasl else AMQP_HEADER)
    assert server.is_terminated
    (closed,) = of(server.events(), ev.ConnectionClosed)
    assert closed.by_peer is False
    server.receive_data(b"more bytes after the end")  # ignored once terminated
    assert server.data_to_send() == b""
    assert server.events() == []


def test_header_split_across_reads() -> None:
    server = Connection(server=True, container_id="s")
    for byte in AMQP_HEADER:
        server.receive_data(bytes([byte]))
    assert server.data_to_send() == AMQP_HEADER
    assert not server.is_terminated


# ----------------------------------------------------------------------------- SASL


def test_sasl_plain_bad_password_is_refused_with_code_1() -> None:
    pair = make_pair(client_kwargs={"password": "wrong"}, open_connection=False)
    pair.client.open()
    pair.pump()
    (outcome,) = bodies(pair.s2c, SaslOutcome)
    assert outcome.code == SASL_AUTH == 1
    assert Open not in {type(f.body) for f in frames(pair.c2s + pair.s2c)}
    (client_closed,) = of(pair.client_events, ev.ConnectionClosed)
    assert client_closed.error.condition == "amqp:unauthorized-access"
    assert client_closed.by_peer is True
    (server_closed,) = of(pair.server_events, ev.ConnectionClosed)
    assert server_closed.error.condition == "amqp:unauthorized-access"
    assert pair.client.is_terminated and pair.server.is_terminated
    assert not of(pair.server_events, ev.SaslCompleted)


def test_sasl_authenticator_that_raises_refuses_with_sys_perm() -> None:
    def broken(credentials: object) -> bool:
        raise RuntimeError("key store down")

    pair = make_pair(server_kwargs={"sasl": SaslServer(authenticate=broken)}, open_connection=False)
    pair.client.open()
    pair.pump()
    (outcome,) = bodies(pair.s2c, SaslOutcome)
    assert outcome.code == 3
    assert pair.client.is_terminated and pair.server.is_terminated


@pytest.mark.parametrize("mechanism", [ANONYMOUS, MSSBCBS])
def test_sasl_mechanisms_without_password(mechanism: str) -> None:
    pair = Pair(
        Connection(container_id="c", sasl=SaslClient(mechanism)),
        Connection(server=True, container_id="s", sasl=SaslServer()),
    )
    pair.client.open()
    pair.pump()
    assert pair.client.is_open and pair.server.is_open
    (init,) = bodies(pair.c2s, SaslInit)
    assert init.mechanism == mechanism
    (done,) = of(pair.server_events, ev.SaslCompleted)
    assert done.mechanism == mechanism
    assert done.credentials.username is None


def test_client_asking_for_a_mechanism_the_server_does_not_offer() -> None:
    pair = Pair(
        Connection(container_id="c", sasl=SaslClient(ANONYMOUS)),
        Connection(server=True, container_id="s", sasl=SaslServer(mechanisms=(PLAIN,))),
    )
    pair.client.open()
    pair.pump()
    assert bodies(pair.s2c, SaslMechanisms)[0].sasl_server_mechanisms == (PLAIN,)
    assert bodies(pair.c2s, SaslInit) == []  # the client gives up before choosing
    (closed,) = of(pair.client_events, ev.ConnectionClosed)
    assert closed.error.condition == "amqp:unauthorized-access"
    assert pair.client.is_terminated
    assert not pair.client.is_open and not pair.server.is_open


def test_server_refuses_an_init_for_a_mechanism_it_did_not_offer() -> None:
    server = Connection(server=True, container_id="s", sasl=SaslServer(mechanisms=(PLAIN,)))
    server.receive_data(SASL_HEADER)
    server.data_to_send()
    init = SaslInit(mechanism=ANONYMOUS, initial_response=b"")
    server.receive_data(encode_frame(0, init, frame_type=FRAME_SASL))
    (outcome,) = bodies(server.data_to_send(), SaslOutcome)
    assert outcome.code == SASL_AUTH
    assert server.is_terminated


def test_malformed_plain_response_is_refused() -> None:
    server = sasl_server()
    server.receive_data(SASL_HEADER)
    server.data_to_send()
    init = SaslInit(mechanism=PLAIN, initial_response=b"no-nul-separators")
    server.receive_data(encode_frame(0, init, frame_type=FRAME_SASL))
    (outcome,) = bodies(server.data_to_send(), SaslOutcome)
    assert outcome.code == SASL_AUTH
    assert server.is_terminated


# ----------------------------------------------------------------------------- open / close


def test_open_exchanges_limits() -> None:
    pair = make_pair(
        client_kwargs={"max_frame_size": 4096, "channel_max": 7, "idle_timeout": 30.0,
                       "hostname": "example", "properties": {"product": "test"}},
        server_kwargs={"max_frame_size": 2048, "channel_max": 3},
    )  # fmt: skip
    client_open = pair.server.remote
    assert client_open.max_frame_size == 4096
    assert client_open.channel_max == 7
    assert client_open.idle_time_out == 30_000
    assert client_open.hostname == "example"
    assert client_open.properties == {"product": "test"}
    server_open = pair.client.remote
    assert server_open.max_frame_size == 2048
    assert server_open.channel_max == 3
    assert server_open.idle_time_out is None
    assert pair.client.remote_max_frame_size == 2048
    assert pair.server.remote_max_frame_size == 4096


def test_channel_max_bounds_the_sessions_we_can_begin() -> None:
    pair = make_pair(server_kwargs={"channel_max": 1})
    first = pair.client.begin_session()
    second = pair.client.begin_session()
    pair.pump()
    assert (first.channel, second.channel) == (0, 1)
    assert first.is_open and second.is_open
    with pytest.raises(Exception, match="no channel left"):
        pair.client.begin_session()


def test_close_with_error_reaches_the_peer() -> None:
    pair = make_pair()
    pair.clear_events()
    pair.client.close(Error(condition="amqp:internal-error", description="shutting down"))
    pair.pump()
    (closed,) = of(pair.server_events, ev.ConnectionClosed)
    assert closed.error == Error(condition="amqp:internal-error", description="shutting down")
    assert closed.by_peer is True
    (echo,) = of(pair.client_events, ev.ConnectionClosed)
    assert echo.error is None and echo.by_peer is False
    assert close_error(pair.s2c) is None  # the answer carries no error
    assert pair.client.is_terminated and pair.server.is_terminated
    assert not pair.client.is_open


def test_server_close_reaches_the_client() -> None:
    pair = make_pair()
    pair.clear_events()
    pair.server.close(Error(condition="amqp:connection:forced", description="maintenance"))
    pair.pump()
    (closed,) = of(pair.client_events, ev.ConnectionClosed)
    assert closed.error.condition == "amqp:connection:forced"
    assert closed.by_peer is True
    assert pair.client.remote_error.description == "maintenance"
    assert pair.client.is_terminated and pair.server.is_terminated


def test_close_ends_sessions_and_links_on_both_sides() -> None:
    pair, _sender, _receiver = sender_pair()
    pair.client.close()
    pair.pump()
    for events in (pair.client_events, pair.server_events):
        assert len(of(events, ev.LinkDetached)) == 1
        assert len(of(events, ev.SessionEnded)) == 1
        assert len(of(events, ev.ConnectionClosed)) == 1
    assert pair.client.sessions == {} and pair.server.sessions == {}


def test_socket_eof_closes_the_connection() -> None:
    pair = make_pair()
    pair.clear_events()
    pair.server.receive_data(b"")
    (closed,) = of(pair.server.events(), ev.ConnectionClosed)
    assert closed.error.condition == "amqp:connection:forced"
    assert pair.server.is_terminated


def test_frames_queued_before_open_are_sent_after_it() -> None:
    client = Connection(container_id="c")
    server = Connection(server=True, container_id="s")
    session = client.begin_session()  # before open(): held back
    client.open()
    pair = Pair(client, server)
    pair.pump()
    kinds = [type(f.body) for f in frames(pair.c2s)]
    assert kinds[:2] == [Open, Begin]
    assert session.is_open


# ----------------------------------------------------------------------------- flow control


def transfers(data: bytes) -> list[Transfer]:
    return bodies(data, Transfer)


def test_sender_without_credit_sends_no_transfer() -> None:
    pair, sender, _receiver = sender_pair()
    mark = pair.mark()
    sender.send(b"hello")
    pair.pump()
    assert transfers(pair.sent_by_client(mark)) == []
    assert sender.queued == 1 and sender.credit == 0
    assert not of(pair.server_events, ev.DeliveryReceived)


def test_flow_n_releases_exactly_n_deliveries() -> None:
    pair, sender, receiver = sender_pair()
    for i in range(5):
        sender.send(b"m%d" % i)
    pair.pump()
    mark = pair.mark()
    receiver.flow(3)
    pair.pump()
    assert len(transfers(pair.sent_by_client(mark))) == 3
    assert sender.queued == 2
    assert sender.credit == 0 and receiver.credit == 0
    received = of(pair.server_events, ev.DeliveryReceived)
    assert [e.delivery.payload for e in received] == [b"m0", b"m1", b"m2"]
    mark = pair.mark()
    receiver.flow(10)
    pair.pump()
    assert len(transfers(pair.sent_by_client(mark))) == 2
    assert sender.queued == 0 and sender.credit == 8


@pytest.mark.parametrize("credit", [0x7FFFFFFF, 0x80000000, 0xFFFFFFFF])
def test_credit_of_two_to_the_31_and_more_is_honoured(credit: int) -> None:
    pair, sender, receiver = sender_pair()
    receiver.flow(credit)
    pair.pump()
    assert sender.credit == credit
    for i in range(3):
        sender.send(b"%d" % i)
    pair.pump()
    assert len(of(pair.server_events, ev.DeliveryReceived)) == 3
    assert sender.credit == credit - 3 and receiver.credit == credit - 3


def test_flow_with_a_stale_delivery_count_grants_only_what_is_left() -> None:
    pair, sender, receiver = sender_pair(credit=5)
    for i in range(3):
        sender.send(b"%d" % i)
    pair.client.data_to_send()  # three transfers the receiver has not seen yet
    assert sender.delivery_count == 3
    pair.client.receive_data(frame_bytes(sender.session.remote_channel, Flow(
        next_incoming_id=0, incoming_window=100, next_outgoing_id=0, outgoing_window=100,
        handle=receiver.handle, delivery_count=0, link_credit=5,
    )))  # fmt: skip
    assert sender.credit == 2  # 0 + 5 - 3


def test_credit_granted_with_the_attach() -> None:
    pair, sender, _receiver = receiver_pair(credit=4)
    assert sender.credit == 4
    for i in range(6):
        sender.send(b"%d" % i)
    pair.pump()
    assert len(of(pair.client_events, ev.DeliveryReceived)) == 4
    assert sender.queued == 2


def test_credit_granted_before_the_senders_attach_has_no_delivery_count() -> None:
    """Spec 2.7.4: a receiver that has not seen the sender's attach MUST NOT set delivery-count
    (it does not know the sender's initial-delivery-count yet)."""
    pair, session = session_pair(auto_accept=False)
    mark = pair.mark()
    receiver = session.attach_receiver("in", Source(address="q"), credit=5)
    pair.pump()
    (early,) = bodies(pair.sent_by_client(mark), Flow)
    assert early.handle == receiver.handle and early.link_credit == 5
    assert early.delivery_count is None
    # a sender whose deliveries are numbered from 100 still gets all 5 credits
    (request,) = of(pair.server_events, ev.LinkAttachRequested)
    sender = request.link
    sender.delivery_count = 100
    sender.accept()
    pair.pump()
    assert sender.credit == 5
    for i in range(5):
        sender.send(b"%d" % i)
    pair.pump()
    assert len(of(pair.client_events, ev.DeliveryReceived)) == 5
    assert receiver.delivery_count == 105 and receiver.credit == 0
    mark = pair.mark()
    receiver.flow(1)  # now the attach is known: the count is set
    pair.pump()
    (late,) = bodies(pair.sent_by_client(mark), Flow)
    assert late.delivery_count == 105


def test_drain_waits_for_transfers_held_by_the_session_window() -> None:
    pair, sender, receiver = receiver_pair(session_options={"incoming_window": 2})
    for i in range(5):
        sender.send(b"%d" % i)
    receiver.flow(8, drain=True)
    pair.pump()
    wire = [f.body for f in frames(pair.s2c)]
    transfer_at = [i for i, body in enumerate(wire) if type(body) is Transfer]
    link_flow_at = [i for i, body in enumerate(wire) if type(body) is Flow and body.handle == 0]
    assert len(transfer_at) == 5 and len(link_flow_at) == 1
    # the drain answer comes after the last transfer (held back by the window), counting all 8
    assert link_flow_at[0] > transfer_at[-1]
    answer = wire[link_flow_at[0]]
    assert answer.delivery_count == 8 and answer.link_credit == 0
    assert len(of(pair.client_events, ev.DeliveryReceived)) == 5
    assert receiver.credit == 0 and receiver.delivery_count == 8


def test_drain_spends_the_unused_credit() -> None:
    pair, sender, receiver = sender_pair()
    sender.send(b"a")
    sender.send(b"b")
    start_count = sender.delivery_count
    mark = pair.mark()
    receiver.flow(5, drain=True)
    pair.pump()
    wire = [f.body for f in frames(pair.sent_by_client(mark))]
    assert [type(b) for b in wire] == [Transfer, Transfer, Flow]
    flow = wire[2]
    assert flow.handle == sender.handle
    assert flow.delivery_count == start_count + 5
    assert flow.link_credit == 0
    assert sender.credit == 0 and sender.delivery_count == start_count + 5
    (flow_event,) = of(pair.server_events, ev.LinkFlow)
    assert flow_event.link is receiver
    assert receiver.credit == 0
    assert receiver.delivery_count == start_count + 5
    assert len(of(pair.server_events, ev.DeliveryReceived)) == 2


def test_drain_with_nothing_queued_answers_at_once() -> None:
    pair, _sender, receiver = sender_pair()
    mark = pair.mark()
    receiver.flow(7, drain=True)
    pair.pump()
    (flow,) = bodies(pair.sent_by_client(mark), Flow)
    assert (flow.delivery_count, flow.link_credit) == (7, 0)
    assert flow.drain is True  # the answer to a drain says so (rhea waits for exactly that)
    assert receiver.credit == 0


def test_manual_drain_when_auto_drain_is_off() -> None:
    pair, sender, receiver = sender_pair()
    sender.auto_drain = False
    receiver.flow(3, drain=True)
    pair.pump()
    (flow_event,) = of(pair.client_events, ev.LinkFlow)
    assert flow_event.drain is True and sender.drain
    assert sender.credit == 3
    sender.drained()
    pair.pump()
    assert receiver.credit == 0 and sender.credit == 0
    assert receiver.delivery_count == 3


def test_echo_flow_is_answered_with_the_link_state() -> None:
    pair, sender, receiver = sender_pair()
    sender.send(b"x")
    mark = pair.mark()
    receiver.flow(4, echo=True)
    pair.pump()
    (request,) = bodies(pair.sent_by_server(mark), Flow)
    assert request.echo is True and request.link_credit == 4
    answer = [f for f in bodies(pair.sent_by_client(mark), Flow) if f.handle == sender.handle]
    assert len(answer) == 1
    assert answer[0].link_credit == 4  # answered before the pump spent credit
    assert answer[0].echo is False


def test_session_level_echo_flow() -> None:
    pair, _session = session_pair()
    server_session = pair.server_session()
    flow = Flow(
        next_incoming_id=0, incoming_window=10, next_outgoing_id=0, outgoing_window=10, echo=True
    )
    pair.server.receive_data(frame_bytes(server_session.remote_channel, flow))
    reply = pair.server.data_to_send()
    (flow,) = bodies(reply, Flow)
    assert flow.handle is None and flow.echo is False
    assert flow.incoming_window == server_session.incoming_window


def test_small_session_incoming_window_is_replenished() -> None:
    pair, sender, receiver = receiver_pair(session_options={"incoming_window": 2})
    server_session = pair.server_session()
    client_session = receiver.session
    assert server_session.remote_incoming_window == 2
    receiver.flow(10)
    pair.pump()
    for i in range(10):
        sender.send(b"%d" % i)
    # one step of the server: only as many transfers as the client's window allows
    first = pair.server.data_to_send()
    assert len(transfers(first)) == 2
    assert server_session.remote_incoming_window == 0
    assert pair.server.data_to_send() == b""  # stopped: the window is shut
    pair.client.receive_data(first)
    replenish = pair.client.data_to_send()
    session_flows = [f for f in bodies(replenish, Flow) if f.handle is None]
    assert len(session_flows) == 1
    assert session_flows[0].incoming_window == 2
    pair.server.receive_data(replenish)
    assert server_session.remote_incoming_window == 2
    pair.client.events()
    pair.pump()
    window_flows = [f for f in bodies(pair.c2s, Flow) if f.handle is None]
    assert len(window_flows) >= 4
    received = of(pair.client_events, ev.DeliveryReceived)
    assert len(received) == 8  # the first two were taken from the client by hand above
    assert client_session.incoming_window >= 1
    assert sender.queued == 0


# ----------------------------------------------------------------------------- multi-frame


def send_and_check(pair: Pair, sender, receiver, payloads: list[bytes], limit: int) -> None:  # type: ignore[no-untyped-def]
    """Sends ``payloads`` and checks framing on the wire and reassembly at the receiver."""
    mark = pair.mark()
    receiver.flow(len(payloads))
    pair.pump()
    sent = pair.sent_by_client(mark)
    assert max(frame_sizes(sent)) <= limit
    per_delivery: dict[int, list] = {}
    for frame in frames(sent):
        if type(frame.body) is Transfer:
            per_delivery.setdefault(frame.body.delivery_id, []).append(frame)
    assert len(per_delivery) == len(payloads)
    for payload, (delivery_id, parts) in zip(payloads, sorted(per_delivery.items()), strict=True):
        assert [p.body.more for p in parts] == [True] * (len(parts) - 1) + [False], delivery_id
        assert b"".join(p.payload for p in parts) == payload
    received = of(pair.server_events, ev.DeliveryReceived)
    assert [e.delivery.payload for e in received] == payloads


@pytest.mark.parametrize("size", [0, 1, 400, 470, 480, 485, 490, 500, 511, 512, 520, 10_240])
def test_transfer_split_at_max_frame_size(size: int) -> None:
    pair, sender, receiver = sender_pair(
        client_kwargs={"max_frame_size": 512}, server_kwargs={"max_frame_size": 512}
    )
    payload = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    sender.send(payload)
    send_and_check(pair, sender, receiver, [payload], 512)


def test_every_size_around_the_frame_boundary() -> None:
    pair, sender, receiver = sender_pair(
        client_kwargs={"max_frame_size": 512}, server_kwargs={"max_frame_size": 512}
    )
    payloads = [bytes([n % 251]) * n for n in range(400, 1100)]
    for payload in payloads:
        sender.send(payload)
    send_and_check(pair, sender, receiver, payloads, 512)


def test_one_megabyte_in_64k_frames() -> None:
    pair, sender, receiver = sender_pair(server_kwargs={"max_frame_size": 65_536})
    payload = bytes(i * 7 % 256 for i in range(1 << 20))
    sender.send(payload, tag=b"big")
    send_and_check(pair, sender, receiver, [payload], 65_536)
    (received,) = of(pair.server_events, ev.DeliveryReceived)
    assert received.delivery.tag == b"big"


def test_sender_respects_the_receivers_frame_size_not_its_own() -> None:
    pair, sender, receiver = sender_pair(
        client_kwargs={"max_frame_size": 65_536}, server_kwargs={"max_frame_size": 600}
    )
    sender.send(b"z" * 5000)
    send_and_check(pair, sender, receiver, [b"z" * 5000], 600)


def test_delivery_of_more_frames_than_the_session_window() -> None:
    """The receiver must reopen its window while a long delivery is still incomplete."""
    pair, sender, _receiver = receiver_pair(
        credit=2, session_options={"incoming_window": 2}, client_kwargs={"max_frame_size": 512}
    )
    payload = bytes(range(256)) * 20  # 5 KB: about a dozen 512-byte frames
    sender.send(payload)
    sender.send(b"after")
    pair.pump()
    assert len(bodies(pair.s2c, Transfer)) > 10
    window_flows = [f for f in bodies(pair.c2s, Flow) if f.handle is None]
    assert len(window_flows) >= 5
    received = [e.delivery.payload for e in of(pair.client_events, ev.DeliveryReceived)]
    assert received == [payload, b"after"]


def test_aborted_transfer_yields_delivery_aborted_and_no_delivery() -> None:
    pair, sender, receiver = sender_pair(credit=5)
    channel = pair.server_session().remote_channel
    handle = sender.handle
    pair.server.receive_data(
        frame_bytes(channel, Transfer(handle=handle, delivery_id=0, delivery_tag=b"t0",
                                      message_format=0, more=True), b"part one, ")
        + frame_bytes(channel, Transfer(handle=handle, more=True), b"part two, ")
        + frame_bytes(channel, Transfer(handle=handle, more=True, aborted=True))
    )  # fmt: skip
    events = pair.server.events()
    (aborted,) = of(events, ev.DeliveryAborted)
    assert aborted.link is receiver and aborted.delivery_tag == b"t0"
    assert not of(events, ev.DeliveryReceived)
    assert receiver.is_open and not pair.server.is_terminated
    # the link is usable afterwards: the next delivery arrives whole
    pair.server.receive_data(
        frame_bytes(channel, Transfer(handle=handle, delivery_id=1, delivery_tag=b"t1"), b"next")
    )
    (received,) = of(pair.server.events(), ev.DeliveryReceived)
    assert received.delivery.payload == b"next"
    assert received.delivery.tag == b"t1"


# ----------------------------------------------------------------------------- settlement


def test_presettled_deliveries_arrive_settled_and_are_not_tracked() -> None:
    pair, sender, receiver = sender_pair(credit=3, link_options={"snd_settle_mode": SND_SETTLED})
    sent = [sender.send(b"%d" % i) for i in range(3)]
    pair.pump()
    assert all(d.settled for d in sent)
    assert all(t.settled for t in transfers(pair.c2s))
    received = [e.delivery for e in of(pair.server_events, ev.DeliveryReceived)]
    assert len(received) == 3
    assert all(d.settled and d.remote_settled for d in received)
    assert sender.session._outgoing_unsettled == {}
    assert receiver.session._incoming_unsettled == {}
    # settling again is a no-op: no disposition for a pre-settled delivery
    mark = pair.mark()
    received[0].update(Accepted())
    pair.pump()
    assert bodies(pair.sent_by_server(mark), Disposition) == []


def test_mixed_mode_can_presettle_one_delivery() -> None:
    pair, sender, receiver = sender_pair(credit=2)
    settled = sender.send(b"fire and forget", settled=True)
    tracked = sender.send(b"tracked")
    pair.pump()
    assert settled.delivery_id not in sender.session._outgoing_unsettled
    assert tracked.delivery_id in sender.session._outgoing_unsettled
    a, b = (e.delivery for e in of(pair.server_events, ev.DeliveryReceived))
    assert a.settled and not b.settled
    assert list(receiver.session._incoming_unsettled) == [b.delivery_id]


def test_accepted_outcome_reaches_the_sender() -> None:
    pair, sender, receiver = sender_pair(credit=1)
    delivery = sender.send(b"m")
    pair.pump()
    (received,) = of(pair.server_events, ev.DeliveryReceived)
    assert not received.delivery.settled
    received.delivery.update(Accepted())
    pair.pump()
    (updated,) = of(pair.client_events, ev.DeliveryUpdated)
    assert updated.delivery is delivery
    assert delivery.remote_state == Accepted()
    assert delivery.remote_settled
    assert sender.session._outgoing_unsettled == {}
    assert receiver.session._incoming_unsettled == {}


def test_unsettled_outcome_then_sender_settles() -> None:
    pair, sender, _receiver = sender_pair(credit=1)
    delivery = sender.send(b"m")
    pair.pump()
    (received,) = of(pair.server_events, ev.DeliveryReceived)
    received.delivery.update(Accepted(), settled=False)  # rcv-settle-mode second style
    pair.pump()
    assert delivery.remote_state == Accepted() and not delivery.remote_settled
    assert delivery.delivery_id in sender.session._outgoing_unsettled
    delivery.settle()
    pair.pump()
    (disposition,) = bodies(pair.c2s, Disposition)
    assert disposition.role is False and disposition.settled
    assert received.delivery.remote_settled


def test_settling_what_the_peer_settled_sends_nothing() -> None:
    """The receiver accepted and settled: the sender settling too is bookkeeping only (a
    sender's disposition for it makes RabbitMQ 3.10 end the session)."""
    pair, sender, _receiver = sender_pair(credit=1)
    delivery = sender.send(b"m")
    pair.pump()
    (received,) = of(pair.server_events, ev.DeliveryReceived)
    received.delivery.update(Accepted())
    pair.pump()
    assert delivery.remote_settled
    mark = pair.mark()
    delivery.settle()
    pair.pump()
    assert delivery.settled
    assert bodies(pair.sent_by_client(mark), Disposition) == []


def test_accepting_ten_deliveries_sends_one_ranged_disposition() -> None:
    pair, sender, _receiver = sender_pair(credit=10)
    for i in range(10):
        sender.send(b"%d" % i)
    pair.pump()
    received = [e.delivery for e in of(pair.server_events, ev.DeliveryReceived)]
    assert [d.delivery_id for d in received] == list(range(10))
    mark = pair.mark()
    for delivery in received:
        delivery.update(Accepted())
    pair.pump()
    (disposition,) = bodies(pair.sent_by_server(mark), Disposition)
    assert (disposition.first, disposition.last) == (0, 9)
    assert disposition.settled and disposition.role is True
    assert disposition.state == Accepted()
    assert len(of(pair.client_events, ev.DeliveryUpdated)) == 10


def test_mixed_outcomes_are_split_into_runs() -> None:
    pair, sender, _receiver = sender_pair(credit=10)
    sent = [sender.send(b"%d" % i) for i in range(10)]
    pair.pump()
    received = [e.delivery for e in of(pair.server_events, ev.DeliveryReceived)]
    outcomes = [Accepted()] * 3 + [Rejected(error=Error(condition="amqp:bad"))] * 2
    outcomes += [Released(), Modified(delivery_failed=True)] + [Accepted()] * 3
    mark = pair.mark()
    for delivery, outcome in reversed(list(zip(received, outcomes, strict=True))):
        delivery.update(outcome)  # any order: the engine sorts by delivery id
    pair.pump()
    dispositions = bodies(pair.sent_by_server(mark), Disposition)
    runs = [(d.first, d.last, type(d.state)) for d in dispositions]
    assert runs == [
        (0, 2, Accepted), (3, 4, Rejected), (5, None, Released), (6, None, Modified),
        (7, 9, Accepted),
    ]  # fmt: skip
    assert [type(d.remote_state) for d in sent] == [type(o) for o in outcomes]
    assert sent[3].remote_state.error.condition == "amqp:bad"


def test_gaps_in_ids_split_dispositions() -> None:
    pair, sender, _receiver = sender_pair(credit=6)
    for i in range(6):
        sender.send(b"%d" % i)
    pair.pump()
    received = [e.delivery for e in of(pair.server_events, ev.DeliveryReceived)]
    mark = pair.mark()
    for index in (0, 1, 3, 4, 5):
        received[index].update(Accepted())
    pair.pump()
    runs = [(d.first, d.last) for d in bodies(pair.sent_by_server(mark), Disposition)]
    assert runs == [(0, 1), (3, 5)]


def test_huge_disposition_range_is_bounded_and_touches_only_known_deliveries() -> None:
    pair, sender, _receiver = sender_pair(credit=3)
    sent = [sender.send(b"%d" % i) for i in range(3)]
    pair.pump()
    channel = sender.session.remote_channel
    pair.client.receive_data(
        frame_bytes(channel, Disposition(role=True, first=0, last=0xFFFFFFFF, settled=True,
                                         state=Accepted()))
    )  # fmt: skip
    updated = of(pair.client.events(), ev.DeliveryUpdated)
    assert sorted(e.delivery.delivery_id for e in updated) == [0, 1, 2]
    assert all(d.remote_settled and d.remote_state == Accepted() for d in sent)
    assert sender.session._outgoing_unsettled == {}
    assert not pair.client.is_terminated


def test_wrapping_disposition_range_uses_serial_arithmetic() -> None:
    pair, sender, _receiver = sender_pair(credit=3)
    sent = [sender.send(b"%d" % i) for i in range(3)]
    pair.pump()
    channel = sender.session.remote_channel
    pair.client.receive_data(
        frame_bytes(channel, Disposition(role=True, first=0xFFFFFFFE, last=1, settled=True,
                                         state=Released()))
    )  # fmt: skip
    updated = of(pair.client.events(), ev.DeliveryUpdated)
    assert sorted(e.delivery.delivery_id for e in updated) == [0, 1]
    assert not sent[2].remote_settled
    assert list(sender.session._outgoing_unsettled) == [2]


def test_disposition_for_unknown_ids_is_ignored() -> None:
    pair, sender, _receiver = sender_pair(credit=1)
    sender.send(b"m")
    pair.pump()
    channel = sender.session.remote_channel
    pair.client.receive_data(
        frame_bytes(channel, Disposition(role=True, first=100, last=200, settled=True))
    )
    assert of(pair.client.events(), ev.DeliveryUpdated) == []
    assert list(sender.session._outgoing_unsettled) == [0]


# ----------------------------------------------------------------------------- idle timeout


def test_idle_timeout_closes_a_silent_peer() -> None:
    pair = make_pair(server_kwargs={"idle_timeout": 1.0})
    pair.clear_events()
    assert pair.server.tick(100.0) == pytest.approx(101.0)
    assert pair.server.tick(100.9) == pytest.approx(101.0)
    assert pair.server.data_to_send() == b""
    assert pair.server.tick(101.0) is None
    sent = pair.server.data_to_send()
    error = close_error(sent)
    assert error.condition == "amqp:resource-limit-exceeded"
    (closed,) = of(pair.server.events(), ev.ConnectionClosed)
    assert closed.by_peer is False
    assert closed.error.condition == "amqp:resource-limit-exceeded"
    pair.client.receive_data(sent)
    (peer_closed,) = of(pair.client.events(), ev.ConnectionClosed)
    assert peer_closed.error.condition == "amqp:resource-limit-exceeded"
    assert peer_closed.by_peer is True


def test_heartbeat_at_half_the_peers_idle_timeout() -> None:
    pair = make_pair(server_kwargs={"idle_timeout": 2.0})
    assert pair.client.remote.idle_time_out == 2000
    assert pair.client.tick(10.0) == pytest.approx(11.0)
    assert pair.client.tick(10.5) == pytest.approx(11.0)
    assert pair.client.data_to_send() == b""
    assert pair.client.tick(11.0) == pytest.approx(12.0)
    assert pair.client.data_to_send() == HEARTBEAT
    assert pair.client.tick(11.2) == pytest.approx(12.0)
    assert pair.client.data_to_send() == b""


def test_no_heartbeat_when_the_peer_asked_for_none() -> None:
    pair = make_pair()
    assert pair.client.tick(0.0) is None
    assert pair.client.tick(1e9) is None
    assert pair.client.data_to_send() == b""


def test_receiving_data_resets_the_idle_timer() -> None:
    pair = make_pair(server_kwargs={"idle_timeout": 1.0})
    pair.server.tick(0.0)
    pair.server.tick(0.8)
    pair.server.receive_data(HEARTBEAT)
    assert pair.server.tick(0.8) == pytest.approx(1.8)
    assert pair.server.tick(1.5) == pytest.approx(1.8)
    assert pair.server.data_to_send() == b""
    assert not pair.server.is_terminated and pair.server.is_open
    pair.server.tick(1.8)
    assert close_error(pair.server.data_to_send()).condition == "amqp:resource-limit-exceeded"


def test_heartbeats_keep_an_idle_connection_alive() -> None:
    pair = make_pair(server_kwargs={"idle_timeout": 1.0}, client_kwargs={"idle_timeout": 1.0})
    now = 0.0
    for _ in range(200):  # 20 simulated seconds without any traffic but heartbeats
        pair.client.tick(now)
        pair.server.tick(now)
        pair.pump()
        now += 0.1
    assert pair.client.is_open and pair.server.is_open
    assert not of(pair.client_events + pair.server_events, ev.ConnectionClosed)
    assert HEARTBEAT in pair.c2s and HEARTBEAT in pair.s2c


def test_heartbeats_when_ticking_only_at_the_returned_deadlines() -> None:
    """The way a transport drives it: tick, flush, sleep until the deadline tick returned."""
    pair = make_pair(server_kwargs={"idle_timeout": 2.0})
    now = 50.0
    heartbeats = []
    for _ in range(12):
        deadline = pair.client.tick(now)
        if pair.client.data_to_send() == HEARTBEAT:
            heartbeats.append(now)
        assert deadline is not None and deadline > now
        now = deadline
    gaps = [b - a for a, b in itertools.pairwise(heartbeats)]
    assert len(heartbeats) >= 10
    assert max(gaps) <= 1.0 + 1e-9  # half the server's 2 s idle timeout


def test_idle_timeout_ends_a_handshake_that_stalls_before_open() -> None:
    server = Connection(server=True, container_id="s", idle_timeout=1.0)
    server.receive_data(AMQP_HEADER)  # then nothing: no open ever comes
    assert server.tick(10.0) == pytest.approx(11.0)
    assert server.tick(11.0) is None
    sent = server.data_to_send()
    assert sent.startswith(AMQP_HEADER)
    assert close_error(sent).condition == "amqp:resource-limit-exceeded"
    assert server.is_terminated
    (closed,) = of(server.events(), ev.ConnectionClosed)
    assert closed.error.condition == "amqp:resource-limit-exceeded"


def test_idle_timeout_ends_a_peer_that_never_sends_a_header() -> None:
    server = Connection(server=True, container_id="s", idle_timeout=1.0)
    server.tick(0.0)
    assert server.tick(1.0) is None
    assert server.is_terminated
