"""The dashboard's entity endpoints: an entity's settings and rules, and creating, changing
and deleting queues, topics, subscriptions and rules through the management API.

* ``GET /$dashboard/api/entity?namespace=&entity=``: every setting, the counts, the ETag, a
  subscription's rules, and the edit form (``entity_form.schema``);
* ``GET .../entity-form?namespace=&kind=``: the form of a new queue, topic or subscription;
* ``POST .../entity/{create|update|delete}`` and ``.../rule/{create|update|delete}``.

The page asks every mutation twice: with ``"check": true`` the form is checked as the
service would check it (``entity_form``) and the answer says what would be done (``plan``)
while nothing is sent; the page shows that sentence, and only once the person confirms does
it ask again without ``check`` (which checks again). A delete needs the name typed back
(``confirm``), as a purge does. Every route needs Manage over the entity: the management
API's own right (``manage``, checked off loopback).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..broker.admin.api import CORRELATION_XML
from ..broker.admin.properties import defaults
from ..broker.entity_records import QUEUE, SUBSCRIPTION, TOPIC
from ..broker.rules import RuleSpec
from ..broker.topic import SUBSCRIPTIONS
from . import entity_form
from .entities import literal
from .entity_admin import EntityAdmin, description
from .entity_form import FormError
from .namespace import DashboardError, Namespace

ROUTES = (
    "entity",
    "entity-form",
    "entity/create",
    "entity/update",
    "entity/delete",
    "rule/create",
    "rule/update",
    "rule/delete",
)
READS = ("entity", "entity-form")
STATUS_MEANING = {
    "Active": "sends and receives",
    "Disabled": "no sends, no receives",
    "SendDisabled": "receives only",
    "ReceiveDisabled": "sends only",
}


def label(kind: str, path: str, namespace: Namespace) -> str:
    """How a sentence names an entity: ``queue 'work' in ns``."""
    if kind == SUBSCRIPTION:
        topic, _, name = path.partition(SUBSCRIPTIONS)
        return f"subscription '{name}' of topic '{topic}' in {namespace.name}"
    return f"{kind} '{path}' in {namespace.name}"


def filter_text(spec: RuleSpec) -> str:
    if spec.kind == "sql":
        return spec.sql or ""
    names = {attribute: xml_name for xml_name, attribute in CORRELATION_XML.items()}
    values = {names[k]: v for k, v in spec.correlation.items() if k != "properties"}
    values.update(spec.correlation.get("properties") or {})
    return "correlation " + " AND ".join(f"{k} = {literal(v)}" for k, v in values.items())


async def answer(
    route: str,
    namespace: Namespace,
    entity: str,
    query: dict[str, str],
    body: dict[str, Any],
    manage: Callable[[str], None],
) -> dict[str, Any]:
    """The answer to one of ``ROUTES``; ``manage(path)`` raises unless the caller may manage
    ``path``. A check that finds the form wrong answers what is wrong (``refused`` and its
    ``field``): the question was answered; the change itself is refused with a 400."""
    try:
        return await _answer(route, namespace, entity, query, body, manage)
    except FormError as exc:
        if not body.get("check"):
            raise
        return {"refused": str(exc), "field": exc.field}


async def _answer(
    route: str,
    namespace: Namespace,
    entity: str,
    query: dict[str, str],
    body: dict[str, Any],
    manage: Callable[[str], None],
) -> dict[str, Any]:
    admin = EntityAdmin(namespace.app, namespace.token)
    if route == "entity-form":
        manage("")
        kind = entity_form.check_kind(query.get("kind"))
        return {"kind": kind, "fields": entity_form.schema(kind, defaults(kind), False)}
    if route == "entity/create":
        return await _create(admin, namespace, body, manage)
    if not entity:
        raise DashboardError("entity: which entity")
    manage(entity)
    found = await admin.read(entity)
    if found is None:
        raise DashboardError(f"no entity {entity!r} in {namespace.name}", 404)
    kind, path = found["kind"], entity
    if route == "entity":
        current = description(kind, found["settings"])
        return {**found, "fields": entity_form.schema(kind, current, True)}
    what = label(kind, path, namespace)
    check = bool(body.get("check"))
    if route == "entity/update":
        old = description(kind, found["settings"])
        new = entity_form.settings(kind, body.get("settings"), old)
        entity_form.check_changes(kind, old, new)
        await _check_forwards(admin, path, old, new)
        changed = entity_form.changes(old, new)
        if not changed:
            raise FormError("settings", f"nothing to change on {what}")
        if "Status" in body.get("settings", {}) and old["Status"] != new["Status"]:
            changed = [
                c + f" ({STATUS_MEANING[new['Status']]})" if c.startswith("Status:") else c
                for c in changed
            ]
        plan = f"Change {what}: " + "; ".join(changed) + "."
        if not check:
            await admin.put(kind, path, new, str(body.get("etag") or found["etag"] or "*"))
        return {"plan" if check else "done": plan}
    if route == "entity/delete":
        counts = found["counts"]
        held = f"{counts['active']} active, {counts['dead_lettered']} dead-lettered"
        extra = ""
        if kind == TOPIC:
            extra = f", its {found['settings'].get('SubscriptionCount', '0')} subscription(s)"
            held = f"{counts['scheduled']} scheduled"
        plan = (
            f"Delete {what}{extra} and every message in it ({held}): gone for good. "
            f'Type "{path}" to go on.'
        )
        if not check:
            if body.get("confirm") != path:
                raise DashboardError(f'confirm: type the entity\'s name ("{path}") to delete it')
            await admin.delete(path)
        return {"plan" if check else "done": plan.partition(" Type")[0]}
    # the rules of a subscription
    if kind != SUBSCRIPTION:
        raise DashboardError(f"{what} has no rules: only a subscription has")
    name = entity_form.rule_name(body.get("name"))
    exists = any(r["name"].lower() == name.lower() for r in found["rules"])
    if route == "rule/delete":
        if not exists:
            raise DashboardError(f"no rule {name!r} on {what}", 404)
        plan = f"Delete rule '{name}' of {what}: messages it let in stop coming."
        if not check:
            if body.get("confirm") != name:
                raise DashboardError(f'confirm: type the rule\'s name ("{name}") to delete it')
            await admin.delete_rule(path, name)
        return {"plan" if check else "done": plan}
    spec = entity_form.rule(name, body)
    update = route == "rule/update"
    if update and not exists:
        raise DashboardError(f"no rule {name!r} on {what}", 404)
    if not update and exists:
        raise FormError("name", f"name: {what} already has a rule {name!r}")
    action = f"; action {spec.action}" if spec.action else ""
    verb = "Change rule" if update else "Add rule"
    plan = f"{verb} '{name}' of {what}: filter {filter_text(spec)}{action}."
    if not check:
        await admin.put_rule(path, spec, update=update)
    return {"plan" if check else "done": plan}


async def _create(
    admin: EntityAdmin, namespace: Namespace, body: dict[str, Any], manage: Callable[[str], None]
) -> dict[str, Any]:
    kind = entity_form.check_kind(body.get("kind"))
    path = entity_form.entity_path(kind, body.get("name"), body.get("topic"))
    manage(path)
    if kind == SUBSCRIPTION:
        topic = await admin.read(path.partition(SUBSCRIPTIONS)[0])
        if topic is None or topic["kind"] != TOPIC:
            raise FormError("topic", f"topic: no topic {body.get('topic')!r} in {namespace.name}")
    existing = await admin.read(path)
    what = label(kind, path, namespace)
    if existing is not None:
        raise FormError("name", f"name: {label(existing['kind'], path, namespace)} exists")
    new = entity_form.settings(kind, body.get("settings") or {}, defaults(kind))
    await _check_forwards(admin, path, {}, new)
    different = entity_form.differences(kind, new)
    plan = f"Create {what} with " + ("; ".join(different) if different else "the defaults") + "."
    if not body.get("check"):
        await admin.put(kind, path, new)
    return {"plan" if body.get("check") else "done": plan, "path": path, "kind": kind}


async def _check_forwards(
    admin: EntityAdmin, path: str, old: dict[str, Any], new: dict[str, Any]
) -> None:
    """The forward targets a form sets must be queues or topics (not itself)."""
    sendable: set[str] = set()
    for name in entity_form.FORWARDS:
        target = new.get(name)
        if target is None or target == old.get(name) or target.lower() == path.lower():
            continue
        found = await admin.read(target)
        if found is not None and found["kind"] in (QUEUE, TOPIC):
            sendable.add(target.lower())
    entity_form.check_forwarding(
        path, new, sendable | {str(old[n]).lower() for n in entity_form.FORWARDS if old.get(n)}
    )
