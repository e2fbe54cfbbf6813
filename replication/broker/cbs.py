"""Claims: who may Send, Listen or Manage what, from SAS tokens put on ``$cbs`` or a SASL
PLAIN login, checked at attach, on each transfer and again as tokens expire."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Final

from ..amqp.link import Delivery
from ..amqp.message import decode_message
from ..amqp.outcomes import Accepted
from ..amqp.sasl import PLAIN, SaslCredentials
from ..symbols import CBS_NODE
from .auth import AuthorizationError, Authorizer
from .clock import Clock
from .commit import GroupCommit
from .errors import error, tracked
from .peer import Peer

log = logging.getLogger("replication.broker")

TOKEN_GRACE_SECONDS = 20.0
"""A connection must put a token within this time (WIRE.md: Service Bus waits 20 s)."""
NO_COVERING_TOKEN: Final = "no token covers this entity"
"""``problem``'s answer when no token put on the connection names the entity."""


class Cbs:
    """The claims of every connection, checked against ``authorizer``."""

    def __init__(self, authorizer: Authorizer, clock: Clock, commits: GroupCommit) -> None:
        self.authorizer = authorizer
        self.clock = clock
        self.commits = commits

    def authenticate_sasl(self, credentials: SaslCredentials) -> bool:
        if credentials.mechanism != PLAIN:
            return True  # ANONYMOUS / MSSBCBS authorise later through CBS
        username = credentials.username or ""
        if self.authorizer.authenticate_plain(username, credentials.password or ""):
            return True
        log.warning("SASL PLAIN login as %r refused: no such rule, or not its key", username)
        return False

    def logged_in(self, peer: Peer, credentials: SaslCredentials | None) -> None:
        """SASL completed: a PLAIN login grants its rule's claims to the whole connection."""
        if credentials is not None and credentials.mechanism == PLAIN:
            peer.plain_grant = self.authorizer.grant_for_rule(credentials.username)
            peer.allowed.clear()

    def problem(self, peer: Peer, entity: str, right: str) -> str | None:
        """Why ``peer`` may not use ``right`` (Send, Listen, Manage) on ``entity``; None: it may."""
        now = self.clock.time()
        until = peer.allowed.get((entity, right))
        if until is not None and until > now:
            return None  # asked for every transfer: the answer stands while its grant does
        grants = list(peer.grants.values())
        if peer.plain_grant is not None:
            grants.append(peer.plain_grant)
        if not grants:
            return (
                f"Unauthorized access. '{right}' claim(s) are required to perform this operation."
            )
        last = NO_COVERING_TOKEN
        for grant in grants:
            if not grant.covers(entity) or grant.expired(now):
                continue
            try:
                self.authorizer.check(grant, right, entity)
            except AuthorizationError as exc:
                last = exc.description
                continue
            expires = grant.expires_at
            peer.allowed[(entity, right)] = math.inf if expires is None else expires
            return None
        return last

    def management_problem(self, peer: Peer, entity: str, right: str) -> str | None:
        """``problem`` for a request on ``<entity>/$management``: a token for the entity, or
        one put for the node itself (the JavaScript SDKs' audience for their management
        links, Service Bus and Event Hubs alike), may cover it; a refusal names what the
        token lacks rather than that no token names the entity."""
        problem = self.problem(peer, entity, right)
        if problem is not None:
            on_node = self.problem(peer, f"{entity}/$management", right)
            if on_node is None or problem == NO_COVERING_TOKEN:
                problem = on_node
        return problem

    def put_token(self, peer: Peer, delivery: Delivery) -> None:
        """A request to ``$cbs``: ``put-token`` adds a grant for its audience."""
        request = decode_message(delivery.payload)
        props = request.application_properties or {}
        audience = str(props.get("name", ""))
        status, description = 202, "Accepted"
        if props.get("operation") != "put-token":
            status, description = 400, f"unsupported CBS operation {props.get('operation')!r}"
        else:
            try:
                grant = self.authorizer.validate(str(request.body), audience, self.clock.time())
                peer.grants[audience.lower()] = grant
                peer.allowed.clear()  # a token for an audience replaces the one before
            except AuthorizationError as exc:
                status, description = 401, exc.description
                # the SDKs show the client only a condition: the reason is here
                log.warning(
                    "put-token for %r from %s refused: %s", audience, peer.driver.peer, description
                )
        if not delivery.settled:
            delivery.update(Accepted())
        if status >= 300:
            description = tracked(description)
        peer.reply(CBS_NODE, request, {"status-code": status, "status-description": description})

    def check_tokens(self, peers: Iterable[Peer]) -> None:
        """Links whose token expired are detached; a connection that put no token within
        ``TOKEN_GRACE_SECONDS`` is closed."""
        for peer in peers:
            for link, entity in list(peer.entity_links.items()):
                right = "Send" if link.is_receiver else "Listen"
                problem = self.problem(peer, entity, right)
                if problem is not None and link.is_open:
                    link.detach(error("amqp:unauthorized-access", f"token expired: {problem}"))
                    self.commits.wake(peer.driver)
            if (  # seed 000: a valid token within 20 s of connecting, or the connection goes
                not peer.grants
                and peer.plain_grant is None
                and self.clock.monotonic() - peer.opened_at > TOKEN_GRACE_SECONDS
            ):
                peer.driver.connection.close(
                    error("amqp:unauthorized-access", "no token within the grace period")
                )
                self.commits.wake(peer.driver)
