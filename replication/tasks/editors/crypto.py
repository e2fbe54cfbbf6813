"""``encrypt`` / ``decrypt``: the body sealed with AES-256-GCM, keys named by id for rotation.

Keys are 256-bit, held in settings as base64 (standard or URL-safe, padding optional). The
``encrypt`` step names its key (``key_id``) in the application property ``repl-key-id`` and
writes ``repl-enc-alg: A256GCM``; ``decrypt`` maps key ids to settings (``keys``), so while a
key rotates it lists both the old and the new one.

Encrypted body layout (version 1)::

    offset  size  content
    0       1     version, 0x01
    1       12    nonce (random for every message: os.urandom)
    13      n     ciphertext (n = length of the plain body)
    13 + n  16    GCM authentication tag

Associated data (authenticated, not stored; rebuilt from the message when decrypting)::

    b"repl-enc-v1"
    u8       version (0x01, the body's first byte)
    u16 BE   length of the key id (UTF-8), then the key id
    u8       1 if the message has a message-id, else 0
    u32 BE   length of the message-id (UTF-8), then the message-id   (only when present)

so a body copied onto another message (another message-id), relabelled with another key id,
or altered in any byte fails to decrypt (``StepFailed("DecryptionFailed")``), exactly like a
wrong key. Other properties, content type included, are left as they are (sign them with the
``sign`` step if they matter); ``decrypt`` removes ``repl-key-id`` and ``repl-enc-alg``.
A message-id assigned after encryption makes the body undecryptable.
"""

from __future__ import annotations

import binascii
import os
import struct
from collections.abc import Callable
from typing import Literal

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pydantic import Field

from ...messages import Message
from ..steps import StepConfigError, StepContext, StepFailed, StepOptions, step
from .signing import decode_base64

KEY_ID = "repl-key-id"
ALGORITHM = "repl-enc-alg"
ALGORITHM_NAME = "A256GCM"
VERSION = 1
NONCE_SIZE = 12
TAG_SIZE = 16
KEY_SIZE = 32
OVERHEAD = 1 + NONCE_SIZE + TAG_SIZE
_AD_PREFIX = b"repl-enc-v1"


class EncryptOptions(StepOptions):
    key_setting: str = Field(min_length=1)
    """Setting holding the base64 256-bit key."""
    key_id: str = Field(min_length=1, max_length=256)
    """Written to ``repl-key-id``; ``decrypt`` finds the key by it."""


class DecryptOptions(StepOptions):
    keys: dict[str, str] = Field(min_length=1)
    """Key id -> setting holding that key (base64, 256-bit)."""
    unencrypted: Literal["fail", "pass"] = "fail"
    """A message without ``repl-key-id``: ``StepFailed("NotEncrypted")``, or pass it on."""


def load_key(context: StepContext, setting: str) -> bytes:
    """The 32-byte AES key in ``setting``; ``StepConfigError`` if missing or malformed."""
    try:
        key = decode_base64(context.setting(setting))
    except (ValueError, binascii.Error) as exc:
        raise StepConfigError(f"setting {setting!r}: not base64: {exc}") from None
    if len(key) != KEY_SIZE:
        raise StepConfigError(
            f"setting {setting!r}: an AES-256 key is {KEY_SIZE} bytes, got {len(key)}"
        )
    return key


def associated_data(key_id: str, message_id: str | None, version: int = VERSION) -> bytes:
    """What the ciphertext is bound to (see the module docstring)."""
    kid = key_id.encode("utf-8")
    parts = [_AD_PREFIX, struct.pack(">BH", version, len(kid)), kid]
    if message_id is None:
        parts.append(b"\x00")
    else:
        mid = message_id.encode("utf-8")
        parts += [struct.pack(">BI", 1, len(mid)), mid]
    return b"".join(parts)


def seal(key: bytes, key_id: str, message_id: str | None, plain: bytes) -> bytes:
    """The encrypted body: version, nonce, ciphertext and tag."""
    nonce = os.urandom(NONCE_SIZE)
    sealed = AESGCM(key).encrypt(nonce, plain, associated_data(key_id, message_id))
    return bytes([VERSION]) + nonce + sealed


def open_sealed(key: bytes, key_id: str, message_id: str | None, body: bytes) -> bytes:
    """The plain body; ``StepFailed`` when the layout is wrong or authentication fails."""
    if len(body) < OVERHEAD:
        why = f"{len(body)} bytes is shorter than the {OVERHEAD}-byte minimum"
        raise StepFailed("BadCiphertext", why)
    if body[0] != VERSION:
        raise StepFailed("BadCiphertext", f"unknown layout version {body[0]}")
    nonce = body[1 : 1 + NONCE_SIZE]
    try:
        return AESGCM(key).decrypt(
            nonce, body[1 + NONCE_SIZE :], associated_data(key_id, message_id, body[0])
        )
    except InvalidTag:
        raise StepFailed(
            "DecryptionFailed",
            f"key {key_id!r} does not open this body (wrong key, altered body, or a body "
            "moved from another message)",
        ) from None


@step("encrypt", EncryptOptions)
def build_encrypt(
    options: EncryptOptions, context: StepContext
) -> Callable[[Message], list[Message]]:
    """Encrypts the body with AES-256-GCM; the key id goes to ``repl-key-id``."""
    key = load_key(context, options.key_setting)
    key_id = options.key_id

    def encrypt(message: Message) -> list[Message]:
        if message.application_properties.get(KEY_ID) is not None:
            raise StepFailed(
                "AlreadyEncrypted",
                f"the body is already encrypted with key "
                f"{message.application_properties[KEY_ID]!r}",
            )
        props = dict(message.application_properties)
        props[KEY_ID] = key_id
        props[ALGORITHM] = ALGORITHM_NAME
        body = seal(key, key_id, message.message_id, message.body)
        return [message.copy(body=body, application_properties=props)]

    return encrypt


@step("decrypt", DecryptOptions)
def build_decrypt(
    options: DecryptOptions, context: StepContext
) -> Callable[[Message], list[Message]]:
    """Decrypts a body ``encrypt`` sealed, with the key its ``repl-key-id`` names."""
    keys = {key_id: load_key(context, setting) for key_id, setting in options.keys.items()}

    def decrypt(message: Message) -> list[Message]:
        key_id = message.application_properties.get(KEY_ID)
        if key_id is None:
            if options.unencrypted == "pass":
                return [message]
            raise StepFailed("NotEncrypted", f"the message has no {KEY_ID} property")
        algorithm = message.application_properties.get(ALGORITHM, ALGORITHM_NAME)
        if algorithm != ALGORITHM_NAME:
            why = f"{ALGORITHM} is {algorithm!r}, not {ALGORITHM_NAME}"
            raise StepFailed("BadCiphertext", why)
        key = keys.get(str(key_id))
        if key is None:
            known = ", ".join(sorted(keys))
            raise StepFailed("UnknownKey", f"key id {key_id!r} is not configured (known: {known})")
        plain = open_sealed(key, str(key_id), message.message_id, message.body)
        props = {
            k: v for k, v in message.application_properties.items() if k not in (KEY_ID, ALGORITHM)
        }
        return [message.copy(body=plain, application_properties=props)]

    return decrypt
