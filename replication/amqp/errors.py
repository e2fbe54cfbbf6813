"""The exceptions of the AMQP layer: each carries the AMQP error condition a peer should see."""

from __future__ import annotations

from typing import ClassVar


class AMQPError(Exception):
    """Base of every error this package raises on purpose."""

    default_condition: ClassVar[str] = "amqp:internal-error"  # a class's, when none is given

    def __init__(self, description: str, condition: str | None = None) -> None:
        super().__init__(description)
        self.description = description
        self.condition = self.default_condition if condition is None else condition


class DecodeError(AMQPError):
    """Bytes that are not a valid AMQP encoding (truncated, bad constructor, bad sizes)."""

    default_condition: ClassVar[str] = "amqp:decode-error"


class EncodeError(AMQPError, ValueError):
    """A Python value that cannot be written as the requested AMQP type."""


class FramingError(AMQPError):
    """A frame that breaks the framing rules (size, doff, type, oversize)."""

    default_condition: ClassVar[str] = "amqp:connection:framing-error"


class ProtocolError(AMQPError):
    """A peer broke a protocol rule; the connection closes with ``condition``."""


class MessageSizeExceededError(AMQPError, ValueError):
    """A message larger than the receiving link's max-message-size; nothing was sent."""

    default_condition: ClassVar[str] = "amqp:link:message-size-exceeded"


class ConnectionClosedError(AMQPError):
    """The connection is closed; ``condition`` is the close error if the peer sent one."""
