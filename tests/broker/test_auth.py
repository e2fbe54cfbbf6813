"""SAS tokens and claims: what the SDKs mint validates; anything forged or stale does not."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote_plus

import pytest
from azure.servicebus._base_handler import ServiceBusSharedKeyCredential, _generate_sas_token
from azure.servicebus._pyamqp.utils import generate_sas_token as sdk_generate_sas_token

from replication.amqp.connection import Connection
from replication.amqp.transport import ConnectionDriver
from replication.broker.auth import (
    EMULATOR_KEY,
    EMULATOR_RULE,
    EMULATOR_RULE_NAME,
    UNAUTHORIZED_ACCESS,
    AuthorizationError,
    Authorizer,
    Grant,
    SharedAccessRule,
    expand_rights,
    normalize_resource,
    parse_sas_token,
)
from replication.broker.cbs import Cbs
from replication.broker.clock import ManualClock
from replication.broker.commit import GroupCommit
from replication.broker.config import parse_config
from replication.broker.peer import Peer
from replication.broker.store import MessageStore
from replication.servicebus.sas import generate_sas_token

NOW = 1_700_000_000.0
LATER = int(NOW) + 3600
NAMESPACE = "sb://localhost:5672"
QUEUE = f"{NAMESPACE}/queue.1"


@pytest.fixture
def authorizer() -> Authorizer:
    return Authorizer([
        EMULATOR_RULE,
        SharedAccessRule("sender", "send-key", frozenset({"Send"})),
        SharedAccessRule("listener", "listen-key", frozenset({"Listen"})),
    ])  # fmt: skip


def refused(authorizer: Authorizer, token: str, audience: str = QUEUE) -> AuthorizationError:
    with pytest.raises(AuthorizationError, match="SAS token") as info:
        authorizer.validate(token, audience, NOW)
    assert info.value.condition == UNAUTHORIZED_ACCESS == "amqp:unauthorized-access"
    return info.value


# ---------------------------------------------------------------------- minting


def test_token_format() -> None:
    token = generate_sas_token(QUEUE, "rule", "key", LATER)
    expected_sig = base64.b64encode(
        hmac.new(b"key", f"{quote_plus(QUEUE)}\n{LATER}".encode(), hashlib.sha256).digest()
    ).decode()
    assert token == (
        f"SharedAccessSignature sr={quote_plus(QUEUE)}&sig={quote_plus(expected_sig)}"
        f"&se={LATER}&skn=rule"
    )


@pytest.mark.parametrize("uri", [QUEUE, NAMESPACE, "sb://ns.servicebus.windows.net/a/b c"])
def test_same_token_as_the_sdk(uri: str) -> None:
    ours = generate_sas_token(uri, EMULATOR_RULE_NAME, EMULATOR_KEY, LATER)
    assert ours == sdk_generate_sas_token(uri, EMULATOR_RULE_NAME, EMULATOR_KEY, LATER)


def test_parse_sas_token() -> None:
    parsed = parse_sas_token(generate_sas_token(QUEUE, "my rule", "k", LATER))
    assert parsed.resource == QUEUE
    assert parsed.key_name == "my rule"
    assert parsed.expiry == LATER
    assert parsed.raw_resource == quote_plus(QUEUE)


# ---------------------------------------------------------------------- SDK tokens validate


def test_sdk_token_validates(authorizer: Authorizer) -> None:
    token = sdk_generate_sas_token(QUEUE, EMULATOR_RULE_NAME, EMULATOR_KEY, LATER)
    grant = authorizer.validate(token, QUEUE, NOW)
    assert grant == Grant(
        rule=EMULATOR_RULE_NAME,
        rights=frozenset({"Manage", "Send", "Listen"}),
        expires_at=float(LATER),
        resource="localhost:5672/queue.1",
        scope="queue.1",
    )


def test_sdk_credential_tokens_validate(authorizer: Authorizer) -> None:
    # What ServiceBusClient.from_connection_string(...) puts on $cbs for the emulator's
    # "Endpoint=sb://localhost;SharedAccessKeyName=RootManageSharedAccessKey;..." string.
    credential = ServiceBusSharedKeyCredential(EMULATOR_RULE_NAME, EMULATOR_KEY)
    access = credential.get_token(QUEUE)
    now = time.time()
    grant = authorizer.validate(access.token, QUEUE, now)
    assert grant.rule == EMULATOR_RULE_NAME
    assert grant.expires_at == access.expires_on > now
    access = _generate_sas_token(QUEUE, "sender", "send-key", timedelta(minutes=5))
    assert authorizer.validate(access.token, QUEUE, time.time()).rule == "sender"


def test_token_as_bytes_validates(authorizer: Authorizer) -> None:
    token = generate_sas_token(QUEUE, "sender", "send-key", LATER)
    assert authorizer.validate(token.encode(), QUEUE, NOW).rule == "sender"


def test_rule_names_match_case_insensitively(authorizer: Authorizer) -> None:
    token = generate_sas_token(QUEUE, "SENDER", "send-key", LATER)
    assert authorizer.validate(token, QUEUE, NOW).rule == "sender"


def test_dotnet_style_lower_case_encoding_validates(authorizer: Authorizer) -> None:
    # HttpUtility.UrlEncode writes lower-case escapes and signs exactly what it sends.
    encoded = quote_plus(QUEUE).replace("%3A", "%3a").replace("%2F", "%2f")
    signature = base64.b64encode(
        hmac.new(b"send-key", f"{encoded}\n{LATER}".encode(), hashlib.sha256).digest()
    ).decode()
    token = f"SharedAccessSignature sr={encoded}&sig={quote_plus(signature)}&se={LATER}&skn=sender"
    assert authorizer.validate(token, QUEUE, NOW).rule == "sender"


def test_unencoded_signature_validates(authorizer: Authorizer) -> None:
    for n in range(200):  # find a signature with '+' or '/' and send it raw
        uri = f"{QUEUE}{n}"
        signature = base64.b64encode(
            hmac.new(b"send-key", f"{quote_plus(uri)}\n{LATER}".encode(), hashlib.sha256).digest()
        ).decode()
        if "+" in signature:
            break
    token = f"SharedAccessSignature sr={quote_plus(uri)}&sig={signature}&se={LATER}&skn=sender"
    assert authorizer.validate(token, uri, NOW).rule == "sender"


# ---------------------------------------------------------------------- audiences and scope


@pytest.mark.parametrize(
    ("sr", "audience"),
    [
        (QUEUE, QUEUE),
        (NAMESPACE, QUEUE),  # a namespace token grants every entity under it
        (NAMESPACE + "/", QUEUE),
        (NAMESPACE, f"{NAMESPACE}/topic.1/subscriptions/sub.1"),
        (f"{NAMESPACE}/topic.1", f"{NAMESPACE}/topic.1/subscriptions/sub.1"),
        (QUEUE, f"{QUEUE}/$management"),
        ("sb://LOCALHOST:5672/Queue.1/", "amqps://localhost:5672/queue.1"),
        ("amqp://localhost:5672/queue.1", "https://LocalHost:5672/QUEUE.1/"),
        # the SDK's audience for a namespace named localhost:5671 has no port
        ("sb://localhost:5671/queue.1", "sb://localhost/queue.1"),
        ("sb://localhost/queue.1", "sb://localhost:5672/queue.1"),
        ("sb://[::1]:5671", "sb://[::1]/queue.1"),
    ],
)
def test_audience_matches(authorizer: Authorizer, sr: str, audience: str) -> None:
    token = generate_sas_token(sr, "listener", "listen-key", LATER)
    assert authorizer.validate(token, audience, NOW).rule == "listener"


@pytest.mark.parametrize(
    ("sr", "audience"),
    [
        (QUEUE, f"{NAMESPACE}/queue.2"),
        (QUEUE, NAMESPACE),  # an entity token does not grant the namespace
        (f"{NAMESPACE}/queue", QUEUE),  # prefixes match whole path segments only
        (QUEUE, "sb://otherhost:5672/queue.1"),
        (QUEUE, "sb://localhost:5673/queue.1"),  # another local namespace's port
        ("sb://[::1]:5671/queue.1", "sb://[::1]:5672/queue.1"),
        ("sb://localhost:5671/queue.1", "sb://localhostx/queue.1"),
        (QUEUE, ""),
    ],
)
def test_wrong_audience_is_refused(authorizer: Authorizer, sr: str, audience: str) -> None:
    token = generate_sas_token(sr, "listener", "listen-key", LATER)
    error = refused(authorizer, token, audience)
    assert "does not cover the audience" in error.description


def test_normalize_resource() -> None:
    assert normalize_resource("sb://Host:5672/Queue.1/") == "host:5672/queue.1"
    assert normalize_resource("amqps://host/q") == normalize_resource("https://HOST/q/")
    assert normalize_resource("ftp://host/q") == "ftp://host/q"


def test_grant_covers_entities_by_path_segment(authorizer: Authorizer) -> None:
    token = generate_sas_token(f"{NAMESPACE}/orders", "sender", "send-key", LATER)
    grant = authorizer.validate(token, f"{NAMESPACE}/orders", NOW)
    assert grant.covers("orders")
    assert grant.covers("ORDERS")
    assert grant.covers("orders/$DeadLetterQueue")
    assert grant.covers("amqps://localhost:5672/orders")
    assert not grant.covers("orders-archive")
    assert not grant.covers("other")
    namespace_grant = authorizer.validate(
        generate_sas_token(NAMESPACE, "sender", "send-key", LATER), QUEUE, NOW
    )
    assert namespace_grant.scope == ""
    assert namespace_grant.covers("anything/at/all")


# ---------------------------------------------------------------------- refusals


def test_tampered_signature_is_refused(authorizer: Authorizer) -> None:
    token = generate_sas_token(QUEUE, "sender", "send-key", LATER)
    sig = parse_sas_token(token).raw_signature
    forged = token.replace(sig, quote_plus(base64.b64encode(b"\0" * 32).decode()))
    error = refused(authorizer, forged)
    assert error.description == "Invalid SAS token signature for rule 'sender'."


def test_token_signed_with_another_key_is_refused(authorizer: Authorizer) -> None:
    token = generate_sas_token(QUEUE, "sender", "not-the-key", LATER)
    assert "Invalid SAS token signature" in refused(authorizer, token).description


def test_changed_expiry_breaks_the_signature(authorizer: Authorizer) -> None:
    token = generate_sas_token(QUEUE, "sender", "send-key", LATER)
    extended = token.replace(f"se={LATER}", f"se={LATER + 86400}")
    assert "Invalid SAS token signature" in refused(authorizer, extended).description


def test_changed_resource_breaks_the_signature(authorizer: Authorizer) -> None:
    token = generate_sas_token(QUEUE, "sender", "send-key", LATER)
    widened = token.replace(quote_plus(QUEUE), quote_plus(NAMESPACE))
    assert "Invalid SAS token signature" in refused(authorizer, widened).description


def test_rule_swap_breaks_the_signature(authorizer: Authorizer) -> None:
    token = generate_sas_token(QUEUE, "listener", "listen-key", LATER)
    swapped = token.replace("skn=listener", f"skn={EMULATOR_RULE_NAME}")
    assert "Invalid SAS token signature" in refused(authorizer, swapped).description


def test_garbage_signature_is_refused(authorizer: Authorizer) -> None:
    token = generate_sas_token(QUEUE, "sender", "send-key", LATER)
    sig = parse_sas_token(token).raw_signature
    assert (
        "Invalid SAS token signature" in refused(authorizer, token.replace(sig, "!!")).description
    )


def test_unknown_rule_is_refused(authorizer: Authorizer) -> None:
    token = generate_sas_token(QUEUE, "intruder", "send-key", LATER)
    error = refused(authorizer, token)
    assert error.description == "Unknown shared access rule 'intruder' (skn) in SAS token."


@pytest.mark.parametrize("expiry", [int(NOW), int(NOW) - 1, 0])
def test_expired_token_is_refused(authorizer: Authorizer, expiry: int) -> None:
    token = generate_sas_token(QUEUE, "sender", "send-key", expiry)
    error = refused(authorizer, token)
    assert error.description == f"SAS token expired at {expiry} (now {int(NOW)})."


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("", "must start with 'SharedAccessSignature '"),
        ("Bearer abc", "must start with 'SharedAccessSignature '"),
        ("SharedAccessSignature", "missing sr, sig, se, skn"),
        ("SharedAccessSignature sr=a&sig=b&se=1", "missing skn"),
        ("SharedAccessSignature sr=a&sig=b&se=&skn=r", "missing se"),
        ("SharedAccessSignature sr=a&sig=b&se=soon&skn=r", "se='soon' is not a Unix time"),
        ("SharedAccessSignature sr=a&sig=b&se=-5&skn=r", "se='-5' is not a Unix time"),
        ("SharedAccessSignature sr=a&sr=b&sig=c&se=1&skn=r", "field 'sr' appears twice"),
        ("SharedAccessSignature sr=a&junk&sig=c&se=1&skn=r", "field 'junk' is not name=value"),
    ],
)
def test_malformed_tokens_are_refused(authorizer: Authorizer, token: str, reason: str) -> None:
    error = refused(authorizer, token)
    assert error.description.startswith("Malformed SAS token: ")
    assert reason in error.description


def test_non_utf8_bytes_token_is_refused(authorizer: Authorizer) -> None:
    with pytest.raises(AuthorizationError, match="not UTF-8"):
        authorizer.validate(b"\xff\xfe", QUEUE, NOW)


# ---------------------------------------------------------------------- claims


def test_missing_claim_is_refused(authorizer: Authorizer) -> None:
    grant = authorizer.validate(generate_sas_token(QUEUE, "sender", "send-key", LATER), QUEUE, NOW)
    authorizer.check(grant, "Send", "queue.1")
    with pytest.raises(AuthorizationError, match=r"Listen claim required for 'queue\.1'") as info:
        authorizer.check(grant, "Listen", "queue.1")
    assert info.value.condition == UNAUTHORIZED_ACCESS
    assert "Listen claim required for 'queue.1'" in info.value.description
    assert "rule 'sender' grants Send" in info.value.description
    with pytest.raises(AuthorizationError, match="Manage claim required"):
        authorizer.check(grant, "Manage", "queue.1")


def test_manage_implies_send_and_listen(authorizer: Authorizer) -> None:
    token = generate_sas_token(NAMESPACE, EMULATOR_RULE_NAME, EMULATOR_KEY, LATER)
    grant = authorizer.validate(token, QUEUE, NOW)
    for right in ("Send", "Listen", "Manage"):
        authorizer.check(grant, right, "queue.1")
        authorizer.check(grant, right, "topic.1/subscriptions/s")


def test_check_refuses_entities_outside_the_scope(authorizer: Authorizer) -> None:
    grant = authorizer.validate(generate_sas_token(QUEUE, "sender", "send-key", LATER), QUEUE, NOW)
    with pytest.raises(AuthorizationError, match=r"does not cover 'queue\.2'"):
        authorizer.check(grant, "Send", "queue.2")


def test_check_rejects_unknown_right_names(authorizer: Authorizer) -> None:
    grant = authorizer.validate(generate_sas_token(QUEUE, "sender", "send-key", LATER), QUEUE, NOW)
    with pytest.raises(ValueError, match="unknown right 'send'"):
        authorizer.check(grant, "send", "queue.1")


def test_grant_expiry(authorizer: Authorizer) -> None:
    grant = authorizer.validate(generate_sas_token(QUEUE, "sender", "send-key", LATER), QUEUE, NOW)
    assert not grant.expired(NOW)
    assert not grant.expired(LATER - 1)
    assert grant.expired(LATER)
    assert grant.allows("Send") and not grant.allows("Listen")


async def test_a_connection_is_asked_again_once_the_grant_that_allowed_it_expired(
    authorizer: Authorizer, tmp_path: Path
) -> None:
    """``Cbs.problem`` runs for every transfer and keeps a yes while the grant behind it
    lasts: past the token's expiry the answer is asked for again, and is no; a new token
    for the connection drops the kept answers (it replaces the one before it)."""
    clock = ManualClock(start=NOW)
    store = MessageStore(tmp_path / "store.db")  # real parts: compiled, they check their types
    cbs = Cbs(authorizer, clock, GroupCommit(store, after=lambda: None))
    peer = Peer(driver=ConnectionDriver(Connection(server=True)), opened_at=0.0)
    grant = authorizer.validate(generate_sas_token(QUEUE, "sender", "send-key", LATER), QUEUE, NOW)
    peer.grants[QUEUE] = grant
    assert cbs.problem(peer, "queue.1", "Send") is None
    assert peer.allowed == {("queue.1", "Send"): LATER}
    assert cbs.problem(peer, "queue.1", "Listen") is not None
    clock.advance(LATER - NOW - 1)
    assert cbs.problem(peer, "queue.1", "Send") is None
    clock.advance(1)
    assert cbs.problem(peer, "queue.1", "Send") == "no token covers this entity"
    store.close()


# ---------------------------------------------------------------------- SASL PLAIN


def test_authenticate_plain(authorizer: Authorizer) -> None:
    assert authorizer.authenticate_plain(EMULATOR_RULE_NAME, EMULATOR_KEY)
    assert authorizer.authenticate_plain("sender", "send-key")
    assert authorizer.authenticate_plain("SENDER", "send-key")
    assert not authorizer.authenticate_plain("sender", "listen-key")
    assert not authorizer.authenticate_plain("sender", "")
    assert not authorizer.authenticate_plain("nobody", "send-key")
    assert not authorizer.authenticate_plain("", "")


def test_plain_grant_is_namespace_wide_and_keeps_the_rules_rights(authorizer: Authorizer) -> None:
    grant = authorizer.grant_for_rule("listener")
    assert grant is not None
    assert grant.rule == "listener"
    assert grant.rights == {"Listen"}
    assert grant.expires_at is None and not grant.expired(1e12)
    assert grant.covers("queue.1") and grant.covers("topic.1/subscriptions/s")
    authorizer.check(grant, "Listen", "queue.1")
    with pytest.raises(AuthorizationError, match="Send claim required"):
        authorizer.check(grant, "Send", "queue.1")
    assert authorizer.grant_for_rule("nobody") is None
    assert authorizer.grant_for_rule(None) is None


# ---------------------------------------------------------------------- rules and config


def test_rules_expand_manage_and_refuse_nonsense() -> None:
    assert expand_rights(["Manage"]) == {"Manage", "Send", "Listen"}
    assert expand_rights(["Send", "Send"]) == {"Send"}
    with pytest.raises(ValueError, match="unknown rights"):
        expand_rights(["Read"])
    with pytest.raises(ValueError, match="empty key"):
        SharedAccessRule("r", "", frozenset({"Send"}))
    with pytest.raises(ValueError, match="duplicate shared access rule"):
        Authorizer([EMULATOR_RULE, SharedAccessRule(EMULATOR_RULE_NAME.upper(), "k", frozenset())])
    assert "SAS_KEY_VALUE" not in repr(EMULATOR_RULE)


def test_authorizer_from_default_config_accepts_the_emulator_connection_string() -> None:
    document = {
        "UserConfig": {"Namespaces": [{"Name": "sbemulatorns"}], "Logging": {"Type": "File"}}
    }
    authorizer = Authorizer(parse_config(document).rules())
    token = (
        ServiceBusSharedKeyCredential("RootManageSharedAccessKey", "SAS_KEY_VALUE")
        .get_token("sb://localhost/queue.1")
        .token
    )
    grant = authorizer.validate(token, "sb://localhost/queue.1", time.time())
    authorizer.check(grant, "Listen", "queue.1")


def test_authorizer_from_config_with_environment_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BROKER_TEST_SEND_KEY", "env-secret")
    document = {"UserConfig": {"Namespaces": [{
        "Name": "sbemulatorns",
        "Queues": [{"Name": "queue.1"}],
        "AuthorizationRules": [
            {"Name": "app", "KeyEnvironmentVariable": "BROKER_TEST_SEND_KEY", "Rights": ["Send"]},
        ],
    }], "Logging": {"Type": "Console"}}}  # fmt: skip
    authorizer = Authorizer(parse_config(document).rules())
    assert [r.name for r in authorizer.rules] == ["app"]
    good = sdk_generate_sas_token(QUEUE, "app", "env-secret", LATER)
    grant = authorizer.validate(good, QUEUE, NOW)
    authorizer.check(grant, "Send", "queue.1")
    with pytest.raises(AuthorizationError, match="Listen claim required"):
        authorizer.check(grant, "Listen", "queue.1")
    emulator = sdk_generate_sas_token(QUEUE, EMULATOR_RULE_NAME, EMULATOR_KEY, LATER)
    assert "Unknown shared access rule" in refused(authorizer, emulator).description
