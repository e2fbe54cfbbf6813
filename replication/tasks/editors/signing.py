"""Integrity editors: ``sign`` / ``verify`` a message, ``attest`` it for third parties.

Canonical encoding (version 1)
------------------------------
Signatures, attestations and chain links (``chain.py``) cover a message through one
byte string, ``canonical_bytes(message, fields)``::

    b"repl-canonical-v1\\n"
    then, for each covered field, in the order listed:
        u16 big-endian  length of the field name (UTF-8)
        field name      UTF-8
        u8              type tag of the value (below)
        u32 big-endian  length of the value bytes
        value bytes

Field names: ``body`` (always covered, always first), ``message-id``, ``correlation-id``,
``session-id``, ``reply-to-session-id``, ``partition-key``, ``subject``, ``content-type``,
``reply-to``, ``to``, ``time-to-live``, ``scheduled-enqueue-time``, and ``property:NAME`` for
the application property ``NAME`` (exact, case-sensitive key). Values, by tag:

==== ========== ==================================================================
tag  value      bytes
==== ========== ==================================================================
0    absent     none (a field or property the message does not have, or None)
1    text/bytes UTF-8 of a string, or the bytes as they are (the body; a ``bytes``
                property: the SDK sends those as strings, so both encode alike)
2    boolean    one byte, 0 or 1
3    integer    ASCII decimal, ``-`` for negatives (``"42"``)
4    double     IEEE 754 binary64, big-endian (8 bytes)
5    timestamp  ASCII decimal milliseconds since 1970-01-01 UTC, floored (AMQP
                timestamps have millisecond precision; naive datetimes count as UTC)
6    duration   ASCII decimal milliseconds, floored (AMQP's TTL unit)
7    uuid       the 16 bytes, big-endian (RFC 4122 order)
==== ========== ==================================================================

Covering an absent field binds its absence: adding it later breaks the signature.

Keys
----
``hmac-sha256``: a shared secret; the setting holds it in base64 (standard or URL-safe
alphabet, padding optional) or, with ``secret_encoding: utf-8``, as text; at least 16 bytes.
``ed25519``: the signer's setting holds the private key, the verifier's the public key, each
as PEM (PKCS #8 ``PRIVATE KEY`` / SubjectPublicKeyInfo ``PUBLIC KEY``) or base64 of the 32 raw
key bytes. Key ids (``key_id``) let verifiers pick among several keys (``keys: {id:
setting}``) while keys rotate.

``sign`` properties
-------------------
``repl-sig`` base64 signature of the canonical bytes; ``repl-sig-alg`` ``HMAC-SHA256`` or
``Ed25519``; ``repl-sig-fields`` the covered field names as a JSON array (compact, e.g.
``["body","message-id"]``); ``repl-sig-key-id`` when a key id is configured. ``verify``
recomputes over the fields *it* is configured with (they must match the signer's) and raises
``StepFailed`` (``NotSigned``, ``UnknownKey``, ``BadSignature``); default ``on_error`` is
dead-letter.

``attest`` properties
---------------------
The step first writes ``repl-attest-time`` (``context.now()``, ISO 8601 UTC as stamping
writes it), ``repl-attest-channel`` (when configured) and ``repl-attest-key-id`` (when
configured); the covered fields are body, the configured fields and properties, then
``property:repl-attest-time``, ``property:repl-attest-channel``, ``property:repl-attest-key-id``
(those present). It then writes ``repl-attest-fields`` (JSON array, as above),
``repl-attest-hash`` = base64(SHA-256(canonical bytes)), ``repl-attest-alg`` (``HMAC-SHA256`` /
``Ed25519``) and ``repl-attest-sig`` = base64(signature over the 32 hash bytes). A third party
checks it with ``verify_attestation`` (or the ``verify-attest`` step): recompute the canonical
bytes over the listed fields, compare the hash, verify the signature over the hash.

Put these steps after every step that changes covered content, and don't cover properties
that later hops change (``repl-enqueue-time`` and ``repl-sequence`` grow on every hop).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import struct
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import Field, field_validator, model_validator

from ...messages import Message
from ..stamping import iso_utc
from ..steps import StepConfigError, StepContext, StepFailed, StepOptions, step

# ---------------------------------------------------------------------- canonical encoding

CANONICAL_HEADER = b"repl-canonical-v1\n"
PROPERTY_PREFIX = "property:"

MessageField = Literal[
    "message-id",
    "correlation-id",
    "session-id",
    "reply-to-session-id",
    "partition-key",
    "subject",
    "content-type",
    "reply-to",
    "to",
    "time-to-live",
    "scheduled-enqueue-time",
]

_ATTRIBUTES: dict[str, str] = {
    "body": "body",
    "message-id": "message_id",
    "correlation-id": "correlation_id",
    "session-id": "session_id",
    "reply-to-session-id": "reply_to_session_id",
    "partition-key": "partition_key",
    "subject": "subject",
    "content-type": "content_type",
    "reply-to": "reply_to",
    "to": "to",
    "time-to-live": "time_to_live",
    "scheduled-enqueue-time": "scheduled_enqueue_time",
}
FIELD_NAMES: tuple[str, ...] = tuple(_ATTRIBUTES)
"""Every field name ``canonical_bytes`` knows besides ``property:NAME``."""

DEFAULT_FIELDS: tuple[MessageField, ...] = ("message-id", "session-id", "content-type")

TAG_ABSENT, TAG_BYTES, TAG_BOOL, TAG_INT, TAG_DOUBLE, TAG_TIME, TAG_DURATION, TAG_UUID = range(8)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)


def encode_value(value: Any) -> tuple[int, bytes]:
    """(type tag, value bytes) of one field value; ``TypeError`` for other types."""
    if value is None:
        return TAG_ABSENT, b""
    if isinstance(value, bool):
        return TAG_BOOL, b"\x01" if value else b"\x00"
    if isinstance(value, int):
        return TAG_INT, str(int(value)).encode("ascii")
    if isinstance(value, float):
        return TAG_DOUBLE, struct.pack(">d", value)
    if isinstance(value, str):
        return TAG_BYTES, value.encode("utf-8")
    if isinstance(value, bytes | bytearray | memoryview):
        return TAG_BYTES, bytes(value)
    if isinstance(value, datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return TAG_TIME, str((moment - _EPOCH) // _MILLISECOND).encode("ascii")
    if isinstance(value, timedelta):
        return TAG_DURATION, str(value // _MILLISECOND).encode("ascii")
    if isinstance(value, uuid.UUID):
        return TAG_UUID, value.bytes
    raise TypeError(f"cannot encode a {type(value).__name__} value canonically")


def field_value(message: Message, name: str) -> Any:
    """The value of covered field ``name`` (None when absent)."""
    if name.startswith(PROPERTY_PREFIX):
        return message.application_properties.get(name[len(PROPERTY_PREFIX) :])
    attribute = _ATTRIBUTES.get(name)
    if attribute is None:
        raise ValueError(f"unknown field {name!r}; expected property:NAME or one of {FIELD_NAMES}")
    return getattr(message, attribute)


def canonical_bytes(message: Message, fields: Iterable[str]) -> bytes:
    """The canonical encoding (see the module docstring) of ``fields`` of ``message``.

    Raises ``ValueError`` for an unknown field name, ``TypeError`` for a value of a type
    that has no encoding."""
    parts = [CANONICAL_HEADER]
    for name in fields:
        encoded_name = name.encode("utf-8")
        tag, value = encode_value(field_value(message, name))
        parts.append(struct.pack(">H", len(encoded_name)))
        parts.append(encoded_name)
        parts.append(struct.pack(">BI", tag, len(value)))
        parts.append(value)
    return b"".join(parts)


def covered_fields(fields: Iterable[str], properties: Iterable[str] = ()) -> tuple[str, ...]:
    """``body``, then ``fields``, then ``property:NAME`` for each property, without repeats."""
    names = ["body", *fields, *(PROPERTY_PREFIX + p for p in properties)]
    return tuple(dict.fromkeys(names))


def fields_text(fields: Sequence[str]) -> str:
    """The covered field names as written in ``repl-sig-fields`` / ``repl-attest-fields``."""
    return json.dumps(list(fields), separators=(",", ":"), ensure_ascii=False)


def parse_fields_text(text: Any) -> tuple[str, ...]:
    """Inverse of ``fields_text``; ``ValueError`` when it is not a JSON array of names."""
    if not isinstance(text, str):
        raise ValueError("not a string")
    fields = json.loads(text)
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise ValueError("not a JSON array of strings")
    for name in fields:
        if not name.startswith(PROPERTY_PREFIX) and name not in _ATTRIBUTES:
            raise ValueError(f"unknown field {name!r}")
    return tuple(fields)


# ---------------------------------------------------------------------- keys

Algorithm = Literal["hmac-sha256", "ed25519"]
ALGORITHM_NAMES: dict[str, str] = {"hmac-sha256": "HMAC-SHA256", "ed25519": "Ed25519"}
"""Option value -> the name written in ``repl-sig-alg`` / ``repl-attest-alg``."""
MIN_SECRET_BYTES = 16


def decode_base64(text: str) -> bytes:
    """Standard or URL-safe base64, padding optional, whitespace ignored."""
    compact = "".join(text.split())
    compact += "=" * (-len(compact) % 4)
    altchars = b"-_" if ("-" in compact or "_" in compact) else None
    return base64.b64decode(compact, altchars=altchars, validate=True)


def encode_base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass(frozen=True, slots=True)
class Signer:
    """Makes signatures with one key: ``sign(data) -> signature bytes``."""

    algorithm: Algorithm
    sign: Callable[[bytes], bytes]
    key_id: str | None = None

    @property
    def name(self) -> str:
        return ALGORITHM_NAMES[self.algorithm]


@dataclass(frozen=True, slots=True)
class Verifier:
    """Checks signatures made with one key: ``verify(data, signature) -> bool``."""

    algorithm: Algorithm
    verify: Callable[[bytes, bytes], bool]

    @property
    def name(self) -> str:
        return ALGORITHM_NAMES[self.algorithm]


def hmac_signer(secret: bytes, key_id: str | None = None) -> Signer:
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"an HMAC secret needs at least {MIN_SECRET_BYTES} bytes")
    return Signer("hmac-sha256", lambda data: hmac.digest(secret, data, "sha256"), key_id)


def hmac_verifier(secret: bytes) -> Verifier:
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"an HMAC secret needs at least {MIN_SECRET_BYTES} bytes")

    def verify(data: bytes, signature: bytes) -> bool:
        return hmac.compare_digest(hmac.digest(secret, data, "sha256"), signature)

    return Verifier("hmac-sha256", verify)


def load_ed25519_private_key(text: str | bytes) -> Ed25519PrivateKey:
    """PEM (PKCS #8) or base64 of the 32-byte raw private key."""
    raw = text.encode("ascii") if isinstance(text, str) else text
    if b"-----BEGIN" in raw:
        key = serialization.load_pem_private_key(raw, password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"the PEM key is a {type(key).__name__}, not an Ed25519 key")
        return key
    return Ed25519PrivateKey.from_private_bytes(decode_base64(raw.decode("ascii")))


def load_ed25519_public_key(text: str | bytes) -> Ed25519PublicKey:
    """PEM (SubjectPublicKeyInfo) or base64 of the 32-byte raw public key."""
    raw = text.encode("ascii") if isinstance(text, str) else text
    if b"-----BEGIN" in raw:
        key = serialization.load_pem_public_key(raw)
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError(f"the PEM key is a {type(key).__name__}, not an Ed25519 key")
        return key
    return Ed25519PublicKey.from_public_bytes(decode_base64(raw.decode("ascii")))


def ed25519_signer(key: Ed25519PrivateKey, key_id: str | None = None) -> Signer:
    return Signer("ed25519", key.sign, key_id)


def ed25519_verifier(key: Ed25519PublicKey) -> Verifier:
    def verify(data: bytes, signature: bytes) -> bool:
        try:
            key.verify(signature, data)
        except InvalidSignature:
            return False
        return True

    return Verifier("ed25519", verify)


def _secret(text: str, encoding: str) -> bytes:
    return text.encode("utf-8") if encoding == "utf-8" else decode_base64(text)


def signer_from_setting(
    context: StepContext,
    setting: str,
    algorithm: Algorithm,
    secret_encoding: str = "base64",
    key_id: str | None = None,
) -> Signer:
    """The signer whose key is in setting ``setting``; ``StepConfigError`` if unusable."""
    text = context.setting(setting)
    try:
        if algorithm == "hmac-sha256":
            return hmac_signer(_secret(text, secret_encoding), key_id)
        return ed25519_signer(load_ed25519_private_key(text), key_id)
    except (ValueError, TypeError, binascii.Error) as exc:
        raise StepConfigError(f"setting {setting!r}: not a usable {algorithm} key: {exc}") from None


def verifier_from_setting(
    context: StepContext, setting: str, algorithm: Algorithm, secret_encoding: str = "base64"
) -> Verifier:
    """The verifier whose key is in setting ``setting``; ``StepConfigError`` if unusable."""
    text = context.setting(setting)
    try:
        if algorithm == "hmac-sha256":
            return hmac_verifier(_secret(text, secret_encoding))
        return ed25519_verifier(load_ed25519_public_key(text))
    except (ValueError, TypeError, binascii.Error) as exc:
        raise StepConfigError(f"setting {setting!r}: not a usable {algorithm} key: {exc}") from None


@dataclass(frozen=True, slots=True)
class KeyRing:
    """Verifiers by key id; ``default`` for messages that name no key id."""

    default: Verifier | None
    by_id: Mapping[str, Verifier]

    def select(self, key_id: Any) -> Verifier:
        if key_id is None or key_id == "":
            if self.default is None:
                why = "the message names no key id and there is no default key (key_setting)"
                raise StepFailed("UnknownKey", why)
            return self.default
        verifier = self.by_id.get(str(key_id))
        if verifier is None:
            known = ", ".join(sorted(self.by_id)) or "none"
            raise StepFailed("UnknownKey", f"key id {key_id!r} is not configured (known: {known})")
        return verifier


def _signature(value: Any, what: str) -> bytes:
    if not isinstance(value, str | bytes):
        raise StepFailed("BadSignature", f"{what} is not base64 text")
    try:
        return decode_base64(value if isinstance(value, str) else value.decode("ascii"))
    except (ValueError, binascii.Error):
        raise StepFailed("BadSignature", f"{what} is not base64 text") from None


def _canonical(message: Message, fields: Sequence[str]) -> bytes:
    try:
        return canonical_bytes(message, fields)
    except TypeError as exc:
        raise StepFailed("UnsupportedValue", str(exc)) from None


# ---------------------------------------------------------------------- options


class _KeyOptions(StepOptions):
    algorithm: Algorithm = "hmac-sha256"
    secret_encoding: Literal["base64", "utf-8"] = "base64"
    """How the setting holds an HMAC secret (Ed25519 keys: PEM or base64 raw, detected)."""


class _CoverageOptions(_KeyOptions):
    fields: tuple[MessageField, ...] = DEFAULT_FIELDS
    """Message fields covered besides the body (always covered)."""
    properties: tuple[str, ...] = ()
    """Application properties covered (exact names); a missing one is covered as absent."""

    reserved_prefix: ClassVar[str] = "repl-sig"

    @field_validator("properties")
    @classmethod
    def _not_own_output(cls, properties: tuple[str, ...]) -> tuple[str, ...]:
        prefix = cls.reserved_prefix
        for name in properties:
            if name.startswith(prefix):
                raise ValueError(f"cannot cover {name!r}: the step writes {prefix}* itself")
        return properties


class _VerifyKeys(_KeyOptions):
    key_setting: str | None = None
    """Setting with the key for messages that name no key id."""
    keys: dict[str, str] = Field(default_factory=dict)
    """Key id -> setting with that key (rotation: list the old and the new)."""

    @model_validator(mode="after")
    def _some_key(self) -> _VerifyKeys:
        if not self.key_setting and not self.keys:
            raise ValueError("needs key_setting or keys")
        return self

    def key_ring(self, context: StepContext) -> KeyRing:
        def load(setting: str) -> Verifier:
            return verifier_from_setting(context, setting, self.algorithm, self.secret_encoding)

        default = load(self.key_setting) if self.key_setting else None
        return KeyRing(default, {kid: load(setting) for kid, setting in self.keys.items()})


class SignOptions(_CoverageOptions):
    key_setting: str = Field(min_length=1)
    """Setting with the HMAC secret or the Ed25519 private key."""
    key_id: str | None = Field(default=None, min_length=1)
    """Written to ``repl-sig-key-id`` so verifiers pick the key."""


class VerifyOptions(_CoverageOptions, _VerifyKeys):
    remove: bool = False
    """Remove the ``repl-sig*`` properties from messages that verify."""


# ---------------------------------------------------------------------- sign / verify

SIGNATURE = "repl-sig"
SIGNATURE_ALG = "repl-sig-alg"
SIGNATURE_FIELDS = "repl-sig-fields"
SIGNATURE_KEY_ID = "repl-sig-key-id"
_SIGNATURE_PROPERTIES = (SIGNATURE, SIGNATURE_ALG, SIGNATURE_FIELDS, SIGNATURE_KEY_ID)


@step("sign", SignOptions)
def build_sign(options: SignOptions, context: StepContext) -> Callable[[Message], list[Message]]:
    """Signs the body and chosen metadata (HMAC-SHA256 or Ed25519) into ``repl-sig``."""
    signer = signer_from_setting(
        context, options.key_setting, options.algorithm, options.secret_encoding, options.key_id
    )
    fields = covered_fields(options.fields, options.properties)
    listed = fields_text(fields)

    def sign(message: Message) -> list[Message]:
        signature = signer.sign(_canonical(message, fields))
        props = dict(message.application_properties)
        props.pop(SIGNATURE_KEY_ID, None)
        props[SIGNATURE] = encode_base64(signature)
        props[SIGNATURE_ALG] = signer.name
        props[SIGNATURE_FIELDS] = listed
        if signer.key_id is not None:
            props[SIGNATURE_KEY_ID] = signer.key_id
        return [message.copy(application_properties=props)]

    return sign


@step("verify", VerifyOptions)
def build_verify(
    options: VerifyOptions, context: StepContext
) -> Callable[[Message], list[Message]]:
    """Checks ``repl-sig`` over the body and the configured metadata; fails on a mismatch."""
    ring = options.key_ring(context)
    fields = covered_fields(options.fields, options.properties)
    expected_alg = ALGORITHM_NAMES[options.algorithm]

    def verify(message: Message) -> list[Message]:
        props = message.application_properties
        if props.get(SIGNATURE) is None:
            raise StepFailed("NotSigned", f"the message has no {SIGNATURE} property")
        alg = props.get(SIGNATURE_ALG)
        if alg is not None and alg != expected_alg:
            raise StepFailed("BadSignature", f"signed with {alg!r}, expected {expected_alg}")
        listed = props.get(SIGNATURE_FIELDS)
        if listed is not None:
            try:
                signed_fields = parse_fields_text(listed)
            except ValueError as exc:
                raise StepFailed("BadSignature", f"{SIGNATURE_FIELDS}: {exc}") from None
            if signed_fields != fields:
                raise StepFailed(
                    "BadSignature",
                    f"the signature covers {list(signed_fields)}, expected {list(fields)}",
                )
        verifier = ring.select(props.get(SIGNATURE_KEY_ID))
        signature = _signature(props[SIGNATURE], SIGNATURE)
        if not verifier.verify(_canonical(message, fields), signature):
            raise StepFailed("BadSignature", "the signature does not match the message")
        if not options.remove:
            return [message]
        kept = {k: v for k, v in props.items() if k not in _SIGNATURE_PROPERTIES}
        return [message.copy(application_properties=kept)]

    return verify


# ---------------------------------------------------------------------- attestation

ATTEST_HASH = "repl-attest-hash"
ATTEST_SIGNATURE = "repl-attest-sig"
ATTEST_ALG = "repl-attest-alg"
ATTEST_FIELDS = "repl-attest-fields"
ATTEST_TIME = "repl-attest-time"
ATTEST_CHANNEL = "repl-attest-channel"
ATTEST_KEY_ID = "repl-attest-key-id"
_ATTEST_PROPERTIES: tuple[str, ...] = (ATTEST_HASH, ATTEST_SIGNATURE, ATTEST_ALG, ATTEST_FIELDS)
_ATTEST_PROPERTIES += (ATTEST_TIME, ATTEST_CHANNEL, ATTEST_KEY_ID)


class AttestOptions(_CoverageOptions):
    algorithm: Algorithm = "ed25519"
    """Ed25519 by default: third parties verify with the public key alone."""
    key_setting: str = Field(min_length=1)
    key_id: str | None = Field(default=None, min_length=1)
    channel: str | None = Field(default=None, min_length=1)
    """What the message came through (e.g. ``namespace/queue``): ``repl-attest-channel``."""

    reserved_prefix: ClassVar[str] = "repl-attest-"


class VerifyAttestOptions(_VerifyKeys):
    algorithm: Algorithm = "ed25519"
    required_fields: tuple[str, ...] = ("body", "message-id")
    """Fields the attestation must cover (``property:NAME`` for properties)."""

    @field_validator("required_fields")
    @classmethod
    def _known_fields(cls, fields: tuple[str, ...]) -> tuple[str, ...]:
        parse_fields_text(fields_text(fields))  # ValueError names an unknown one
        return fields


@dataclass(frozen=True, slots=True)
class Attestation:
    """What a valid attestation says."""

    fields: tuple[str, ...]
    digest: bytes
    algorithm: str
    time: str | None
    channel: str | None
    key_id: str | None


@step("attest", AttestOptions)
def build_attest(
    options: AttestOptions, context: StepContext
) -> Callable[[Message], list[Message]]:
    """Attaches a SHA-256 hash of body and metadata, signed, for third parties to check."""
    signer = signer_from_setting(
        context, options.key_setting, options.algorithm, options.secret_encoding, options.key_id
    )
    extra = [ATTEST_TIME]
    if options.channel is not None:
        extra.append(ATTEST_CHANNEL)
    if options.key_id is not None:
        extra.append(ATTEST_KEY_ID)
    fields = covered_fields(options.fields, (*options.properties, *extra))
    listed = fields_text(fields)

    def attest(message: Message) -> list[Message]:
        props = {
            k: v for k, v in message.application_properties.items() if k not in _ATTEST_PROPERTIES
        }
        props[ATTEST_TIME] = iso_utc(context.now())
        if options.channel is not None:
            props[ATTEST_CHANNEL] = options.channel
        if options.key_id is not None:
            props[ATTEST_KEY_ID] = options.key_id
        covered = message.copy(application_properties=props)
        digest = hashlib.sha256(_canonical(covered, fields)).digest()
        return [
            covered.copy(
                application_properties={
                    **props,
                    ATTEST_FIELDS: listed,
                    ATTEST_HASH: encode_base64(digest),
                    ATTEST_ALG: signer.name,
                    ATTEST_SIGNATURE: encode_base64(signer.sign(digest)),
                }
            )
        ]

    return attest


def verify_attestation(
    message: Message,
    keys: Verifier | Mapping[str, Verifier] | KeyRing,
    *,
    required_fields: Iterable[str] = ("body",),
) -> Attestation:
    """Checks the attestation ``attest`` wrote on ``message``; returns what it says.

    ``keys``: one verifier for any key id, or verifiers by ``repl-attest-key-id`` (``""``
    for messages without one). Raises ``StepFailed``: ``NotAttested`` (properties missing),
    ``BadAttestation`` (malformed), ``AttestationIncomplete`` (a required field not covered),
    ``HashMismatch`` (content changed), ``UnknownKey``, ``BadSignature``.
    """
    props = message.application_properties
    required = (ATTEST_FIELDS, ATTEST_HASH, ATTEST_ALG, ATTEST_SIGNATURE)
    missing = [p for p in required if props.get(p) is None]
    if missing:
        raise StepFailed("NotAttested", f"missing {', '.join(missing)}")
    try:
        fields = parse_fields_text(props[ATTEST_FIELDS])
        claimed = decode_base64(str(props[ATTEST_HASH]))
    except (ValueError, binascii.Error) as exc:
        raise StepFailed("BadAttestation", str(exc)) from None
    absent = [f for f in required_fields if f not in fields]
    if absent:
        raise StepFailed("AttestationIncomplete", f"does not cover {', '.join(absent)}")
    digest = hashlib.sha256(_canonical(message, fields)).digest()
    if not hmac.compare_digest(digest, claimed):
        raise StepFailed("HashMismatch", "the message differs from what was attested")
    key_id = props.get(ATTEST_KEY_ID)
    if isinstance(keys, Verifier):
        verifier = keys
    elif isinstance(keys, KeyRing):
        verifier = keys.select(key_id)
    else:
        found = keys.get("" if key_id is None else str(key_id))
        if found is None:
            if key_id is None or key_id == "":
                why = "the message names no key id and there is no default key ('')"
            else:
                known = ", ".join(sorted(keys)) or "none"
                why = f"key id {key_id!r} is not configured (known: {known})"
            raise StepFailed("UnknownKey", why)
        verifier = found
    if props[ATTEST_ALG] != verifier.name:
        why = f"attested with {props[ATTEST_ALG]!r}, expected {verifier.name}"
        raise StepFailed("BadSignature", why)
    if not verifier.verify(digest, _signature(props[ATTEST_SIGNATURE], ATTEST_SIGNATURE)):
        raise StepFailed("BadSignature", "the attestation signature does not match")
    return Attestation(
        fields=fields,
        digest=digest,
        algorithm=verifier.name,
        time=None if props.get(ATTEST_TIME) is None else str(props[ATTEST_TIME]),
        channel=None if props.get(ATTEST_CHANNEL) is None else str(props[ATTEST_CHANNEL]),
        key_id=None if key_id is None else str(key_id),
    )


@step("verify-attest", VerifyAttestOptions)
def build_verify_attest(
    options: VerifyAttestOptions, context: StepContext
) -> Callable[[Message], list[Message]]:
    """Checks an attestation made by ``attest``; fails on a mismatch."""
    ring = options.key_ring(context)

    def verify(message: Message) -> list[Message]:
        verify_attestation(message, ring, required_fields=options.required_fields)
        return [message]

    return verify
