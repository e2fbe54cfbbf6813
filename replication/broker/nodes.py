"""Where a link attaches: the broker resolves each attach to a ``Node`` by the link's address
and from then on hands that node the link's events.

This is the seam for a new kind of addressable thing: a node says which links it takes
(``accepts``), answers their attach, and handles their transfers, flows, settlements and
detach. The broker's table (``Nodes``) asks its nodes in order: the transaction coordinator,
the request/response nodes (``$cbs``, ``<entity>/$management``), any added with ``add``, and
last the entities (which answer not-found for an address that names none).
"""

from __future__ import annotations

from collections.abc import Callable

from ..amqp.link import Delivery, Link
from ..symbols import CBS_NODE, MANAGEMENT_SUFFIX
from .cbs import Cbs
from .limits import LINK_CREDIT
from .peer import Peer
from .registry import entity_path


class Node:
    """A kind of link end the broker serves; the defaults ignore an event."""

    def accepts(self, link: Link, path: str) -> bool:
        """Takes this link (``path``: its address without host; a sender's source, a
        receiver's target)."""
        raise NotImplementedError

    def attach(self, peer: Peer, link: Link, path: str) -> None:
        """Answers the attach: ``link.accept`` or ``link.refuse``, now or later."""
        raise NotImplementedError

    def transfer(self, peer: Peer, link: Link, delivery: Delivery) -> None:
        """The peer sent a message on the link."""

    def flow(self, peer: Peer, link: Link) -> None:
        """The link may send more: the peer gave it credit, or the connection's socket
        drained (``ConnectionDriver.on_resume``)."""

    def settle(self, peer: Peer, link: Link, delivery: Delivery) -> None:
        """The peer changed the state of (or settled) a delivery we sent."""

    def detach(self, peer: Peer, link: Link) -> None:
        """The link is gone (detached, its session ended or its connection closed)."""


class Nodes:
    """The broker's nodes, asked in order; ``fallback`` takes every link no other does."""

    def __init__(self, *nodes: Node, fallback: Node) -> None:
        self._nodes = list(nodes)
        self._fallback = fallback

    def add(self, node: Node) -> None:
        """A new kind of node, asked after the ones given before it and before the fallback."""
        self._nodes.append(node)

    def resolve(self, link: Link, path: str) -> Node:
        for node in self._nodes:
            if node.accepts(link, path):
                return node
        return self._fallback


class RequestNode(Node):
    """``$cbs`` and ``<entity>/$management``: requests come on a link the peer sends on,
    responses go back on the link it attached to receive them (``Peer.reply``)."""

    def __init__(self, cbs: Cbs, management: Callable[[Peer, str, Delivery], None]) -> None:
        self.cbs = cbs
        self.management = management
        """Runs a ``$management`` request on an entity (``management.handle_request``)."""

    def accepts(self, link: Link, path: str) -> bool:
        return path.lower() == CBS_NODE or path.lower().endswith(MANAGEMENT_SUFFIX)

    def attach(self, peer: Peer, link: Link, path: str) -> None:
        link.accept()
        if link.is_receiver:
            link.flow(LINK_CREDIT)
            return
        peer.add_reply_link(path, link)

    def transfer(self, peer: Peer, link: Link, delivery: Delivery) -> None:
        path = entity_path(getattr(link.target, "address", None)).lower()
        if path == CBS_NODE:
            self.cbs.put_token(peer, delivery)
        else:
            self.management(peer, path[: -len(MANAGEMENT_SUFFIX)], delivery)

    def detach(self, peer: Peer, link: Link) -> None:
        peer.forget_reply_link(link)
