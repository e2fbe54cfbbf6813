"""What the engine tells its user: small frozen values, one per thing that happened.

The connection queues these while it digests bytes; the transport (or a test) drains them
with ``Connection.next_event()`` and reacts by calling methods on the connection, its sessions
and links, exactly like h11/h2 events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .link import Delivery, Link
    from .performatives import Error, Open
    from .session import Session


@dataclass(frozen=True, slots=True)
class SaslCompleted:
    """SASL finished successfully; on a server ``credentials`` says who the peer claimed to be."""

    mechanism: str
    credentials: Any = None


@dataclass(frozen=True, slots=True)
class ConnectionOpened:
    """The peer's open arrived (its container id, limits, properties are in ``remote``)."""

    remote: Open


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The connection is over. ``by_peer`` tells who started it; ``error`` why, if anyone said."""

    error: Error | None
    by_peer: bool


@dataclass(frozen=True, slots=True)
class SessionBegun:
    """A session is mapped both ways (the peer began it and we answered, or it answered us)."""

    session: Session


@dataclass(frozen=True, slots=True)
class SessionEnded:
    session: Session
    error: Error | None
    by_peer: bool


@dataclass(frozen=True, slots=True)
class LinkAttachRequested:
    """The peer attached a new link: answer with ``link.accept(...)`` or ``link.refuse(error)``."""

    link: Link


@dataclass(frozen=True, slots=True)
class LinkAttached:
    """The peer answered our attach; ``link.remote_source``/``remote_target`` hold its view."""

    link: Link


@dataclass(frozen=True, slots=True)
class LinkFlow:
    """Flow state changed: new credit for a sender, or the peer asked it to ``drain``."""

    link: Link
    drain: bool


@dataclass(frozen=True, slots=True)
class DeliveryReceived:
    """A whole message arrived on a receiving link (all transfer frames of it)."""

    link: Link
    delivery: Delivery


@dataclass(frozen=True, slots=True)
class DeliveryAborted:
    """The sender aborted a multi-frame delivery; its partial bytes were discarded."""

    link: Link
    delivery_tag: bytes | None


@dataclass(frozen=True, slots=True)
class DeliveryUpdated:
    """The peer changed a delivery's state or settled it (a disposition arrived)."""

    link: Link
    delivery: Delivery


@dataclass(frozen=True, slots=True)
class LinkDetached:
    link: Link
    error: Error | None
    closed: bool
    by_peer: bool


Event = (
    SaslCompleted
    | ConnectionOpened
    | ConnectionClosed
    | SessionBegun
    | SessionEnded
    | LinkAttachRequested
    | LinkAttached
    | LinkFlow
    | DeliveryReceived
    | DeliveryAborted
    | DeliveryUpdated
    | LinkDetached
)
