"""Helpers for the engine tests: a client/server pair of real ``Connection``s and wire parsing.

A ``Pair`` moves the bytes each side writes (``data_to_send``) into the other side
(``receive_data``) until both are quiet, keeps every byte it moved (``c2s``/``s2c``) so a test
can parse what really went over the wire, and collects each side's events. By default the
server accepts every attach it is offered, as a broker would.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from replication.amqp import events as ev
from replication.amqp.connection import Connection
from replication.amqp.frames import FRAME_AMQP, Frame, FrameReader, ProtocolHeader, encode_frame
from replication.amqp.link import Link
from replication.amqp.performatives import Close, Error
from replication.amqp.sasl import SaslClient, SaslServer
from replication.amqp.session import Session
from replication.amqp.terminus import Source, Target

T = TypeVar("T")

USER = "u"
PASSWORD = "p"
HEARTBEAT = b"\x00\x00\x00\x08\x02\x00\x00\x00"


def check_password(credentials: Any) -> bool:
    return credentials.username == USER and credentials.password == PASSWORD


def plain_client(password: str = PASSWORD, **kwargs: Any) -> Connection:
    kwargs.setdefault("container_id", "client")
    return Connection(sasl=SaslClient("PLAIN", username=USER, password=password), **kwargs)


def sasl_server(**kwargs: Any) -> Connection:
    kwargs.setdefault("container_id", "server")
    kwargs.setdefault("sasl", SaslServer(authenticate=check_password))
    return Connection(server=True, **kwargs)


# ---------------------------------------------------------------------------------- wire parsing


def parse_wire(data: bytes | bytearray) -> list[ProtocolHeader | Frame]:
    """Splits a captured byte stream into protocol headers and frames (decoded by FrameReader).

    A frame of 0x414D5150 bytes ("AMQP") would be ambiguous, but no test sends a 1 GiB frame.
    """
    data = bytes(data)
    items: list[ProtocolHeader | Frame] = []
    pos = 0
    while pos < len(data):
        if data[pos : pos + 4] == b"AMQP":
            assert len(data) - pos >= 8, f"truncated protocol header at {pos}"
            items.append(ProtocolHeader(*data[pos + 4 : pos + 8]))
            pos += 8
            continue
        assert len(data) - pos >= 8, f"truncated frame header at {pos}"
        (size,) = struct.unpack_from(">I", data, pos)
        assert len(data) - pos >= size, f"truncated frame at {pos}"
        reader = FrameReader()
        reader.expect_header = False
        reader.feed(data[pos : pos + size])
        frame = reader.next()
        assert isinstance(frame, Frame)
        assert reader.buffered == 0
        items.append(frame)
        pos += size
    return items


def frames(data: bytes | bytearray) -> list[Frame]:
    return [item for item in parse_wire(data) if isinstance(item, Frame)]


def frame_sizes(data: bytes | bytearray) -> list[int]:
    """The size field of every frame in a stream (headers skipped)."""
    sizes = []
    pos = 0
    data = bytes(data)
    while pos < len(data):
        if data[pos : pos + 4] == b"AMQP":
            pos += 8
            continue
        (size,) = struct.unpack_from(">I", data, pos)
        sizes.append(size)
        pos += size
    return sizes


def bodies(data: bytes | bytearray, kind: type[T]) -> list[T]:
    """The frame bodies of one performative type, in wire order."""
    return [f.body for f in frames(data) if type(f.body) is kind]


def of(events: Iterable[Any], kind: type[T]) -> list[T]:
    return [e for e in events if isinstance(e, kind)]


def close_error(data: bytes | bytearray) -> Error | None:
    """The error of the one close frame in ``data`` (asserts there is exactly one)."""
    closes = bodies(data, Close)
    assert len(closes) == 1, f"expected one close frame, got {frames(data)}"
    return closes[0].error


def frame_bytes(channel: int, body: Any, payload: bytes = b"") -> bytes:
    return encode_frame(channel, body, payload, frame_type=FRAME_AMQP)


# ---------------------------------------------------------------------------------- the pair


@dataclass
class Pair:
    client: Connection
    server: Connection
    auto_accept: bool = True
    client_events: list[Any] = field(default_factory=list)
    server_events: list[Any] = field(default_factory=list)
    c2s: bytearray = field(default_factory=bytearray)
    s2c: bytearray = field(default_factory=bytearray)

    def pump(self, max_rounds: int = 10_000) -> None:
        """Moves bytes both ways until neither side has anything to say."""
        for _ in range(max_rounds):
            moved = False
            data = self.client.data_to_send()
            if data:
                moved = True
                self.c2s += data
                self.server.receive_data(data)
            self._collect_server()
            data = self.server.data_to_send()
            if data:
                moved = True
                self.s2c += data
                self.client.receive_data(data)
            self._collect_client()
            if not moved:
                return
        raise AssertionError("the pair kept talking")

    def _collect_server(self) -> None:
        for event in self.server.events():
            self.server_events.append(event)
            if self.auto_accept and isinstance(event, ev.LinkAttachRequested):
                event.link.accept()

    def _collect_client(self) -> None:
        self.client_events.extend(self.client.events())

    def mark(self) -> tuple[int, int]:
        """Where the captured streams end now; pass to ``sent_by_client``/``sent_by_server``."""
        return len(self.c2s), len(self.s2c)

    def sent_by_client(self, since: tuple[int, int] = (0, 0)) -> bytes:
        return bytes(self.c2s[since[0] :])

    def sent_by_server(self, since: tuple[int, int] = (0, 0)) -> bytes:
        return bytes(self.s2c[since[1] :])

    def clear_events(self) -> None:
        self.client_events.clear()
        self.server_events.clear()

    def server_link(self, name: str) -> Link:
        link = self.server.find_link(name)
        assert link is not None, f"server has no link {name!r}"
        return link

    def server_session(self) -> Session:
        (session,) = self.server.sessions.values()
        return session


def make_pair(
    *,
    sasl: bool = True,
    client_kwargs: dict[str, Any] | None = None,
    server_kwargs: dict[str, Any] | None = None,
    auto_accept: bool = True,
    open_connection: bool = True,
) -> Pair:
    """A client and a server; opened (and pumped) unless ``open_connection`` is false."""
    client_kwargs = dict(client_kwargs or {})
    server_kwargs = dict(server_kwargs or {})
    if sasl:
        client = plain_client(**client_kwargs)
        server = sasl_server(**server_kwargs)
    else:
        client_kwargs.setdefault("container_id", "client")
        server_kwargs.setdefault("container_id", "server")
        client = Connection(**client_kwargs)
        server = Connection(server=True, **server_kwargs)
    pair = Pair(client, server, auto_accept=auto_accept)
    if open_connection:
        client.open()
        pair.pump()
        assert client.is_open and server.is_open
    return pair


def session_pair(**kwargs: Any) -> tuple[Pair, Session]:
    """An open pair with one session begun by the client."""
    session_options = kwargs.pop("session_options", {})
    pair = make_pair(**kwargs)
    session = pair.client.begin_session(**session_options)
    pair.pump()
    assert session.is_open
    return pair, session


def sender_pair(
    name: str = "out", *, credit: int = 0, link_options: dict[str, Any] | None = None, **kwargs: Any
) -> tuple[Pair, Link, Link]:
    """Client sender -> server receiver, attached; the server grants ``credit`` if non-zero."""
    pair, session = session_pair(**kwargs)
    sender = session.attach_sender(name, Target(address="q"), **(link_options or {}))
    pair.pump()
    receiver = pair.server_link(name)
    assert sender.is_open and receiver.is_open
    if credit:
        receiver.flow(credit)
        pair.pump()
    pair.clear_events()
    return pair, sender, receiver


def receiver_pair(
    name: str = "in", *, credit: int = 0, link_options: dict[str, Any] | None = None, **kwargs: Any
) -> tuple[Pair, Link, Link]:
    """Server sender -> client receiver, attached; returns (pair, sender, receiver)."""
    pair, session = session_pair(**kwargs)
    receiver = session.attach_receiver(
        name, Source(address="q"), credit=credit, **(link_options or {})
    )
    pair.pump()
    sender = pair.server_link(name)
    assert sender.is_open and receiver.is_open
    pair.clear_events()
    return pair, sender, receiver
