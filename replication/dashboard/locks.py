"""Messages the page received under a lock, held between its requests until it settles them.

A person reads a message, then decides: complete, abandon, dead-letter or defer. The lock
must outlive the HTTP request that received the message, so the receiver (or, for deferred
messages received by sequence number, the ``$management`` lock tokens) stays open under a
receipt id the page sends back with each settlement. A receipt ends when its last message is
settled, when the page releases it (the rest go back without a delivery counted), or when
more than ``MAX_RECEIPTS`` are open (the oldest is released): no lock is held for nobody.
Locks still expire at the entity's lock duration; a settlement after that fails with the
broker's own "lock lost" error, which the page shows.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Literal

from ..messages import Message
from ..servicebus.client import AmqpReceiver, SourceError
from ..servicebus.management import Management

Action = Literal["complete", "abandon", "defer", "dead-letter"]
ACTIONS: tuple[Action, ...] = ("complete", "abandon", "defer", "dead-letter")
MAX_RECEIPTS = 20
"""Receipts open at once (per dashboard); the oldest is released past this."""


class ReceiptNotFound(Exception):
    """The receipt was settled in full, released, or pushed out by newer ones."""


@dataclass
class Receipt:
    """Locked messages of one entity: on a receiver's link, or by ``$management`` lock token
    (deferred messages received by sequence number), settled the matching way."""

    id: str
    entity: str
    messages: dict[int, Message]
    receiver: AmqpReceiver | None = None
    management: Management | None = None
    session: AmqpReceiver | None = None
    """Holds the session of deferred messages received in it, until the receipt ends."""
    settled: list[int] = field(default_factory=list)

    async def settle(
        self, numbers: list[int], action: Action, reason: str = "", description: str = ""
    ) -> tuple[list[int], list[int]]:
        """Settles the held messages with these sequence numbers; (done, not held)."""
        chosen = [self.messages[n] for n in numbers if n in self.messages]
        missing = [n for n in numbers if n not in self.messages]
        if self.receiver is not None:
            if not self.receiver.is_open:
                raise SourceError(f"the receiver on {self.entity} closed: its locks are gone")
            if action == "complete":
                self.receiver.complete(chosen)
            elif action == "abandon":
                self.receiver.abandon(chosen)
            elif action == "defer":
                self.receiver.defer(chosen)
            else:
                for message in chosen:
                    self.receiver.dead_letter(message, reason, description)
        elif self.management is not None and chosen:
            await self.management.settle(chosen, action, reason=reason, description=description)
        done = [int(m.sequence_number or 0) for m in chosen]
        for number in done:
            del self.messages[number]
        self.settled += done
        return done, missing

    async def release(self) -> int:
        """Gives back what is still held (no delivery counted) and closes the receiver."""
        count = len(self.messages)
        if self.receiver is not None:
            if self.receiver.is_open and self.messages:
                self.receiver.release(list(self.messages.values()))
            await self.receiver.close()
        if self.session is not None:
            await self.session.close()
        self.messages.clear()
        return count


class Receipts:
    """The open receipts of one dashboard, oldest first."""

    def __init__(self) -> None:
        self._open: dict[str, Receipt] = {}

    async def add(
        self,
        entity: str,
        messages: list[Message],
        *,
        receiver: AmqpReceiver | None = None,
        management: Management | None = None,
        session: AmqpReceiver | None = None,
    ) -> Receipt:
        receipt = Receipt(
            str(uuid.uuid4()),
            entity,
            {int(m.sequence_number or 0): m for m in messages},
            receiver=receiver,
            management=management,
            session=session,
        )
        if not messages:
            await receipt.release()
            return receipt
        self._open[receipt.id] = receipt
        while len(self._open) > MAX_RECEIPTS:
            oldest = next(iter(self._open))
            await self._open.pop(oldest).release()
        return receipt

    def get(self, receipt_id: str) -> Receipt:
        receipt = self._open.get(receipt_id)
        if receipt is None:
            raise ReceiptNotFound(
                f"receipt {receipt_id!r} is not open (settled, released or pushed out by "
                f"newer ones): receive again"
            )
        return receipt

    async def settle(
        self,
        receipt_id: str,
        numbers: list[int],
        action: Action,
        reason: str = "",
        description: str = "",
    ) -> tuple[list[int], list[int]]:
        receipt = self.get(receipt_id)
        done, missing = await receipt.settle(numbers, action, reason, description)
        if not receipt.messages:
            await self._open.pop(receipt.id).release()
        return done, missing

    async def release(self, receipt_id: str) -> int:
        return await self._open.pop(self.get(receipt_id).id).release()

    async def close(self) -> None:
        while self._open:
            await self._open.popitem()[1].release()
