"""The filter, dedupe, encrypt/decrypt, sign/verify, attest and chain/verify-chain steps,
each built with ``build_step`` and run with ``run_chain``."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import struct
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from replication.messages import Message
from replication.tasks.editors import chain as chain_module
from replication.tasks.editors import crypto, signing
from replication.tasks.editors.chain import ChainState, chain_key
from replication.tasks.registry import build_step
from replication.tasks.steps import (
    BoundStep,
    Outcome,
    StepConfigError,
    StepContext,
    StepFailed,
    run_chain,
)

T0 = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


AES_1, AES_2 = os.urandom(32), os.urandom(32)
HMAC_1, HMAC_2 = os.urandom(32), os.urandom(32)
ED_1, ED_2 = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()


def pem_private(key: Ed25519PrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def pem_public(key: Ed25519PrivateKey) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


def raw_public(key: Ed25519PrivateKey) -> str:
    return b64(
        key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )


def raw_private(key: Ed25519PrivateKey) -> str:
    return b64(
        key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
    )


SETTINGS = {
    "AES_1": b64(AES_1),
    "AES_2": b64(AES_2),
    "HMAC_1": b64(HMAC_1),
    "HMAC_2": b64(HMAC_2),
    "ED_1_PRIVATE": pem_private(ED_1),
    "ED_1_PUBLIC": pem_public(ED_1),
    "ED_1_PRIVATE_RAW": raw_private(ED_1),
    "ED_1_PUBLIC_RAW": raw_public(ED_1),
    "ED_2_PRIVATE": pem_private(ED_2),
    "ED_2_PUBLIC": pem_public(ED_2),
    "SHORT_AES": b64(os.urandom(16)),
    "SHORT_SECRET": b64(os.urandom(15)),
    "NOT_BASE64": "this is not base64!",
    "TEXT_SECRET": "a shared secret of some length",
}


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def context(clock: Clock) -> StepContext:
    return StepContext(settings=dict(SETTINGS), now=clock)


def make(name: str, context: StepContext, **options: Any) -> BoundStep:
    return build_step(name, options, context)


def msg(body: bytes | str = b'{"order": {"id": "o-1", "total": 12}}', **fields: Any) -> Message:
    fields.setdefault("message_id", "m-1")
    if isinstance(body, str):
        body = body.encode()
    return Message(body=body, **fields)


def run1(message: Message, *steps: BoundStep) -> list[Message]:
    """Outputs of a chain that must neither fail nor dead-letter."""
    outcome = run_chain(message, list(steps))
    assert outcome.dead_letter is None, outcome.dead_letter
    assert not outcome.dropped, outcome.dropped
    return outcome.outputs


def failure(message: Message, *steps: BoundStep) -> tuple[str, str]:
    outcome = run_chain(message, list(steps))
    assert outcome.dead_letter is not None, outcome
    assert outcome.outputs == []
    return outcome.dead_letter


# ---------------------------------------------------------------------- filter


def test_filter_keeps_matching_messages_on_properties(context: StepContext) -> None:
    step = make("filter", context, condition="sys.Label = 'order' AND priority > 2")
    keep = msg(subject="order", application_properties={"priority": 3})
    assert run1(keep, step) == [keep]
    assert run1(keep.copy(application_properties={"priority": 1}), step) == []
    assert run1(keep.copy(subject="invoice"), step) == []
    assert run1(keep.copy(application_properties={}), step) == []  # unknown: filtered


def test_filter_on_body_fields(context: StepContext) -> None:
    step = make("filter", context, condition="body.order.total >= @min", parameters={"min": 10})
    assert len(run1(msg(), step)) == 1
    assert run1(msg('{"order": {"total": 9}}'), step) == []
    assert run1(msg('{"other": 1}'), step) == []
    assert run1(msg("plain text, not JSON"), step) == []
    assert run1(msg(b"\x00\x01\x02"), step) == []


def test_filter_on_array_elements(context: StepContext) -> None:
    step = make("filter", context, condition="body.items.1.sku LIKE 'B%'")
    assert len(run1(msg('{"items": [{"sku": "A1"}, {"sku": "B2"}]}'), step)) == 1
    assert run1(msg('{"items": [{"sku": "A1"}]}'), step) == []


def test_filter_refuses_bad_conditions_when_built(context: StepContext) -> None:
    with pytest.raises(StepConfigError, match="expected a system property name"):
        make("filter", context, condition="sys.Nope = 1")
    with pytest.raises(StepConfigError, match="expected a parameter that is given a value"):
        make("filter", context, condition="a = @p")
    with pytest.raises(StepConfigError, match="parameter 'p': list is not a string"):
        make("filter", context, condition="a = @p", parameters={"p": [1, 2]})
    with pytest.raises(StepConfigError, match=r"^step 'filter': condition: Field required"):
        make("filter", context)


def test_filter_evaluation_errors_take_the_error_path(context: StepContext) -> None:
    message = msg(application_properties={"n": 1})
    reason, description = failure(message, make("filter", context, condition="n / 0 = 1"))
    assert reason == "filter: ConditionFailed"
    assert "division by zero" in description
    dropping = make("filter", context, condition="n / 0 = 1", on_error="drop")
    outcome = run_chain(message, [dropping])
    assert outcome.outputs == [] and outcome.dead_letter is None
    assert outcome.dropped and "ConditionFailed" in outcome.dropped[0][1]


# ---------------------------------------------------------------------- dedupe


def test_dedupe_drops_repeats_within_the_window(context: StepContext, clock: Clock) -> None:
    step = make("dedupe", context, window="PT1M")
    first = msg(message_id="a", sequence_number=1)
    assert run1(first, step) == [first]
    clock.advance(seconds=30)
    assert run1(msg(message_id="a", sequence_number=2), step) == []
    assert len(run1(msg(message_id="b", sequence_number=3), step)) == 1
    clock.advance(seconds=29)
    assert run1(msg(message_id="a", sequence_number=4), step) == []  # repeats don't extend
    clock.advance(seconds=1)  # 60 s after the first "a"
    assert len(run1(msg(message_id="a", sequence_number=5), step)) == 1
    assert run1(msg(message_id="a", sequence_number=6), step) == []


def test_dedupe_memory_is_bounded(context: StepContext, clock: Clock) -> None:
    step = make("dedupe", context, max_entries=3, window=3600)
    seen = step.run.seen  # type: ignore[attr-defined]
    for n in range(10):
        assert len(run1(msg(message_id=f"id-{n}", sequence_number=n), step)) == 1
        clock.advance(seconds=1)
        assert len(seen) <= 3
    assert len(seen) == 3
    assert run1(msg(message_id="id-9", sequence_number=100), step) == []  # still remembered
    assert len(run1(msg(message_id="id-0", sequence_number=101), step)) == 1  # forgotten


def test_dedupe_expired_keys_are_purged(context: StepContext, clock: Clock) -> None:
    step = make("dedupe", context, window=10)
    for n in range(5):
        run1(msg(message_id=f"id-{n}", sequence_number=n), step)
    assert len(step.run.seen) == 5  # type: ignore[attr-defined]
    clock.advance(seconds=11)
    run1(msg(message_id="new", sequence_number=99), step)
    assert len(step.run.seen) == 1  # type: ignore[attr-defined]


def test_dedupe_on_a_body_field_or_expression(context: StepContext) -> None:
    step = make("dedupe", context, key="tenant + ':' + body.order.id")
    a = msg('{"order": {"id": "o-1"}}', message_id="1", application_properties={"tenant": "t"})
    assert len(run1(a, step)) == 1
    assert run1(a.copy(message_id="2"), step) == []  # same key, different message id
    assert len(run1(a.copy(application_properties={"tenant": "u"}), step)) == 1
    assert len(run1(a.copy(body=b'{"order": {"id": "o-2"}}'), step)) == 1


def test_dedupe_keys_of_different_types_differ(context: StepContext) -> None:
    step = make("dedupe", context, key="k")
    assert len(run1(msg(application_properties={"k": 1}), step)) == 1
    assert len(run1(msg(application_properties={"k": "1"}), step)) == 1
    assert len(run1(msg(application_properties={"k": True}), step)) == 1
    assert run1(msg(application_properties={"k": 1}), step) == []


def test_dedupe_missing_keys(context: StepContext) -> None:
    keep = make("dedupe", context, key="body.id")
    assert len(run1(msg("not json"), keep)) == 1
    assert len(run1(msg("not json"), keep)) == 1  # never deduplicated
    fail = make("dedupe", context, key="body.id", missing_key="fail")
    assert failure(msg("not json"), fail)[0] == "dedupe: MissingKey"
    assert len(run1(msg(message_id=None), make("dedupe", context))) == 1


def test_dedupe_lets_a_redelivery_through(context: StepContext) -> None:
    step = make("dedupe", context)
    first = msg(message_id="a", sequence_number=7, delivery_count=1)
    assert len(run1(first, step)) == 1
    redelivered = first.copy(delivery_count=2)
    assert len(run1(redelivered, step)) == 1  # the send failed: it must go again
    assert run1(msg(message_id="a", sequence_number=8), step) == []  # a real duplicate
    unsequenced = make("dedupe", context)
    assert len(run1(msg(message_id="x"), unsequenced)) == 1
    assert run1(msg(message_id="x"), unsequenced) == []


def test_dedupe_state_is_per_built_step(context: StepContext) -> None:
    one, two = make("dedupe", context), make("dedupe", context)
    assert len(run1(msg(sequence_number=1), one)) == 1
    assert len(run1(msg(sequence_number=2), two)) == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"window": 0}, "window must be positive"),
        ({"window": "-PT1M"}, "window must be positive"),
        ({"max_entries": 0}, "max_entries: Input should be greater than 0"),
        ({"key": "a = 1"}, "expected an arithmetic operator or end of input but found '='"),
        ({"key": ""}, "key: String should have at least 1 character"),
    ],
)
def test_dedupe_bad_options(context: StepContext, options: dict[str, Any], message: str) -> None:
    with pytest.raises(StepConfigError, match=re.escape(message)):
        make("dedupe", context, **options)


# ---------------------------------------------------------------------- encrypt / decrypt


def test_encrypt_then_decrypt(context: StepContext) -> None:
    encrypt = make("encrypt", context, key_setting="AES_1", key_id="k1")
    decrypt = make("decrypt", context, keys={"k1": "AES_1"})
    message = msg(application_properties={"keep": "me"}, content_type="application/json")
    [sealed] = run1(message, encrypt)
    assert sealed.body != message.body
    assert sealed.application_properties == {
        "keep": "me",
        "repl-key-id": "k1",
        "repl-enc-alg": "A256GCM",
    }
    assert sealed.content_type == "application/json" and sealed.message_id == "m-1"
    [opened] = run1(sealed, decrypt)
    assert opened.body == message.body
    assert opened.application_properties == {"keep": "me"}
    assert message.application_properties == {"keep": "me"}  # the input is untouched


def test_the_encrypted_layout(context: StepContext) -> None:
    encrypt = make("encrypt", context, key_setting="AES_1", key_id="k1")
    plain = b"hello"
    [a] = run1(msg(plain), encrypt)
    [b] = run1(msg(plain), encrypt)
    assert len(a.body) == 1 + 12 + len(plain) + 16
    assert a.body[0] == 1
    assert a.body[1:13] != b.body[1:13]  # a fresh nonce each time
    # what a third party would do with the documented layout and associated data
    ad = b"repl-enc-v1" + bytes([1]) + struct.pack(">H", 2) + b"k1"
    ad += b"\x01" + struct.pack(">I", 3) + b"m-1"
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    assert AESGCM(AES_1).decrypt(a.body[1:13], a.body[13:], ad) == plain


def test_messages_without_a_message_id_are_bound_to_its_absence(context: StepContext) -> None:
    encrypt = make("encrypt", context, key_setting="AES_1", key_id="k1")
    decrypt = make("decrypt", context, keys={"k1": "AES_1"})
    [sealed] = run1(msg(b"x", message_id=None), encrypt)
    assert run1(sealed, decrypt)[0].body == b"x"
    assert failure(sealed.copy(message_id=""), decrypt)[0] == "decrypt: DecryptionFailed"


def test_wrong_key_fails(context: StepContext) -> None:
    [sealed] = run1(msg(), make("encrypt", context, key_setting="AES_1", key_id="k1"))
    reason, description = failure(sealed, make("decrypt", context, keys={"k1": "AES_2"}))
    assert reason == "decrypt: DecryptionFailed"
    assert "wrong key" in description


@pytest.mark.parametrize("index", [0, 1, 12, 13, -1])
def test_tampered_body_fails(context: StepContext, index: int) -> None:
    [sealed] = run1(msg(), make("encrypt", context, key_setting="AES_1", key_id="k1"))
    body = bytearray(sealed.body)
    body[index] ^= 0x01
    reason, _ = failure(
        sealed.copy(body=bytes(body)), make("decrypt", context, keys={"k1": "AES_1"})
    )
    assert reason in ("decrypt: DecryptionFailed", "decrypt: BadCiphertext")


def test_a_body_moved_to_another_message_fails(context: StepContext) -> None:
    [sealed] = run1(msg(), make("encrypt", context, key_setting="AES_1", key_id="k1"))
    decrypt = make("decrypt", context, keys={"k1": "AES_1", "k2": "AES_1"})
    assert failure(sealed.copy(message_id="m-2"), decrypt)[0] == "decrypt: DecryptionFailed"
    relabelled = dict(sealed.application_properties, **{"repl-key-id": "k2"})
    assert failure(sealed.copy(application_properties=relabelled), decrypt)[0] == (
        "decrypt: DecryptionFailed"
    )


def test_decrypt_errors(context: StepContext) -> None:
    decrypt = make("decrypt", context, keys={"k1": "AES_1"})
    assert failure(msg(), decrypt)[0] == "decrypt: NotEncrypted"
    assert run1(msg(), make("decrypt", context, keys={"k1": "AES_1"}, unencrypted="pass"))
    [sealed] = run1(msg(), make("encrypt", context, key_setting="AES_1", key_id="k9"))
    reason, description = failure(sealed, decrypt)
    assert reason == "decrypt: UnknownKey" and "k9" in description
    short = msg(b"\x01short", application_properties={"repl-key-id": "k1"})
    assert failure(short, decrypt)[0] == "decrypt: BadCiphertext"
    other = dict(sealed.application_properties, **{"repl-enc-alg": "A128CBC"})
    assert failure(sealed.copy(application_properties=other), decrypt)[0] == (
        "decrypt: BadCiphertext"
    )


def test_encrypting_twice_is_refused(context: StepContext) -> None:
    encrypt = make("encrypt", context, key_setting="AES_1", key_id="k1")
    assert failure(msg(), encrypt, encrypt)[0] == "encrypt: AlreadyEncrypted"


def test_key_rotation(context: StepContext) -> None:
    old = make("encrypt", context, key_setting="AES_1", key_id="2026-01")
    new = make("encrypt", context, key_setting="AES_2", key_id="2026-02")
    decrypt = make("decrypt", context, keys={"2026-01": "AES_1", "2026-02": "AES_2"})
    [a] = run1(msg(b"old"), old)
    [b] = run1(msg(b"new"), new)
    assert run1(a, decrypt)[0].body == b"old"
    assert run1(b, decrypt)[0].body == b"new"
    retired = make("decrypt", context, keys={"2026-02": "AES_2"})
    assert failure(a, retired)[0] == "decrypt: UnknownKey"


@pytest.mark.parametrize(
    ("step", "options", "match"),
    [
        ("encrypt", {"key_setting": "SHORT_AES", "key_id": "k"}, "32 bytes"),
        ("encrypt", {"key_setting": "NOT_BASE64", "key_id": "k"}, "not base64"),
        ("encrypt", {"key_setting": "NOPE", "key_id": "k"}, "not set"),
        ("encrypt", {"key_setting": "AES_1"}, "key_id"),
        ("decrypt", {"keys": {}}, "keys"),
        ("decrypt", {"keys": {"k": "SHORT_AES"}}, "32 bytes"),
    ],
)
def test_crypto_configuration_errors(
    context: StepContext, step: str, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(StepConfigError, match=match):
        make(step, context, **options)


# ---------------------------------------------------------------------- canonical encoding


def test_canonical_bytes_layout() -> None:
    message = Message(
        body=b"hi",
        message_id="m",
        application_properties={"n": 5, "b": True, "d": 1.5, "raw": b"\xff", "s": "x"},
        time_to_live=timedelta(seconds=2, microseconds=1500),
        scheduled_enqueue_time=datetime(1970, 1, 1, 0, 0, 1, 999, tzinfo=UTC),
    )
    fields = [
        "body", "message-id", "session-id", "property:n", "property:b", "property:d",
        "property:raw", "property:s", "time-to-live", "scheduled-enqueue-time",
    ]  # fmt: skip

    def record(name: str, tag: int, value: bytes) -> bytes:
        return (
            struct.pack(">H", len(name))
            + name.encode()
            + struct.pack(">BI", tag, len(value))
            + value
        )

    expected = b"repl-canonical-v1\n" + b"".join(
        [
            record("body", 1, b"hi"),
            record("message-id", 1, b"m"),
            record("session-id", 0, b""),
            record("property:n", 3, b"5"),
            record("property:b", 2, b"\x01"),
            record("property:d", 4, struct.pack(">d", 1.5)),
            record("property:raw", 1, b"\xff"),
            record("property:s", 1, b"x"),
            record("time-to-live", 6, b"2001"),
            record("scheduled-enqueue-time", 5, b"1000"),
        ]
    )
    assert signing.canonical_bytes(message, fields) == expected


def test_canonical_bytes_equal_for_str_and_bytes_properties() -> None:
    a = Message(application_properties={"p": "abc"})
    b = Message(application_properties={"p": b"abc"})
    assert signing.canonical_bytes(a, ["property:p"]) == signing.canonical_bytes(b, ["property:p"])
    c = Message(application_properties={"p": 1})
    d = Message(application_properties={"p": 1.0})
    assert signing.canonical_bytes(c, ["property:p"]) != signing.canonical_bytes(d, ["property:p"])
    with pytest.raises(ValueError, match="unknown field"):
        signing.canonical_bytes(a, ["nope"])


# ---------------------------------------------------------------------- sign / verify


SIGNED_PROPS = ["body", "message-id", "session-id", "content-type", "property:tenant"]


def test_hmac_sign_and_verify(context: StepContext) -> None:
    sign = make("sign", context, key_setting="HMAC_1", properties=["tenant"])
    verify = make("verify", context, key_setting="HMAC_1", properties=["tenant"])
    message = msg(session_id="s", application_properties={"tenant": "t", "other": 1})
    [signed] = run1(message, sign)
    props = signed.application_properties
    assert props["repl-sig-alg"] == "HMAC-SHA256"
    assert json.loads(props["repl-sig-fields"]) == SIGNED_PROPS
    assert "repl-sig-key-id" not in props
    # a third party can recompute it from the documented encoding
    expected = hmac.digest(HMAC_1, signing.canonical_bytes(signed, SIGNED_PROPS), "sha256")
    assert base64.b64decode(props["repl-sig"]) == expected
    assert run1(signed, verify) == [signed]
    # properties that are not covered may change
    changed = dict(props, other=2)
    assert run1(signed.copy(application_properties=changed), verify)


@pytest.mark.parametrize(
    "change",
    [
        {"body": b"tampered"},
        {"message_id": "m-2"},
        {"session_id": "s2"},
        {"content_type": "text/plain"},
        {"tenant": "u"},
        {"tenant": None},
    ],
)
def test_verify_detects_changes(context: StepContext, change: dict[str, Any]) -> None:
    sign = make("sign", context, key_setting="HMAC_1", properties=["tenant"])
    verify = make("verify", context, key_setting="HMAC_1", properties=["tenant"])
    [signed] = run1(msg(session_id="s", application_properties={"tenant": "t"}), sign)
    if "tenant" in change:
        props = dict(signed.application_properties)
        if change["tenant"] is None:
            del props["tenant"]
        else:
            props["tenant"] = change["tenant"]
        tampered = signed.copy(application_properties=props)
    else:
        tampered = signed.copy(**change)
    reason, description = failure(tampered, verify)
    assert reason == "verify: BadSignature"
    assert "does not match" in description


def test_verify_with_the_wrong_secret_fails(context: StepContext) -> None:
    [signed] = run1(msg(), make("sign", context, key_setting="HMAC_1"))
    assert failure(signed, make("verify", context, key_setting="HMAC_2"))[0] == (
        "verify: BadSignature"
    )


def test_verify_error_paths(context: StepContext) -> None:
    verify = make("verify", context, key_setting="HMAC_1")
    assert failure(msg(), verify)[0] == "verify: NotSigned"
    [signed] = run1(msg(), make("sign", context, key_setting="HMAC_1"))
    garbage = dict(signed.application_properties, **{"repl-sig": "@@@"})
    assert failure(signed.copy(application_properties=garbage), verify)[0] == (
        "verify: BadSignature"
    )
    more = make("verify", context, key_setting="HMAC_1", fields=["message-id", "to"])
    reason, description = failure(signed, more)
    assert reason == "verify: BadSignature" and "covers" in description
    ed = make("verify", context, algorithm="ed25519", key_setting="ED_1_PUBLIC")
    reason, description = failure(signed, ed)
    assert reason == "verify: BadSignature" and "HMAC-SHA256" in description
    routed = make("verify", context, key_setting="HMAC_2", on_error="route", error_target="bad")
    [out] = run_chain(signed, [routed]).outputs
    assert out.target == "bad" and out.application_properties["repl-error-reason"] == "BadSignature"


@pytest.mark.parametrize(
    ("private", "public"),
    [("ED_1_PRIVATE", "ED_1_PUBLIC"), ("ED_1_PRIVATE_RAW", "ED_1_PUBLIC_RAW"),
     ("ED_1_PRIVATE", "ED_1_PUBLIC_RAW")],
)  # fmt: skip
def test_ed25519_sign_and_verify(context: StepContext, private: str, public: str) -> None:
    sign = make("sign", context, algorithm="ed25519", key_setting=private)
    verify = make("verify", context, algorithm="ed25519", key_setting=public)
    [signed] = run1(msg(), sign)
    assert signed.application_properties["repl-sig-alg"] == "Ed25519"
    assert len(base64.b64decode(signed.application_properties["repl-sig"])) == 64
    ED_1.public_key().verify(
        base64.b64decode(signed.application_properties["repl-sig"]),
        signing.canonical_bytes(signed, ["body", "message-id", "session-id", "content-type"]),
    )
    assert run1(signed, verify) == [signed]
    assert failure(signed.copy(body=b"x"), verify)[0] == "verify: BadSignature"
    other = make("verify", context, algorithm="ed25519", key_setting="ED_2_PUBLIC")
    assert failure(signed, other)[0] == "verify: BadSignature"


def test_signing_key_rotation(context: StepContext) -> None:
    old = make("sign", context, algorithm="ed25519", key_setting="ED_1_PRIVATE", key_id="a")
    new = make("sign", context, algorithm="ed25519", key_setting="ED_2_PRIVATE", key_id="b")
    verify = make(
        "verify", context, algorithm="ed25519", keys={"a": "ED_1_PUBLIC", "b": "ED_2_PUBLIC"}
    )
    [a] = run1(msg(), old)
    [b] = run1(msg(), new)
    assert a.application_properties["repl-sig-key-id"] == "a"
    assert run1(a, verify) and run1(b, verify)
    swapped = dict(a.application_properties, **{"repl-sig-key-id": "b"})
    assert failure(a.copy(application_properties=swapped), verify)[0] == "verify: BadSignature"
    only_b = make("verify", context, algorithm="ed25519", keys={"b": "ED_2_PUBLIC"})
    assert failure(a, only_b)[0] == "verify: UnknownKey"
    [unnamed] = run1(msg(), make("sign", context, algorithm="ed25519", key_setting="ED_1_PRIVATE"))
    assert failure(unnamed, only_b)[0] == "verify: UnknownKey"


def test_verify_can_remove_the_signature(context: StepContext) -> None:
    [signed] = run1(
        msg(application_properties={"x": 1}),
        make("sign", context, key_setting="HMAC_1", key_id="k"),
    )
    verify = make("verify", context, keys={"k": "HMAC_1"}, remove=True)
    assert run1(signed, verify)[0].application_properties == {"x": 1}


def test_utf8_secrets(context: StepContext) -> None:
    sign = make("sign", context, key_setting="TEXT_SECRET", secret_encoding="utf-8")
    verify = make("verify", context, key_setting="TEXT_SECRET", secret_encoding="utf-8")
    [signed] = run1(msg(), sign)
    assert run1(signed, verify)


@pytest.mark.parametrize(
    ("step", "options", "match"),
    [
        ("sign", {"key_setting": "SHORT_SECRET"}, "at least 16 bytes"),
        ("sign", {"key_setting": "NOT_BASE64"}, "usable"),
        ("sign", {"key_setting": "SHORT_AES", "algorithm": "ed25519"}, "usable"),
        ("sign", {"key_setting": "ED_1_PUBLIC", "algorithm": "ed25519"}, "usable"),
        ("sign", {"key_setting": "HMAC_1", "properties": ["repl-sig"]}, "repl-sig"),
        ("sign", {"key_setting": "HMAC_1", "fields": ["body2"]}, "fields"),
        ("sign", {}, "key_setting"),
        ("verify", {}, "key_setting or keys"),
        ("verify", {"key_setting": "ED_1_PRIVATE", "algorithm": "ed25519"}, "usable"),
        ("verify", {"keys": {"k": "MISSING"}}, "not set"),
    ],
)
def test_signing_configuration_errors(
    context: StepContext, step: str, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(StepConfigError, match=match):
        make(step, context, **options)


# ---------------------------------------------------------------------- attest


def attested(context: StepContext, message: Message | None = None, **options: Any) -> Message:
    options.setdefault("key_setting", "ED_1_PRIVATE")
    [out] = run1(message or msg(session_id="s"), make("attest", context, **options))
    return out


def test_attest_writes_a_checkable_statement(context: StepContext) -> None:
    out = attested(context, channel="ns1/orders", key_id="att-1", properties=["tenant"])
    props = out.application_properties
    assert props["repl-attest-time"] == "2026-11-23T10:00:00.0000000Z"
    assert props["repl-attest-channel"] == "ns1/orders"
    assert props["repl-attest-alg"] == "Ed25519"
    fields = json.loads(props["repl-attest-fields"])
    assert fields == [
        "body", "message-id", "session-id", "content-type", "property:tenant",
        "property:repl-attest-time", "property:repl-attest-channel", "property:repl-attest-key-id",
    ]  # fmt: skip
    # the third party's check, from the documentation alone
    digest = hashlib.sha256(signing.canonical_bytes(out, fields)).digest()
    assert base64.b64decode(props["repl-attest-hash"]) == digest
    ED_1.public_key().verify(base64.b64decode(props["repl-attest-sig"]), digest)
    verifier = signing.ed25519_verifier(signing.load_ed25519_public_key(SETTINGS["ED_1_PUBLIC"]))
    info = signing.verify_attestation(out, verifier, required_fields=["body", "property:tenant"])
    assert info.channel == "ns1/orders" and info.key_id == "att-1"
    assert info.time == "2026-11-23T10:00:00.0000000Z" and info.digest == digest
    assert signing.verify_attestation(out, {"att-1": verifier}).fields == tuple(fields)


def test_attestation_detects_changes(context: StepContext) -> None:
    out = attested(context, channel="ns1/orders")
    verifier = signing.ed25519_verifier(ED_1.public_key())
    for tampered in (
        out.copy(body=b"other"),
        out.copy(message_id="m-2"),
        out.copy(application_properties=dict(out.application_properties, **{
            "repl-attest-channel": "elsewhere"})),
        out.copy(application_properties=dict(out.application_properties, **{
            "repl-attest-time": "2020-01-01T00:00:00.0000000Z"})),
    ):  # fmt: skip
        with pytest.raises(
            StepFailed, match=r"^HashMismatch: the message differs from what was attested$"
        ):
            signing.verify_attestation(tampered, verifier)
    # a consistent re-hash without the key: the signature gives it away
    forged = out.copy(body=b"other")
    fields = json.loads(out.application_properties["repl-attest-fields"])
    new_hash = hashlib.sha256(signing.canonical_bytes(forged, fields)).digest()
    forged.application_properties["repl-attest-hash"] = b64(new_hash)
    bad_signature = r"^BadSignature: the attestation signature does not match$"
    with pytest.raises(StepFailed, match=bad_signature):
        signing.verify_attestation(forged, verifier)
    with pytest.raises(StepFailed, match=bad_signature):
        signing.verify_attestation(out, signing.ed25519_verifier(ED_2.public_key()))


def test_attestation_error_paths(context: StepContext) -> None:
    out = attested(context)
    verifier = signing.ed25519_verifier(ED_1.public_key())
    with pytest.raises(StepFailed, match=r"^NotAttested: missing repl-attest-fields, "):
        signing.verify_attestation(msg(), verifier)
    with pytest.raises(
        StepFailed, match=r"^AttestationIncomplete: does not cover property:tenant$"
    ):
        signing.verify_attestation(out, verifier, required_fields=["property:tenant"])
    bad = dict(out.application_properties, **{"repl-attest-fields": "[1]"})
    with pytest.raises(StepFailed, match=r"^BadAttestation: not a JSON array of strings$"):
        signing.verify_attestation(out.copy(application_properties=bad), verifier)
    with pytest.raises(
        StepFailed, match=r"^UnknownKey: the message names no key id and there is no default key"
    ):
        signing.verify_attestation(out, {"other": verifier})
    assert "repl-attest-key-id" not in out.application_properties
    named = {**out.application_properties, "repl-attest-key-id": "k9"}
    with pytest.raises(StepFailed, match=r"^UnknownKey: key id 'k9' is not configured \(known: "):
        signing.verify_attestation(out.copy(application_properties=named), {"other": verifier})


def test_attest_with_hmac_and_the_verify_attest_step(context: StepContext, clock: Clock) -> None:
    out = attested(context, algorithm="hmac-sha256", key_setting="HMAC_1")
    assert out.application_properties["repl-attest-alg"] == "HMAC-SHA256"
    check = make("verify-attest", context, algorithm="hmac-sha256", key_setting="HMAC_1")
    assert run1(out, check) == [out]
    assert failure(out.copy(body=b"x"), check) == (
        "verify-attest: HashMismatch",
        "the message differs from what was attested",
    )
    wrong = make("verify-attest", context, algorithm="hmac-sha256", key_setting="HMAC_2")
    assert failure(out, wrong)[0] == "verify-attest: BadSignature"
    # attesting again replaces the attestation (a later time)
    clock.advance(minutes=1)
    again = attested(context, out, algorithm="hmac-sha256", key_setting="HMAC_1")
    assert again.application_properties["repl-attest-time"] == "2026-11-23T10:01:00.0000000Z"
    assert run1(again, check)


# ---------------------------------------------------------------------- chain / verify-chain


def chained(step: BoundStep, messages: list[Message]) -> list[Message]:
    return [run1(m, step)[0] for m in messages]


def session(name: str, count: int, start: int = 0) -> list[Message]:
    return [
        msg(f"{name}-{n}", message_id=f"{name}-{n}", session_id=name, sequence_number=100 + n)
        for n in range(start, start + count)
    ]


def outcomes(step: BoundStep, messages: list[Message]) -> list[Outcome]:
    return [run_chain(m, [step]) for m in messages]


def reasons(results: list[Outcome]) -> list[str | None]:
    return [None if r.dead_letter is None else r.dead_letter[0] for r in results]


def test_chain_stamps_per_session(context: StepContext) -> None:
    step = make("chain", context)
    a = chained(step, session("a", 3))
    b = chained(step, session("b", 2))
    more = chained(step, session("a", 1, start=3))
    assert [m.application_properties["repl-chain-seq"] for m in a + more] == [1, 2, 3, 4]
    assert [m.application_properties["repl-chain-seq"] for m in b] == [1, 2]
    ids = {m.application_properties["repl-chain-id"] for m in a + more}
    assert len(ids) == 1 and ids != {b[0].application_properties["repl-chain-id"]}
    # the documented link computation
    chain_id = a[0].application_properties["repl-chain-id"]
    previous = hashlib.sha256(b"repl-chain-v1\n" + chain_id.encode()).digest()
    fields = ["body", "message-id", "session-id", "content-type"]
    for seq, message in enumerate([*a, *more], start=1):
        digest = hashlib.sha256(signing.canonical_bytes(message, fields)).digest()
        link = hashlib.sha256(previous + struct.pack(">Q", seq) + digest).digest()
        assert message.application_properties["repl-chain-hash"] == b64(link)
        previous = link


def test_chain_keys() -> None:
    assert chain_key(Message(session_id="s", partition_key="s")) == "s"
    assert chain_key(Message(partition_key="p")) == "p"
    assert chain_key(Message()) == ""


def test_verify_chain_accepts_an_intact_chain(context: StepContext) -> None:
    chain, verify = make("chain", context), make("verify-chain", context)
    messages = chained(chain, session("a", 3) + session("b", 3))
    interleaved = [messages[0], messages[3], messages[1], messages[4], messages[2], messages[5]]
    for message in interleaved:
        assert run1(message, verify) == [message]


def test_verify_chain_detects_a_missing_message(context: StepContext) -> None:
    chain, verify = make("chain", context), make("verify-chain", context)
    m = chained(chain, session("a", 5))
    results = outcomes(verify, [m[0], m[1], m[3], m[4]])
    assert reasons(results) == [None, None, "verify-chain: MissingMessage", None]
    assert "seq 3 missing before seq 4" in results[2].dead_letter[1]  # type: ignore[index]
    assert reasons(outcomes(verify, [m[2]])) == ["verify-chain: Reordered"]  # late


def test_verify_chain_detects_reordering(context: StepContext) -> None:
    chain, verify = make("chain", context), make("verify-chain", context)
    m = chained(chain, session("a", 4))
    assert reasons(outcomes(verify, [m[0], m[2], m[1], m[3]])) == [
        None,
        "verify-chain: MissingMessage",
        "verify-chain: Reordered",
        None,
    ]


def test_verify_chain_duplicates(context: StepContext) -> None:
    chain = make("chain", context)
    m = chained(chain, session("a", 3))
    failing = make("verify-chain", context)
    assert reasons(outcomes(failing, [m[0], m[1], m[1], m[0], m[2]])) == [
        None, None, "verify-chain: DuplicateMessage", "verify-chain: DuplicateMessage", None,
    ]  # fmt: skip
    dropping = make("verify-chain", context, duplicates="drop")
    assert [len(run1(x, dropping)) for x in [m[0], m[1], m[1], m[2], m[0]]] == [1, 1, 0, 1, 0]


def test_verify_chain_detects_altered_messages(context: StepContext) -> None:
    chain, verify = make("chain", context), make("verify-chain", context)
    m = chained(chain, session("a", 3))
    tampered = m[1].copy(body=b"evil")
    assert reasons(outcomes(verify, [m[0], tampered, m[2]])) == [
        None,
        "verify-chain: ChainBroken",
        None,  # resynchronised on the claimed link
    ]
    again = make("verify-chain", context)
    first = m[0].copy(body=b"evil")
    assert reasons(outcomes(again, [first])) == ["verify-chain: ChainBroken"]
    # a verified link repeated with other content is not a duplicate
    third = make("verify-chain", context, duplicates="drop")
    assert reasons(outcomes(third, [m[0], m[1], tampered])) == [
        None, None, "verify-chain: ChainBroken",
    ]  # fmt: skip


def test_verify_chain_needs_the_same_fields_and_key(context: StepContext) -> None:
    chain = make("chain", context, key_setting="HMAC_1", properties=["tenant"])
    m = chained(chain, [x.copy(application_properties={"tenant": "t"}) for x in session("a", 2)])
    good = make("verify-chain", context, key_setting="HMAC_1", properties=["tenant"])
    assert reasons(outcomes(good, m)) == [None, None]
    wrong_key = make("verify-chain", context, key_setting="HMAC_2", properties=["tenant"])
    assert reasons(outcomes(wrong_key, m)) == ["verify-chain: ChainBroken"] * 2
    unkeyed = make("verify-chain", context, properties=["tenant"])
    assert reasons(outcomes(unkeyed, m)) == ["verify-chain: ChainBroken"] * 2
    changed = m[1].copy(application_properties=dict(m[1].application_properties, tenant="u"))
    fresh = make("verify-chain", context, key_setting="HMAC_1", properties=["tenant"])
    assert reasons(outcomes(fresh, [m[0], changed])) == [None, "verify-chain: ChainBroken"]


def test_verify_chain_not_chained(context: StepContext) -> None:
    verify = make("verify-chain", context)
    assert reasons(outcomes(verify, [msg()])) == ["verify-chain: NotChained"]
    [m] = chained(make("chain", context), session("a", 1))
    for name, value in (("repl-chain-seq", 0), ("repl-chain-seq", "x"),
                        ("repl-chain-hash", "AAAA"), ("repl-chain-seq", True)):  # fmt: skip
        props = dict(m.application_properties, **{name: value})
        assert reasons(outcomes(verify, [m.copy(application_properties=props)])) == [
            "verify-chain: NotChained"
        ]
    as_text = dict(m.application_properties, **{"repl-chain-seq": "1"})
    assert reasons(outcomes(verify, [m.copy(application_properties=as_text)])) == [None]


def test_a_restarted_chain(context: StepContext) -> None:
    verify = make("verify-chain", context)
    before = chained(make("chain", context), session("a", 2))
    after = chained(make("chain", context), session("a", 2, start=2))  # a new process
    assert after[0].application_properties["repl-chain-seq"] == 1
    assert reasons(outcomes(verify, before + after)) == [None] * 4
    # a straggler of the earlier chain is late
    assert reasons(outcomes(verify, [before[1]])) == ["verify-chain: Reordered"]
    strict = make("verify-chain", context, restarts="fail")
    assert reasons(outcomes(strict, before + after)) == [
        None, None, "verify-chain: ChainRestarted", None,
    ]  # fmt: skip
    # a new chain whose start is missing
    third = chained(make("chain", context), session("a", 2, start=4))
    assert reasons(outcomes(verify, [third[1]])) == ["verify-chain: MissingMessage"]


def test_verify_chain_start_policy(context: StepContext) -> None:
    m = chained(make("chain", context), session("a", 3))
    anywhere = make("verify-chain", context)
    assert reasons(outcomes(anywhere, m[1:])) == [None, None]
    first = make("verify-chain", context, start="first")
    assert reasons(outcomes(first, m[1:])) == ["verify-chain: MissingMessage", None]


def test_chain_state_can_be_persisted(context: StepContext) -> None:
    chain = make("chain", context)
    verify = make("verify-chain", context)
    m = chained(chain, session("a", 2))
    assert reasons(outcomes(verify, m)) == [None, None]
    saved = chain.run.get_state("a")  # type: ignore[attr-defined]
    saved_verify = verify.run.get_state("a")  # type: ignore[attr-defined]
    assert json.loads(saved)["seq"] == 2 and chain.run.get_state("b") is None  # type: ignore[attr-defined]
    restarted = make("chain", context)
    restarted.run.set_state("a", saved)  # type: ignore[attr-defined]
    verify_restarted = make("verify-chain", context, start="first", restarts="fail")
    verify_restarted.run.set_state("a", saved_verify)  # type: ignore[attr-defined]
    n = chained(restarted, session("a", 2, start=2))
    assert [x.application_properties["repl-chain-seq"] for x in n] == [3, 4]
    assert reasons(outcomes(verify_restarted, n)) == [None, None]
    restarted.run.set_state("a", None)  # type: ignore[attr-defined]
    assert restarted.run.get_state("a") is None  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="not a chain state"):
        restarted.run.set_state("a", b'{"v": 2}')  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="not a chain state"):
        restarted.run.set_state("a", b"junk")  # type: ignore[attr-defined]


def test_a_redelivered_message_gets_its_first_stamp(context: StepContext) -> None:
    chain = make("chain", context)
    verify = make("verify-chain", context, duplicates="drop")
    m = session("a", 3)
    first = chained(chain, m)
    # the send failed: m[1] and m[2] come again (delivery count 2), then new messages
    again = chained(chain, [x.copy(delivery_count=2) for x in m[1:]])
    assert [x.application_properties for x in again] == [
        x.application_properties for x in first[1:]
    ]
    later = chained(chain, session("a", 1, start=3))
    assert later[0].application_properties["repl-chain-seq"] == 4
    # whether or not the first copies arrived, the receiver sees an intact chain
    assert [len(run1(x, verify)) for x in [first[0], *again, *later]] == [1, 1, 1, 1]
    both = make("verify-chain", context, duplicates="drop")
    assert [len(run1(x, both)) for x in [*first, *again, *later]] == [1, 1, 1, 0, 0, 1]
    # changed content is not a redelivery of the same thing: it gets a new link
    changed = chained(chain, [m[0].copy(body=b"changed")])
    assert changed[0].application_properties["repl-chain-seq"] == 5


def test_chain_memory_is_bounded(context: StepContext) -> None:
    chain = make("chain", context, max_chains=2, remember=2)
    for name in "abcde":
        chained(chain, session(name, 3))
    assert len(chain.run) == 2  # type: ignore[arg-type]
    assert chain.run.get_state("a") is None and chain.run.get_state("e")  # type: ignore[attr-defined]
    state = chain.run.states["e"]  # type: ignore[attr-defined]
    assert len(state.recent) == 2
    verify = make("verify-chain", context, max_chains=1, history=1)
    chained_a = chained(make("chain", context), session("a", 2))
    chained_b = chained(make("chain", context), session("b", 1))
    assert reasons(outcomes(verify, [chained_a[0], chained_b[0], chained_a[1]])) == [None] * 3
    assert len(verify.run) == 1  # type: ignore[arg-type]


def test_chain_state_bytes_round_trip() -> None:
    state = ChainState("ab" * 16, 7, bytes(range(32)))
    again = ChainState.from_bytes(state.to_bytes())
    assert (again.chain_id, again.seq, again.hash) == (state.chain_id, 7, state.hash)


@pytest.mark.parametrize(
    ("step", "options", "message"),
    [
        (
            "chain",
            {"properties": ["repl-chain-seq"]},
            "step 'chain': cannot cover 'repl-chain-seq': the steps write repl-chain-* itself",
        ),
        ("chain", {"max_chains": 0}, "step 'chain': max_chains: Input should be greater than 0"),
        ("chain", {"key_setting": "NOT_BASE64"}, "setting 'NOT_BASE64': not base64"),
        ("chain", {"key_setting": "MISSING"}, "setting 'MISSING' is not set"),
        (
            "verify-chain",
            {"duplicates": "ignore"},
            "step 'verify-chain': duplicates: Input should be 'fail' or 'drop'",
        ),
        (
            "verify-chain",
            {"fields": ["body"]},
            "step 'verify-chain': fields.0: Input should be 'message-id', ",
        ),
    ],
)
def test_chain_configuration_errors(
    context: StepContext, step: str, options: Mapping[str, Any], message: str
) -> None:
    with pytest.raises(StepConfigError, match="^" + re.escape(message)):
        make(step, context, **options)


def test_steps_are_registered() -> None:
    from replication.tasks import registry

    for name in ("filter", "dedupe", "encrypt", "decrypt", "sign", "verify", "attest",
                 "verify-attest", "chain", "verify-chain"):  # fmt: skip
        spec = registry.lookup(name)
        assert spec is not None and spec.doc, name
    assert chain_module.CHAIN_SEQ == "repl-chain-seq" and crypto.KEY_ID == "repl-key-id"
