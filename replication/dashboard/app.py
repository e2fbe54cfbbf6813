"""The dashboard's HTTP side: the page, its JSON endpoints and a stream of live state.

``Dashboard.handle`` answers ``Request`` values (``broker.httpapi``), so the same app runs on
the local host's ``/metrics`` port (``threaded.py`` bridges its threads to the host's loop)
and on the broker's own HTTP port (``python -m replication broker --ui``). Paths:

* ``GET /``: the page (``static/``: plain HTML, CSS and JavaScript, nothing built or fetched);
* ``GET /$dashboard/api/overview``: pipelines (local host), their history, each namespace's
  entities with counts; ``GET /$dashboard/api/events``: the same as server-sent events;
* ``GET /$dashboard/api/messages?namespace=&entity=&dead_letter=&count=&from=&session=``
  (peek), ``.../sessions?namespace=&entity=``, ``.../session-state?...&session=``;
* ``POST /$dashboard/api/send?namespace=&entity=`` (a test message), ``POST
  /$dashboard/api/dead-letters/{resubmit|delete}?namespace=&entity=`` with
  ``{"sequence_numbers": [...] | "all"}``;
* the explorer (``POST .../{receive|deferred|settle|release|scheduled/cancel|purge|resend}``):
  receive under a lock and settle by receipt (``locks.py``), typed sends (``send_form.py``);
  ``messages`` with search criteria searches a peek (``search.py``);
* entities (``entity_api.py``): ``GET .../entity`` (every setting, the rules), ``POST
  .../{entity|rule}/{create|update|delete}`` through the management API, checked first;
* ``.../eventhubs[/events|/send]``: event hubs, their partitions and events
  (``eventhubs_view.py``).

Names start with ``$`` as Service Bus's own resources do, so no entity path can collide.

Access: POSTs must be JSON (a form on another site cannot send that without the browser
asking first). Bound to a loopback address, the server in front (the broker's listener, the
local host's HTTP server) answers only for a loopback ``Host`` and takes POSTs only from a
loopback ``Origin`` (``broker/loopback.py``: no DNS rebinding), so no token is asked for.
Bound elsewhere, every API call needs a SAS token (``Authorization: SharedAccessSignature
...``) of the namespace, with the rights Service Bus would ask for: Listen to look, Send to
send, Manage to resubmit or delete. The explorer's: Listen to receive and settle, Send to
send, resend and cancel a scheduled message, Manage to purge. Entities: Manage to see
their settings and to change anything (the management API's right).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import Any

from ..broker.auth import LISTEN, MANAGE, SEND, AuthorizationError, normalize_resource
from ..broker.auth import parse_sas_token as parse_token
from ..broker.httpapi import Request, Response
from ..servicebus.client import EntityNotFound, SourceError
from . import entity_api, search, send_form
from .eventhubs_view import EventHubsView
from .locks import ACTIONS, ReceiptNotFound, Receipts
from .namespace import MAX_PEEK, DashboardError, Namespace, describe, resubmit_target
from .pipelines import PipelineBoard

log = logging.getLogger("replication.dashboard")

PREFIX = "/$dashboard/"
API = PREFIX + "api/"
STATIC = PREFIX + "static/"
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
HttpApp = Callable[[Request], Awaitable[Response]]


def _json(value: Any, status: int = 200) -> Response:
    body = json.dumps(value, default=str).encode()
    return Response(status, {"content-type": "application/json", "cache-control": "no-store"}, body)


def _error(status: int, message: str) -> Response:
    return _json({"error": message}, status)


class Dashboard:
    """The dashboard over ``namespaces`` (and the local host's pipelines, given a ``board``).
    ``require_token``: callers must show a SAS token (the server listens beyond loopback);
    without, the server must be one that refuses other Hosts and Origins (``loopback.py``)."""

    def __init__(
        self,
        namespaces: list[Namespace],
        board: PipelineBoard | None = None,
        *,
        require_token: bool = False,
        interval: float = 1.0,
        event_hubs: EventHubsView | None = None,
    ) -> None:
        self.namespaces = {n.name: n for n in namespaces}
        self.event_hubs = event_hubs or EventHubsView({})
        self.board = board
        self.require_token = require_token
        self.interval = interval
        self.receipts = Receipts()
        self._sampler: asyncio.Task[None] | None = None
        self._closing: asyncio.Event | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Starts sampling the pipelines' counts (call on the loop the namespaces live on)."""
        if self.board is not None and self._sampler is None:
            self._sampler = asyncio.get_running_loop().create_task(self._sample())

    async def _sample(self) -> None:
        assert self.board is not None
        while True:
            try:
                self.board.sample()
            except Exception:  # a bad sample must not end the history
                log.exception("dashboard: sampling the pipelines failed")
            await asyncio.sleep(self.board.interval)

    async def stop(self) -> None:
        """Ends the streams and the sampling, closes the namespaces' clients."""
        self._closed().set()
        if self._sampler is not None:
            self._sampler.cancel()
            self._sampler = None
        await self.receipts.close()
        for namespace in self.namespaces.values():
            await namespace.close()

    def wrap(self, app: HttpApp) -> HttpApp:
        """``app`` with the dashboard's paths answered first (the broker's management API)."""

        async def handle(request: Request) -> Response:
            response = await self.handle(request)
            return response if response is not None else await app(request)

        return handle

    # ------------------------------------------------------------------ dispatch

    async def handle(self, request: Request) -> Response | None:
        """The answer to a dashboard path; None for any other path."""
        path = request.path
        if path not in ("/", "/$dashboard", PREFIX) and not path.startswith(PREFIX):
            return None
        refused = self._refuse(request)
        if refused is not None:
            return refused
        if not path.startswith(API):
            return self._static(request)
        try:
            return await self._api(request, path[len(API) :])
        except DashboardError as exc:
            return _json({"error": str(exc), "field": exc.field}, exc.status)
        except send_form.ComposeError as exc:
            return _error(400, str(exc))
        except ReceiptNotFound as exc:
            return _error(410, str(exc))
        except AuthorizationError as exc:
            return _error(401, exc.description)
        except EntityNotFound as exc:
            return _error(404, str(exc))
        except SourceError as exc:
            return _error(502, str(exc))
        except Exception as exc:  # the page says what failed; the log has the rest
            log.exception("dashboard: %s %s failed", request.method, request.target)
            return _error(500, f"{type(exc).__name__}: {exc}")

    def _refuse(self, request: Request) -> Response | None:
        if request.method == "POST":
            kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
            if kind != "application/json":
                return _error(415, "POST bodies must be application/json")
        return None

    def _static(self, request: Request) -> Response:
        if request.method not in ("GET", "HEAD"):
            return _error(405, "GET only")
        name = request.path[len(STATIC) :] if request.path.startswith(STATIC) else "index.html"
        kind = TYPES.get("." + name.rpartition(".")[2])
        folder = resources.files(__package__).joinpath("static")
        if "/" in name or kind is None or not folder.joinpath(name).is_file():
            return _error(404, f"no such file: {name}")
        body = folder.joinpath(name).read_bytes()
        return Response(200, {"content-type": kind, "cache-control": "no-cache"}, body)

    async def _api(self, request: Request, route: str) -> Response:
        query = request.query
        get = request.method in ("GET", "HEAD")
        if route == "overview" and get:
            self._authorize(request, None, "", LISTEN)
            return _json(await self.overview(history=True))
        if route == "events" and get:
            self._authorize(request, None, "", LISTEN)
            return Response(
                200,
                {
                    "content-type": "text/event-stream",
                    "cache-control": "no-store",
                    "x-accel-buffering": "no",
                },
                stream=self.events(),
            )
        namespace = self._namespace(query)
        entity = query.get("entity", "").strip("/")
        if route.partition("/")[0] == "eventhubs":
            body = _body(request) if request.method == "POST" else {}
            return _json(
                await self.event_hubs.handle(request, route, namespace, self._authorize, body)
            )
        if route == "messages" and get:
            self._authorize(request, namespace, entity, LISTEN)
            return _json(await self._peek(namespace, entity, query))
        if route == "sessions" and get:
            self._authorize(request, namespace, entity, LISTEN)
            return _json({"sessions": await namespace.sessions(entity)})
        if route == "session-state" and get:
            self._authorize(request, namespace, entity, LISTEN)
            session = query.get("session")
            if not session:
                raise DashboardError("session: which session")
            return _json(
                {"session": session, "state": await namespace.session_state(entity, session)}
            )
        if route in entity_api.ROUTES and (get == (route in entity_api.READS)):
            body = {} if get else _body(request)

            def manage(path: str) -> None:
                self._authorize(request, namespace, path, MANAGE)

            return _json(await entity_api.answer(route, namespace, entity, query, body, manage))
        if request.method != "POST":
            return _error(404 if route not in _POSTS else 405, f"no such endpoint: {route}")
        body = _body(request)
        if route in _MESSAGE_POSTS:
            return await self._post(request, route, namespace, entity, body)
        if route in ("dead-letters/resubmit", "dead-letters/delete"):
            self._authorize(request, namespace, entity, MANAGE)
            numbers = body.get("sequence_numbers")
            if numbers == "all":
                numbers = await namespace.dead_letter_numbers(entity)
            if not isinstance(numbers, list) or not all(
                isinstance(n, int) and not isinstance(n, bool) for n in numbers
            ):
                raise DashboardError('sequence_numbers: a list of integers, or "all"')
            result = await namespace.settle_dead_letters(
                entity,
                numbers,
                resubmit=route.endswith("resubmit"),
                new_message_ids=bool(body.get("new_message_ids")),
            )
            return _json(result)
        return _error(404, f"no such endpoint: {route}")

    async def _peek(
        self, namespace: Namespace, entity: str, query: dict[str, str]
    ) -> dict[str, Any]:
        """A page of messages from ``from`` on; with search criteria, the matches among up
        to ``search.MAX_SCAN`` messages, and how far it looked (``next_from`` goes on)."""
        dead_letter = query.get("dead_letter") in ("1", "true")
        count = _int(query, "count", 20)
        start = _int(query, "from", 1)
        session = query.get("session") or None
        wanted = search.criteria(query)
        if not wanted:
            page = await namespace.peek(
                entity,
                dead_letter=dead_letter,
                count=count,
                from_sequence=start,
                session_id=session,
            )
            last = page[-1]["sequence_number"] if page else None
            return {"messages": page, "next_from": None if last is None else last + 1}
        found: list[dict[str, Any]] = []
        scanned, at, last = 0, start, None
        while scanned < search.MAX_SCAN and len(found) < count:
            page = await namespace.peek(
                entity,
                dead_letter=dead_letter,
                count=min(MAX_PEEK, search.MAX_SCAN - scanned),
                from_sequence=at,
                session_id=session,
            )
            for message in page:
                scanned += 1
                last = message["sequence_number"]
                if search.matches(message, wanted):
                    found.append(message)
                    if len(found) == count:
                        break
            if len(page) < MAX_PEEK or last is None:
                break
            at = last + 1
        return {
            "messages": found,
            "scanned": scanned,
            "limit": search.MAX_SCAN,
            "next_from": None if last is None else last + 1,
        }

    async def _post(
        self, request: Request, route: str, namespace: Namespace, entity: str, body: dict[str, Any]
    ) -> Response:
        """The message operations: what each does is in ``locks.py`` and ``namespace.py``;
        the right each needs is the one Service Bus asks for (a purge, like a dead-letter
        delete, needs Manage: it removes what nobody looked at)."""
        if route == "send":
            self._authorize(request, namespace, entity, SEND)
            messages = send_form.messages(body)
            scheduled = await namespace.send(entity, messages)
            return _json(
                {
                    "sent": messages[0].message_id if len(messages) == 1 else len(messages),
                    "message_ids": [m.message_id for m in messages],
                    "scheduled": scheduled,
                    "entity": entity,
                }
            )
        if route == "receive":
            self._authorize(request, namespace, entity, LISTEN)
            dead_letter = bool(body.get("dead_letter"))
            receiver, taken = await namespace.receive(
                entity,
                _count(body.get("count", 10)),
                dead_letter=dead_letter,
                session_id=body.get("session") or None,
            )
            label = entity + ("/$DeadLetterQueue" if dead_letter else "")
            receipt = await self.receipts.add(label, taken, receiver=receiver)
            return _json(
                {"receipt": receipt.id, "entity": label, "messages": [describe(m) for m in taken]}
            )
        if route == "deferred":
            self._authorize(request, namespace, entity, LISTEN)
            management, taken, session = await namespace.receive_deferred(
                entity, _numbers(body), body.get("session") or None
            )
            receipt = await self.receipts.add(entity, taken, management=management, session=session)
            return _json(
                {"receipt": receipt.id, "entity": entity, "messages": [describe(m) for m in taken]}
            )
        if route == "settle":
            self._authorize(request, namespace, entity, LISTEN)
            action = body.get("action")
            if action not in ACTIONS:
                raise DashboardError(f"action: one of {', '.join(ACTIONS)}")
            done, missing = await self.receipts.settle(
                str(body.get("receipt", "")),
                _numbers(body),
                action,
                str(body.get("reason") or ""),
                str(body.get("description") or ""),
            )
            return _json({"action": action, "done": done, "not_held": missing})
        if route == "release":
            self._authorize(request, namespace, entity, LISTEN)
            return _json({"released": await self.receipts.release(str(body.get("receipt", "")))})
        if route == "scheduled/cancel":
            self._authorize(request, namespace, entity, SEND)
            numbers = _numbers(body)
            await namespace.cancel_scheduled(entity, numbers)
            return _json({"cancelled": numbers})
        if route == "purge":
            self._authorize(request, namespace, entity, MANAGE)
            if body.get("confirm") != entity:
                raise DashboardError(f'confirm: type the entity\'s name ("{entity}") to purge it')
            return _json(
                {"purged": await namespace.purge(entity, dead_letter=bool(body.get("dead_letter")))}
            )
        # resend: reads the message (Listen) and sends its copy (Send)
        self._authorize(request, namespace, entity, LISTEN)
        self._authorize(request, namespace, resubmit_target(entity), SEND)
        changes: dict[str, Any] = {}
        if "body" in body:
            if not isinstance(body["body"], str):
                raise DashboardError("body: a string")
            changes["body"] = body["body"]
        if "application_properties" in body:
            changes["application_properties"] = send_form.properties(body["application_properties"])
        number = body.get("sequence_number")
        if not isinstance(number, int) or isinstance(number, bool):
            raise DashboardError("sequence_number: the message's, a whole number")
        copy = await namespace.resend(
            entity,
            number,
            dead_letter=bool(body.get("dead_letter")),
            changes=changes,
            new_message_id=bool(body.get("new_message_id")),
        )
        return _json({"sent": copy.message_id, "entity": resubmit_target(entity)})

    def _namespace(self, query: dict[str, str]) -> Namespace:
        name = query.get("namespace", "")
        namespace = self.namespaces.get(name)
        if namespace is None:
            known = ", ".join(sorted(self.namespaces)) or "none"
            raise DashboardError(f"no namespace {name!r} here (known: {known})", 404)
        return namespace

    def _authorize(
        self, request: Request, namespace: Namespace | None, entity: str, right: str
    ) -> None:
        """With ``require_token``: the caller's SAS token must hold ``right`` over ``entity``
        of ``namespace`` (or, for namespace-wide views, over any namespace here)."""
        if not self.require_token:
            return
        token = request.headers.get("authorization", "")
        if not token:
            raise AuthorizationError(description="a SAS token is required (Authorization header)")
        problem = "no namespace"
        for candidate in [namespace] if namespace is not None else self.namespaces.values():
            try:
                host = normalize_resource(parse_token(token).resource).partition("/")[0]
                now = candidate.clock.time() if candidate.clock is not None else time.time()
                grant = candidate.authorizer.validate(token, f"{host}/{entity}".rstrip("/"), now)
                candidate.authorizer.check(grant, right, entity)
                return
            except AuthorizationError as exc:
                problem = exc.description
        raise AuthorizationError(description=problem)

    # ------------------------------------------------------------------ state

    async def overview(self, history: bool = False) -> dict[str, Any]:
        """Pipelines (with their history when asked) and every namespace's entities."""
        namespaces = []
        for namespace in self.namespaces.values():
            item: dict[str, Any] = {
                "name": namespace.name,
                "host": namespace.host,
                "event_hubs": namespace.name in self.event_hubs.catalogs,
            }
            try:
                item.update(await namespace.entities())
            except Exception as exc:  # one namespace not answering must not hide the rest
                item["error"] = str(exc)
            namespaces.append(item)
        state: dict[str, Any] = {
            "time": time.time(),
            "namespaces": namespaces,
            "pipelines": self.board.describe() if self.board is not None else None,
            "auth": {"token_required": self.require_token},
        }
        if history and self.board is not None:
            state["history"] = self.board.history()
        return state

    async def events(self) -> AsyncIterator[bytes]:
        """Server-sent events: the overview every ``interval`` seconds, until the client goes."""
        closing = self._closed()
        while not closing.is_set():
            state = await self.overview()
            yield f"event: state\ndata: {json.dumps(state, default=str)}\n\n".encode()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(closing.wait(), self.interval)

    def _closed(self) -> asyncio.Event:
        if self._closing is None:
            self._closing = asyncio.Event()
        return self._closing


_MESSAGE_POSTS = (
    "send",
    "receive",
    "deferred",
    "settle",
    "release",
    "scheduled/cancel",
    "purge",
    "resend",
)
_POSTS = (*_MESSAGE_POSTS, "dead-letters/resubmit", "dead-letters/delete")


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_PEEK:
        raise DashboardError(f"count: a whole number from 1 to {MAX_PEEK}")
    return value


def _numbers(body: dict[str, Any]) -> list[int]:
    numbers = body.get("sequence_numbers")
    if not isinstance(numbers, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) for n in numbers
    ):
        raise DashboardError("sequence_numbers: a list of integers")
    return numbers


def _int(query: dict[str, str], name: str, default: int) -> int:
    try:
        return int(query.get(name, default))
    except ValueError:
        raise DashboardError(f"{name}: a whole number") from None


def _body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(request.body or b"{}")
    except ValueError as exc:
        raise DashboardError(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise DashboardError("the body must be a JSON object")
    return body
