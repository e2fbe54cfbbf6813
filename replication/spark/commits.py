"""The driver-side reader's commit service: tells executors when a micro-batch was committed.

The ``servicebus`` data source reads on executors (README "(b)"): a task receives its
assignment's messages, yields their rows and leaves the receiver with its unsettled
messages to a holder in its Python worker (``holder.py``). Only the driver-side reader
learns that Spark committed the micro-batch (``commit``, or ``latestOffset`` asked for the
batch after it). So that reader runs this small HTTP service on the driver's host (a port
from the OS; its address travels in the assignments), and holders ask it, per
``{run, batch}``, what to do. Only batch numbers cross the network, never messages.

``/<run>/<batch>/<slot>/<holder>`` (``holder``: one task attempt's read):

- ``PUT ?messages=N``: the read registers once it has received (also with no message: an
  empty retry of a slot must keep an earlier attempt of that slot from being completed);
  answers ``open``, or ``unknown`` when the batch is not open any more.
- ``GET ?wait=S``: the verdict, long-polled up to S seconds while the batch is open.
- ``DELETE``: the read gave its messages back (its task failed or was cancelled).

Verdicts: ``open``; ``committed`` (complete on your link, then close it); ``release`` (the
batch was committed, but its slot was read by more than one attempt: which one's rows were
written is unknown, so all give their messages back); ``unknown`` (another run, a batch this
reader did not plan, or one that ended without a commit: give the messages back).

Why ``release``: Spark retries a failed task with the same assignment, and a retry
receives other messages; the rows of a failed attempt are discarded even when its read
completed. Without speculative execution a committed batch has exactly one successful
attempt per slot and it registered, so a slot with one live registration is safe to
complete; with more, completing any could complete rows nobody wrote. Giving back costs
duplicates, never a loss.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger("replication.spark")

OPEN, COMMITTED, RELEASE, UNKNOWN = "open", "committed", "release", "unknown"
MAX_WAIT = 30.0
"""The longest long-poll the service holds."""
KEPT_BATCHES = 64
"""Batches remembered after they ended (their holders may still ask)."""


@dataclass
class _Batch:
    state: str = OPEN
    holders: dict[int, dict[str, int]] = field(default_factory=dict)
    """slot -> live registrations (holder -> messages held)."""
    told: set[str] = field(default_factory=set)
    """Holders given a final verdict."""
    warned: set[int] = field(default_factory=set)


class CommitService:
    """Per ``{run, batch}``: open, committed, or unknown (see the module)."""

    def __init__(self, run: str, host: str = "127.0.0.1") -> None:
        self.run = run
        self._batches: dict[int, _Batch] = {}
        self._changed = threading.Condition()
        server = _Server6 if ":" in host else _Server
        self._server = server((host, 0), _Handler)
        self._server.service = self
        port = self._server.server_address[1]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="servicebus-commits", daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------------ the reader's calls

    def planned(self, batch: int) -> None:
        """``partitions`` planned ``batch``: holders of it wait for its commit."""
        with self._changed:
            self._batches.setdefault(batch, _Batch())
            for old in sorted(self._batches)[:-KEPT_BATCHES]:
                if self._batches[old].state != OPEN:
                    del self._batches[old]

    def committed(self, upto: int) -> None:
        """Spark committed every batch up to ``upto`` (it plans one batch at a time)."""
        with self._changed:
            for number, batch in self._batches.items():
                if number <= upto and batch.state == OPEN:
                    batch.state = COMMITTED
            self._changed.notify_all()

    def wait_told(self, upto: int, timeout: float) -> bool:
        """Waits until every holder of the committed batches up to ``upto`` that holds
        messages was given its verdict (before the query ends and this service with it)."""
        with self._changed:
            return self._wait_told(upto, timeout)

    def close(self, grace: float = 5.0) -> None:
        """Open batches end without a commit (their holders give their messages back); the
        service answers for up to ``grace`` seconds more, until every holder that holds
        messages was told (one that finds it gone waits a lock duration)."""
        with self._changed:
            for batch in self._batches.values():
                if batch.state == OPEN:
                    batch.state = UNKNOWN
            self._changed.notify_all()
            self._wait_told(None, grace)
        self._server.shutdown()
        self._server.server_close()

    def _wait_told(self, upto: int | None, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            left = [
                holder
                for number, batch in self._batches.items()
                if (upto is None or number <= upto) and batch.state != OPEN
                for slot in batch.holders.values()
                for holder, messages in slot.items()
                if messages and holder not in batch.told
            ]
            remaining = deadline - time.monotonic()
            if not left or remaining <= 0:
                return not left
            self._changed.wait(remaining)

    # ------------------------------------------------------------------ the holders' calls

    def register(self, run: str, number: int, slot: int, holder: str, messages: int) -> str:
        with self._changed:
            batch = self._batches.get(number) if run == self.run else None
            if batch is None or batch.state != OPEN:
                return UNKNOWN
            batch.holders.setdefault(slot, {})[holder] = messages
            return OPEN

    def unregister(self, run: str, number: int, slot: int, holder: str) -> str:
        with self._changed:
            batch = self._batches.get(number) if run == self.run else None
            if batch is not None:
                batch.holders.get(slot, {}).pop(holder, None)
                batch.told.add(holder)
                self._changed.notify_all()
            return UNKNOWN

    def verdict(self, run: str, number: int, slot: int, holder: str, wait: float = 0.0) -> str:
        deadline = time.monotonic() + min(max(wait, 0.0), MAX_WAIT)
        with self._changed:
            while True:
                answer = self._verdict(run, number, slot, holder)
                remaining = deadline - time.monotonic()
                if answer != OPEN or remaining <= 0:
                    return answer
                self._changed.wait(remaining)

    def _verdict(self, run: str, number: int, slot: int, holder: str) -> str:
        batch = self._batches.get(number) if run == self.run else None
        if batch is None:
            return UNKNOWN
        if batch.state == OPEN:
            return OPEN
        live = batch.holders.get(slot, {})
        if batch.state != COMMITTED or holder not in live:
            answer = UNKNOWN
        elif len(live) == 1:
            answer = COMMITTED
        else:
            answer = RELEASE
            if slot not in batch.warned:
                batch.warned.add(slot)
                log.warning(
                    "batch %d, slot %d was read by %d task attempts (a retried or speculative "
                    "task, or the micro-batch's DataFrame computed more than once: persist it "
                    "in foreachBatch): their messages are given back and come again",
                    number,
                    slot,
                    len(live),
                )
        batch.told.add(holder)
        self._changed.notify_all()
        return answer


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    service: CommitService


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass  # one request per holder per long-poll: not worth a log line each

    def do_GET(self) -> None:
        self._answer("GET")

    def do_PUT(self) -> None:
        self._answer("PUT")

    def do_DELETE(self) -> None:
        self._answer("DELETE")

    def _answer(self, method: str) -> None:
        url = urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        query = parse_qs(url.query)
        service = self.server.service
        try:
            if len(parts) != 4:
                raise ValueError(url.path)
            run, number, slot, holder = parts[0], int(parts[1]), int(parts[2]), parts[3]
            if method == "PUT":
                answer = service.register(
                    run, number, slot, holder, int(query.get("messages", ["0"])[0])
                )
            elif method == "DELETE":
                answer = service.unregister(run, number, slot, holder)
            else:
                wait = float(query.get("wait", ["0"])[0])
                answer = service.verdict(run, number, slot, holder, wait)
        except ValueError:
            self.send_error(404, "expected /<run>/<batch>/<slot>/<holder>")
            return
        body = json.dumps({"verdict": answer}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):  # the holder went away meanwhile
            self.wfile.write(body)


def service_host(connection_string: str, explicit: str | None = None) -> str:
    """The address executors reach the driver at: ``explicit`` (option ``commitServiceHost``),
    else ``SPARK_LOCAL_IP``, else the local address of the route to the Service Bus namespace
    (executors that reach the namespace usually share that network; a loopback namespace,
    as in tests, gives ``127.0.0.1``)."""
    if explicit:
        return explicit
    if os.environ.get("SPARK_LOCAL_IP"):
        return os.environ["SPARK_LOCAL_IP"]
    from ..servicebus.endpoint import Endpoint

    try:
        endpoint = Endpoint.from_connection_string(connection_string)
        family, _, _, _, address = socket.getaddrinfo(
            endpoint.host, endpoint.port, type=socket.SOCK_DGRAM
        )[0]
        if ipaddress.ip_address(address[0]).is_loopback:
            return "127.0.0.1" if family == socket.AF_INET else "::1"
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address[:2])  # UDP: picks the route, sends nothing
            return str(probe.getsockname()[0])
    except (OSError, ValueError) as exc:
        log.warning(
            "cannot tell the driver's address from the namespace's route (%s); "
            "give option 'commitServiceHost'",
            exc,
        )
        return socket.gethostbyname(socket.gethostname())
