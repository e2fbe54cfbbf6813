"""Benchmark: the embedded Service Bus broker end to end, from real clients in another process.

    python bench/broker.py [--messages 20000] [--size 256] [--in-flight 1000]
                           [--rss-messages 1000000] [--skip-rss]
                           [--standin | --broker-cmd CMD] [--queue NAME]

Starts the broker as a subprocess (a temporary Config.json and data directory, a free port on
127.0.0.1) and stops it at the end. After a header line with the versions in play:

1. proton e2e: one python-qpid-proton connection, a sender and a receiver link on the queue,
   ``--messages`` durable messages of ``--size`` bytes sent and received concurrently. The
   sender keeps at most ``--in-flight`` deliveries unsettled, the receiver grants that much
   credit and accepts each delivery (peek-lock: the broker deletes a message only then). A
   message counts once it is received and the broker has accepted its send. Proton's engine
   (Connection + Transport + Collector) runs from our own non-blocking socket loop here; its
   BlockingConnection tops out near 5,500 msg/s, far below the broker, and the per-message
   events go through cproton (see ``_C``) for the same reason. A warm-up of 1,000 messages
   on a separate connection goes first, untimed.
2. SDK e2e: azure-servicebus (sync), a sender thread sending batches of 100 and a receiver
   thread (prefetch 100) receiving up to 100 at a time and completing each message.
3. RSS: ``--rss-messages`` messages of 1 KiB queued through proton (pre-settled, the last one
   waited for so the broker has committed all of them), then the broker's VmRSS.

Throughput is messages / wall time from the first send to the last receive. ``--standin``
runs ``/tmp/bt/run_broker.py`` (queues ``queue.1`` and ``orders``; the queue defaults to
``queue.1`` then). ``--broker-cmd`` takes a command line with ``{python}``, ``{config}``,
``{host}``, ``{port}`` and ``{data_dir}`` placeholders; the broker counts as ready once it
prints ``broker listening on`` or ``PORT <n>``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import azure.servicebus
import cproton
import proton
from azure.servicebus import ServiceBusClient, ServiceBusMessage

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from replication import __version__ as REPLICATION_VERSION

ROOT = Path(__file__).resolve().parent.parent

HOST = "127.0.0.1"
SAS_RULE = "RootManageSharedAccessKey"
SAS_KEY = "SAS_KEY_VALUE"
NAMESPACE = "sbemulatorns"
DEFAULT_QUEUE = "bench"
STANDIN_SCRIPT = "/tmp/bt/run_broker.py"
STANDIN_QUEUE = "queue.1"
BROKER_CMD = (
    "{python} -m replication broker --config {config} --host {host} --port {port} "
    "--data-dir {data_dir}"
)
STANDIN_CMD = "{python} " + STANDIN_SCRIPT + " {data_dir} {port}"
READY = re.compile(r"broker listening on \S+:(\d+)|^PORT (\d+)")
TROUBLE = re.compile(r"\b(WARNING|ERROR|CRITICAL|Traceback)\b|Error:|Exception")
SDK_BATCH = 100
RSS_SIZE = 1024
START_TIMEOUT = 30.0
WARM_UP = 1_000


class BenchError(Exception):
    """A measurement could not finish: the broker refused, closed, or stalled."""


# ---------------------------------------------------------------------- the broker process


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def write_config(path: Path, queue: str) -> None:
    """A Config.json in the Service Bus emulator's schema with the one queue we use."""
    config = {
        "UserConfig": {
            "Namespaces": [
                {
                    "Name": NAMESPACE,
                    "Queues": [
                        {
                            "Name": queue,
                            "Properties": {"MaxDeliveryCount": 10, "LockDuration": "PT1M"},
                        }
                    ],
                }
            ],
            "Logging": {"Type": "Console"},
        }
    }
    path.write_text(json.dumps(config, indent=2))


class BrokerProcess:
    """The broker under test, run as a child process; its output is drained by threads."""

    def __init__(self, command: str, queue: str, label: str) -> None:
        self.label = label
        self.workdir = Path(tempfile.mkdtemp(prefix="bench-broker-"))
        self.config = self.workdir / "Config.json"
        self.data_dir = self.workdir / "data"
        self.data_dir.mkdir()
        write_config(self.config, queue)
        self.port = free_port()
        self.argv = shlex.split(
            command.format(
                python=shlex.quote(sys.executable), config=shlex.quote(str(self.config)),
                host=HOST, port=self.port, data_dir=shlex.quote(str(self.data_dir)),
            )
        )  # fmt: skip
        self.process: subprocess.Popen[str] | None = None
        self.tail: deque[str] = deque(maxlen=40)
        self.trouble: list[str] = []
        self._ready = threading.Event()

    def start(self) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            self.argv, cwd=ROOT, env=env, text=True, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        for stream in (self.process.stdout, self.process.stderr):
            threading.Thread(target=self._drain, args=(stream,), daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT
        while not self._ready.wait(0.05):
            if self.process.poll() is not None:
                raise BenchError(f"broker exited with {self.process.returncode} before ready")
            if time.monotonic() > deadline:
                raise BenchError(f"broker not ready after {START_TIMEOUT:.0f} s:\n{self.log()}")

    def _drain(self, stream: Any) -> None:
        for line in stream:
            line = line.rstrip("\n")
            self.tail.append(line)
            match = READY.search(line)
            if match and not self._ready.is_set():
                self.port = int(match.group(1) or match.group(2))
                self._ready.set()
            elif TROUBLE.search(line) and len(self.trouble) < 200:
                self.trouble.append(line)

    def log(self) -> str:
        return "\n".join(self.tail)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def memory_mb(self) -> tuple[float, float]:
        """(VmRSS, VmHWM) of the broker process in MB, from /proc/<pid>/status."""
        fields: dict[str, float] = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0]) / 1024  # kB -> MB
        return fields["VmRSS"], fields["VmHWM"]

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> int | None:
        """SIGTERM (SIGKILL after 10 s); returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)
        return self.process.returncode


# ---------------------------------------------------------------------- proton, our own loop


# Proton's Python classes wrap C objects afresh on every access: one collector event builds
# five or six wrappers (event, delivery, link, session, connection, transport), some 60 us of
# client CPU per message, as much as the broker spends on it, so on a small box the client
# would set the pace. The two hot events (DELIVERY, LINK_FLOW) are therefore handled through
# cproton, the C binding underneath proton's classes, on the same engine objects; every other
# event goes through proton.Event as usual.
_C = cproton.lib


class LinkHandler(Protocol):
    """What an ``Engine`` calls for the hot events, with C pointers (``pn_delivery_t *``...)."""

    def on_delivery(self, delivery: Any) -> None: ...

    def on_flow(self, link: Any) -> None: ...


class Engine:
    """One proton connection (SASL PLAIN, plain AMQP) driven from a non-blocking socket.

    Remote closes and transport errors raise ``BenchError`` unless we are closing ourselves.
    """

    def __init__(self, port: int, handler: LinkHandler) -> None:
        self.handler = handler
        self.sock = socket.create_connection((HOST, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.sock, selectors.EVENT_READ)
        self._watching = selectors.EVENT_READ
        self.connection = proton.Connection()
        self.connection.container = f"bench-{os.getpid()}"
        self.connection.hostname = "localhost"
        self.connection.user = SAS_RULE
        self.connection.password = SAS_KEY
        self.transport = proton.Transport()
        sasl = self.transport.sasl()
        sasl.allowed_mechs("PLAIN")
        sasl.allow_insecure_mechs = True
        self.transport.bind(self.connection)
        self.collector = proton.Collector()
        self.connection.collect(self.collector)
        self.closing = False
        self.eof = False
        self.connection.open()
        self.session = self.connection.session()
        self.session.open()

    def sender(self, name: str, address: str) -> proton.Sender:
        link = self.session.sender(name)
        link.target.address = address
        link.open()
        return link

    def receiver(self, name: str, address: str, credit: int) -> proton.Receiver:
        link = self.session.receiver(name)
        link.source.address = address
        link.open()
        link.flow(credit)
        return link

    def run_until(
        self, done: Callable[[], bool], what: str, progress: Callable[[], object], stall: float
    ) -> None:
        """Pumps the connection until ``done()``; raises if ``progress()`` stops changing."""
        last, last_change = progress(), time.monotonic()
        while True:
            self._dispatch()
            self._write()
            if done():
                return
            self._wait(0.25)
            self._read()
            now = time.monotonic()
            current = progress()
            if current != last:
                last, last_change = current, now
            elif now - last_change > stall:
                raise BenchError(f"{what}: stalled for {stall:.0f} s at {current}")

    def close(self, timeout: float = 5.0) -> None:
        """Closes the connection and waits (a little) for the broker's close."""
        self.closing = True
        with contextlib.suppress(Exception):
            self.connection.close()
            deadline = time.monotonic() + timeout
            while not self.eof and time.monotonic() < deadline:
                self._dispatch()
                self._write()
                if self.connection.state & proton.Endpoint.REMOTE_CLOSED:
                    break
                self._wait(0.1)
                self._read()
        self.selector.close()
        self.sock.close()

    def _wait(self, timeout: float) -> None:
        want = selectors.EVENT_READ
        if self.transport.pending() > 0:
            want |= selectors.EVENT_WRITE
        if want != self._watching:
            self.selector.modify(self.sock, want)
            self._watching = want
        deadline = self.transport.tick(time.monotonic())  # heartbeats, idle timeout
        if deadline:
            timeout = max(0.0, min(timeout, deadline - time.monotonic()))
        self.selector.select(timeout)

    def _read(self) -> None:
        while not self.eof:
            capacity = self.transport.capacity()
            if capacity <= 0:
                return
            try:
                data = self.sock.recv(min(capacity, 1 << 20))
            except BlockingIOError:
                return
            except OSError as exc:
                self._lost(f"socket error: {exc}")
                return
            if not data:
                self._lost("broker closed the socket")
                return
            self.transport.push(data)

    def _write(self) -> None:
        while True:
            pending = self.transport.pending()
            if pending <= 0:
                return
            try:
                sent = self.sock.send(self.transport.peek(pending))
            except BlockingIOError:
                return
            except OSError as exc:
                self._lost(f"socket error: {exc}")
                return
            self.transport.pop(sent)

    def _lost(self, why: str) -> None:
        self.eof = True
        with contextlib.suppress(Exception):
            self.transport.close_tail()
        if not self.closing:
            raise BenchError(why)

    def _dispatch(self) -> None:
        collector, handler = self.collector._impl, self.handler
        while event := _C.pn_collector_peek(collector):
            kind = _C.pn_event_type(event)
            if kind == _C.PN_DELIVERY:
                handler.on_delivery(_C.pn_event_delivery(event))
            elif kind == _C.PN_LINK_FLOW:
                handler.on_flow(_C.pn_event_link(event))
            elif not self.closing:
                self._check(proton.Event.wrap(event))
            _C.pn_collector_pop(collector)

    @staticmethod
    def _check(event: proton.Event) -> None:
        if event.type in _REMOTE_CLOSES:
            what, condition = event.clazz.removeprefix("pn_"), event.context.remote_condition
            raise BenchError(f"broker closed the {what}: {_describe(condition)}")
        if event.type == proton.Event.TRANSPORT_ERROR:
            raise BenchError(f"transport error: {_describe(event.transport.condition)}")


_REMOTE_CLOSES = (
    proton.Event.CONNECTION_REMOTE_CLOSE,
    proton.Event.SESSION_REMOTE_CLOSE,
    proton.Event.LINK_REMOTE_CLOSE,
    proton.Event.LINK_REMOTE_DETACH,
)


def _describe(condition: proton.Condition | None) -> str:
    if condition is None:
        return "no error given"
    return f"{condition.name}: {condition.description}"


def _outcome(delivery: Any) -> str:
    wrapped = proton.Delivery.wrap(delivery)
    return f"{wrapped.remote_state} ({_describe(wrapped.remote.condition)})"


def _remote_active(link: proton.Link) -> bool:
    return bool(link.state & proton.Endpoint.REMOTE_ACTIVE)


def body(size: int) -> bytes:
    return bytes(i % 251 for i in range(size))


def encode_message(data: bytes) -> bytes:
    """One durable AMQP message with a binary body, encoded once and sent many times."""
    return proton.Message(body=data, durable=True).encode()


def send(link: Any, tag: int, payload: bytes) -> Any:
    """One whole delivery on a sender (a ``pn_link_t *``); returns the ``pn_delivery_t *``."""
    delivery = cproton.pn_delivery(link, b"%d" % tag)
    cproton.pn_link_send(link, payload)
    _C.pn_link_advance(link)
    return delivery


class EndToEnd:
    """Concurrent send + receive of ``count`` messages over one proton connection."""

    def __init__(self, port: int, queue: str, count: int, size: int, in_flight: int) -> None:
        self.count = count
        self.in_flight = in_flight
        self.body = body(size)
        self.payload = encode_message(self.body)
        self.sent = self.accepted = self.received = 0
        self.problems: list[str] = []
        self.started = False
        self.engine = Engine(port, self)
        self.sender = self.engine.sender("bench-sender", queue)
        self.receiver = self.engine.receiver("bench-receiver", queue, in_flight)
        self._snd, self._rcv = self.sender._impl, self.receiver._impl

    def run(self, stall: float) -> float:
        """Returns the seconds from the first send to the last message done."""
        engine = self.engine
        try:
            engine.run_until(
                lambda: _remote_active(self.sender) and _remote_active(self.receiver)
                and self.sender.credit > 0,
                "proton attach", lambda: 0, START_TIMEOUT,
            )  # fmt: skip
            start = time.perf_counter()
            self.started = True
            self.fill()
            engine.run_until(
                lambda: self.received >= self.count and self.accepted >= self.count,
                "proton e2e", self.progress, stall,
            )  # fmt: skip
            elapsed = time.perf_counter() - start
            if self.received > self.count:
                self.problems.append(f"received {self.received} messages, sent {self.count}")
            return elapsed
        finally:
            engine.close()

    def progress(self) -> str:
        return f"{self.sent} sent, {self.accepted} accepted, {self.received} received"

    def fill(self) -> None:
        """Sends while the broker gives credit and fewer than ``in_flight`` are unsettled."""
        link, payload = self._snd, self.payload
        limit = min(self.count, self.accepted + self.in_flight)
        while self.sent < limit and _C.pn_link_credit(link) > 0:
            send(link, self.sent, payload)
            self.sent += 1

    def on_flow(self, link: Any) -> None:
        if self.started and link == self._snd:
            self.fill()

    def on_delivery(self, delivery: Any) -> None:
        if _C.pn_delivery_link(delivery) == self._snd:
            self.on_outcome(delivery)
        else:
            self.on_message(delivery)

    def on_outcome(self, delivery: Any) -> None:
        state = _C.pn_delivery_remote_state(delivery)
        if state == _C.PN_ACCEPTED:
            self.accepted += 1
            _C.pn_delivery_settle(delivery)
            self.fill()
        elif state or _C.pn_delivery_settled(delivery):
            raise BenchError(f"a send was not accepted: {_outcome(delivery)}")

    def on_message(self, delivery: Any) -> None:
        """Takes a whole message, accepts it (settling at once) and tops credit back up."""
        if not _C.pn_delivery_readable(delivery) or _C.pn_delivery_partial(delivery):
            return
        link = self._rcv
        _, data = cproton.pn_link_recv(link, _C.pn_delivery_pending(delivery))
        _C.pn_link_advance(link)
        if self.received == 0:
            self.check_first(bytes(data))
        self.received += 1
        _C.pn_delivery_update(delivery, _C.PN_ACCEPTED)
        _C.pn_delivery_settle(delivery)
        credit = _C.pn_link_credit(link)
        if credit < self.in_flight // 2:
            _C.pn_link_flow(link, self.in_flight - credit)

    def check_first(self, data: bytes) -> None:
        """The first message back must carry the body we sent, still durable."""
        message = proton.Message()
        message.decode(data)
        if bytes(message.body or b"") != self.body:
            self.problems.append(f"first message body differs: {message.body!r:.80}")
        if not message.durable:
            self.problems.append("first message came back not durable")


def proton_e2e(port: int, queue: str, count: int, size: int, in_flight: int) -> float:
    EndToEnd(port, queue, min(count, WARM_UP), size, in_flight).run(stall=30.0)
    bench = EndToEnd(port, queue, count, size, in_flight)
    elapsed = bench.run(stall=30.0)
    for problem in bench.problems:
        print(f"  ! proton e2e: {problem}")
    return count / elapsed


class Loader:
    """Queues ``count`` messages fast: pre-settled sends, then one unsettled to wait on.

    The broker handles one connection's transfers in order and accepts only after the commit
    that holds them, so the last message's ``accepted`` means every message is stored.
    """

    def __init__(self, port: int, queue: str, count: int, size: int) -> None:
        self.count = count
        self.payload = encode_message(body(size))
        self.sent = 0
        self.confirmed = False
        self.engine = Engine(port, self)
        self.sender = self.engine.sender("bench-loader", queue)
        self._snd = self.sender._impl

    def run(self, stall: float = 60.0) -> float:
        """Returns the seconds from the first send to the broker accepting the last."""
        engine = self.engine
        try:
            engine.run_until(
                lambda: _remote_active(self.sender) and self.sender.credit > 0,
                "loader attach", lambda: 0, START_TIMEOUT,
            )  # fmt: skip
            start = time.perf_counter()
            self.fill()
            engine.run_until(lambda: self.confirmed, "loading", lambda: f"{self.sent} sent", stall)
            return time.perf_counter() - start
        finally:
            engine.close()

    def fill(self) -> None:
        link, payload, last = self._snd, self.payload, self.count - 1
        while self.sent < self.count and _C.pn_link_credit(link) > 0:
            delivery = send(link, self.sent, payload)
            if self.sent != last:
                _C.pn_delivery_settle(delivery)  # before it goes out: sent pre-settled
            self.sent += 1

    def on_flow(self, link: Any) -> None:
        if self.sent:
            self.fill()

    def on_delivery(self, delivery: Any) -> None:
        state = _C.pn_delivery_remote_state(delivery)
        if state == _C.PN_ACCEPTED:
            self.confirmed = True
            _C.pn_delivery_settle(delivery)
        elif state or _C.pn_delivery_settled(delivery):
            raise BenchError(f"the last message loaded was not accepted: {_outcome(delivery)}")


# ---------------------------------------------------------------------- azure-servicebus


def connection_string(port: int) -> str:
    return (
        f"Endpoint=sb://localhost:{port};SharedAccessKeyName={SAS_RULE};"
        f"SharedAccessKey={SAS_KEY};UseDevelopmentEmulator=true;"
    )


def sdk_e2e(port: int, queue: str, count: int, size: int, stall: float = 30.0) -> float:
    """A sender thread (batches of 100) and a receiver thread (prefetch 100, complete each)."""
    data = body(size)
    errors: list[Exception] = []
    received = [0]
    go = threading.Barrier(3)

    with ServiceBusClient.from_connection_string(connection_string(port)) as client:
        sender = client.get_queue_sender(queue)
        receiver = client.get_queue_receiver(queue, prefetch_count=SDK_BATCH)
        with sender, receiver:  # both links attached (and authorised) before the clock starts

            def send() -> None:
                try:
                    go.wait()
                    for start in range(0, count, SDK_BATCH):
                        n = min(SDK_BATCH, count - start)
                        sender.send_messages([ServiceBusMessage(data) for _ in range(n)])
                except Exception as exc:
                    errors.append(exc)

            def receive() -> None:
                try:
                    go.wait()
                    while received[0] < count:
                        batch = receiver.receive_messages(
                            max_message_count=SDK_BATCH, max_wait_time=stall
                        )
                        if not batch:
                            raise BenchError(f"SDK receive stalled at {received[0]}/{count}")
                        for message in batch:
                            receiver.complete_message(message)
                        received[0] += len(batch)
                except Exception as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=fn, daemon=True) for fn in (send, receive)]
            for thread in threads:
                thread.start()
            go.wait()
            start = time.perf_counter()
            for thread in threads:
                thread.join()
            elapsed = time.perf_counter() - start
    if errors:
        raise BenchError(f"SDK e2e failed: {errors[0]!r}") from errors[0]
    if received[0] != count:
        print(f"  ! SDK e2e: received {received[0]} messages, sent {count}")
    return count / elapsed


# ---------------------------------------------------------------------- main


def header(broker: BrokerProcess) -> str:
    return (
        f"broker: replication {REPLICATION_VERSION} via {broker.label} (pid {broker.pid}) | "
        f"clients: python-qpid-proton {'.'.join(map(str, proton.VERSION))}, "
        f"azure-servicebus {azure.servicebus.__version__} | "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages per e2e run")
    parser.add_argument("--size", type=int, default=256, help="e2e message body bytes")
    parser.add_argument("--in-flight", type=int, default=1_000, help="unsettled sends / credit")
    parser.add_argument("--rss-messages", type=int, default=1_000_000, help="1 KiB messages")
    parser.add_argument("--skip-rss", action="store_true", help="skip the memory measurement")
    parser.add_argument("--queue", help=f"queue name (default {DEFAULT_QUEUE})")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--broker-cmd", default=BROKER_CMD, help="broker command line template")
    which.add_argument("--standin", action="store_true", help=f"run {STANDIN_SCRIPT} instead")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.standin:
        command, label = STANDIN_CMD, f"stand-in {STANDIN_SCRIPT}"
    else:
        command = args.broker_cmd
        label = "python -m replication broker" if command == BROKER_CMD else repr(command)
    queue = args.queue or (STANDIN_QUEUE if args.standin else DEFAULT_QUEUE)
    broker = BrokerProcess(command, queue, label)
    failed = False
    try:
        broker.start()
        print(header(broker), flush=True)
        rate = proton_e2e(broker.port, queue, args.messages, args.size, args.in_flight)
        print(
            f"proton e2e: {rate:,.0f} msgs/s ({args.messages:,} x {args.size} B durable, "
            f"{args.in_flight:,} in flight, peek-lock + accept)", flush=True,
        )  # fmt: skip
        rate = sdk_e2e(broker.port, queue, args.messages, args.size)
        print(
            f"SDK e2e: {rate:,.0f} msgs/s ({args.messages:,} x {args.size} B, batches of "
            f"{SDK_BATCH}, prefetch {SDK_BATCH}, complete each)", flush=True,
        )  # fmt: skip
        if not args.skip_rss:
            before, _ = broker.memory_mb()
            elapsed = Loader(broker.port, queue, args.rss_messages, RSS_SIZE).run()
            rss, peak = broker.memory_mb()
            print(
                f"RSS: {rss:,.0f} MB with {args.rss_messages:,} x 1 KiB queued (peak "
                f"{peak:,.0f} MB, {before:,.0f} MB before); loaded in {elapsed:.1f} s = "
                f"{args.rss_messages / elapsed:,.0f} msgs/s", flush=True,
            )  # fmt: skip
    except Exception as exc:  # report, stop the broker, exit 1
        failed = True
        print(f"FAILED: {exc if isinstance(exc, BenchError) else repr(exc)}", file=sys.stderr)
        if not broker.alive():
            print(f"broker output:\n{broker.log()}", file=sys.stderr)
    finally:
        code = broker.stop()
    if broker.trouble:
        print(f"broker reported {len(broker.trouble)} warning/error line(s), first ones:")
        for line in broker.trouble[:10]:
            print(f"  {line}")
    if code not in (0, -signal.SIGTERM, None):
        print(f"broker exited with {code}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
