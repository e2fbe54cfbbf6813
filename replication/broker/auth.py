"""Shared access signatures, checked (CBS, SASL PLAIN); ``servicebus.sas`` mints them.

Service Bus authorises with SAS tokens that clients put on the ``$cbs`` node, or (the
emulator, some AMQP clients) with SASL PLAIN carrying a rule name and key. Both end up here
as a ``Grant``: which rule, which rights, until when, over which part of the namespace.
This module knows nothing of AMQP, so the CBS handler, the management node and the tests
all share one implementation of the rules.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import quote_plus, unquote, unquote_plus

from ..servicebus.sas import TOKEN_TYPE, sign

UNAUTHORIZED_ACCESS = "amqp:unauthorized-access"
SEND = "Send"
LISTEN = "Listen"
MANAGE = "Manage"
RIGHTS: frozenset[str] = frozenset({SEND, LISTEN, MANAGE})

EMULATOR_RULE_NAME = "RootManageSharedAccessKey"
"""The rule every emulator connection string names (``SharedAccessKeyName=...``)."""
EMULATOR_KEY = "SAS_KEY_VALUE"
"""The emulator's well-known key (``SharedAccessKey=SAS_KEY_VALUE``)."""

_URI_SCHEMES = frozenset({"sb", "amqp", "amqps", "https", "http"})  # http: the plain HTTP port
"""Schemes a client may put on a token's ``sr`` or a CBS audience for the same resource."""


class AuthorizationError(Exception):
    """A refused token or claim; ``condition`` and ``description`` go into the AMQP error."""

    def __init__(self, *, condition: str = UNAUTHORIZED_ACCESS, description: str) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description


def expand_rights(rights: Iterable[str]) -> frozenset[str]:
    """Validate rights and apply Azure's implication: ``Manage`` includes Send and Listen."""
    result = frozenset(rights)
    unknown = result - RIGHTS
    if unknown:
        raise ValueError(f"unknown rights {sorted(unknown)}; expected Send, Listen or Manage")
    if MANAGE in result:
        result |= {SEND, LISTEN}
    return result


@dataclass(frozen=True, slots=True)
class SharedAccessRule:
    """A namespace authorization rule with its key resolved (the key never shows in repr)."""

    name: str
    key: str = field(repr=False)
    rights: frozenset[str]

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a shared access rule needs a name")
        if not self.key:
            raise ValueError(f"shared access rule {self.name!r} has an empty key")
        object.__setattr__(self, "rights", expand_rights(self.rights))


EMULATOR_RULE = SharedAccessRule(EMULATOR_RULE_NAME, EMULATOR_KEY, frozenset({MANAGE}))
"""What the emulator accepts when Config.json names no rules; so do we."""


def normalize_resource(uri: str) -> str:
    """``sb://Host:5672/Queue/`` -> ``host:5672/queue``: how ``sr`` and audiences are compared.

    Clients spell the same resource with different schemes (sb, amqp, amqps, https) and
    case; entity names are case-insensitive in Service Bus. A query names no other resource:
    the JavaScript administration client signs the request URL with its ``?api-version=``.
    """
    text = uri.strip()
    scheme, sep, rest = text.partition("://")
    if sep and scheme.lower() in _URI_SCHEMES:
        text = rest
    text = text.partition("?")[0].partition("#")[0]
    return text.rstrip("/").lower()


def _covers(resource: str, target: str) -> bool:
    """Whether the normalised ``target`` is ``resource`` or under it, path segment by
    segment. Ports that both name must agree (locally, two namespaces may differ by port
    only); a side without one takes the other's: the SDK drops ``:5671`` from its CBS
    audience for a namespace named ``localhost:5671``, while the token was signed for it."""
    resource_host, _, resource_path = resource.partition("/")
    target_host, _, target_path = target.partition("/")
    resource_name, resource_port = _host_and_port(resource_host)
    target_name, target_port = _host_and_port(target_host)
    if resource_name != target_name:
        return False
    if resource_port and target_port and resource_port != target_port:
        return False
    return (
        not resource_path
        or target_path == resource_path
        or target_path.startswith(resource_path + "/")
    )


def _host_and_port(host: str) -> tuple[str, str]:
    """``localhost:5671`` -> (``localhost``, ``5671``); ``[::1]:5671`` -> (``[::1]``, ...)."""
    if host.startswith("["):
        name, _, rest = host.partition("]")
        return name + "]", rest.removeprefix(":")
    name, colon, port = host.rpartition(":")
    return (name, port) if colon else (host, "")


def _entity_scope(resource: str) -> str:
    """The entity-path part of a normalised resource (``""`` for the whole namespace)."""
    return resource.partition("/")[2].strip("/")


def _entity_path(entity: str) -> str:
    if "://" in entity:
        return _entity_scope(normalize_resource(entity))
    return entity.strip("/").lower()


@dataclass(frozen=True, slots=True)
class Grant:
    """What an accepted token (or PLAIN login) allows: rule, rights, expiry and scope.

    ``scope`` is the lower-cased entity path the token was issued for; ``""`` means the
    whole namespace. ``expires_at`` is Unix seconds, ``None`` for a PLAIN login, which lasts
    as long as its connection.
    """

    rule: str
    rights: frozenset[str]
    expires_at: float | None
    resource: str | None
    """The token's normalised ``sr`` (``host:port/path``); ``None`` for a PLAIN login."""
    scope: str = ""

    def covers(self, entity: str) -> bool:
        """Whether ``entity`` (a path such as ``topic/subscriptions/sub``) is under the scope.

        The match is per path segment: a token for ``orders`` covers ``orders`` and
        ``orders/$DeadLetterQueue`` but not ``orders-archive``.
        """
        path = _entity_path(entity)
        return not self.scope or path == self.scope or path.startswith(self.scope + "/")

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    def allows(self, right: str) -> bool:
        return right in self.rights


@dataclass(frozen=True, slots=True)
class SasToken:
    """A parsed ``SharedAccessSignature`` string; the ``raw_*`` fields are what was signed."""

    resource: str
    signature: str
    expiry: int
    key_name: str
    raw_resource: str
    raw_signature: str
    raw_expiry: str


def _malformed(reason: str) -> AuthorizationError:
    return AuthorizationError(description=f"Malformed SAS token: {reason}.")


def parse_sas_token(token: str | bytes) -> SasToken:
    """Split a token into its fields; raises ``AuthorizationError`` when it is malformed."""
    if isinstance(token, bytes):
        try:
            token = token.decode("utf-8")
        except UnicodeDecodeError:
            raise _malformed("not UTF-8") from None
    if not isinstance(token, str):
        raise _malformed(f"expected a string, got {type(token).__name__}")
    kind, _, rest = token.strip().partition(" ")
    if kind.lower() != TOKEN_TYPE.lower():
        raise _malformed(f"it must start with '{TOKEN_TYPE} '")
    fields: dict[str, str] = {}
    for part in rest.strip().split("&"):
        if not part:
            continue  # "SharedAccessSignature" alone, or a stray '&'
        name, sep, value = part.partition("=")
        if not sep or not name:
            raise _malformed(f"field {part!r} is not name=value")
        name = name.lower()
        if name in fields:
            raise _malformed(f"field {name!r} appears twice")
        fields[name] = value
    missing = [name for name in ("sr", "sig", "se", "skn") if not fields.get(name)]
    if missing:
        raise _malformed(f"missing {', '.join(missing)}")
    raw_expiry = fields["se"]
    if not raw_expiry.isascii() or not raw_expiry.isdigit():
        raise _malformed(f"se={raw_expiry!r} is not a Unix time in seconds")
    return SasToken(
        resource=unquote_plus(fields["sr"]),
        signature=fields["sig"],
        expiry=int(raw_expiry),
        key_name=unquote_plus(fields["skn"]),
        raw_resource=fields["sr"],
        raw_signature=fields["sig"],
        raw_expiry=raw_expiry,
    )


def _describe_rights(rights: frozenset[str]) -> str:
    return ", ".join(r for r in (MANAGE, SEND, LISTEN) if r in rights) or "nothing"


class Authorizer:
    """Checks SAS tokens and PLAIN logins against the namespace's authorization rules.

    Rule names are matched case-insensitively, as Service Bus does.
    """

    def __init__(self, rules: Iterable[SharedAccessRule]) -> None:
        self._rules: dict[str, SharedAccessRule] = {}
        for rule in rules:
            folded = rule.name.lower()
            if folded in self._rules:
                raise ValueError(f"duplicate shared access rule {rule.name!r}")
            self._rules[folded] = rule

    @property
    def rules(self) -> tuple[SharedAccessRule, ...]:
        return tuple(self._rules.values())

    def rule(self, name: str) -> SharedAccessRule | None:
        return self._rules.get(name.lower())

    # ------------------------------------------------------------------ tokens

    def validate(self, token: str | bytes, audience: str, now: float) -> Grant:
        """Accept a CBS ``put-token`` for ``audience`` or raise ``AuthorizationError``.

        The signature is checked before expiry and audience so that nothing about a
        token that was not signed with a known key is trusted.
        """
        parsed = parse_sas_token(token)
        rule = self.rule(parsed.key_name)
        if rule is None:
            raise AuthorizationError(
                description=f"Unknown shared access rule {parsed.key_name!r} (skn) in SAS token."
            )
        if not self._signature_matches(rule, parsed):
            raise AuthorizationError(
                description=f"Invalid SAS token signature for rule {rule.name!r}."
            )
        if parsed.expiry <= now:
            raise AuthorizationError(
                description=f"SAS token expired at {parsed.expiry} (now {int(now)})."
            )
        resource = normalize_resource(parsed.resource)
        if not _covers(resource, normalize_resource(audience)):
            raise AuthorizationError(
                description=(
                    f"SAS token for {parsed.resource!r} does not cover the audience {audience!r}."
                )
            )
        return Grant(
            rule=rule.name,
            rights=rule.rights,
            expires_at=float(parsed.expiry),
            resource=resource,
            scope=_entity_scope(resource),
        )

    @staticmethod
    def _signature_matches(rule: SharedAccessRule, parsed: SasToken) -> bool:
        # The signed resource is the encoded sr exactly as sent (that is what .NET and Python
        # sign); re-encoding covers clients that send sr less encoded than they signed it.
        signed_resources = dict.fromkeys((parsed.raw_resource, quote_plus(parsed.resource)))
        offered: list[bytes] = []
        raw = parsed.raw_signature
        for text in dict.fromkeys((unquote_plus(raw), unquote(raw))):
            try:
                offered.append(base64.b64decode(text, validate=True))
            except (binascii.Error, ValueError):
                continue
        matched = False
        for resource in signed_resources:
            expected = sign(rule.key, f"{resource}\n{parsed.raw_expiry}")
            for signature in offered:
                matched |= hmac.compare_digest(expected, signature)
        return matched

    # ------------------------------------------------------------------ claims

    def check(self, grant: Grant, right: str, entity: str) -> None:
        """Raise ``AuthorizationError`` unless ``grant`` holds ``right`` over ``entity``."""
        if right not in RIGHTS:
            raise ValueError(f"unknown right {right!r}; expected Send, Listen or Manage")
        if not grant.covers(entity):
            raise AuthorizationError(
                description=(
                    f"Unauthorized access. The token for {grant.resource!r} does not cover "
                    f"{entity!r}."
                )
            )
        if not grant.allows(right):
            raise AuthorizationError(
                description=(
                    f"Unauthorized access. {right} claim required for {entity!r}; rule "
                    f"{grant.rule!r} grants {_describe_rights(grant.rights)}."
                )
            )

    # ------------------------------------------------------------------ SASL PLAIN

    def authenticate_plain(self, username: str, password: str) -> bool:
        """SASL PLAIN: the username names a rule, the password is its key."""
        rule = self.rule(username)
        key = rule.key if rule is not None else "\0" * max(len(password), 1)
        matches = hmac.compare_digest(password.encode("utf-8"), key.encode("utf-8"))
        return rule is not None and matches

    def grant_for_rule(self, name: str | None) -> Grant | None:
        """The namespace-wide, non-expiring grant a PLAIN login as ``name`` carries."""
        rule = self.rule(name) if name else None
        if rule is None:
            return None
        return Grant(rule=rule.name, rights=rule.rights, expires_at=None, resource=None)
