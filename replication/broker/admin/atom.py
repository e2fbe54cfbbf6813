"""The management API's XML: ATOM entries and feeds around Service Bus descriptions.

Requests are untrusted, so they are parsed with ``defusedxml`` (no entity expansion, no
external DTDs). Responses are written as text with explicit prefixes, the way Service Bus
writes them: the SDKs look values up by namespace, but the key/value lists of rules carry
their XML Schema type as a prefixed ``xsi:type`` (``d6p1:int``) that a generic serializer
would not produce.
"""

from __future__ import annotations

import math
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from xml.sax.saxutils import escape, quoteattr

import defusedxml.ElementTree as SafeET
from defusedxml import DefusedXmlException

from ..config import parse_duration

ATOM = "http://www.w3.org/2005/Atom"
SB = "http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"
SB_2011 = "http://schemas.microsoft.com/netservices/2011/06/servicebus"
XSI = "http://www.w3.org/2001/XMLSchema-instance"
XSD = "http://www.w3.org/2001/XMLSchema"
SERIALIZATION = "http://schemas.microsoft.com/2003/10/Serialization/"
"""The namespace of .NET's DataContract types that XML Schema lacks (``guid``)."""
UNLIMITED = "P10675199DT2H48M5.4775807S"
"""TimeSpan.MaxValue as Service Bus writes it: "never" for TTLs and AutoDeleteOnIdle."""
NEVER = "0001-01-01T00:00:00Z"
"""DateTime.MinValue: what Service Bus reports for a time that has not happened."""
CONTENT_TYPE = "application/atom+xml;type=entry;charset=utf-8"
FEED_CONTENT_TYPE = "application/atom+xml;type=feed;charset=utf-8"


class XmlError(ValueError):
    """A request body that is not the XML the API expects (HTTP 400)."""


# ---------------------------------------------------------------------- values


def format_duration(value: timedelta | None) -> str:
    """A TimeSpan as .NET's XmlConvert writes it (``PT1M``, ``P14D``, ``PT0.5S``)."""
    if value is None:
        return UNLIMITED
    if value < timedelta(0):
        return "-" + format_duration(-value)
    micros = value // timedelta(microseconds=1)
    days, rest = divmod(micros, 86_400_000_000)
    hours, rest = divmod(rest, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    seconds, fraction = divmod(rest, 1_000_000)
    clock = (f"{hours}H" if hours else "") + (f"{minutes}M" if minutes else "")
    if seconds or fraction:
        clock += f"{seconds}.{fraction:06d}".rstrip("0").rstrip(".") + "S"
    text = "P" + (f"{days}D" if days else "") + (f"T{clock}" if clock else "")
    return "PT0S" if text == "P" else text


def format_time(ms: int | None) -> str:
    if not ms:
        return NEVER
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, timedelta):
        return format_duration(value)
    return str(value)


def typed_value(value: Any) -> tuple[str, str]:
    """A rule property's XML Schema type and text (``int``, ``long``, ``double``, ...)."""
    if isinstance(value, bool):
        return "boolean", "true" if value else "false"
    if isinstance(value, int):
        return ("int" if -(2**31) <= value < 2**31 else "long"), str(value)
    if isinstance(value, float):
        return "double", repr(value) if math.isfinite(value) else str(value).upper()
    if isinstance(value, datetime):
        return "dateTime", value.isoformat().replace("+00:00", "Z")
    if isinstance(value, timedelta):
        return "duration", format_duration(value)
    if isinstance(value, uuid.UUID):
        return "guid", str(value)
    return "string", str(value)


def parse_typed(text: str, kind: str) -> Any:
    """A ``<Value xsi:type="d6p1:int">`` as the Python value filters compare."""
    try:
        if kind in ("int", "long", "short", "byte", "unsignedInt", "unsignedLong"):
            return int(text)
        if kind in ("double", "float", "decimal"):
            return float(text)
        if kind == "boolean":
            if text.strip().lower() not in ("true", "false"):
                raise ValueError(text)
            return text.strip().lower() == "true"
        if kind == "dateTime":
            return datetime.fromisoformat(text.replace("Z", "+00:00"))
        if kind == "duration":
            negative = text.strip().startswith("-")
            value = parse_duration(text.strip().removeprefix("-"))
            return -value if negative else value
        if kind == "guid":
            return uuid.UUID(text.strip())
    except ValueError:
        raise XmlError(f"{text!r} is not a valid {kind}") from None
    if kind == "string":
        return text
    raise XmlError(f"values of type {kind!r} are not supported in rule properties or parameters")


# ---------------------------------------------------------------------- reading requests


def local(tag: str) -> str:
    return tag.rpartition("}")[2]


def parse_description(body: bytes, expected: Iterable[str]) -> ET.Element:
    """The description inside ``<entry><content>``; its tag names the kind of entity."""
    if not body.strip():
        raise XmlError("the request body is empty; expected an Atom entry")
    try:
        root = SafeET.fromstring(body)
    except ET.ParseError as exc:
        raise XmlError(f"the request body is not well-formed XML: {exc}") from None
    except DefusedXmlException as exc:
        raise XmlError(f"the request body uses forbidden XML constructs: {exc}") from None
    if root.tag != f"{{{ATOM}}}entry":
        raise XmlError(f"expected an Atom <entry> element, got <{local(root.tag)}>")
    content = root.find(f"{{{ATOM}}}content")
    if content is None:
        raise XmlError("the Atom entry has no <content> element")
    children = list(content)
    if len(children) != 1:
        raise XmlError("the Atom <content> must hold exactly one description element")
    description = children[0]
    names = list(expected)
    if description.tag not in {f"{{{SB}}}{name}" for name in names}:
        raise XmlError(
            f"expected {' or '.join(names)} in the Service Bus namespace ({SB}), "
            f"got <{description.tag}>"
        )
    return description


def elements(description: ET.Element) -> dict[str, ET.Element]:
    """The description's properties by name; unknown namespaces and repeats are refused."""
    found: dict[str, ET.Element] = {}
    for child in description:
        if not child.tag.startswith(f"{{{SB}}}"):
            raise XmlError(f"element <{child.tag}> is not in the Service Bus namespace")
        name = local(child.tag)
        if name in found:
            raise XmlError(f"element <{name}> appears more than once")
        found[name] = child
    return found


def xsi_type(element: ET.Element) -> str | None:
    value = element.get(f"{{{XSI}}}type")
    return None if value is None else value.rpartition(":")[2]


def key_values(parent: ET.Element | None) -> dict[str, Any]:
    """``<KeyValueOfstringanyType><Key/><Value xsi:type/></...>`` items as a dict."""
    values: dict[str, Any] = {}
    if parent is None:
        return values
    for item in parent:
        if local(item.tag) not in ("KeyValueOfstringanyType", "KeyValueOfObjectType"):
            raise XmlError(f"unexpected <{local(item.tag)}> in <{local(parent.tag)}>")
        key = item.find(f"{{{SB}}}Key")
        value = item.find(f"{{{SB}}}Value")
        if key is None or not key.text or value is None:
            raise XmlError(f"a <{local(item.tag)}> needs a <Key> and a <Value>")
        if key.text in values:
            raise XmlError(f"the key {key.text!r} appears more than once in <{local(parent.tag)}>")
        if value.get(f"{{{XSI}}}nil", "").strip().lower() == "true":
            values[key.text] = None
            continue
        values[key.text] = parse_typed(value.text or "", xsi_type(value) or "string")
    return values


# ---------------------------------------------------------------------- writing responses


@dataclass(slots=True)
class Xml:
    """A tiny writer: ``add(name, value)`` for leaf elements, ``raw`` for pre-built ones."""

    parts: list[str] = field(default_factory=list)

    def add(self, name: str, value: Any, prefix: str = "") -> None:
        if value is None:
            return
        tag = f"{prefix}{name}"
        self.parts.append(f"<{tag}>{escape(format_value(value))}</{tag}>")

    def raw(self, text: str) -> None:
        self.parts.append(text)

    def text(self) -> str:
        return "".join(self.parts)


def description(tag: str, body: str) -> str:
    return f'<{tag} xmlns="{SB}" xmlns:i="{XSI}">{body}</{tag}>'


def count_details(active: int, dead_letter: int, scheduled: int, deferred: int = 0) -> str:
    """Service Bus's five counts, then ``DeferredMessageCount``: the broker's own (deferred
    messages are among the active ones; the SDKs read the elements they know by name)."""
    out = Xml()
    for name, value in (
        ("ActiveMessageCount", active),
        ("DeadLetterMessageCount", dead_letter),
        ("ScheduledMessageCount", scheduled),
        ("TransferMessageCount", 0),
        ("TransferDeadLetterMessageCount", 0),
        ("DeferredMessageCount", deferred),
    ):
        out.add(name, value, "d2p1:")
    return f'<CountDetails xmlns:d2p1="{SB_2011}">{out.text()}</CountDetails>'


def key_value_list(tag: str, values: dict[str, Any]) -> str:
    """Correlation filter ``Properties`` or SQL ``Parameters``, each value with its type, as
    Service Bus writes them (and the SDKs' rule deserializers read them back typed)."""
    items = []
    for key, value in values.items():
        if value is None:
            items.append(
                f'<KeyValueOfstringanyType><Key>{escape(key)}</Key><Value i:nil="true"/>'
                "</KeyValueOfstringanyType>"
            )
            continue
        kind, text = typed_value(value)
        namespace = SERIALIZATION if kind == "guid" else XSD
        items.append(
            f"<KeyValueOfstringanyType><Key>{escape(key)}</Key>"
            f'<Value xmlns:d6p1="{namespace}" i:type="d6p1:{kind}">{escape(text)}</Value>'
            "</KeyValueOfstringanyType>"
        )
    return f"<{tag}>{''.join(items)}</{tag}>"


def entry(url: str, title: str, content: str, published: str, updated: str, author: str) -> str:
    return (
        f'<entry xmlns="{ATOM}"><id>{escape(url)}</id><title type="text">{escape(title)}</title>'
        f"<published>{published}</published><updated>{updated}</updated>"
        f"<author><name>{escape(author)}</name></author>"
        f'<link rel="self" href={quoteattr(url)}/>'
        f'<content type="application/xml">{content}</content></entry>'
    )


def feed(url: str, title: str, entries: list[str], next_url: str | None, updated: str) -> str:
    links = f'<link rel="self" href={quoteattr(url)}/>'
    if next_url is not None:
        links += f'<link rel="next" href={quoteattr(next_url)}/>'
    return (
        f'<feed xmlns="{ATOM}"><title type="text">{escape(title)}</title>'
        f"<id>{escape(url)}</id><updated>{updated}</updated>{links}{''.join(entries)}</feed>"
    )


def error(code: int, detail: str) -> bytes:
    return f"<Error><Code>{code}</Code><Detail>{escape(detail)}</Detail></Error>".encode()
