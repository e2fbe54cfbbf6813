"""One AMQP connection as the broker sees it: its grants, links and reply routes."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..amqp.link import Link
from ..amqp.message import BodyType, Message, Properties, encode_message
from ..amqp.transport import ConnectionDriver
from .auth import Grant

if TYPE_CHECKING:
    from .dispatch import Consumer
    from .nodes import Node

log = logging.getLogger("replication.broker")


@dataclass(slots=True, eq=False)
class Peer:
    """Per-connection state: its grants, request/reply links and consumers."""

    driver: ConnectionDriver
    opened_at: float
    grants: dict[str, Grant] = field(default_factory=dict)
    """Tokens put on ``$cbs``, by audience (lower case)."""
    plain_grant: Grant | None = None
    """The SAS rule a SASL PLAIN login named."""
    allowed: dict[tuple[str, str], float] = field(default_factory=dict)
    """(entity, right) -> until when a grant allows it (``Cbs.problem``'s answers, kept
    until a token or login changes the grants)."""
    reply_links: dict[str, Link] = field(default_factory=dict)
    """Node -> the last link the peer attached to receive that node's replies."""
    reply_targets: dict[str, Link] = field(default_factory=dict)
    """The same links by their target address: the ``reply-to`` a request names."""
    nodes: dict[Link, Node] = field(default_factory=dict)
    """The node each link attached to (``nodes.py``): it gets the link's events."""
    consumers: dict[Link, Consumer] = field(default_factory=dict)
    """Links the broker sends an entity's messages on."""
    entity_links: dict[Link, str] = field(default_factory=dict)
    """Links to an entity, with the entity whose claim they need (token expiry, idle time)."""
    links: set[Link] = field(default_factory=set)
    """Every link answered (accepted or refused) and not yet detached, in any session: what
    ``MAX_LINKS_PER_CONNECTION`` counts."""

    def add_reply_link(self, node: str, link: Link) -> None:
        """``link`` receives ``node``'s replies: those whose ``reply-to`` names its target
        (each client its own link), and those without one (the node's last link)."""
        self.reply_links[node.lower()] = link
        target = getattr(link.remote_target, "address", None)
        if target:
            self.reply_targets[str(target)] = link

    def forget_reply_link(self, link: Link) -> None:
        for links in (self.reply_links, self.reply_targets):
            for name, reply in list(links.items()):
                if reply is link:
                    del links[name]

    def reply(
        self, node: str, request: Message, properties: dict[str, Any], body: Any = None
    ) -> None:
        """Answers a request to ``node`` ($cbs, <entity>/$management) on the peer's reply
        link: the one its ``reply-to`` names, else the last one attached for the node."""
        reply_to = request.properties.reply_to if request.properties else None
        link = self.reply_targets.get(str(reply_to)) if reply_to else None
        if link is None:  # no reply-to, or none of the peer's links: the node's last link
            link = self.reply_links.get(node.lower())
        if link is None or not link.is_open:
            log.warning("no reply link for %s; response dropped", node)
            return
        correlation = request.properties.message_id if request.properties else None
        response = Message(
            body=body,
            body_type=BodyType.VALUE,
            properties=Properties(correlation_id=correlation),
            application_properties=properties,
        )
        link.send(encode_message(response), settled=True)
