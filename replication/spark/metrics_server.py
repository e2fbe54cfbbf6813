"""The Spark runner's ``--metrics-port``: ``/metrics`` on 127.0.0.1, for loopback Hosts only.

prometheus_client's own server answers any ``Host``, so a page whose name an attacker's DNS
points at 127.0.0.1 could read the counters (pipeline names, rates, the recovery point).
Every other HTTP endpoint of the app refuses such names (``broker/loopback.py``); this one
serves prometheus_client's WSGI app behind the same rule.
"""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ..broker.loopback import refusal

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def loopback_only(app: Wsgi) -> Wsgi:
    """``app`` for the requests a loopback-bound server may answer; the rest get the
    refusal's status (421 for another Host, 403 for another Origin on a POST)."""

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        why = refusal(
            environ.get("REQUEST_METHOD", "GET"),
            environ.get("HTTP_HOST"),
            environ.get("HTTP_ORIGIN"),
        )
        if why is None:
            return app(environ, start_response)
        body = why.message.encode() + b"\n"
        start_response(
            f"{why.status} {HTTPStatus(why.status).phrase}",
            [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))],
        )
        return [body]

    return guarded


def serve_metrics(port: int) -> WSGIServer:
    """Serves the app's registry on 127.0.0.1:``port`` (0: any free port) from a daemon
    thread; returns the server (``server_port``, ``shutdown``)."""
    from prometheus_client import make_wsgi_app

    from ..metrics import REGISTRY

    app = loopback_only(make_wsgi_app(REGISTRY))
    server = make_server("127.0.0.1", port, app, _Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
