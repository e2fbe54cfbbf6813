"""A namespace's queues, topics, subscriptions and rules, read through its management API.

The dashboard asks the broker the way ``ServiceBusAdministrationClient`` does (``GET
/$Resources/Queues``, ``/{topic}/Subscriptions``, ``.../Rules``: ATOM feeds, SAS-signed with
a Manage key), through the broker's HTTP app in-process, so it sees what any client sees and
nothing the API does not show. This module only turns those feeds into plain dicts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from xml.etree.ElementTree import Element

from defusedxml import ElementTree

from ..broker.admin.atom import key_values
from ..broker.httpapi import Request, Response
from ..servicebus.runtime_properties import count_details

ATOM = "{http://www.w3.org/2005/Atom}"
PAGE = 100
"""Entries per feed page (Service Bus returns at most 100, whatever ``$top`` asks)."""
SETTINGS = (
    "RequiresSession",
    "RequiresDuplicateDetection",
    "DuplicateDetectionHistoryTimeWindow",
    "LockDuration",
    "MaxDeliveryCount",
    "Status",
    "ForwardTo",
    "ForwardDeadLetteredMessagesTo",
)

HttpApp = Callable[[Request], Awaitable[Response]]


class ManagementError(Exception):
    """The management API said no (status and its detail)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"management API answered {status}: {detail}")
        self.status = status


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def _description(entry: Element) -> Element | None:
    content = entry.find(f"{ATOM}content")
    return None if content is None or len(content) == 0 else content[0]


def _fields(description: Element) -> dict[str, Element]:
    return {_local(child.tag): child for child in description}


def _settings(fields: dict[str, Element]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in SETTINGS:
        element = fields.get(name)
        if element is None or element.text is None:
            continue
        text = element.text
        out[name] = text == "true" if text in ("true", "false") else text
    return out


def entity(entry: Element) -> dict[str, Any]:
    """One feed entry (queue, topic or subscription) as the page shows it."""
    title = entry.findtext(f"{ATOM}title") or ""
    description = _description(entry)
    fields = _fields(description) if description is not None else {}
    return {
        "name": title,
        "counts": count_details(fields.get("CountDetails")),
        "settings": _settings(fields),
    }


def literal(value: Any) -> str:
    """A correlation filter's value as its type reads: ``5`` (a number), ``'5'`` (else)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return repr(str(value))


def rule(entry: Element) -> dict[str, Any]:
    """A rule: its name, its filter as text (SQL, or the correlation's fields) and action."""
    description = _description(entry)
    fields = _fields(description) if description is not None else {}
    found: dict[str, Any] = {
        "name": entry.findtext(f"{ATOM}title") or "",
        "filter": "",
        "action": None,
    }
    filter_ = fields.get("Filter")
    if filter_ is not None:
        kind = next((v for k, v in filter_.attrib.items() if _local(k) == "type"), "")
        parts = _fields(filter_)
        if kind == "CorrelationFilter":
            pairs = [
                f"{name} = '{e.text}'"
                for name, e in parts.items()
                if e.text and name != "Properties"
            ]
            # typed as the filter compares them: 5 matches an int 5, '5' a string
            properties = key_values(parts.get("Properties"))
            pairs += [f"{key} = {literal(value)}" for key, value in properties.items()]
            found["filter"] = " AND ".join(pairs) or "(correlation: any)"
        elif kind == "TrueFilter":
            found["filter"] = "1=1"
        elif kind == "FalseFilter":
            found["filter"] = "1=0"
        else:
            found["filter"] = parts["SqlExpression"].text if "SqlExpression" in parts else kind
    action = fields.get("Action")
    if action is not None:
        sql = action.findtext(".//{*}SqlExpression")
        found["action"] = sql or None
    return found


class Entities:
    """Reads one namespace's entities through ``app`` (its management API) with ``token()``
    (a SAS token with Manage over the namespace)."""

    def __init__(self, app: HttpApp, token: Callable[[], str]) -> None:
        self.app = app
        self.token = token

    async def _feed(self, path: str) -> list[Element]:
        entries: list[Element] = []
        while True:
            target = f"{path}?api-version=2021-05&$skip={len(entries)}&$top={PAGE}"
            request = Request("GET", target, {"authorization": self.token()}, scheme="http")
            response = await self.app(request)
            if response.status != 200:
                raise ManagementError(response.status, response.body.decode("utf-8", "replace"))
            root = ElementTree.fromstring(response.body)
            page = root.findall(f"{ATOM}entry")
            entries += page
            if len(page) < PAGE:
                return entries

    async def read(self) -> dict[str, Any]:
        """``{"queues": [...], "topics": [{..., "subscriptions": [{..., "rules": [...]}]}]}``."""
        queues = [entity(e) for e in await self._feed("/$Resources/Queues")]
        topics = []
        for entry in await self._feed("/$Resources/Topics"):
            topic = entity(entry)
            subscriptions = []
            for sub_entry in await self._feed(f"/{topic['name']}/Subscriptions"):
                subscription = entity(sub_entry)
                rules = await self._feed(
                    f"/{topic['name']}/Subscriptions/{subscription['name']}/Rules"
                )
                subscription["rules"] = [rule(r) for r in rules]
                subscriptions.append(subscription)
            topic["subscriptions"] = subscriptions
            topics.append(topic)
        return {"queues": queues, "topics": topics}
