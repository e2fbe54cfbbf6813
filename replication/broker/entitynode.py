"""Links to the namespace's entities: senders to queues and topics (messages in), receivers
from queues and subscriptions (``dispatch.py`` sends them messages)."""

from __future__ import annotations

from ..amqp.errors import AMQPError
from ..amqp.link import Delivery, Link
from ..amqp.outcomes import ACCEPTED, Rejected, TransactionalState
from ..symbols import ENTITY_DISABLED, TRANSFER_DESTINATION
from . import wire
from .cbs import Cbs
from .commit import GroupCommit
from .dispatch import Dispatcher
from .errors import SendRefusedError, error
from .limits import LINK_CREDIT, RECEIVE_LIMIT, Intake
from .nodes import Node
from .peer import Peer
from .queue import Queue
from .registry import Registry, disabled, entity_path
from .topic import Topic
from .transactions import TransactionCoordinator


class EntityNode(Node):
    """Queues, topics and subscriptions (and dead-letter queues) by path: the broker's
    fallback node, so an address that names no entity is refused with not-found."""

    def __init__(
        self,
        registry: Registry,
        cbs: Cbs,
        intake: Intake,
        dispatcher: Dispatcher,
        transactions: TransactionCoordinator,
        commits: GroupCommit,
    ) -> None:
        self.registry = registry
        self.cbs = cbs
        self.intake = intake
        self.dispatcher = dispatcher
        self.transactions = transactions
        self.commits = commits

    def accepts(self, link: Link, path: str) -> bool:
        return True

    def attach(self, peer: Peer, link: Link, path: str) -> None:
        entity = self.registry.entities.get(path.lower())
        if entity is None:
            link.refuse(
                error("amqp:not-found", f"The messaging entity '{path}' could not be found.")
            )
            return
        if link.is_receiver and entity.name.lower() not in self.registry.sendable:
            link.refuse(
                error(
                    "amqp:not-allowed",
                    (f"cannot send to '{path}': send to its queue or topic instead"),
                )
            )
            return
        if not link.is_receiver and isinstance(entity, Topic):
            link.refuse(
                error(
                    "amqp:not-allowed",
                    (
                        f"cannot receive from topic '{path}': receive from one of its "
                        "subscriptions "
                        f"('{path}/Subscriptions/<name>')"
                    ),
                )
            )
            return
        right = "Send" if link.is_receiver else "Listen"
        problem = self.cbs.problem(peer, entity.name, right)
        if problem is not None:
            link.refuse(error("amqp:unauthorized-access", problem))
            return
        stopped = disabled(entity, right)
        if stopped is not None:
            link.refuse(error(ENTITY_DISABLED, stopped))
            return
        if link.is_receiver and TRANSFER_DESTINATION in (link.remote_properties or {}):
            self.transactions.attach_send_via(peer, link)  # send-via (transactions.py)
            return
        if link.is_receiver:
            peer.entity_links[link] = entity.name
            link.accept(max_message_size=entity.settings.max_message_size)
            link.receive_limit = max(RECEIVE_LIMIT, entity.settings.max_message_size)
            link.flow(LINK_CREDIT)
            return
        assert isinstance(entity, Queue)
        self.dispatcher.attach(peer, link, entity)

    def transfer(self, peer: Peer, link: Link, delivery: Delivery) -> None:
        path = entity_path(getattr(link.target, "address", None)).lower()
        entity = self.registry.entities[self.transactions.destination(link, path)]  # send-via
        problem = self.cbs.problem(peer, entity.name, "Send")
        if problem is not None:
            delivery.update(Rejected(error=error("amqp:unauthorized-access", problem)))
            return
        stopped = disabled(entity, "Send")
        if stopped is not None:
            delivery.update(Rejected(error=error(ENTITY_DISABLED, stopped)))
            return
        if len(delivery.payload) > entity.settings.max_message_size:
            delivery.update(
                Rejected(
                    error=error(
                        "amqp:link:message-size-exceeded",
                        f"The received message (size {len(delivery.payload)}) exceeds the limit "
                        f"({entity.settings.max_message_size}) of entity '{entity.name}'.",
                    )
                )
            )
            return
        try:
            messages = wire.parse_transfer(delivery.payload, delivery.message_format)
        except AMQPError as malformed:
            delivery.update(Rejected(error=error("amqp:decode-error", malformed.description)))
            return
        if isinstance(delivery.state, TransactionalState):  # stored at commit (transactions.py)
            self.transactions.enlist_send(peer, delivery, entity, messages)
            return
        try:
            self.intake.send(entity, messages)
        except SendRefusedError as refused:
            delivery.update(Rejected(error=error(refused.condition, str(refused))))
            return
        if delivery.settled:
            self.commits.soon()
        else:
            self.commits.soon(lambda: delivery.update(ACCEPTED))

    def flow(self, peer: Peer, link: Link) -> None:
        consumer = peer.consumers.get(link)
        if consumer is not None:
            self.dispatcher.pump(consumer)

    def settle(self, peer: Peer, link: Link, delivery: Delivery) -> None:
        consumer = peer.consumers.get(link)
        if consumer is None:
            return
        if isinstance(delivery.remote_state, TransactionalState):  # applied at commit
            self.transactions.enlist_settle(consumer, delivery)  # (transactions.py)
        else:
            self.dispatcher.settle(consumer, delivery)

    def detach(self, peer: Peer, link: Link) -> None:
        self.transactions.forget_link(link)  # a send-via link
        self.dispatcher.remove(peer, link)
