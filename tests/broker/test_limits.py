"""Limits and abuse: oversize messages, slow and vanished consumers, link floods, bad headers.

Each case checks that the broker answers precisely (the error condition a client maps) and
that only the offending link or connection pays for it: the same connection stays usable
where the spec allows, and other connections never notice.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.exceptions import MessageSizeExceededError
from proton import Delivery, Message
from proton.utils import LinkDetached

from replication.amqp.frames import AMQP_HEADER, SASL_HEADER, Frame, ProtocolHeader, encode_frame
from replication.amqp.message import Message as AmqpMessage
from replication.amqp.message import Properties, encode_message
from replication.amqp.outcomes import Accepted
from replication.amqp.performatives import (
    ROLE_RECEIVER,
    ROLE_SENDER,
    Attach,
    Close,
    Detach,
    Disposition,
    Flow,
    Open,
    SaslMechanisms,
    Transfer,
)
from replication.amqp.terminus import Source, Target
from replication.broker import limits, server
from replication.broker.auth import EMULATOR_KEY, EMULATOR_RULE_NAME
from replication.clock import ManualClock

from .conftest import HOST, REPO_ROOT, BrokerHandle, make_config, proton_connection, wait_for
from .test_broker_fuzz import RawClient

CONFIG = make_config({"q": {}, "slow": {}, "fast": {}, "locks": {}})
MESSAGE_SIZE_EXCEEDED = "amqp:link:message-size-exceeded"
KIB = 1024

StartBroker = Callable[..., BrokerHandle]


@pytest.fixture
def broker(broker_factory: StartBroker) -> BrokerHandle:
    return broker_factory(CONFIG)


def raw_session(port: int, **begin: Any) -> RawClient:
    client = RawClient(port)
    client.handshake()
    client.begin(**begin)
    return client


# ---------------------------------------------------------------------------- message size


@pytest.mark.timeout(60)
def test_proton_oversize_message_is_rejected_and_the_link_stays(broker: BrokerHandle) -> None:
    """Proton sends whatever it is given. A 300 KiB message on a queue with the standard
    256 KiB limit: the broker reads it and answers with a rejected disposition carrying
    ``amqp:link:message-size-exceeded`` (what the SDK maps to ``MessageSizeExceededError``);
    the link and connection stay, and the next message on the same link is accepted."""
    conn = proton_connection(broker.port)
    try:
        sender = conn.create_sender("q")
        assert sender.link.remote_max_message_size == 256 * KIB  # what the broker advertises
        big = Message(body=b"x" * (300 * KIB), id="too-big")
        delivery = sender.send(big, error_states=[])
        assert delivery.remote_state == Delivery.REJECTED
        condition = delivery.remote.condition
        assert condition is not None and condition.name == MESSAGE_SIZE_EXCEEDED
        assert "exceeds the limit" in condition.description
        assert sender.link.state & sender.link.REMOTE_ACTIVE  # no detach

        small = sender.send(Message(body=b"small", id="small"))
        assert small.remote_state == Delivery.ACCEPTED
        receiver = conn.create_receiver("q", credit=10)
        message = receiver.receive(timeout=5)
        receiver.accept()
        assert message.id == "small"
    finally:
        conn.close()
    assert broker.count("q") == 0  # the oversize message was never stored


@pytest.mark.timeout(60)
def test_huge_message_costs_the_link_not_the_connection(broker: BrokerHandle) -> None:
    """Above ``limits.RECEIVE_LIMIT`` (4 MiB) the broker stops reading the delivery: it
    detaches the link with ``amqp:link:message-size-exceeded``. The connection stays: a new
    link on it sends fine."""
    size = limits.RECEIVE_LIMIT + 256 * KIB
    conn = proton_connection(broker.port)
    try:
        sender = conn.create_sender("q")
        with pytest.raises(LinkDetached, match="exceeds the link's max-message-size") as info:
            sender.send(Message(body=b"x" * size, id="huge"), timeout=15)
        assert info.value.condition == MESSAGE_SIZE_EXCEEDED
        assert "max-message-size" in info.value.link.remote_condition.description
        sender.close()  # answer the detach (proton leaves that to us)
        second = conn.create_sender("q", name="second")  # same connection, new link
        assert second.send(Message(body=b"after", id="after")).remote_state == Delivery.ACCEPTED
    finally:
        conn.close()
    assert broker.count("q") == 1


@pytest.mark.timeout(60)
def test_sdk_oversize_single_message_and_batch(broker: BrokerHandle) -> None:
    """The SDK raises ``MessageSizeExceededError`` for a single 300 KiB message (the broker's
    rejected disposition: the SDK itself does not check a single message's size), refuses it
    in a batch by itself (against the link's max-message-size the broker advertised), and the
    same sender goes on sending."""
    with broker.client(retry_total=0) as client, client.get_queue_sender("q") as sender:
        with pytest.raises(
            MessageSizeExceededError, match=r"exceeds the limit \(262144\) of entity 'q'"
        ) as info:
            sender.send_messages(ServiceBusMessage(b"x" * (300 * KIB), message_id="big"))
        # the broker's words: the SDK sent the message and mapped the rejection
        assert "amqp:link:message-size-exceeded" in str(info.value)
        batch = sender.create_message_batch()
        assert batch.max_size_in_bytes == 256 * KIB
        with pytest.raises(MessageSizeExceededError, match="size limit: 262144"):
            batch.add_message(ServiceBusMessage(b"x" * (300 * KIB)))
        sender.send_messages(ServiceBusMessage(b"fits", message_id="fits"))
        with client.get_queue_receiver(
            "q", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        ) as receiver:
            received = receiver.receive_messages(max_message_count=10, max_wait_time=2)
    assert [m.message_id for m in received] == ["fits"]


# ---------------------------------------------------------------------------- slow consumer


@pytest.mark.timeout(90)
def test_slow_consumer_does_not_stall_others(broker: BrokerHandle) -> None:
    """A consumer grants 10,000 credit and never reads its socket. The broker stops writing
    to it once the socket is full (and takes no more messages off the queue for it), while
    a producer and a consumer on other connections move 500 messages as fast as ever. When
    the slow consumer reads again, it gets everything it was owed."""
    count, size = 300, 32 * KIB  # ~10 MB: more than the kernel buffers hold
    with broker.client() as client, client.get_queue_sender("slow") as sender:
        for start in range(0, count, 6):
            sender.send_messages([
                ServiceBusMessage(b"s" * size, message_id=f"slow-{i}")
                for i in range(start, min(count, start + 6))
            ])  # fmt: skip

    slow = RawClient(broker.port, rcvbuf=256 * KIB)  # a fixed window: no autotuning to 32 MB
    try:
        slow.handshake()
        slow.begin(incoming_window=0x7FFFFFFF)
        slow.send(encode_frame(0, Attach(
            name="slow-reader", handle=0, role=ROLE_RECEIVER, source=Source(address="slow"),
            target=Target(address="slow-reader"), snd_settle_mode=0, rcv_settle_mode=0,
        )))  # fmt: skip
        assert slow.expect(Attach).source is not None
        slow.send(encode_frame(0, Flow(
            next_incoming_id=0, incoming_window=0x7FFFFFFF, next_outgoing_id=0,
            outgoing_window=0x7FFFFFFF, handle=0, delivery_count=0, link_credit=10_000,
        )))  # fmt: skip
        # ... and from here on it reads nothing

        def slow_peer_paused() -> bool:
            assert broker.broker is not None
            return any(p.driver.paused and p.consumers for p in broker.broker.peers.values())

        wait_for(lambda: broker.call(slow_peer_paused), timeout=15)
        held_back = broker.call(lambda: len(broker.broker.queues["slow"].ready))  # type: ignore[union-attr]
        assert held_back > 0, "the broker took every message for a reader that reads nothing"

        started = time.monotonic()
        received: list[str] = []

        def consume() -> None:
            with (
                broker.client() as client,
                client.get_queue_receiver("fast", prefetch_count=100) as receiver,
            ):
                deadline = time.monotonic() + 30
                while len(received) < 500 and time.monotonic() < deadline:
                    for message in receiver.receive_messages(100, max_wait_time=1):
                        receiver.complete_message(message)
                        received.append(str(message.message_id))

        consumer = threading.Thread(target=consume, name="fast-consumer")
        consumer.start()
        with broker.client() as client, client.get_queue_sender("fast") as sender:
            for i in range(500):
                sender.send_messages(ServiceBusMessage(f"fast {i}", message_id=f"fast-{i}"))
        consumer.join(40)
        elapsed = time.monotonic() - started
        assert sorted(received) == sorted(f"fast-{i}" for i in range(500))
        assert elapsed < 20, f"500 messages took {elapsed:.1f} s next to a stalled consumer"
        assert broker.call(slow_peer_paused), "the slow consumer got unstuck by itself?"

        # the slow reader wakes up: the broker resumes and delivers everything it owes
        tags: set[bytes] = set()
        deadline = time.monotonic() + 30
        while len(tags) < count:
            assert time.monotonic() < deadline, f"slow reader got {len(tags)} of {count}"
            item = slow.next(timeout=max(0.1, deadline - time.monotonic()))
            assert item is not None, "connection closed"
            if (
                isinstance(item, Frame)
                and isinstance(item.body, Transfer)
                and item.body.delivery_tag
            ):
                tags.add(bytes(item.body.delivery_tag))
        assert broker.call(lambda: len(broker.broker.queues["slow"].locks)) == count  # type: ignore[union-attr]
    finally:
        slow.close()
    # its connection gone, the slow reader's locks hold their messages until they expire
    wait_for(lambda: broker.call(lambda: len(broker.broker.queues["slow"].orphaned_locks)) == count)  # type: ignore[union-attr]
    assert broker.call(lambda: len(broker.broker.queues["slow"].ready)) == 0  # type: ignore[union-attr]


# ---------------------------------------------------------------------------- dropped consumer

PROTON_RECEIVER = textwrap.dedent("""
    import sys, time
    from proton.utils import BlockingConnection
    port, user, password, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    conn = BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=10, user=user,
                              password=password, allowed_mechs="PLAIN")
    receiver = conn.create_receiver("locks", credit=count)
    ids = [str(receiver.receive(timeout=10).id) for _ in range(count)]  # never settled
    print(" ".join(ids), flush=True)
    time.sleep(120)
""")


def hold_locks_with_proton(port: int, count: int) -> tuple[subprocess.Popen[str], list[str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", PROTON_RECEIVER, str(port), EMULATOR_RULE_NAME, EMULATOR_KEY,
         str(count)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(30)
    if not line or not line[0].strip():
        proc.kill()
        raise AssertionError(f"proton receiver failed: {proc.stderr.read()}")  # type: ignore[union-attr]
    return proc, line[0].split()


def hold_locks_raw(port: int, count: int) -> tuple[RawClient, list[str]]:
    client = raw_session(port)
    client.send(encode_frame(0, Attach(
        name="dropper", handle=0, role=ROLE_RECEIVER, source=Source(address="locks"),
        target=Target(address="dropper"),
    )))  # fmt: skip
    client.expect(Attach)
    client.send(encode_frame(0, Flow(
        next_incoming_id=0, incoming_window=65536, next_outgoing_id=0, outgoing_window=65536,
        handle=0, delivery_count=0, link_credit=count,
    )))  # fmt: skip
    assert client.collect(Transfer, count, timeout=10) == count
    return client, [f"lock-{i}" for i in range(count)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["proton-killed", "socket-reset"])
def test_dropped_connection_keeps_its_locks_until_they_expire(
    broker_factory: Any, how: str
) -> None:
    """A consumer holds 10 peek-locks and its connection dies without a word (the process is
    SIGKILLed, or the socket is reset). As on Service Bus the messages stay locked until the
    locks expire (60 s on the broker's clock), then come again with a delivery counted."""
    broker: BrokerHandle = broker_factory(CONFIG, clock=ManualClock())
    count = 10
    with broker.client() as client, client.get_queue_sender("locks") as sender:
        sender.send_messages(
            [ServiceBusMessage(b"l", message_id=f"lock-{i}") for i in range(count)]
        )

    if how == "proton-killed":
        proc, held = hold_locks_with_proton(broker.port, count)
        drop: Callable[[], None] = lambda: (proc.send_signal(signal.SIGKILL), proc.wait(10))  # noqa: E731
    else:
        raw, held = hold_locks_raw(broker.port, count)

        def drop() -> None:  # RST instead of FIN
            raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00" * 2)
            raw.close()

    try:
        assert sorted(held) == sorted(f"lock-{i}" for i in range(count))
        assert broker.call(lambda: len(broker.broker.queues["locks"].locks)) == count  # type: ignore[union-attr]
    finally:
        drop()

    def held_and_ready() -> tuple[int, int]:
        assert broker.broker is not None
        queue = broker.broker.queues["locks"]
        return len(queue.orphaned_locks), len(queue.ready)

    wait_for(lambda: broker.call(held_and_ready) == (count, 0))
    broker.advance(61)
    started = time.monotonic()
    with broker.client() as client, client.get_queue_receiver("locks") as receiver:
        got: list[Any] = []
        while len(got) < count and time.monotonic() - started < 10:
            got += receiver.receive_messages(max_message_count=count, max_wait_time=1)
        for message in got:
            receiver.complete_message(message)
    assert sorted(str(m.message_id) for m in got) == sorted(held)
    assert all(m.delivery_count == 1 for m in got)
    assert broker.count("locks") == 0


# ---------------------------------------------------------------------------- link flood


def attach_flood(channel: int, first_handle: int, count: int) -> bytes:
    return b"".join(
        encode_frame(
            channel,
            Attach(
                name=f"flood-{channel}-{h}",
                handle=h,
                role=ROLE_SENDER,
                source=Source(address=f"flood-{channel}-{h}"),
                target=Target(address="q"),
                initial_delivery_count=0,
            ),
        )
        for h in range(first_handle, first_handle + count)
    )


def read_attach_answers(client: RawClient, count: int, timeout: float = 30) -> dict[str, Any]:
    """Link name -> "accepted", or the condition of the detach that refused it."""
    answers: dict[str, Any] = {}
    refused: dict[tuple[int, int], str] = {}  # (broker's channel, broker's handle) -> name
    deadline = time.monotonic() + timeout
    while len(answers) < count:
        assert time.monotonic() < deadline, f"{len(answers)} of {count} attaches answered"
        item = client.next(timeout=max(0.1, deadline - time.monotonic()))
        assert item is not None, "the broker closed the connection"
        if not isinstance(item, Frame):
            continue
        body = item.body
        if isinstance(body, Attach):
            if body.target is not None:
                answers[body.name] = "accepted"
            else:  # a refusal: an attach without terminus, then a detach with the reason
                assert body.source is None
                refused[(item.channel, body.handle)] = body.name
        elif isinstance(body, Detach):
            name = refused.pop((item.channel, body.handle))
            assert body.closed
            answers[name] = str(body.error.condition) if body.error else None
    return answers


def channel_and_handle(name: str) -> tuple[int, int]:
    _, channel, handle = name.split("-")
    return int(channel), int(handle)


@pytest.mark.timeout(90)
def test_link_flood_hits_the_per_connection_limit(broker: BrokerHandle) -> None:
    """1,400 sender links over two sessions of one connection: the first
    ``MAX_LINKS_PER_CONNECTION`` (1,000) are accepted, every further attach is refused (an
    attach without terminus, then a closed detach with ``amqp:resource-limit-exceeded``).
    The connection stays usable, and detaching links frees room for new ones."""
    limit = limits.MAX_LINKS_PER_CONNECTION
    per_session = 700
    client = raw_session(broker.port)
    try:
        client.begin(channel=1)
        # the broker numbers its sessions itself: learn its channel for each of ours
        client.send(attach_flood(0, 0, per_session) + attach_flood(1, 0, per_session))
        answers = read_attach_answers(client, 2 * per_session)
        accepted = [name for name, value in answers.items() if value == "accepted"]
        refused = [name for name, value in answers.items() if value != "accepted"]
        assert len(accepted) == limit
        assert len(refused) == 2 * per_session - limit
        assert {answers[name] for name in refused} == {"amqp:resource-limit-exceeded"}

        # a link of each session still works: an accepted message on each
        for channel in (0, 1):
            handle = min(h for c, h in map(channel_and_handle, accepted) if c == channel)
            message = AmqpMessage.from_bytes(b"x", properties=Properties(message_id=channel))
            client.send(encode_frame(channel, Transfer(
                handle=handle, delivery_id=0, delivery_tag=b"t", message_format=0,
            ), encode_message(message)))  # fmt: skip
            disposition = client.expect(Disposition)
            assert disposition.settled and isinstance(disposition.state, Accepted)

        # answer the refusals and close ten accepted links: room for ten new ones, not eleven
        frames = b""
        for name in refused:
            channel, handle = channel_and_handle(name)
            frames += encode_frame(channel, Detach(handle=handle, closed=True))
        for name in [n for n in accepted if channel_and_handle(n)[0] == 0][:10]:
            frames += encode_frame(0, Detach(handle=channel_and_handle(name)[1], closed=True))
        client.send(frames)
        assert client.collect(Detach, 10, timeout=10) == 10
        client.send(attach_flood(1, 5000, 11))
        again = read_attach_answers(client, 11)
        assert sorted(again.values()) == ["accepted"] * 10 + ["amqp:resource-limit-exceeded"]
        client.send(encode_frame(0, Close()))
        assert client.expect(Close).error is None
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_link_limit_is_configurable(broker: BrokerHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rule with the limit lowered to 20 (one session), and the SDK on another
    connection does not notice."""
    monkeypatch.setattr(server, "MAX_LINKS_PER_CONNECTION", 20)
    client = raw_session(broker.port)
    try:
        client.send(attach_flood(0, 0, 30))
        answers = read_attach_answers(client, 30)
        assert list(answers.values()).count("accepted") == 20
        assert list(answers.values()).count("amqp:resource-limit-exceeded") == 10
        with broker.client() as sdk, sdk.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage(b"other connection"))
    finally:
        client.close()
    assert broker.count("q") == 1


@pytest.mark.timeout(60)
def test_refusals_left_attached_close_the_connection(
    broker: BrokerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer that keeps attaching past the limit and never detaches the refused links
    would grow the broker's link table without end: at twice the limit the connection is
    closed with ``amqp:resource-limit-exceeded``."""
    monkeypatch.setattr(server, "MAX_LINKS_PER_CONNECTION", 10)
    client = raw_session(broker.port)
    try:
        client.send(attach_flood(0, 0, 30))
        close = client.expect(Close, timeout=10)
        assert close.error is not None
        assert str(close.error.condition) == "amqp:resource-limit-exceeded"
    finally:
        client.close()
    with broker.client() as sdk, sdk.get_queue_sender("q") as sender:
        sender.send_messages(ServiceBusMessage(b"the broker is fine"))
    assert broker.count("q") == 1


# ---------------------------------------------------------------------------- protocol header


def exchange(port: int, data: bytes, timeout: float = 5.0) -> tuple[bytes, bool]:
    """Writes ``data``; returns what the broker sent back and whether it closed the socket."""
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        sock.sendall(data)
        received = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                return received, False
            except ConnectionResetError:
                return received, True
            if not chunk:
                return received, True
            received += chunk
        return received, False


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/1.1 200 OK\r\n\r\n",  # a response is no request (requests are served here)
        b"AMQX",  # a wrong byte inside the first four: no need to wait for eight
        b"AMQP\x01\x01\x00\x00",  # unknown protocol id
        b"AMQP\x02\x01\x00\x00",  # TLS: not offered on this port
        b"AMQP\x03\x01\x00\x01",  # SASL, wrong revision
        b"AMQP\x00\x02\x00\x00",  # AMQP 2.0
        b"AMQP\x03\x00\x09\x01",  # AMQP 0-9-1 with a SASL id
        bytes(8),
    ],
    ids=[
        "http-response",
        "early-mismatch",
        "protocol-1",
        "tls",
        "revision",
        "amqp-2.0",
        "0-9-1",
        "zeros",
    ],
)
def test_malformed_header_gets_the_supported_header_and_close(
    broker: BrokerHandle, data: bytes
) -> None:
    """Spec 2.2: a header the broker cannot serve is answered with the header it does
    support (SASL first, as it offers SASL) and the socket is closed; nothing else is sent.
    (An HTTP request or a TLS ClientHello is served on this port: test_tls_websockets.py.)"""
    received, closed = exchange(broker.port, data)
    assert received == SASL_HEADER
    assert closed


@pytest.mark.timeout(30)
def test_valid_headers_are_answered_in_kind(broker: BrokerHandle) -> None:
    # SASL: the SASL header and the mechanisms, connection open
    client = RawClient(broker.port)
    try:
        client.send(SASL_HEADER)
        assert client.expect(ProtocolHeader).to_bytes() == SASL_HEADER
        mechanisms = client.expect(SaslMechanisms).sasl_server_mechanisms
        assert {str(m) for m in mechanisms} >= {"PLAIN", "ANONYMOUS", "MSSBCBS"}
    finally:
        client.close()
    # plain AMQP (SASL is optional here): the AMQP header, then open for open
    client = RawClient(broker.port)
    try:
        client.send(AMQP_HEADER + encode_frame(0, Open(container_id="no-sasl")))
        assert client.expect(ProtocolHeader).to_bytes() == AMQP_HEADER
        assert client.expect(Open).container_id
    finally:
        client.close()
    # a header sent one byte at a time is still a header
    client = RawClient(broker.port)
    try:
        for byte in SASL_HEADER:
            client.send(bytes([byte]))
            time.sleep(0.01)
        assert client.expect(ProtocolHeader).to_bytes() == SASL_HEADER
    finally:
        client.close()


@pytest.mark.timeout(30)
def test_wrong_header_after_sasl_gets_the_amqp_header_and_close(broker: BrokerHandle) -> None:
    """After SASL succeeded the next header must be AMQP's; a second SASL header is answered
    with the AMQP header and the socket closes."""
    client = RawClient(broker.port)
    try:
        client.sasl_plain()
        client.send(SASL_HEADER)
        heard = client.read_to_end()
        assert [h.to_bytes() for h in heard.headers] == [AMQP_HEADER]
        assert heard.frames == []
    finally:
        client.close()
