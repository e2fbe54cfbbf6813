"""``chain`` / ``verify-chain``: a hash chain per session, so a receiver detects missing,
duplicated and reordered messages.

Chains
------
One chain per *chain key*: the session id, or for messages without one the partition key, or
``""`` (one chain) for messages with neither; these are the groups the pipeline keeps in
order (``Message.order_key``). Each chain has a random id (32 hex digits), made when this
process starts the chain. ``chain`` writes:

``repl-chain-id``    the chain id
``repl-chain-seq``   1, 2, 3... within the chain (an integer)
``repl-chain-hash``  base64 of the 32-byte link hash

Link hashes (SHA-256, or HMAC-SHA256 with the secret in ``key_setting``, so that only key
holders can forge a chain)::

    digest(m)   = SHA-256(canonical_bytes(m, fields))        (signing.py's encoding; the
                                                               body plus the chosen fields)
    genesis(id) = SHA-256(b"repl-chain-v1\\n" + id as ASCII)
    link(n)     = H(link(n-1) || u64 BE n || digest(m_n)),   link(0) = genesis(id)

``verify-chain`` (configured with the same fields and key) recomputes each link from the
previous one and fails (``StepFailed``) with: ``MissingMessage`` (the sequence skips; the
chain resynchronises on this message, so one gap is reported once), ``Reordered`` (a sequence
number at or below the last one that is not a copy of it: arrived late, or from an earlier
chain), ``DuplicateMessage`` (an exact copy of a message already verified; ``duplicates:
drop`` filters them instead), ``ChainBroken`` (the link does not match: content altered, or a
different message in its place; the chain resynchronises too), ``NotChained`` (properties
missing or malformed), and with ``restarts: fail`` ``ChainRestarted``.

Place ``chain`` last in a pipeline (a message dropped after it is reported missing), and
cover only what later hops keep (``repl-enqueue-time`` grows on every hop).

State, restarts, redelivery
---------------------------
State lives in memory per built step instance, bounded by ``max_chains`` (least recently used
chains are forgotten first). When ``chain`` has no state for a chain key (first message,
process restart, chain forgotten) it starts a new chain: new id, sequence 1. ``verify-chain``
accepts a new chain id at sequence 1 as a restart (logged; ``restarts: fail`` reports it),
and without state takes the first message it sees of a chain as the anchor (it cannot check
that message's link; ``start: first`` requires sequence 1 instead). So a restart costs
continuity, never messages.

To keep chains across restarts or across instances (a session moving to another function
instance), a runner persists state with the hooks of the built step (``BoundStep.run``):
``get_state(chain_key) -> bytes | None`` after the chain's messages were sent, and
``set_state(chain_key, data)`` before processing that key again; Service Bus session state
(``set_session_state``) fits. The bytes are JSON ``{"v":1,"id":..,"seq":..,"hash":..}``.

A source message delivered again (same ``sequence_number``, after a failed send) with the
same content gets the same ``repl-chain-seq`` and hash as the first time (the last
``remember`` assignments per chain are kept), so a resend fills its own place; if the first
copy did arrive, the receiver sees an exact duplicate.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import json
import logging
import os
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from ...messages import Message
from ..steps import StepConfigError, StepContext, StepFailed, StepOptions, step
from .signing import (
    DEFAULT_FIELDS,
    MessageField,
    canonical_bytes,
    covered_fields,
    decode_base64,
    encode_base64,
)

log = logging.getLogger("replication.tasks.chain")

CHAIN_ID = "repl-chain-id"
CHAIN_SEQ = "repl-chain-seq"
CHAIN_HASH = "repl-chain-hash"
_CHAIN_PROPERTIES = (CHAIN_ID, CHAIN_SEQ, CHAIN_HASH)
GENESIS_PREFIX = b"repl-chain-v1\n"
STATE_VERSION = 1


def _without(props: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in props.items() if k not in names}


def chain_key(message: Message) -> str:
    """The chain a message belongs to: session id, else partition key, else ``""``."""
    if message.session_id is not None:
        return message.session_id
    if message.partition_key is not None:
        return message.partition_key
    return ""


def genesis(chain_id: str) -> bytes:
    return hashlib.sha256(GENESIS_PREFIX + chain_id.encode("ascii")).digest()


class Linker:
    """Computes digests and links for one configuration (fields, optional HMAC secret)."""

    def __init__(self, fields: tuple[str, ...], secret: bytes | None) -> None:
        self.fields = fields
        self.secret = secret

    def digest(self, message: Message) -> bytes:
        try:
            return hashlib.sha256(canonical_bytes(message, self.fields)).digest()
        except TypeError as exc:
            raise StepFailed("UnsupportedValue", str(exc)) from None

    def link(self, previous: bytes, seq: int, digest: bytes) -> bytes:
        data = previous + struct.pack(">Q", seq) + digest
        if self.secret is None:
            return hashlib.sha256(data).digest()
        return hmac.digest(self.secret, data, "sha256")


@dataclass(slots=True)
class ChainState:
    """Where a chain stands: its id, the last sequence number and that link's hash."""

    chain_id: str
    seq: int
    hash: bytes
    recent: OrderedDict[Any, Any] = field(default_factory=OrderedDict)
    """chain: source sequence number -> (seq, hash, digest); verify-chain: seq -> (hash,
    digest)."""
    retired: tuple[str, ...] = ()
    """verify-chain: ids of earlier chains under this key (their stragglers are late)."""

    def to_bytes(self) -> bytes:
        document = {
            "v": STATE_VERSION,
            "id": self.chain_id,
            "seq": self.seq,
            "hash": encode_base64(self.hash),
        }
        return json.dumps(document, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes) -> ChainState:
        try:
            document = json.loads(data)
            if document.get("v") != STATE_VERSION:
                raise ValueError(f"state version {document.get('v')!r}")
            state = cls(str(document["id"]), int(document["seq"]), decode_base64(document["hash"]))
        except (ValueError, TypeError, KeyError, AttributeError, binascii.Error) as exc:
            raise ValueError(f"not a chain state: {exc}") from None
        if state.seq < 0 or len(state.hash) != 32:
            raise ValueError("not a chain state: bad seq or hash")
        return state


class _ChainStates:
    """Chain states by chain key, least recently used forgotten beyond ``max_chains``."""

    def __init__(self, max_chains: int) -> None:
        self.max_chains = max_chains
        self.states: OrderedDict[str, ChainState] = OrderedDict()
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.states)

    def get(self, key: str) -> ChainState | None:
        state = self.states.get(key)
        if state is not None:
            self.states.move_to_end(key)
        return state

    def put(self, key: str, state: ChainState) -> None:
        self.states[key] = state
        self.states.move_to_end(key)
        while len(self.states) > self.max_chains:
            self.states.popitem(last=False)

    def get_state(self, key: str) -> bytes | None:
        """The state of chain ``key`` as bytes to persist, or None if there is none."""
        with self.lock:
            state = self.states.get(key)
            return None if state is None else state.to_bytes()

    def set_state(self, key: str, data: bytes | None) -> None:
        """Restores (or, with None, forgets) the state of chain ``key``; ``ValueError`` for
        bytes ``get_state`` did not make."""
        with self.lock:
            if data is None:
                self.states.pop(key, None)
            else:
                self.put(key, ChainState.from_bytes(data))


# ---------------------------------------------------------------------- options


class _ChainOptions(StepOptions):
    fields: tuple[MessageField, ...] = DEFAULT_FIELDS
    """Message fields in each link's digest besides the body (always included)."""
    properties: tuple[str, ...] = ()
    """Application properties in each link's digest."""
    key_setting: str | None = Field(default=None, min_length=1)
    """Setting with an HMAC secret for keyed links; none: plain SHA-256."""
    secret_encoding: Literal["base64", "utf-8"] = "base64"
    max_chains: int = Field(default=10_000, gt=0)
    """Chains (sessions) remembered at once; least recently used forgotten first."""

    reserved_prefix: ClassVar[str] = "repl-chain-"

    @model_validator(mode="after")
    def _not_own_output(self) -> _ChainOptions:
        for name in self.properties:
            if name.startswith(self.reserved_prefix):
                raise ValueError(f"cannot cover {name!r}: the steps write repl-chain-* itself")
        return self

    def linker(self, context: StepContext) -> Linker:
        secret = None
        if self.key_setting is not None:
            text = context.setting(self.key_setting)
            try:
                secret = (
                    text.encode("utf-8") if self.secret_encoding == "utf-8" else decode_base64(text)
                )
            except (ValueError, binascii.Error) as exc:
                raise StepConfigError(f"setting {self.key_setting!r}: not base64: {exc}") from None
        return Linker(covered_fields(self.fields, self.properties), secret)


class ChainOptions(_ChainOptions):
    remember: int = Field(default=1_000, ge=0)
    """Assignments kept per chain to give a redelivered message its first stamp again."""


class VerifyChainOptions(_ChainOptions):
    history: int = Field(default=1_000, ge=0)
    """Links kept per chain to tell an exact duplicate from a late (reordered) message."""
    duplicates: Literal["fail", "drop"] = "fail"
    """An exact copy of a verified message: ``DuplicateMessage``, or filter it out."""
    start: Literal["any", "first"] = "any"
    """A chain this verifier has no state for: anchor on any message, or require seq 1."""
    restarts: Literal["accept", "fail"] = "accept"
    """A new chain id at sequence 1 under a known key: accept it, or ``ChainRestarted``."""
    remove: bool = False
    """Remove the ``repl-chain-*`` properties from messages that verify."""


# ---------------------------------------------------------------------- chain


class ChainStep(_ChainStates):
    """The built ``chain`` step: stamps messages; ``get_state`` / ``set_state`` persist."""

    def __init__(self, options: ChainOptions, context: StepContext) -> None:
        super().__init__(options.max_chains)
        self.linker = options.linker(context)
        self.remember = options.remember

    def __call__(self, message: Message) -> list[Message]:
        digest = self.linker.digest(message)
        key = chain_key(message)
        source = message.sequence_number
        with self.lock:
            state = self.get(key)
            if state is None:
                state = ChainState(os.urandom(16).hex(), 0, b"")
                state.hash = genesis(state.chain_id)
                self.put(key, state)
            again = state.recent.get(source) if source is not None else None
            if again is not None and again[2] == digest:
                seq, link = again[0], again[1]
            else:
                seq = state.seq + 1
                link = self.linker.link(state.hash, seq, digest)
                state.seq, state.hash = seq, link
                if source is not None and self.remember:
                    state.recent[source] = (seq, link, digest)
                    state.recent.move_to_end(source)
                    while len(state.recent) > self.remember:
                        state.recent.popitem(last=False)
            chain_id = state.chain_id
        props = _without(message.application_properties, _CHAIN_PROPERTIES)
        props[CHAIN_ID] = chain_id
        props[CHAIN_SEQ] = seq
        props[CHAIN_HASH] = encode_base64(link)
        return [message.copy(application_properties=props)]


@step("chain", ChainOptions)
def build_chain(options: ChainOptions, context: StepContext) -> ChainStep:
    """Stamps each message with its session's next sequence number and chained hash."""
    return ChainStep(options, context)


# ---------------------------------------------------------------------- verify-chain


def _stamp(message: Message) -> tuple[str, int, bytes]:
    props = message.application_properties
    chain_id, seq, link = props.get(CHAIN_ID), props.get(CHAIN_SEQ), props.get(CHAIN_HASH)
    if chain_id is None or seq is None or link is None:
        missing = [n for n in _CHAIN_PROPERTIES if props.get(n) is None]
        raise StepFailed("NotChained", f"missing {', '.join(missing)}")
    try:
        if isinstance(seq, bool) or not isinstance(seq, int | str):
            raise ValueError(f"{CHAIN_SEQ} is a {type(seq).__name__}")
        seq = int(seq)
        if seq < 1:
            raise ValueError(f"{CHAIN_SEQ} {seq} is below 1")
        chain_id = str(chain_id)
        chain_id.encode("ascii")
        link = decode_base64(str(link))
        if len(link) != 32:
            raise ValueError(f"{CHAIN_HASH} is not 32 bytes")
    except (ValueError, binascii.Error) as exc:
        raise StepFailed("NotChained", str(exc)) from None
    return chain_id, seq, link


class VerifyChainStep(_ChainStates):
    """The built ``verify-chain`` step; ``get_state`` / ``set_state`` persist its state."""

    RETIRED = 8

    def __init__(self, options: VerifyChainOptions, context: StepContext) -> None:
        super().__init__(options.max_chains)
        self.linker = options.linker(context)
        self.options = options

    def __call__(self, message: Message) -> list[Message]:
        chain_id, seq, link = _stamp(message)
        digest = self.linker.digest(message)
        key = chain_key(message)
        with self.lock:
            keep = self._check(key, chain_id, seq, link, digest)
        if not keep:
            return []
        if not self.options.remove:
            return [message]
        props = _without(message.application_properties, _CHAIN_PROPERTIES)
        return [message.copy(application_properties=props)]

    def _accept(self, key: str, state: ChainState, seq: int, link: bytes, digest: bytes) -> None:
        state.seq, state.hash = seq, link
        if self.options.history:
            state.recent[seq] = (link, digest)
            while len(state.recent) > self.options.history:
                state.recent.popitem(last=False)
        self.put(key, state)

    def _check(self, key: str, chain_id: str, seq: int, link: bytes, digest: bytes) -> bool:
        state = self.get(key)
        where = f"chain {key!r} ({chain_id[:8]}…)"
        if state is not None and chain_id in state.retired:
            raise StepFailed("Reordered", f"{where} seq {seq} is from an earlier chain")
        if state is None or state.chain_id != chain_id:
            retired = () if state is None else (state.chain_id, *state.retired)[: self.RETIRED]
            fresh = ChainState(chain_id, 0, genesis(chain_id), retired=retired)
            if seq == 1:
                expected = self.linker.link(fresh.hash, 1, digest)
                self._accept(key, fresh, seq, link, digest)
                if not hmac.compare_digest(expected, link):
                    raise StepFailed("ChainBroken", f"{where} seq 1 does not match its hash")
                if state is not None:
                    if self.options.restarts == "fail":
                        was = f"chain {state.chain_id[:8]}… at seq {state.seq}"
                        raise StepFailed("ChainRestarted", f"{where} replaces {was}")
                    log.info("%s restarted (was %s at seq %d)", where, state.chain_id, state.seq)
                return True
            self._accept(key, fresh, seq, link, digest)  # an anchor: its link can't be checked
            if state is not None or self.options.start == "first":
                missing = f"seq 1 to {seq - 1} not seen"
                raise StepFailed("MissingMessage", f"{where} starts at seq {seq}: {missing}")
            log.info("%s: anchored at seq %d (no state)", where, seq)
            return True
        if seq == state.seq + 1:
            expected = self.linker.link(state.hash, seq, digest)
            self._accept(key, state, seq, link, digest)
            if not hmac.compare_digest(expected, link):
                why = "altered, or another message"
                raise StepFailed("ChainBroken", f"{where} seq {seq} does not follow ({why})")
            return True
        if seq > state.seq + 1:
            last = state.seq
            self._accept(key, state, seq, link, digest)
            first_missing = last + 1
            missing = f"seq {first_missing}"
            if seq - 1 > first_missing:
                missing += f" to {seq - 1}"
            raise StepFailed("MissingMessage", f"{where}: {missing} missing before seq {seq}")
        known = state.recent.get(seq)
        if known is not None and hmac.compare_digest(known[0], link):
            if not hmac.compare_digest(known[1], digest):
                why = "repeats a verified link with other content"
                raise StepFailed("ChainBroken", f"{where} seq {seq} {why}")
            if self.options.duplicates == "drop":
                log.info("%s: dropped a duplicate of seq %d", where, seq)
                return False
            raise StepFailed("DuplicateMessage", f"{where} seq {seq} was already verified")
        raise StepFailed("Reordered", f"{where} seq {seq} arrived after seq {state.seq}")


@step("verify-chain", VerifyChainOptions)
def build_verify_chain(options: VerifyChainOptions, context: StepContext) -> VerifyChainStep:
    """Checks each message's chain link; fails on missing, reordered or altered messages."""
    return VerifyChainStep(options, context)
