"""Links and deliveries (spec 2.6): credit, delivery-count, settlement, per-link state.

A ``Link`` is one end of a unidirectional route; ``role`` is ours (a sender sends transfers).
Sending buffers deliveries until the peer grants credit; the session turns them into frames.
A receiver grants credit with ``flow`` and settles with ``Delivery.update``.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import TYPE_CHECKING, Any, Final

from .errors import MessageSizeExceededError, ProtocolError
from .performatives import (
    RCV_FIRST,
    ROLE_RECEIVER,
    ROLE_SENDER,
    SND_MIXED,
    SND_SETTLED,
    Attach,
    Detach,
    Error,
    Flow,
)

if TYPE_CHECKING:
    from .session import Session

SERIAL_MASK: Final = 0xFFFFFFFF


class LinkState(enum.Enum):
    DETACHED = "detached"
    ATTACH_SENT = "attach-sent"
    ATTACH_RECEIVED = "attach-received"
    ATTACHED = "attached"
    DETACH_SENT = "detach-sent"
    DETACH_RECEIVED = "detach-received"


class Delivery:
    """One message in flight on a link, as the sender or the receiver sees it."""

    __slots__ = (
        "aborted",
        "delivery_id",
        "link",
        "message_format",
        "payload",
        "remote_settled",
        "remote_state",
        "settled",
        "state",
        "tag",
    )

    def __init__(
        self,
        link: Link,
        tag: bytes,
        payload: bytes,
        *,
        message_format: int = 0,
        settled: bool = False,
        state: Any = None,
    ) -> None:
        self.link = link
        self.tag = tag
        self.payload = payload
        self.message_format = message_format
        self.delivery_id: int | None = None
        self.settled = settled
        self.state = state
        self.remote_settled = False
        self.remote_state: Any = None
        self.aborted = False

    def update(self, state: Any = None, *, settled: bool = True) -> None:
        """Tells the peer this delivery's outcome (accepted, rejected, ...) and/or settles it."""
        if self.settled:
            return
        self.state = state
        self.settled = settled
        self.link.session._queue_disposition(self)

    def settle(self) -> None:
        """Settles locally with the current state (e.g. after the peer's outcome arrived)."""
        self.update(self.state, settled=True)

    def __repr__(self) -> str:
        return (
            f"Delivery(id={self.delivery_id}, tag={self.tag!r}, {len(self.payload)} bytes, "
            f"settled={self.settled}, remote_state={self.remote_state!r})"
        )


class Link:
    """A link endpoint; create through ``Session.attach_sender``/``attach_receiver``."""

    def __init__(
        self,
        session: Session,
        name: str,
        handle: int,
        role: bool,
        *,
        source: Any = None,
        target: Any = None,
        snd_settle_mode: int = SND_MIXED,
        rcv_settle_mode: int = RCV_FIRST,
        max_message_size: int | None = None,
        properties: dict[Any, Any] | None = None,
        offered_capabilities: tuple[str, ...] | None = None,
        desired_capabilities: tuple[str, ...] | None = None,
    ) -> None:
        self.session = session
        self.name = name
        self.handle = handle
        self.role = role
        self.source = source
        self.target = target
        self.snd_settle_mode = snd_settle_mode
        self.rcv_settle_mode = rcv_settle_mode
        self.max_message_size = max_message_size
        self.properties = properties
        self.offered_capabilities = offered_capabilities
        self.desired_capabilities = desired_capabilities
        self.state = LinkState.DETACHED
        self.remote_handle: int | None = None
        self.remote: Attach | None = None
        self.remote_error: Error | None = None
        # flow state (spec 2.6.7); on a receiver delivery_count mirrors the sender's
        self.delivery_count = 0
        self.link_credit = 0
        self.available = 0
        self.drain = False
        self.in_flight_allowance = 0
        """Receiver: transfers still acceptable without credit because a grant we lowered
        was in force when the sender sent them (a flow takes effect when the sender reads
        it, spec 2.6.7): the sum of the reductions, used up by such transfers."""
        self.receive_limit: int | None = None
        """Largest delivery this receiver reassembles before detaching the link with
        message-size-exceeded; defaults to ``max_message_size``. A broker can set it above the
        advertised limit to answer an oversize message with a rejected disposition instead."""
        self.auto_drain = True
        """A sender with nothing buffered answers a drain by itself when output is collected."""
        self._outgoing: deque[Delivery] = deque()
        self._next_tag = 0
        self._partial: Delivery | None = None
        self._partial_chunks: list[bytes] = []
        self._partial_size = 0

    # ------------------------------------------------------------------ properties

    @property
    def is_sender(self) -> bool:
        return self.role is ROLE_SENDER

    @property
    def is_receiver(self) -> bool:
        return self.role is ROLE_RECEIVER

    @property
    def credit(self) -> int:
        """Deliveries this sender may still send (or this receiver still allows)."""
        return self.link_credit

    @property
    def queued(self) -> int:
        """Deliveries buffered by ``send`` that wait for credit or session window."""
        return len(self._outgoing)

    @property
    def remote_source(self) -> Any:
        return self.remote.source if self.remote else None

    @property
    def remote_target(self) -> Any:
        return self.remote.target if self.remote else None

    @property
    def remote_properties(self) -> dict[Any, Any] | None:
        return self.remote.properties if self.remote else None

    @property
    def is_open(self) -> bool:
        return self.state is LinkState.ATTACHED

    # ------------------------------------------------------------------ lifecycle

    def _attach_performative(self) -> Attach:
        return Attach(
            name=self.name,
            handle=self.handle,
            role=self.role,
            snd_settle_mode=self.snd_settle_mode,
            rcv_settle_mode=self.rcv_settle_mode,
            source=self.source,
            target=self.target,
            initial_delivery_count=self.delivery_count if self.is_sender else None,
            max_message_size=self.max_message_size,
            offered_capabilities=self.offered_capabilities,
            desired_capabilities=self.desired_capabilities,
            properties=self.properties,
        )

    def accept(
        self,
        *,
        source: Any = ...,
        target: Any = ...,
        properties: dict[Any, Any] | None = None,
        max_message_size: int | None = None,
        offered_capabilities: tuple[str, ...] | None = None,
        snd_settle_mode: int | None = None,
        rcv_settle_mode: int | None = None,
    ) -> None:
        """Answers the peer's attach; terminus defaults to what the peer asked for."""
        if self.state is not LinkState.ATTACH_RECEIVED:
            raise ProtocolError(f"link {self.name!r} has no attach to answer ({self.state.value})")
        remote = self.remote
        assert remote is not None
        self.source = remote.source if source is ... else source
        self.target = remote.target if target is ... else target
        self.properties = properties
        self.max_message_size = max_message_size
        self.offered_capabilities = offered_capabilities
        self.snd_settle_mode = (
            remote.snd_settle_mode if snd_settle_mode is None else snd_settle_mode
        )
        self.rcv_settle_mode = (
            remote.rcv_settle_mode if rcv_settle_mode is None else rcv_settle_mode
        )
        self.state = LinkState.ATTACHED
        self.session._send_frame(self._attach_performative())

    def refuse(self, error: Error) -> None:
        """Answers the peer's attach with no terminus, then detaches with ``error`` (spec 2.6.3)."""
        if self.state is not LinkState.ATTACH_RECEIVED:
            raise ProtocolError(f"link {self.name!r} has no attach to refuse ({self.state.value})")
        self.source = None
        self.target = None
        self.state = LinkState.ATTACHED
        self.session._send_frame(self._attach_performative())
        self.detach(error)

    def detach(self, error: Error | None = None, *, closed: bool = True) -> None:
        if self.state in (LinkState.DETACHED, LinkState.DETACH_SENT):
            return
        replying = self.state is LinkState.DETACH_RECEIVED
        # settlements made before the detach go before it: after it, the peer has no link
        # to take them on (Service Bus keeps such a message locked until its lock expires)
        self.session._flush_dispositions()
        self.session._send_frame(Detach(handle=self.handle, closed=closed, error=error))
        self._outgoing.clear()
        if replying:
            self.state = LinkState.DETACHED
            self.session._forget_link(self)
        else:
            self.state = LinkState.DETACH_SENT

    # ------------------------------------------------------------------ sending

    def send(
        self,
        payload: bytes,
        *,
        tag: bytes | None = None,
        settled: bool | None = None,
        message_format: int = 0,
        state: Any = None,
    ) -> Delivery:
        """Queues one message; it goes out when the peer's credit and session window allow."""
        if not self.is_sender:
            raise ProtocolError(f"link {self.name!r} is a receiver and cannot send")
        if self.state not in (LinkState.ATTACHED, LinkState.ATTACH_SENT):
            raise ProtocolError(f"link {self.name!r} is {self.state.value}")
        limit = self.remote.max_message_size if self.remote is not None else None
        if limit and len(payload) > limit:  # 0 or unset: no limit (spec 2.7.3)
            raise MessageSizeExceededError(
                f"message of {len(payload)} bytes exceeds link {self.name!r}'s "
                f"max-message-size of {limit} bytes"
            )
        if settled is None:
            settled = self.snd_settle_mode == SND_SETTLED
        if tag is None:
            tag = self._next_tag.to_bytes(8, "big")
            self._next_tag += 1
        delivery = Delivery(
            self, tag, payload, message_format=message_format, settled=settled, state=state
        )
        self._outgoing.append(delivery)
        return delivery

    def drained(self) -> None:
        """Ends a drain: spends the remaining credit and tells the receiver (spec 2.6.7)."""
        if not self.is_sender:
            raise ProtocolError("only a sender answers a drain")
        self.delivery_count = (self.delivery_count + self.link_credit) & SERIAL_MASK
        self.link_credit = 0
        # the flow still says drain=true: that is how a receiver tells the answer from any
        # other flow (rhea emits ``receiver_drained`` only then, and the JS SDK closes its
        # link when that never comes)
        self.session._send_link_flow(self)
        self.drain = False

    # ------------------------------------------------------------------ receiving

    def flow(self, credit: int, *, drain: bool = False, echo: bool = False) -> None:
        """Grants ``credit`` deliveries (replacing the previous grant), optionally draining."""
        if not self.is_receiver:
            raise ProtocolError(f"link {self.name!r} is a sender; it does not grant credit")
        if not 0 <= credit <= SERIAL_MASK:
            raise ValueError(f"link credit {credit} out of range")
        self.in_flight_allowance += max(0, self.link_credit - credit)
        self.link_credit = credit
        self.drain = drain
        self.session._send_link_flow(self, echo=echo)

    def _flow_performative_fields(self) -> dict[str, Any]:
        return {
            "handle": self.handle,
            # spec 2.7.4: a receiver that has not seen the sender's attach MUST NOT set it
            "delivery_count": (
                self.delivery_count if self.is_sender or self.remote is not None else None
            ),
            "link_credit": self.link_credit,
            "available": self.available if self.is_sender else None,
            "drain": self.drain,
        }

    def _on_flow(self, flow: Flow) -> bool:
        """Applies the peer's link flow; returns True when the user should hear of it."""
        if self.is_sender:
            remote_count = (
                flow.delivery_count if flow.delivery_count is not None else self.delivery_count
            )
            credit = flow.link_credit if flow.link_credit is not None else 0
            # spec 2.6.7: credit = count_rcv + credit_rcv - count_snd, the counts compared as
            # serial numbers (the credit itself may be anything up to 2**32 - 1)
            behind = (self.delivery_count - remote_count) & SERIAL_MASK
            if behind <= 0x7FFFFFFF:  # the receiver has not seen our last `behind` transfers
                self.link_credit = max(0, credit - behind)
            else:
                self.link_credit = min(SERIAL_MASK, credit + ((-behind) & SERIAL_MASK))
            self.drain = bool(flow.drain)
            return True
        if flow.delivery_count is not None:
            advanced = (flow.delivery_count - self.delivery_count) & SERIAL_MASK
            if advanced <= 0x7FFFFFFF:
                self.link_credit = max(0, self.link_credit - advanced)
                self.delivery_count = flow.delivery_count
        if flow.available is not None:
            self.available = flow.available
        return bool(flow.drain) or self.drain

    def __repr__(self) -> str:
        role = "sender" if self.is_sender else "receiver"
        return f"Link({self.name!r}, {role}, handle={self.handle}, {self.state.value})"
