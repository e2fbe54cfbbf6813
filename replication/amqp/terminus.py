"""Link endpoints (spec 3.5): source, target, and the lifetime policies of dynamic nodes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .composite import amqp_field, composite

# terminus durability (spec 3.5.5)
DURABLE_NONE = 0
DURABLE_CONFIGURATION = 1
DURABLE_UNSETTLED_STATE = 2


@composite(0x28, "amqp:source:list", trim=False)  # see performatives.Error
@dataclass(slots=True)
class Source:
    address: Any = amqp_field("*")
    durable: int = amqp_field("uint", default=DURABLE_NONE)
    expiry_policy: str = amqp_field("symbol", default="session-end")
    timeout: int = amqp_field("uint", default=0)
    dynamic: bool = amqp_field("boolean", default=False)
    dynamic_node_properties: dict[Any, Any] | None = amqp_field("fields")
    distribution_mode: str | None = amqp_field("symbol")
    filter: dict[Any, Any] | None = amqp_field("fields")
    default_outcome: Any = amqp_field("*")
    outcomes: tuple[str, ...] | None = amqp_field("symbol", multiple=True)
    capabilities: tuple[str, ...] | None = amqp_field("symbol", multiple=True)


@composite(0x29, "amqp:target:list", trim=False)  # see performatives.Error
@dataclass(slots=True)
class Target:
    address: Any = amqp_field("*")
    durable: int = amqp_field("uint", default=DURABLE_NONE)
    expiry_policy: str = amqp_field("symbol", default="session-end")
    timeout: int = amqp_field("uint", default=0)
    dynamic: bool = amqp_field("boolean", default=False)
    dynamic_node_properties: dict[Any, Any] | None = amqp_field("fields")
    capabilities: tuple[str, ...] | None = amqp_field("symbol", multiple=True)


@composite(0x2B, "amqp:delete-on-close:list")
@dataclass(slots=True)
class DeleteOnClose:
    pass


@composite(0x2C, "amqp:delete-on-no-links:list")
@dataclass(slots=True)
class DeleteOnNoLinks:
    pass


@composite(0x2D, "amqp:delete-on-no-messages:list")
@dataclass(slots=True)
class DeleteOnNoMessages:
    pass


@composite(0x2E, "amqp:delete-on-no-links-or-messages:list")
@dataclass(slots=True)
class DeleteOnNoLinksOrMessages:
    pass
