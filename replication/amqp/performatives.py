"""Frame bodies: the nine AMQP performatives, the five SASL frames and ``error`` (2.7, 5.3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from .composite import amqp_field, composite

MAX_UINT: Final = 0xFFFFFFFF

# settle modes (spec 2.8.2, 2.8.3)
SND_UNSETTLED: Final = 0
SND_SETTLED: Final = 1
SND_MIXED: Final = 2
RCV_FIRST: Final = 0
RCV_SECOND: Final = 1

# link roles (spec 2.8.1): the boolean on attach and disposition
ROLE_SENDER: Final = False
ROLE_RECEIVER: Final = True


# Performatives, their termini and errors go out untrimmed (every field, trailing nulls
# too): the azure-servicebus SDK reads an error's info as element 2 of the list, and the
# azure-eventhub SDK's pyamqp (5.15.1) indexes begin, attach, source, target and transfer
# fields by position without padding a short list (a transfer's payload is appended after
# the fields it got, so a trimmed transfer loses it).
@composite(0x1D, "amqp:error:list", trim=False)
@dataclass(slots=True)
class Error:
    condition: str = amqp_field("symbol", mandatory=True)
    description: str | None = amqp_field("string")
    info: dict[Any, Any] | None = amqp_field("fields")


@composite(0x10, "amqp:open:list", trim=False)
@dataclass(slots=True)
class Open:
    container_id: str = amqp_field("string", mandatory=True)
    hostname: str | None = amqp_field("string")
    max_frame_size: int = amqp_field("uint", default=MAX_UINT)
    channel_max: int = amqp_field("ushort", default=0xFFFF)
    idle_time_out: int | None = amqp_field("uint")
    outgoing_locales: tuple[str, ...] | None = amqp_field("symbol", multiple=True)
    incoming_locales: tuple[str, ...] | None = amqp_field("symbol", multiple=True)
    offered_capabilities: tuple[str, ...] | None = amqp_field("symbol", multiple=True)
    desired_capabilities: tuple[str, ...] | None = amqp_field("symbol", multiple=True)
    properties: dict[Any, Any] | None = amqp_field("fields")


@composite(0x11, "amqp:begin:list", trim=False)
@dataclass(slots=True)
class Begin:
    remote_channel: int | None = amqp_field("ushort")
    next_outgoing_id: int = amqp_field("uint", mandatory=True)
    incoming_window: int = amqp_field("uint", mandatory=True)
    outgoing_window: int = amqp_field("uint", mandatory=True)
    handle_max: int = amqp_field("uint", default=MAX_UINT)
    offered_capabilities: tuple[str, ...] | None = amqp_field("symbol", multiple=True)
    desired_capabilities: tuple[str, ...] | None = amqp_field("symbol", multiple=True)
    properties: dict[Any, Any] | None = amqp_field("fields")


@composite(0x12, "amqp:attach:list", trim=False)
@dataclass(slots=True)
class Attach:
    name: str = amqp_field("string", mandatory=True)
    handle: int = amqp_field("uint", mandatory=True)
    role: bool = amqp_field("boolean", mandatory=True)
    snd_settle_mode: int = amqp_field("ubyte", default=SND_MIXED)
    rcv_settle_mode: int = amqp_field("ubyte", default=RCV_FIRST)
    source: Any = amqp_field("*")
    target: Any = amqp_field("*")
    unsettled: dict[Any, Any] | None = amqp_field("map")
    incomplete_unsettled: bool = amqp_field("boolean", default=False)
    initial_delivery_count: int | None = amqp_field("uint")
    max_message_size: int | None = amqp_field("ulong")
    offered_capabilities: tuple[str, ...] | None = amqp_field("symbol", multiple=True)
    desired_capabilities: tuple[str, ...] | None = amqp_field("symbol", multiple=True)
    properties: dict[Any, Any] | None = amqp_field("fields")


@composite(0x13, "amqp:flow:list", trim=False)
@dataclass(slots=True)
class Flow:
    next_incoming_id: int | None = amqp_field("uint")
    incoming_window: int = amqp_field("uint", mandatory=True)
    next_outgoing_id: int = amqp_field("uint", mandatory=True)
    outgoing_window: int = amqp_field("uint", mandatory=True)
    handle: int | None = amqp_field("uint")
    delivery_count: int | None = amqp_field("uint")
    link_credit: int | None = amqp_field("uint")
    available: int | None = amqp_field("uint")
    drain: bool = amqp_field("boolean", default=False)
    echo: bool = amqp_field("boolean", default=False)
    properties: dict[Any, Any] | None = amqp_field("fields")


@composite(0x14, "amqp:transfer:list", trim=False)
@dataclass(slots=True)
class Transfer:
    handle: int = amqp_field("uint", mandatory=True)
    delivery_id: int | None = amqp_field("uint")
    delivery_tag: bytes | None = amqp_field("binary")
    message_format: int | None = amqp_field("uint")
    settled: bool | None = amqp_field("boolean")
    more: bool = amqp_field("boolean", default=False)
    rcv_settle_mode: int | None = amqp_field("ubyte")
    state: Any = amqp_field("*")
    resume: bool = amqp_field("boolean", default=False)
    aborted: bool = amqp_field("boolean", default=False)
    batchable: bool = amqp_field("boolean", default=False)


@composite(0x15, "amqp:disposition:list", trim=False)
@dataclass(slots=True)
class Disposition:
    role: bool = amqp_field("boolean", mandatory=True)
    first: int = amqp_field("uint", mandatory=True)
    last: int | None = amqp_field("uint")
    settled: bool = amqp_field("boolean", default=False)
    state: Any = amqp_field("*")
    batchable: bool = amqp_field("boolean", default=False)


@composite(0x16, "amqp:detach:list", trim=False)
@dataclass(slots=True)
class Detach:
    handle: int = amqp_field("uint", mandatory=True)
    closed: bool = amqp_field("boolean", default=False)
    error: Error | None = amqp_field("*", requires=Error)


@composite(0x17, "amqp:end:list", trim=False)
@dataclass(slots=True)
class End:
    error: Error | None = amqp_field("*", requires=Error)


@composite(0x18, "amqp:close:list", trim=False)
@dataclass(slots=True)
class Close:
    error: Error | None = amqp_field("*", requires=Error)


# SASL frame bodies (spec 5.3.3)

SASL_OK = 0
SASL_AUTH = 1
SASL_SYS = 2
SASL_SYS_PERM = 3
SASL_SYS_TEMP = 4


@composite(0x40, "amqp:sasl-mechanisms:list")
@dataclass(slots=True)
class SaslMechanisms:
    sasl_server_mechanisms: tuple[str, ...] = amqp_field("symbol", mandatory=True, multiple=True)


@composite(0x41, "amqp:sasl-init:list")
@dataclass(slots=True)
class SaslInit:
    mechanism: str = amqp_field("symbol", mandatory=True)
    initial_response: bytes | None = amqp_field("binary")
    hostname: str | None = amqp_field("string")


@composite(0x42, "amqp:sasl-challenge:list")
@dataclass(slots=True)
class SaslChallenge:
    challenge: bytes = amqp_field("binary", mandatory=True)


@composite(0x43, "amqp:sasl-response:list")
@dataclass(slots=True)
class SaslResponse:
    response: bytes = amqp_field("binary", mandatory=True)


@composite(0x44, "amqp:sasl-outcome:list")
@dataclass(slots=True)
class SaslOutcome:
    code: int = amqp_field("ubyte", mandatory=True)
    additional_data: bytes | None = amqp_field("binary")


PERFORMATIVES = (Open, Begin, Attach, Flow, Transfer, Disposition, Detach, End, Close)
SASL_FRAMES = (SaslMechanisms, SaslInit, SaslChallenge, SaslResponse, SaslOutcome)
