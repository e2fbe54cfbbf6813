"""The management REST API: routes, SAS checks, and the broker calls behind each operation.

Paths, verbs and replies follow Service Bus (as ``ServiceBusAdministrationClient`` uses them):

* ``GET /$namespaceinfo``; ``GET /$Resources/{Queues|Topics}?$skip&$top`` (feeds);
* ``GET|PUT|DELETE /{queue-or-topic}``; ``GET /{topic}/Subscriptions`` (feed);
* ``GET|PUT|DELETE /{topic}/Subscriptions/{name}``; ``GET .../Rules`` (feed);
* ``GET|PUT|DELETE .../Rules/{name}``.

A PUT without ``If-Match`` creates (409 when the entity exists); with ``If-Match`` it updates
(404 when it does not; 412 when the ETag named is not the entity's current one). A GET of a
queue or topic that does not exist answers 200 with an empty feed, as Service Bus does; the
SDKs turn that into "not found". Every call needs a SAS token with the Manage claim over the
entity in ``Authorization``; a ForwardTo target the token does not cover needs a Send token
in ``ServiceBusSupplementaryAuthorization`` (``ServiceBusDlqSupplementaryAuthorization``).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote

from ..auth import MANAGE, SEND, AuthorizationError, Grant, normalize_resource, parse_sas_token
from ..config import validate_entity_name
from ..entity_records import QUEUE, SUBSCRIPTION, TOPIC
from ..httpapi import Request, Response
from ..queue import Queue
from ..registry import Entity, last_use
from ..rules import (
    CORRELATION_FIELDS,
    DEFAULT_RULE_NAME,
    RuleError,
    RuleSpec,
    compile_rule,
    dump_rules,
)
from ..server import Broker
from ..topic import SUBSCRIPTIONS, Subscription, Topic
from . import atom
from .properties import (
    LAYOUT,
    READ_ONLY,
    Description,
    PropertyError,
    check_update,
    defaults,
    description_of,
    dump_extra,
    load_extra,
    parse_value,
    settings_of,
)

log = logging.getLogger("replication.broker.admin")

MAX_BODY = 256 * 1024
"""Larger request bodies are refused with 413 before they are parsed."""
MAX_PAGE = 100
"""Service Bus returns at most 100 entries per page, whatever ``$top`` asks for."""
MAX_SUBSCRIPTION_NAME = 50
MAX_RULE_NAME = 50
MAX_SQL_EXPRESSION = 1024
_SIMPLE_NAME = re.compile(r"[A-Za-z0-9._-]+")
SUPPLEMENTARY = "ServiceBusSupplementaryAuthorization"
DLQ_SUPPLEMENTARY = "ServiceBusDlqSupplementaryAuthorization"
DESCRIPTION_TAGS = {
    QUEUE: "QueueDescription",
    TOPIC: "TopicDescription",
    SUBSCRIPTION: "SubscriptionDescription",
}
CORRELATION_XML = {
    "CorrelationId": "correlation_id",
    "MessageId": "message_id",
    "To": "to",
    "ReplyTo": "reply_to",
    "Label": "subject",
    "SessionId": "session_id",
    "ReplyToSessionId": "reply_to_session_id",
    "ContentType": "content_type",
}
assert set(CORRELATION_XML.values()) == set(CORRELATION_FIELDS)


class ApiError(Exception):
    """An error reply: HTTP status and the detail Service Bus would write."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def _bad_request(detail: str) -> ApiError:
    return ApiError(400, detail)


def _not_found(what: str) -> ApiError:
    return ApiError(404, f"The messaging entity '{what}' could not be found.")


def _conflict(what: str) -> ApiError:
    return ApiError(409, f"The messaging entity '{what}' already exists.")


@dataclasses.dataclass(frozen=True, slots=True)
class Route:
    """What a path names: a namespace resource, or an entity, subscription or rule."""

    kind: str
    """namespace, list-queues, list-topics, entity, list-subs, sub, list-rules, rule."""
    entity: str = ""
    subscription: str = ""
    rule: str = ""

    @property
    def auth_path(self) -> str:
        """The entity (or subscription) the request acts on, as error messages name it."""
        if self.subscription:
            return f"{self.entity}{SUBSCRIPTIONS}{self.subscription}"
        return self.entity


def route(path: str) -> Route:
    # Names arrive URL-encoded (the Python SDK sends '/' inside a name as %2F): decode each
    # segment, then split again, so both spellings of a nested name mean the same thing.
    parts = "/".join(unquote(s) for s in path.strip("/").split("/")).split("/")
    if parts == [""]:
        raise _not_found("/")
    head = parts[0].lower()
    if head == "$namespaceinfo" and len(parts) == 1:
        return Route("namespace")
    if head == "$resources":
        if len(parts) == 2 and parts[1].lower() in ("queues", "topics"):
            return Route(f"list-{parts[1].lower()}")
        raise _not_found("/".join(parts))
    lowered = [p.lower() for p in parts]
    if "subscriptions" not in lowered[1:]:
        return Route("entity", "/".join(parts))
    at = lowered.index("subscriptions", 1)
    topic, rest = "/".join(parts[:at]), parts[at + 1 :]
    if not rest:
        return Route("list-subs", topic)
    if len(rest) == 1:
        return Route("sub", topic, rest[0])
    if rest[1].lower() == "rules" and len(rest) == 2:
        return Route("list-rules", topic, rest[0])
    if rest[1].lower() == "rules" and len(rest) == 3:
        return Route("rule", topic, rest[0], rest[2])
    raise _not_found("/".join(parts))


class AdminApi:
    """``AdminApi(broker).handle`` answers management requests for one broker; it runs on
    the broker's event loop (the broker is single-threaded)."""

    def __init__(self, broker: Broker, *, namespace: str = "sbemulatorns") -> None:
        self.broker = broker
        self.namespace = namespace
        self.started_ms = broker.now_ms()

    async def handle(self, request: Request) -> Response:
        try:
            return self._handle(request)
        except ApiError as exc:
            return self._error(exc.status, exc.detail)
        except atom.XmlError as exc:
            return self._error(400, str(exc))
        except Exception:
            log.exception("management request %s %s failed", request.method, request.target)
            return self._error(500, "The server was unable to process the request.")

    # ------------------------------------------------------------------ dispatch

    def _handle(self, request: Request) -> Response:
        if len(request.body) > MAX_BODY:
            raise ApiError(
                413,
                (
                    f"The request body is {len(request.body)} bytes; at most {MAX_BODY} are "
                    "accepted."
                ),
            )
        target = route(request.path)
        grant = self._authorize(request)
        method = request.method.upper()
        handlers: dict[tuple[str, str], Callable[[Request, Route, Grant], Response]] = {
            ("namespace", "GET"): self._namespace_info,
            ("list-queues", "GET"): self._list_entities,
            ("list-topics", "GET"): self._list_entities,
            ("entity", "GET"): self._get_entity,
            ("entity", "PUT"): self._put_entity,
            ("entity", "DELETE"): self._delete_entity,
            ("list-subs", "GET"): self._list_subscriptions,
            ("sub", "GET"): self._get_subscription,
            ("sub", "PUT"): self._put_subscription,
            ("sub", "DELETE"): self._delete_subscription,
            ("list-rules", "GET"): self._list_rules,
            ("rule", "GET"): self._get_rule,
            ("rule", "PUT"): self._put_rule,
            ("rule", "DELETE"): self._delete_rule,
        }
        handler = handlers.get((target.kind, method))
        if handler is None:
            allowed = sorted(m for (kind, m) in handlers if kind == target.kind)
            return Response(
                405,
                {"allow": ", ".join(allowed)},
                atom.error(405, f"The method {method} is not allowed on this resource."),
            )
        return handler(request, target, grant)

    # ------------------------------------------------------------------ authorization

    def _authorize(self, request: Request) -> Grant:
        """Manage over the resource asked for, as Service Bus checks it: the token's resource
        must cover the request's path (the JavaScript client signs each request's own URL, a
        rule's rather than its subscription's; a namespace or entity token covers it too)."""
        token = request.headers.get("authorization")
        if not token:
            raise ApiError(401, "MissingToken: The authorization header was not provided.")
        requested = "/".join(unquote(s) for s in request.path.strip("/").split("/"))
        return self._grant(token, requested, MANAGE)

    def _grant(self, token: str, path: str, right: str) -> Grant:
        authorizer = self.broker.authorizer
        try:
            # The audience is the token's own host plus the path: entities match by path,
            # never by host (a client may say localhost where the token says 127.0.0.1).
            host = normalize_resource(parse_sas_token(token).resource).partition("/")[0]
            audience = f"{host}/{path}".rstrip("/")
            grant = authorizer.validate(token, audience, self.broker.clock.time())
            authorizer.check(grant, right, path)
        except AuthorizationError as exc:
            raise ApiError(401, exc.description) from None
        return grant

    def _check_forwarding(self, request: Request, grant: Grant, description: Description) -> None:
        """Forwarding sends into another entity: the caller needs Send on it."""
        for name, header in (
            ("ForwardTo", SUPPLEMENTARY),
            ("ForwardDeadLetteredMessagesTo", DLQ_SUPPLEMENTARY),
        ):
            target = description.get(name)
            if target is None:
                continue
            if target.lower() not in self.broker.registry.sendable:
                raise _bad_request(f"{name}: the queue or topic '{target}' does not exist.")
            if grant.covers(target):
                continue
            token = request.headers.get(header.lower())
            if not token:
                raise ApiError(
                    401,
                    (
                        f"{name}: the token does not cover '{target}'; send a token with the Send "
                        f"claim for it in the {header} header."
                    ),
                )
            self._grant(token, target, SEND)

    # ------------------------------------------------------------------ namespace

    def _namespace_info(self, request: Request, target: Route, grant: Grant) -> Response:
        created = min(
            (r.created_ms for r in self.broker.registry.managed.values()), default=self.started_ms
        )
        updated = max(
            (r.updated_ms for r in self.broker.registry.managed.values()), default=created
        )
        body = atom.Xml()
        body.add("CreatedTime", atom.format_time(created))
        body.add("MessagingSKU", "Standard")
        body.add("ModifiedTime", atom.format_time(updated))
        body.add("Name", self.namespace)
        body.add("NamespaceType", "Messaging")
        content = atom.description("NamespaceInfo", body.text())
        now = atom.format_time(self._now())
        xml = atom.entry(
            self._url(request, "$namespaceinfo"), self.namespace, content, now, now, self.namespace
        )
        return self._ok(200, xml)

    # ------------------------------------------------------------------ queues and topics

    def _list_entities(self, request: Request, target: Route, grant: Grant) -> Response:
        wanted = Queue if target.kind == "list-queues" else Topic
        names = sorted(
            (
                e.name
                for key, e in self.broker.registry.entities.items()
                if key in self.broker.registry.sendable and isinstance(e, wanted)
            ),
            key=str.lower,
        )
        title = "Queues" if wanted is Queue else "Topics"
        return self._feed(request, f"$Resources/{title}", title, names, self._entity_entry)

    def _get_entity(self, request: Request, target: Route, grant: Grant) -> Response:
        entity = self._sendable(target.entity)
        if entity is None:  # Service Bus answers an empty feed, not 404
            now = atom.format_time(self._now())
            url = self._url(request, target.entity)
            return self._ok(200, atom.feed(url, "Publicly Listed Services", [], None, now))
        return self._ok(200, self._entity_entry(request, entity.name), self._etag(entity.name))

    def _put_entity(self, request: Request, target: Route, grant: Grant) -> Response:
        element = atom.parse_description(request.body, ("QueueDescription", "TopicDescription"))
        kind = QUEUE if atom.local(element.tag) == "QueueDescription" else TOPIC
        existing = self._sendable(target.entity)
        if not self._is_update(request):
            if existing is not None:
                raise _conflict(target.entity)
            try:
                validate_entity_name(target.entity)
            except ValueError as exc:
                raise _bad_request(f"Invalid entity name: {exc}") from None
            description = self._read(kind, element, defaults(kind))
            self._check_forwarding(request, grant, description)
            self._check_self_forward(target.entity, description)
            entity = self.broker.create_entity(
                kind, target.entity, settings_of(kind, description), dump_extra(description)
            )
            return self._ok(201, self._entity_entry(request, entity.name), self._etag(entity.name))
        if existing is None:
            raise _not_found(target.entity)
        self._check_etag(request, existing.name)
        current_kind = TOPIC if isinstance(existing, Topic) else QUEUE
        if kind != current_kind:
            raise _bad_request(
                f"'{existing.name}' is a {current_kind}; send a {DESCRIPTION_TAGS[current_kind]}."
            )
        self._update(request, grant, kind, existing.name, element)
        return self._ok(200, self._entity_entry(request, existing.name), self._etag(existing.name))

    def _delete_entity(self, request: Request, target: Route, grant: Grant) -> Response:
        entity = self._sendable(target.entity)
        if entity is None:
            raise _not_found(target.entity)
        self.broker.delete_entity(entity.name)
        return Response(200, {}, b"")

    # ------------------------------------------------------------------ subscriptions

    def _topic(self, name: str) -> Topic:
        topic = self.broker.registry.topics.get(name.lower())
        if topic is None:
            raise _not_found(name)
        return topic

    def _subscription(self, target: Route) -> Subscription:
        topic = self._topic(target.entity)
        subscription = topic.subscriptions.get(target.subscription.lower())
        if subscription is None:
            raise _not_found(target.auth_path)
        return subscription

    def _list_subscriptions(self, request: Request, target: Route, grant: Grant) -> Response:
        topic = self._topic(target.entity)
        names = sorted((s.queue.name for s in topic.subscriptions.values()), key=str.lower)
        return self._feed(
            request, f"{topic.name}/Subscriptions", "Subscriptions", names, self._entity_entry
        )

    def _get_subscription(self, request: Request, target: Route, grant: Grant) -> Response:
        path = self._subscription(target).queue.name
        return self._ok(200, self._entity_entry(request, path), self._etag(path))

    def _put_subscription(self, request: Request, target: Route, grant: Grant) -> Response:
        element = atom.parse_description(request.body, ("SubscriptionDescription",))
        topic = self._topic(target.entity)
        existing = topic.subscriptions.get(target.subscription.lower())
        if not self._is_update(request):
            if existing is not None:
                raise _conflict(target.auth_path)
            self._check_simple_name("subscription", target.subscription, MAX_SUBSCRIPTION_NAME)
            description = self._read(SUBSCRIPTION, element, defaults(SUBSCRIPTION))
            self._check_forwarding(request, grant, description)
            rules = [RuleSpec(DEFAULT_RULE_NAME, "true")]
            default_rule = atom.elements(element).get("DefaultRuleDescription")
            if default_rule is not None:
                rules = [self._read_rule(default_rule, None)]
            path = topic.subscription_path(target.subscription)
            self.broker.create_entity(
                SUBSCRIPTION,
                path,
                settings_of(SUBSCRIPTION, description),
                dump_extra(description),
                rules,
            )
            return self._ok(201, self._entity_entry(request, path), self._etag(path))
        if existing is None:
            raise _not_found(target.auth_path)
        path = existing.queue.name
        self._check_etag(request, path)
        self._update(request, grant, SUBSCRIPTION, path, element)
        return self._ok(200, self._entity_entry(request, path), self._etag(path))

    def _delete_subscription(self, request: Request, target: Route, grant: Grant) -> Response:
        self.broker.delete_entity(self._subscription(target).queue.name)
        return Response(200, {}, b"")

    # ------------------------------------------------------------------ rules

    def _list_rules(self, request: Request, target: Route, grant: Grant) -> Response:
        subscription = self._subscription(target)
        names = [spec.name for spec in subscription.rules.specs]
        path = subscription.queue.name

        def rule_entry(request: Request, name: str) -> str:
            return self._rule_entry(request, subscription, name)

        return self._feed(request, f"{path}/Rules", "Rules", names, rule_entry)

    def _find_rule(self, subscription: Subscription, name: str) -> int | None:
        for index, spec in enumerate(subscription.rules.specs):
            if spec.name.lower() == name.lower():
                return index
        return None

    def _get_rule(self, request: Request, target: Route, grant: Grant) -> Response:
        subscription = self._subscription(target)
        if self._find_rule(subscription, target.rule) is None:
            raise _not_found(f"{subscription.queue.name}/Rules/{target.rule}")
        xml = self._rule_entry(request, subscription, target.rule)
        return self._ok(200, xml, self._rule_etag(subscription, target.rule))

    def _put_rule(self, request: Request, target: Route, grant: Grant) -> Response:
        element = atom.parse_description(request.body, ("RuleDescription",))
        subscription = self._subscription(target)
        spec = self._read_rule(element, target.rule)
        index = self._find_rule(subscription, target.rule)
        rules = subscription.rules
        try:
            compiled = compile_rule(spec)
        except RuleError as exc:
            raise _bad_request(str(exc)) from None
        if not self._is_update(request):
            if index is not None:
                raise _conflict(f"{subscription.queue.name}/Rules/{target.rule}")
            self._check_simple_name("rule", target.rule, MAX_RULE_NAME, DEFAULT_RULE_NAME)
            rules.rules.append(compiled)
            status = 201
        else:
            if index is None:
                raise _not_found(f"{subscription.queue.name}/Rules/{target.rule}")
            if not self._etag_matches(request, self._rule_etag(subscription, target.rule)):
                raise ApiError(412, "The entity has been modified since the ETag given.")
            rules.rules[index] = compiled
            status = 200
        self.broker.registry.save_rules(subscription)
        self.broker.store.commit()
        xml = self._rule_entry(request, subscription, spec.name)
        return self._ok(status, xml, self._rule_etag(subscription, spec.name))

    def _delete_rule(self, request: Request, target: Route, grant: Grant) -> Response:
        subscription = self._subscription(target)
        try:
            subscription.rules.remove(target.rule)
        except KeyError:
            raise _not_found(f"{subscription.queue.name}/Rules/{target.rule}") from None
        self.broker.registry.save_rules(subscription)
        self.broker.store.commit()
        return Response(200, {}, b"")

    def _read_rule(self, element: Any, name: str | None) -> RuleSpec:
        """A ``RuleDescription`` (or ``DefaultRuleDescription``) as a rule record."""
        found = atom.elements(element)
        unknown = set(found) - {"Filter", "Action", "Name", "CreatedAt"}
        if unknown:
            raise _bad_request(f"{', '.join(sorted(unknown))} is not a property of a rule")
        body_name = found["Name"].text if "Name" in found else None
        if name is None:
            name = body_name or DEFAULT_RULE_NAME
        elif body_name and body_name.lower() != name.lower():
            raise _bad_request(f"The rule name in the body ({body_name!r}) is not {name!r}.")
        action, action_parameters = self._read_action(found.get("Action"))
        rule_filter = found.get("Filter")
        if rule_filter is None:
            return RuleSpec(name, "true", action=action, action_parameters=action_parameters)
        kind = atom.xsi_type(rule_filter)
        parts = atom.elements(rule_filter)
        if kind in ("SqlFilter", "TrueFilter", "FalseFilter"):
            parameters = self._parameters(parts)
            sql = (parts["SqlExpression"].text or "") if "SqlExpression" in parts else ""
            if kind == "TrueFilter" or sql.replace(" ", "") == "1=1":
                return RuleSpec(name, "true", action=action, action_parameters=action_parameters)
            if kind == "FalseFilter" or sql.replace(" ", "") == "1=0":
                return RuleSpec(name, "false", action=action, action_parameters=action_parameters)
            if not sql.strip():
                raise _bad_request("A SqlFilter needs a SqlExpression.")
            if len(sql) > MAX_SQL_EXPRESSION:
                raise _bad_request(f"The SqlExpression is longer than {MAX_SQL_EXPRESSION}.")
            return RuleSpec(
                name,
                "sql",
                sql=sql,
                action=action,
                sql_parameters=parameters,
                action_parameters=action_parameters,
            )
        if kind == "CorrelationFilter":
            correlation: dict[str, Any] = {}
            for xml_name, child in parts.items():
                if xml_name == "Properties":
                    try:
                        properties = atom.key_values(child)
                    except atom.XmlError as exc:
                        raise _bad_request(str(exc)) from None
                    if properties:
                        correlation["properties"] = properties
                elif xml_name in CORRELATION_XML:
                    if child.text:
                        correlation[CORRELATION_XML[xml_name]] = child.text
                else:
                    raise _bad_request(f"{xml_name} is not a property of a CorrelationFilter")
            if not correlation:
                raise _bad_request("A CorrelationFilter must set at least one property.")
            return RuleSpec(
                name,
                "correlation",
                correlation=correlation,
                action=action,
                action_parameters=action_parameters,
            )
        raise _bad_request(
            f"Unknown filter type {kind!r} (SqlFilter, CorrelationFilter, "
            "TrueFilter or FalseFilter)."
        )

    def _read_action(self, element: Any) -> tuple[str | None, dict[str, Any]]:
        """A rule's ``Action``: its SQL text (None for EmptyRuleAction) and parameters."""
        if element is None or atom.xsi_type(element) in (None, "EmptyRuleAction"):
            return None, {}
        if atom.xsi_type(element) != "SqlRuleAction":
            raise _bad_request(f"Unknown action type {atom.xsi_type(element)!r}.")
        parts = atom.elements(element)
        parameters = self._parameters(parts)
        sql = (parts["SqlExpression"].text or "") if "SqlExpression" in parts else ""
        if not sql.strip():
            raise _bad_request("A SqlRuleAction needs a SqlExpression.")
        return sql, parameters

    @staticmethod
    def _parameters(parts: dict[str, Any]) -> dict[str, Any]:
        """A SqlFilter's or SqlRuleAction's ``<Parameters>`` (``@name`` values), typed."""
        try:
            return atom.key_values(parts.get("Parameters"))
        except atom.XmlError as exc:
            raise _bad_request(f"Parameters: {exc}") from None

    def _rule_entry(self, request: Request, subscription: Subscription, name: str) -> str:
        index = self._find_rule(subscription, name)
        assert index is not None
        spec = subscription.rules.specs[index]
        record = self.broker.registry.entity_record(subscription.queue.name)
        created = record.created_ms if record else self.started_ms
        body = atom.Xml()
        body.raw(rule_xml(spec))
        body.add("CreatedAt", atom.format_time(created))
        body.add("Name", spec.name)
        content = atom.description("RuleDescription", body.text())
        stamp = atom.format_time(created)
        url = self._url(request, f"{subscription.queue.name}/Rules/{spec.name}")
        return atom.entry(url, spec.name, content, stamp, stamp, self.namespace)

    # ------------------------------------------------------------------ descriptions

    def _read(self, kind: str, element: Any, base: Description) -> Description:
        values = dict(base)
        for name, child in atom.elements(element).items():
            if name in READ_ONLY[kind]:
                continue
            try:
                values[name] = parse_value(kind, name, child.text or "", base.get(name))
            except PropertyError as exc:
                raise _bad_request(str(exc)) from None
        return values

    def _update(self, request: Request, grant: Grant, kind: str, path: str, element: Any) -> None:
        current = self._description(kind, path)
        description = self._read(kind, element, current)
        try:
            check_update(kind, current, description)
        except PropertyError as exc:
            raise _bad_request(str(exc)) from None
        self._check_forwarding(request, grant, description)
        self._check_self_forward(path, description)
        self.broker.update_entity(path, settings_of(kind, description), dump_extra(description))

    @staticmethod
    def _check_self_forward(path: str, description: Description) -> None:
        for name in ("ForwardTo", "ForwardDeadLetteredMessagesTo"):
            target = description.get(name)
            if target is not None and target.lower() == path.lower():
                raise _bad_request(f"{name}: an entity cannot forward to itself.")

    def _description(self, kind: str, path: str) -> Description:
        entity = self.broker.registry.entities[path.lower()]
        record = self.broker.registry.entity_record(path)
        extra = load_extra(record.description if record else None)
        return description_of(kind, entity.settings, extra)

    def _entity_entry(self, request: Request, path: str) -> str:
        entity = self.broker.registry.entities[path.lower()]
        if isinstance(entity, Topic):
            kind = TOPIC
        else:
            kind = SUBSCRIPTION if path.lower() in self.broker.registry.subscriptions else QUEUE
        description = self._description(kind, path)
        record = self.broker.registry.entity_record(path)
        created = record.created_ms if record else self.started_ms
        updated = record.updated_ms if record else created
        active, dead, scheduled, deferred, size = self._runtime(entity)
        computed: dict[str, Any] = {
            "SizeInBytes": size,
            "MessageCount": active + dead + scheduled,
            "CreatedAt": atom.format_time(created),
            "UpdatedAt": atom.format_time(updated),
            "AccessedAt": atom.format_time(max(updated, last_use(entity))),
            "EntityAvailabilityStatus": "Available",
        }
        if isinstance(entity, Topic):
            specs = [r for s in entity.subscriptions.values() for r in s.rules.specs]
            computed["SubscriptionCount"] = len(entity.subscriptions)
            computed["SqlFilterCount"] = sum(r.kind != "correlation" for r in specs)
            computed["CorrelationFilterCount"] = sum(r.kind == "correlation" for r in specs)
        body = atom.Xml()
        for name in LAYOUT[kind]:
            if name == "CountDetails":
                body.raw(atom.count_details(active, dead, scheduled, deferred))
            elif name == "AuthorizationRules":
                body.raw("<AuthorizationRules/>")
            elif name in computed:
                body.add(name, computed[name])
            else:
                value = description.get(name)
                if value is not None and name in ("ForwardTo", "ForwardDeadLetteredMessagesTo"):
                    value = f"sb://{self._host(request)}/{value}"
                if value is None and name in ("DefaultMessageTimeToLive", "AutoDeleteOnIdle"):
                    value = atom.UNLIMITED
                body.add(name, value)
        content = atom.description(DESCRIPTION_TAGS[kind], body.text())
        title = path.partition(SUBSCRIPTIONS)[2] if kind == SUBSCRIPTION else entity.name
        return atom.entry(
            self._url(request, path),
            title,
            content,
            atom.format_time(created),
            atom.format_time(updated),
            self.namespace,
        )

    def _runtime(self, entity: Entity) -> tuple[int, int, int, int, int]:
        """(active, dead-lettered, scheduled, deferred, size in bytes) from the store."""
        store = self.broker.store
        if isinstance(entity, Topic):
            stats = store.stats(entity.entity)
            size = stats.size + sum(
                store.stats(s.queue.entity).size for s in entity.subscriptions.values()
            )
            return 0, 0, stats.scheduled, 0, size
        stats = store.stats(entity.entity)
        dead = store.stats(entity.dead_letter.entity) if entity.dead_letter else None
        dead_count = dead.active + dead.scheduled if dead else 0
        size = stats.size + (dead.size if dead else 0)
        return stats.active, dead_count, stats.scheduled, stats.deferred, size

    # ------------------------------------------------------------------ helpers

    def _sendable(self, name: str) -> Entity | None:
        key = name.lower()
        return (
            self.broker.registry.entities.get(key) if key in self.broker.registry.sendable else None
        )

    @staticmethod
    def _is_update(request: Request) -> bool:
        return "if-match" in request.headers

    def _etag(self, path: str) -> str:
        record = self.broker.registry.entity_record(path)
        return f'"{record.updated_ms if record else self.started_ms}"'

    def _rule_etag(self, subscription: Subscription, name: str) -> str:
        index = self._find_rule(subscription, name)
        spec = subscription.rules.specs[index] if index is not None else None
        return f'"{abs(hash(dump_rules([spec]))) if spec else 0:x}"'

    @staticmethod
    def _etag_matches(request: Request, etag: str) -> bool:
        wanted = [tag.strip() for tag in request.headers.get("if-match", "*").split(",")]
        return "*" in wanted or etag in wanted or etag.strip('"') in wanted

    def _check_etag(self, request: Request, path: str) -> None:
        if not self._etag_matches(request, self._etag(path)):
            raise ApiError(
                412, (f"The entity '{path}' has been modified since the ETag given in If-Match.")
            )

    @staticmethod
    def _check_simple_name(kind: str, name: str, limit: int, reserved: str | None = None) -> None:
        if name == reserved:
            return
        if not name or len(name) > limit or not _SIMPLE_NAME.fullmatch(name):
            raise _bad_request(
                f"Invalid {kind} name {name!r}: 1 to {limit} letters, digits, '.', '-' or '_'."
            )

    def _feed(
        self,
        request: Request,
        path: str,
        title: str,
        names: list[str],
        render: Callable[[Request, str], str],
    ) -> Response:
        query = request.query
        try:
            skip = int(query.get("$skip", "0"))
            top = int(query.get("$top", str(MAX_PAGE)))
        except ValueError:
            raise _bad_request("$skip and $top must be integers.") from None
        if skip < 0 or top < 0:
            raise _bad_request("$skip and $top must not be negative.")
        top = min(top, MAX_PAGE)
        page = names[skip : skip + top]
        next_url = None
        if skip + top < len(names) and top > 0:
            next_url = self._url(request, path, f"$skip={skip + top}&$top={top}&")
        entries = [render(request, name) for name in page]
        now = atom.format_time(self._now())
        return self._ok(
            200, atom.feed(self._url(request, path), title, entries, next_url, now), feed=True
        )

    def _host(self, request: Request) -> str:
        return request.headers.get("host") or "localhost"

    def _url(self, request: Request, path: str, query: str = "") -> str:
        version = request.query.get("api-version", "2021-05")
        return (
            f"https://{self._host(request)}/{quote(path, safe='/$')}?{query}"
            f"api-version={quote(version)}"
        )

    def _now(self) -> int:
        return self.broker.now_ms()

    @staticmethod
    def _ok(status: int, xml: str, etag: str | None = None, *, feed: bool = False) -> Response:
        headers = {"content-type": atom.FEED_CONTENT_TYPE if feed else atom.CONTENT_TYPE}
        if etag is not None:
            headers["etag"] = etag
        return Response(status, headers, xml.encode())

    @staticmethod
    def _error(status: int, detail: str) -> Response:
        return Response(
            status, {"content-type": "application/xml; charset=utf-8"}, atom.error(status, detail)
        )


def _parameters_xml(parameters: dict[str, Any]) -> str:
    return atom.key_value_list("Parameters", parameters) if parameters else ""


def rule_xml(spec: RuleSpec) -> str:
    """A rule's ``Filter`` and ``Action`` elements as Service Bus writes them (and reads
    them back: the dashboard sends rules in this form)."""
    if spec.kind in ("true", "false", "sql"):
        kind = {"true": "TrueFilter", "false": "FalseFilter", "sql": "SqlFilter"}[spec.kind]
        sql = {"true": "1=1", "false": "1=0"}.get(spec.kind, spec.sql or "")
        parameters = spec.sql_parameters if spec.kind == "sql" else {}
        rule_filter = (
            f'<Filter i:type="{kind}"><SqlExpression>{atom.escape(sql)}</SqlExpression>'
            f"<CompatibilityLevel>20</CompatibilityLevel>{_parameters_xml(parameters)}</Filter>"
        )
    else:
        body = atom.Xml()
        for xml_name, attribute in CORRELATION_XML.items():
            body.add(xml_name, spec.correlation.get(attribute))
        body.raw(atom.key_value_list("Properties", dict(spec.correlation.get("properties") or {})))
        rule_filter = f'<Filter i:type="CorrelationFilter">{body.text()}</Filter>'
    if not spec.action:
        return rule_filter + '<Action i:type="EmptyRuleAction"/>'
    return (
        f'{rule_filter}<Action i:type="SqlRuleAction"><SqlExpression>'
        f"{atom.escape(spec.action)}</SqlExpression><CompatibilityLevel>20</CompatibilityLevel>"
        f"{_parameters_xml(spec.action_parameters)}</Action>"
    )
