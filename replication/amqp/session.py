"""Sessions (spec 2.5.6): channels, transfer-id windows, delivery ids, dispositions by range.

A session numbers every transfer frame (``next-outgoing-id``) and every delivery
(``delivery-id``), sends transfer frames only while the peer's incoming window is open, and
folds dispositions for consecutive delivery ids with one outcome into a single frame.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import TYPE_CHECKING, Any, Final

from . import events as ev
from .errors import ProtocolError
from .frames import encode_transfer_frames, transfer_frame
from .link import SERIAL_MASK, Delivery, Link, LinkState
from .performatives import (
    RCV_FIRST,
    ROLE_RECEIVER,
    ROLE_SENDER,
    SND_MIXED,
    Attach,
    Begin,
    Detach,
    Disposition,
    End,
    Error,
    Flow,
    Transfer,
)

if TYPE_CHECKING:
    from .connection import Connection

DEFAULT_WINDOW: Final = 65_536
DEFAULT_MAX_MESSAGE_SIZE: Final = 256 * 1024 * 1024
"""Largest delivery a receiver reassembles when its link sets no max-message-size."""


class SessionState(enum.Enum):
    UNMAPPED = "unmapped"
    BEGIN_SENT = "begin-sent"
    MAPPED = "mapped"
    END_SENT = "end-sent"
    END_RECEIVED = "end-received"
    DISCARDING = "discarding"


class SessionError(ProtocolError):
    """Ends this session with ``condition`` (the connection survives)."""


class LinkError(ProtocolError):
    """Detaches ``link`` with ``condition`` (the session survives)."""

    def __init__(self, link: Link, description: str, condition: str) -> None:
        super().__init__(description, condition)
        self.link = link


def _serial_in_window(value: int, first: int, last: int) -> bool:
    return ((value - first) & SERIAL_MASK) <= ((last - first) & SERIAL_MASK)


class Session:
    """One session of a connection; create with ``Connection.begin_session``."""

    def __init__(
        self,
        connection: Connection,
        channel: int,
        *,
        incoming_window: int = DEFAULT_WINDOW,
        outgoing_window: int = DEFAULT_WINDOW,
        handle_max: int = 0xFFFFFFFF,
        properties: dict[Any, Any] | None = None,
    ) -> None:
        self.connection = connection
        self.channel = channel
        self.remote_channel: int | None = None
        self.state = SessionState.UNMAPPED
        self.handle_max = handle_max
        self.properties = properties
        self.remote: Begin | None = None
        # flow state (spec 2.5.6)
        self.next_outgoing_id = 0
        self.max_incoming_window = incoming_window
        self.incoming_window = incoming_window
        self.outgoing_window = outgoing_window
        self.next_incoming_id = 0
        self.remote_incoming_window = 0
        self.remote_outgoing_window = 0
        self._next_delivery_id = 0
        self.links: dict[int, Link] = {}
        self._links_by_remote: dict[int, Link] = {}
        self._links_by_name: dict[tuple[str, bool], Link] = {}
        self._refused_by_name: dict[tuple[str, bool], Link] = {}
        """Refusals of a name in use (``_refuse_name_in_use``) the peer has not detached."""
        self._outgoing_unsettled: dict[int, Delivery] = {}
        self._incoming_unsettled: dict[int, Delivery] = {}
        self._pending_frames: deque[bytes] = deque()
        self._pending_dispositions: dict[int, Delivery] = {}
        """By ``id(delivery)``: several updates before a flush send the last state once."""

    # ------------------------------------------------------------------ lifecycle

    def _begin_performative(self) -> Begin:
        return Begin(
            remote_channel=self.remote_channel,
            next_outgoing_id=self.next_outgoing_id,
            incoming_window=self.incoming_window,
            outgoing_window=self.outgoing_window,
            handle_max=self.handle_max,
            properties=self.properties,
        )

    def end(self, error: Error | None = None) -> None:
        if self.state in (SessionState.UNMAPPED, SessionState.END_SENT):
            return
        replying = self.state is SessionState.END_RECEIVED
        self._flush_dispositions()
        self._send_frame(End(error=error))
        if replying:
            self.connection._forget_session(self)
        else:
            self.state = SessionState.END_SENT

    @property
    def is_open(self) -> bool:
        return self.state is SessionState.MAPPED

    def _allocate_handle(self) -> int:
        handle = 0
        while handle in self.links:
            handle += 1
        limit = self.remote.handle_max if self.remote else self.handle_max
        if handle > min(limit, self.handle_max):
            raise ProtocolError(f"no link handle left (handle-max {limit})")
        return handle

    def _new_link(self, name: str, role: bool, **options: Any) -> Link:
        if (name, role) in self._links_by_name:
            raise ProtocolError(f"a link named {name!r} is already attached in this session")
        link = Link(self, name, self._allocate_handle(), role, **options)
        self.links[link.handle] = link
        self._links_by_name[(name, role)] = link
        return link

    def attach_sender(
        self,
        name: str,
        target: Any,
        *,
        source: Any = None,
        snd_settle_mode: int = SND_MIXED,
        rcv_settle_mode: int = RCV_FIRST,
        **options: Any,
    ) -> Link:
        """Attaches a link we send on; ``target`` is where messages go (an address or Target)."""
        link = self._new_link(
            name,
            ROLE_SENDER,
            source=source,
            target=target,
            snd_settle_mode=snd_settle_mode,
            rcv_settle_mode=rcv_settle_mode,
            **options,
        )
        link.state = LinkState.ATTACH_SENT
        self._send_frame(link._attach_performative())
        return link

    def attach_receiver(
        self,
        name: str,
        source: Any,
        *,
        target: Any = None,
        credit: int = 0,
        snd_settle_mode: int = SND_MIXED,
        rcv_settle_mode: int = RCV_FIRST,
        **options: Any,
    ) -> Link:
        """Attaches a link we receive on; grants ``credit`` right after the attach."""
        link = self._new_link(
            name,
            ROLE_RECEIVER,
            source=source,
            target=target,
            snd_settle_mode=snd_settle_mode,
            rcv_settle_mode=rcv_settle_mode,
            **options,
        )
        link.state = LinkState.ATTACH_SENT
        self._send_frame(link._attach_performative())
        if credit:
            link.flow(credit)
        return link

    def _forget_link(self, link: Link) -> None:
        self.links.pop(link.handle, None)
        if link.remote_handle is not None:
            self._links_by_remote.pop(link.remote_handle, None)
        key = (link.name, link.role)
        if self._links_by_name.get(key) is link:  # a refused namesake leaves the original
            del self._links_by_name[key]
        elif self._refused_by_name.get(key) is link:
            del self._refused_by_name[key]

    # ------------------------------------------------------------------ output

    def _send_frame(self, performative: Any, payload: bytes = b"") -> None:
        self.connection._send_frame(self.channel, performative, payload)

    def _flow_performative(self, **link_fields: Any) -> Flow:
        return Flow(
            next_incoming_id=self.next_incoming_id if self.remote is not None else None,
            incoming_window=self.incoming_window,
            next_outgoing_id=self.next_outgoing_id,
            outgoing_window=self.outgoing_window,
            **link_fields,
        )

    def _send_link_flow(self, link: Link, *, echo: bool = False) -> None:
        if link.state in (LinkState.DETACHED, LinkState.DETACH_SENT):
            return
        self._send_frame(self._flow_performative(echo=echo, **link._flow_performative_fields()))

    def _queue_disposition(self, delivery: Delivery) -> None:
        if delivery.delivery_id is None:  # not yet on the wire: settle before sending
            return
        if not (delivery.settled and delivery.remote_settled):
            # both ends settled: nothing left to say (RabbitMQ ends the session on a sender's
            # disposition for a delivery it settled itself)
            self._pending_dispositions[id(delivery)] = delivery
        if delivery.settled:
            if delivery.link.is_sender:
                self._outgoing_unsettled.pop(delivery.delivery_id, None)
            else:
                self._incoming_unsettled.pop(delivery.delivery_id, None)

    def _flush_dispositions(self) -> None:
        """Writes queued dispositions, one frame per run of consecutive ids with one outcome."""
        if not self._pending_dispositions:
            return
        pending = sorted(
            self._pending_dispositions.values(), key=lambda d: (d.link.role, d.delivery_id)
        )
        self._pending_dispositions = {}
        run_first = pending[0]
        run_last = run_first
        for delivery in pending[1:]:
            if (
                delivery.link.role is run_last.link.role
                and delivery.delivery_id == ((run_last.delivery_id or 0) + 1) & SERIAL_MASK
                and delivery.settled == run_first.settled
                and (delivery.state is run_first.state or delivery.state == run_first.state)
            ):
                run_last = delivery
                continue
            self._write_disposition(run_first, run_last)
            run_first = run_last = delivery
        self._write_disposition(run_first, run_last)

    def _write_disposition(self, first: Delivery, last: Delivery) -> None:
        assert first.delivery_id is not None  # only sent deliveries are settled
        self._send_frame(
            Disposition(
                role=first.link.role,
                first=first.delivery_id,
                last=last.delivery_id if last is not first else None,
                settled=first.settled,
                state=first.state,
            )
        )

    def _pump(self, max_frame_size: int) -> None:
        """Turns buffered deliveries into transfer frames as credit and windows allow."""
        self._flush_dispositions()
        if self.state is not SessionState.MAPPED:
            return
        for link in list(self.links.values()):
            if not link.is_sender or link.state is not LinkState.ATTACHED:
                continue
            while link._outgoing and link.link_credit > 0:
                delivery = link._outgoing.popleft()
                self._start_delivery(link, delivery, max_frame_size)
            # the drained flow counts these deliveries: it must follow their transfer frames
            self._flush_transfer_frames()
            if link.drain and link.auto_drain and not link._outgoing and not self._pending_frames:
                link.drained()
        self._flush_transfer_frames()

    def _start_delivery(self, link: Link, delivery: Delivery, max_frame_size: int) -> None:
        delivery_id = self._next_delivery_id
        self._next_delivery_id = (delivery_id + 1) & SERIAL_MASK
        delivery.delivery_id = delivery_id
        link.delivery_count = (link.delivery_count + 1) & SERIAL_MASK
        link.link_credit -= 1
        frame = None
        if delivery.state is None:
            frame = transfer_frame(
                self.channel,
                link.handle,
                delivery_id,
                delivery.tag,
                delivery.message_format,
                delivery.settled,
                delivery.payload,
                max_frame_size,
            )
        if frame is not None:
            self._pending_frames.append(frame)
        else:
            transfer = Transfer(
                handle=link.handle,
                delivery_id=delivery_id,
                delivery_tag=delivery.tag,
                message_format=delivery.message_format,
                settled=delivery.settled,
                state=delivery.state,
            )
            frames = encode_transfer_frames(
                self.channel, transfer, delivery.payload, max_frame_size
            )
            self._pending_frames.extend(frames)
        if not delivery.settled:
            self._outgoing_unsettled[delivery_id] = delivery

    def _flush_transfer_frames(self) -> None:
        frames = self._pending_frames
        while frames and self.remote_incoming_window > 0:
            self.connection._write(frames.popleft())
            self.next_outgoing_id = (self.next_outgoing_id + 1) & SERIAL_MASK
            self.remote_incoming_window -= 1

    # ------------------------------------------------------------------ input

    def _on_frame(self, body: Any, payload: bytes) -> None:
        kind = type(body)
        if self.state is SessionState.DISCARDING:
            if kind is End:
                self.connection._forget_session(self)
                self.connection._emit(ev.SessionEnded(self, body.error, False))
            return
        if kind is Transfer:
            self._on_transfer(body, payload)
        elif kind is Flow:
            self._on_flow(body)
        elif kind is Disposition:
            self._on_disposition(body)
        elif kind is Attach:
            self._on_attach(body)
        elif kind is Detach:
            self._on_detach(body)
        elif kind is End:
            self._on_end(body)
        else:
            raise ProtocolError(
                f"{kind.__name__} is not allowed on an open session", "amqp:not-allowed"
            )

    def _on_begin_reply(self, begin: Begin) -> None:
        self.remote = begin
        self.next_incoming_id = begin.next_outgoing_id
        self.remote_incoming_window = begin.incoming_window
        self.remote_outgoing_window = begin.outgoing_window
        if self.state is SessionState.BEGIN_SENT:
            self.state = SessionState.MAPPED
            self.connection._emit(ev.SessionBegun(self))

    def _link_for(self, handle: int) -> Link:
        link = self._links_by_remote.get(handle)
        if link is None:
            raise SessionError(f"handle {handle} is not attached", "amqp:session:unattached-handle")
        return link

    def _on_attach(self, attach: Attach) -> None:
        if attach.handle > self.handle_max:
            raise SessionError(
                f"handle {attach.handle} exceeds handle-max {self.handle_max}",
                "amqp:session:handle-in-use",
            )
        if attach.handle in self._links_by_remote:
            raise SessionError(
                f"handle {attach.handle} is already in use", "amqp:session:handle-in-use"
            )
        our_role = not attach.role
        link = self._links_by_name.get((attach.name, our_role))
        if link is not None and link.state is LinkState.ATTACH_SENT:
            link.remote = attach
            link.remote_handle = attach.handle
            self._links_by_remote[attach.handle] = link
            if link.is_receiver and attach.initial_delivery_count is not None:
                link.delivery_count = attach.initial_delivery_count
            link.state = LinkState.ATTACHED
            self.connection._emit(ev.LinkAttached(link))
            return
        if link is not None:
            if (attach.name, our_role) in self._refused_by_name:  # bounds what a peer piles up
                raise SessionError(f"link {attach.name!r} is already attached", "amqp:not-allowed")
            self._refuse_name_in_use(attach, our_role)
            return
        link = Link(self, attach.name, self._allocate_handle(), our_role)
        link.remote = attach
        link.remote_handle = attach.handle
        if link.is_receiver:
            link.delivery_count = attach.initial_delivery_count or 0
        link.state = LinkState.ATTACH_RECEIVED
        self.links[link.handle] = link
        self._links_by_remote[attach.handle] = link
        self._links_by_name[(link.name, link.role)] = link
        self.connection._emit(ev.LinkAttachRequested(link))

    def _refuse_name_in_use(self, attach: Attach, our_role: bool) -> None:
        """A second attach of an attached link's name is refused on its own handle, as
        Service Bus refuses a link name in use (``amqp:resource-locked``): the link already
        attached goes on, and the peer hears at once rather than waiting on an answer (a
        session ended under it is what python-qpid-proton's ``BlockingConnection`` misses)."""
        refused = Link(self, attach.name, self._allocate_handle(), our_role)
        refused.remote = attach
        refused.remote_handle = attach.handle
        refused.state = LinkState.ATTACH_RECEIVED
        self.links[refused.handle] = refused
        self._links_by_remote[attach.handle] = refused
        self._refused_by_name[(attach.name, our_role)] = refused
        refused.refuse(
            Error(
                condition="amqp:resource-locked",
                description=f"the link name {attach.name!r} is already in use on this session",
            )
        )

    def _on_detach(self, detach: Detach) -> None:
        link = self._link_for(detach.handle)
        link.remote_error = detach.error
        if link.state is LinkState.DETACH_SENT:
            link.state = LinkState.DETACHED
            self._forget_link(link)
            self.connection._emit(ev.LinkDetached(link, detach.error, detach.closed, False))
            return
        link.state = LinkState.DETACH_RECEIVED
        self.connection._emit(ev.LinkDetached(link, detach.error, detach.closed, True))
        link.detach(closed=detach.closed)

    def _on_end(self, end: End) -> None:
        by_peer = self.state is not SessionState.END_SENT
        for link in list(self.links.values()):
            if link.state is not LinkState.DETACHED:
                link.state = LinkState.DETACHED
                self.connection._emit(ev.LinkDetached(link, None, False, by_peer))
        self.links.clear()
        self._links_by_remote.clear()
        self._links_by_name.clear()
        self._refused_by_name.clear()
        if by_peer:
            self.state = SessionState.END_RECEIVED
            self.connection._emit(ev.SessionEnded(self, end.error, True))
            self.end()
        else:
            self.connection._forget_session(self)
            self.connection._emit(ev.SessionEnded(self, end.error, False))

    def _on_flow(self, flow: Flow) -> None:
        # next-incoming-id unset: the peer has not seen our begin; our first id is 0
        next_incoming_id = flow.next_incoming_id or 0
        window = (next_incoming_id + flow.incoming_window - self.next_outgoing_id) & SERIAL_MASK
        self.remote_incoming_window = 0 if window > 0x7FFFFFFF else window
        self.remote_outgoing_window = flow.outgoing_window
        if flow.handle is None:
            if flow.echo:
                self._send_frame(self._flow_performative())
            return
        link = self._link_for(flow.handle)
        notify = link._on_flow(flow)
        if link.is_receiver and link.drain and link.link_credit == 0:
            link.drain = False
            notify = True
        if flow.echo:
            self._send_link_flow(link)
        if notify:
            self.connection._emit(ev.LinkFlow(link, bool(flow.drain)))

    def _on_transfer(self, transfer: Transfer, payload: bytes) -> None:
        if self.incoming_window <= 0:
            raise SessionError(
                "transfer beyond the session's incoming window", "amqp:session:window-violation"
            )
        self.incoming_window -= 1
        self.next_incoming_id = (self.next_incoming_id + 1) & SERIAL_MASK
        self.remote_outgoing_window -= 1
        # per frame, not per delivery: a delivery of more frames than the window would stall
        self._replenish_incoming_window()
        link = self._link_for(transfer.handle)
        if not link.is_receiver:
            raise SessionError(
                f"transfer on link {link.name!r}, which receives nothing from the peer",
                "amqp:session:errant-link",
            )
        if link.state is not LinkState.ATTACHED:
            return  # detaching: drop what is still in flight
        delivery = link._partial
        if delivery is None:
            if transfer.delivery_id is None or transfer.delivery_tag is None:
                raise LinkError(
                    link,
                    "the first transfer of a delivery needs a delivery-id and a tag",
                    "amqp:invalid-field",
                )
            if link.link_credit > 0:
                link.link_credit -= 1
            elif link.in_flight_allowance > 0:  # sent before our lower grant reached it
                link.in_flight_allowance -= 1
            else:
                raise LinkError(
                    link, "transfer without link credit", "amqp:link:transfer-limit-exceeded"
                )
            link.delivery_count = (link.delivery_count + 1) & SERIAL_MASK
            delivery = Delivery(
                link,
                transfer.delivery_tag,
                b"",
                message_format=transfer.message_format or 0,
                state=transfer.state,
            )
            delivery.delivery_id = transfer.delivery_id
            delivery.remote_settled = bool(transfer.settled)
            link._partial = delivery
            link._partial_chunks = []
            link._partial_size = 0
        elif transfer.delivery_id is not None and transfer.delivery_id != delivery.delivery_id:
            raise LinkError(
                link,
                f"transfer for delivery {transfer.delivery_id} while {delivery.delivery_id}"
                " is incomplete",
                "amqp:invalid-field",
            )
        if transfer.settled:
            delivery.remote_settled = True
        if transfer.aborted:
            link._partial = None
            link._partial_chunks = []
            self.connection._emit(ev.DeliveryAborted(link, delivery.tag))
            return
        if payload:
            link._partial_size += len(payload)
            limit = link.receive_limit or link.max_message_size or DEFAULT_MAX_MESSAGE_SIZE
            if link._partial_size > limit:
                link._partial = None
                link._partial_chunks = []
                raise LinkError(
                    link,
                    f"message of more than {limit} bytes exceeds the link's max-message-size",
                    "amqp:link:message-size-exceeded",
                )
            link._partial_chunks.append(payload)
        if transfer.more:
            return
        chunks = link._partial_chunks
        delivery.payload = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        link._partial = None
        link._partial_chunks = []
        if delivery.remote_settled:
            delivery.settled = True
        else:
            self._incoming_unsettled[delivery.delivery_id] = delivery  # type: ignore[index]  # set on transfer
        self.connection._emit(ev.DeliveryReceived(link, delivery))

    def _replenish_incoming_window(self) -> None:
        if self.incoming_window * 2 < self.max_incoming_window:
            self.incoming_window = self.max_incoming_window
            self._send_frame(self._flow_performative())

    def _on_disposition(self, disposition: Disposition) -> None:
        # the peer's role says whose deliveries these are: a receiver settles ours
        ours = (
            self._outgoing_unsettled
            if disposition.role is ROLE_RECEIVER
            else self._incoming_unsettled
        )
        first = disposition.first
        last = disposition.last if disposition.last is not None else first
        span = (last - first) & SERIAL_MASK
        if span < len(ours):
            ids = [(first + i) & SERIAL_MASK for i in range(span + 1)]
            touched = [ours[i] for i in ids if i in ours]
        else:
            touched = [d for i, d in ours.items() if _serial_in_window(i, first, last)]
        for delivery in touched:
            delivery.remote_state = disposition.state
            if disposition.settled:
                delivery.remote_settled = True
                ours.pop(delivery.delivery_id, None)  # type: ignore[arg-type]  # set on transfer
            self.connection._emit(ev.DeliveryUpdated(delivery.link, delivery))

    def __repr__(self) -> str:
        return f"Session(channel={self.channel}, {self.state.value})"
