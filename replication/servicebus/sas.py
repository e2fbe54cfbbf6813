"""Shared access signatures: minted for our own connections (the CBS put-token) and checked
by the broker (``broker.auth``), one signing for both.

As in every Service Bus SDK, the signed string is ``quote_plus(uri) + "\\n" + expiry`` and
the HMAC-SHA256 key is the key's UTF-8 bytes (not its base64 decoding).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from urllib.parse import quote_plus

TOKEN_TYPE = "SharedAccessSignature"
DEFAULT_LIFETIME = 3600
"""Seconds a minted token lasts (what the SDKs use)."""


def generate_sas_token(uri: str, key_name: str, key: str, expiry_unix: int) -> str:
    """``SharedAccessSignature sr=...&sig=...&se=...&skn=...`` for ``uri`` until ``expiry_unix``."""
    encoded_uri = quote_plus(uri)
    expiry = str(int(expiry_unix))
    signature = sign(key, f"{encoded_uri}\n{expiry}")
    return (
        f"{TOKEN_TYPE} sr={encoded_uri}&sig={quote_plus(base64.b64encode(signature).decode())}"
        f"&se={expiry}&skn={quote_plus(key_name)}"
    )


def sign(key: str, text: str) -> bytes:
    """HMAC-SHA256 of ``text`` with the key's UTF-8 bytes."""
    return hmac.new(key.encode("utf-8"), text.encode("utf-8"), hashlib.sha256).digest()


def token_expiry(token: str) -> int | None:
    """The ``se=`` of a SharedAccessSignature (Unix seconds), None when it has none."""
    for part in token.partition(" ")[2].split("&"):
        name, _, value = part.partition("=")
        if name.strip().lower() == "se" and value.strip().isdigit():
            return int(value)
    return None


def mint(
    uri: str,
    key_name: str,
    key: str,
    lifetime: float = DEFAULT_LIFETIME,
    now: float | None = None,
) -> tuple[str, int]:
    """A fresh token for ``uri`` and its expiry (Unix seconds; ``now``: the time it is
    minted at, default the real time)."""
    expiry = int((time.time() if now is None else now) + lifetime)
    return generate_sas_token(uri, key_name, key, expiry), expiry
