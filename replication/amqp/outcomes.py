"""Delivery states (spec 3.4) and the transaction types (spec 4.5): what a disposition says."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .composite import amqp_field, composite
from .performatives import Error


@composite(0x23, "amqp:received:list")
@dataclass(slots=True)
class Received:
    section_number: int = amqp_field("uint", mandatory=True)
    section_offset: int = amqp_field("ulong", mandatory=True)


@composite(0x24, "amqp:accepted:list")
@dataclass(slots=True)
class Accepted:
    pass


ACCEPTED = Accepted()
"""Accepted has no fields: one instance serves every delivery that is answered with it."""


@composite(0x25, "amqp:rejected:list")
@dataclass(slots=True)
class Rejected:
    error: Error | None = amqp_field("*", requires=Error)


@composite(0x26, "amqp:released:list")
@dataclass(slots=True)
class Released:
    pass


@composite(0x27, "amqp:modified:list")
@dataclass(slots=True)
class Modified:
    delivery_failed: bool | None = amqp_field("boolean")
    undeliverable_here: bool | None = amqp_field("boolean")
    message_annotations: dict[Any, Any] | None = amqp_field("fields")


@composite(0x30, "amqp:coordinator:list")
@dataclass(slots=True)
class Coordinator:
    """The target of a link to a transaction coordinator."""

    capabilities: tuple[str, ...] | None = amqp_field("symbol", multiple=True)


@composite(0x31, "amqp:declare:list")
@dataclass(slots=True)
class Declare:
    global_id: Any = amqp_field("*")


@composite(0x32, "amqp:discharge:list")
@dataclass(slots=True)
class Discharge:
    txn_id: bytes = amqp_field("binary", mandatory=True)
    fail: bool | None = amqp_field("boolean")


@composite(0x33, "amqp:declared:list")
@dataclass(slots=True)
class Declared:
    txn_id: bytes = amqp_field("binary", mandatory=True)


@composite(0x34, "amqp:transactional-state:list")
@dataclass(slots=True)
class TransactionalState:
    txn_id: bytes = amqp_field("binary", mandatory=True)
    outcome: Any = amqp_field("*")


TERMINAL_OUTCOMES = (Accepted, Rejected, Released, Modified)
