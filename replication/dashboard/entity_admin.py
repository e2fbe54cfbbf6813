"""Creates, reads, changes and deletes entities and rules through a namespace's management API.

The same requests ``ServiceBusAdministrationClient`` makes (``GET|PUT|DELETE /{path}``,
``.../Rules/{name}``: ATOM entries, SAS-signed with the namespace's Manage key), handed to
the broker's HTTP app in-process, so the dashboard can do nothing the API would not let any
client do, and a refusal comes back with the service's own words (``ServiceRefused``). A PUT
that changes an entity carries the ETag the page saw (``If-Match``): a change made by
someone else meanwhile is refused (412), not overwritten.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import quote
from xml.etree.ElementTree import Element

from defusedxml import ElementTree

from ..broker.admin import atom
from ..broker.admin.api import DESCRIPTION_TAGS, rule_xml
from ..broker.admin.properties import WRITABLE, Description, PropertyError
from ..broker.httpapi import Request, Response
from ..broker.registry import entity_path
from ..broker.rules import RuleSpec
from ..servicebus.runtime_properties import count_details
from .entities import ATOM, HttpApp, rule
from .entity_form import fields
from .namespace import DashboardError

API_VERSION = "2021-05"
KIND_OF = {tag: kind for kind, tag in DESCRIPTION_TAGS.items()}
HIDDEN = frozenset({"CountDetails", "AuthorizationRules"})
"""Elements of a description the settings view does not list (the counts are shown apart)."""


class ServiceRefused(DashboardError):
    """The management API said no: its status, and its detail as the page shows it."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"the service refused ({status}): {detail}", status)
        self.detail = detail


def _detail(response: Response) -> str:
    text = response.body.decode("utf-8", "replace")
    try:
        found = ElementTree.fromstring(response.body).findtext("Detail")
    except Exception:  # not the API's <Error> (a proxy's page): the text as it is
        return text[:500]
    return found or text[:500]


def _target(path: str) -> str:
    return "/" + "/".join(quote(part, safe="") for part in path.split("/"))


def _entry(tag: str, body: str) -> bytes:
    content = atom.description(tag, body)
    wrapped = f'<entry xmlns="{atom.ATOM}"><content type="application/xml">{content}</content>'
    return (wrapped + "</entry>").encode()


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def _typed_property(name: str, value: Any) -> dict[str, Any]:
    """A correlation filter's property as the page's typed inputs hold it."""
    if isinstance(value, bool):
        return {"name": name, "type": "bool", "value": "true" if value else "false"}
    if isinstance(value, int):
        return {"name": name, "type": "int", "value": str(value)}
    if isinstance(value, float):
        return {"name": name, "type": "double", "value": repr(value)}
    if isinstance(value, datetime):
        return {"name": name, "type": "timestamp", "value": value.isoformat()}
    return {"name": name, "type": "string", "value": "" if value is None else str(value)}


def rule_form(entry: Element) -> dict[str, Any]:
    """A rule as the page shows it (``entities.rule``: its filter as text) and as its form
    edits it: ``{"sql": ...}`` or ``{"correlation": {XmlName: text, "properties": [...]}}``."""
    found = rule(entry)
    description = entry.find(f"{ATOM}content/*")
    filter_ = description.find("{*}Filter") if description is not None else None
    kind = atom.xsi_type(filter_) if filter_ is not None else "TrueFilter"
    found["filter_type"] = kind
    if kind == "CorrelationFilter" and filter_ is not None:
        values: dict[str, Any] = {}
        for child in filter_:
            name = _local(child.tag)
            if name == "Properties":
                typed = atom.key_values(child)
                values["properties"] = [_typed_property(k, v) for k, v in typed.items()]
            elif child.text:
                values[name] = child.text
        found["form"] = {"correlation": values}
    else:
        found["form"] = {"sql": found["filter"]}
    return found


class EntityAdmin:
    """One namespace's management API (``app``), signed with ``token()`` (Manage)."""

    def __init__(self, app: HttpApp, token: Any) -> None:
        self.app = app
        self.token = token

    async def _call(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> Response:
        sent = {"authorization": self.token(), **(headers or {})}
        if body:
            sent["content-type"] = "application/atom+xml;type=entry;charset=utf-8"
        target = f"{_target(path)}?api-version={API_VERSION}"
        response = await self.app(Request(method, target, sent, body, scheme="http"))
        if response.status not in (200, 201):
            raise ServiceRefused(response.status, _detail(response))
        return response

    # ------------------------------------------------------------------ reading

    async def read(self, path: str) -> dict[str, Any] | None:
        """The entity at ``path``: its kind, every setting the API gives (as text), its
        counts and ETag, and a subscription's rules; None when there is none."""
        try:
            response = await self._call("GET", path)
        except ServiceRefused as exc:
            if exc.status == 404:
                return None
            raise
        root = ElementTree.fromstring(response.body)
        if _local(root.tag) != "entry":  # a queue or topic that is not: an empty feed
            return None
        description = root.find(f"{ATOM}content/*")
        if description is None or _local(description.tag) not in KIND_OF:  # a rule's path
            return None
        kind = KIND_OF[_local(description.tag)]
        texts = {item.name: "" for item in fields(kind)}  # the API leaves out what is unset
        texts.update(
            (_local(child.tag), child.text or "")
            for child in description
            if _local(child.tag) not in HIDDEN
        )
        for name in ("ForwardTo", "ForwardDeadLetteredMessagesTo"):
            texts[name] = entity_path(texts.get(name))  # sb://host/queue: the host is ours
        found: dict[str, Any] = {
            "kind": kind,
            "path": path,
            "settings": texts,
            "counts": count_details(description.find("{*}CountDetails")),
            "etag": response.headers.get("etag"),
        }
        if kind == "subscription":
            found["rules"] = await self.rules(path)
        return found

    async def rules(self, path: str) -> list[dict[str, Any]]:
        response = await self._call("GET", f"{path}/Rules")
        return [rule_form(e) for e in ElementTree.fromstring(response.body).findall(f"{ATOM}entry")]

    async def exists(self, path: str) -> bool:
        return await self.read(path) is not None

    # ------------------------------------------------------------------ writing

    async def put(
        self, kind: str, path: str, description: Description, etag: str | None = None
    ) -> None:
        """Creates the entity (``etag`` None) or changes it (only if still at ``etag``);
        the form's settings are sent, the API keeps the rest as it was (or its default)."""
        body = atom.Xml()
        for item in fields(kind):
            value = description.get(item.name)
            if value is None and item.type == "duration":
                body.add(item.name, atom.UNLIMITED)
            elif value is None:
                body.raw(f"<{item.name}/>")
            else:
                body.add(item.name, value)
        headers = {} if etag is None else {"if-match": etag}
        await self._call("PUT", path, _entry(DESCRIPTION_TAGS[kind], body.text()), headers)

    async def delete(self, path: str) -> None:
        await self._call("DELETE", path)

    async def put_rule(self, path: str, spec: RuleSpec, *, update: bool) -> None:
        body = rule_xml(spec) + f"<Name>{atom.escape(spec.name)}</Name>"
        headers = {"if-match": "*"} if update else {}
        await self._call(
            "PUT", f"{path}/Rules/{spec.name}", _entry("RuleDescription", body), headers
        )

    async def delete_rule(self, path: str, name: str) -> None:
        await self._call("DELETE", f"{path}/Rules/{name}")


def description(kind: str, texts: dict[str, str]) -> Description:
    """An entity's writable settings, typed, from the texts the API gave (not checked
    against the API's limits: Config.json may have set what the API would not)."""
    found: Description = {}
    for prop in WRITABLE[kind]:
        text = texts.get(prop.name)
        if text is None:
            found[prop.name] = prop.default
            continue
        try:
            found[prop.name] = prop.parse(text)
        except PropertyError:
            found[prop.name] = text
    return found
