"""Shared fixtures for the broker's integration tests: a real broker on a background loop.

``broker`` (one broker, default queues) and ``broker_factory`` (any number, any config)
run ``replication.broker`` in a daemon thread with its own asyncio loop, listening on a
free port of 127.0.0.1 with its data in a fresh temporary directory, so the synchronous
``azure-servicebus`` client (and proton's ``BlockingConnection``) can be used straight
from the test's thread, and the asyncio client from the test's own loop.

A test picks a config for ``broker`` with ``@pytest.mark.broker_config(config_dict)``, or
calls ``broker_factory(config_dict)``. Config dicts follow the emulator's Config.json schema;
``make_config`` builds one from queue properties and optional authorization rules.

Teardown stops every broker on its loop (closing client connections), fails the test if
the broker cannot stop, and joins the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceivedMessage,
    ServiceBusReceiver,
    ServiceBusSender,
    ServiceBusSubQueue,
)
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.aio import ServiceBusReceiver as AsyncServiceBusReceiver
from azure.servicebus.aio import ServiceBusSender as AsyncServiceBusSender

from replication.broker.auth import EMULATOR_KEY, EMULATOR_RULE_NAME
from replication.broker.clock import Clock, ManualClock
from replication.broker.config import parse_config
from replication.broker.main import build_broker
from replication.broker.server import Broker
from tests.ports import LISTENING

T = TypeVar("T")

HOST = "127.0.0.1"
NAMESPACE = "sbemulatorns"
REPO_ROOT = Path(__file__).resolve().parents[2]

DEFAULT_QUEUES: dict[str, dict[str, Any]] = {
    "q": {},
    "dlq-test": {"MaxDeliveryCount": 2, "LockDuration": "PT5S"},
    "dedupe": {"RequiresDuplicateDetection": True, "DuplicateDetectionHistoryTimeWindow": "PT20S"},
    "ttl": {"DefaultMessageTimeToLive": "PT2S", "DeadLetteringOnMessageExpiration": True},
    "short-lock": {"LockDuration": "PT5S"},
}
"""The queues every default broker has, with their Config.json ``Properties``."""


def make_config(
    queues: dict[str, dict[str, Any]] | None = None,
    rules: list[dict[str, Any]] | None = None,
    *,
    topics: dict[str, dict[str, Any]] | None = None,
    namespace: str = NAMESPACE,
) -> dict[str, Any]:
    """An emulator-schema Config.json dict: ``queues`` maps names to ``Properties``
    (default ``DEFAULT_QUEUES``); ``rules`` is the namespace's ``AuthorizationRules``
    (``[{"Name": ..., "Key": ..., "Rights": [...]}]``), left out when None; ``topics`` maps
    topic names to ``{"Properties": {...}, "Subscriptions": {name: {"Properties": {...},
    "Rules": [...]}}}`` (both keys optional)."""
    queues = DEFAULT_QUEUES if queues is None else queues
    ns: dict[str, Any] = {
        "Name": namespace,
        "Queues": [
            {"Name": name, "Properties": copy.deepcopy(props)} for name, props in queues.items()
        ],
    }
    if topics:
        ns["Topics"] = [
            {
                "Name": name,
                "Properties": copy.deepcopy(topic.get("Properties", {})),
                "Subscriptions": [
                    {"Name": sub_name, **copy.deepcopy(sub)}
                    for sub_name, sub in topic.get("Subscriptions", {}).items()
                ],
            }
            for name, topic in topics.items()
        ]
    if rules is not None:
        ns["AuthorizationRules"] = copy.deepcopy(rules)
    return {"UserConfig": {"Namespaces": [ns], "Logging": {"Type": "File"}}}


def connection_string(
    port: int, key_name: str = EMULATOR_RULE_NAME, key: str = EMULATOR_KEY, host: str = "localhost"
) -> str:
    """An emulator-style connection string (plain AMQP on ``port``)."""
    return (
        f"Endpoint=sb://{host}:{port};SharedAccessKeyName={key_name};"
        f"SharedAccessKey={key};UseDevelopmentEmulator=true;"
    )


def write_config(path: Path, config: dict[str, Any]) -> Path:
    """Writes a Config.json dict to ``path`` and returns the path."""
    path.write_text(json.dumps(config, indent=2))
    return path


# ---------------------------------------------------------------------------- loop thread


class LoopThread:
    """An asyncio event loop running forever in a daemon thread, stopped by ``close``."""

    def __init__(self, name: str = "broker-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def submit(self, coro: Awaitable[T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]

    def run(self, coro: Awaitable[T], timeout: float = 15.0) -> T:
        """Runs ``coro`` on the loop and waits (from another thread) for its result."""
        return self.submit(coro).result(timeout)

    def call(self, fn: Callable[[], T], timeout: float = 15.0) -> T:
        """Calls ``fn`` on the loop's thread (to read or change broker state without races)."""

        async def _call() -> T:
            return fn()

        return self.run(_call(), timeout)

    def close(self, timeout: float = 10.0) -> None:
        if self.loop.is_closed():
            return

        async def _cancel_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            self.run(_cancel_rest(), timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the broker's event loop thread did not stop"


# ---------------------------------------------------------------------------- SDK clients


class QuickCloseClient(ServiceBusClient):
    """``ServiceBusClient`` whose senders and receivers default to ``keep_alive=None``.

    Each sync handler otherwise starts a keep-alive thread that sleeps in 1 s steps, and
    closing the handler joins it: up to a second per sender or receiver. The client does not
    pass its own ``keep_alive`` on to handlers, hence the override. (Receivers with
    ``prefetch_count=0``, the default, still get one: the SDK then forces a 5 s keep-alive.)
    Everything else is the unmodified SDK; tests that want the stock client use
    ``ServiceBusClient`` directly.
    """

    def get_queue_sender(self, queue_name: str, **kwargs: Any) -> ServiceBusSender:
        kwargs.setdefault("keep_alive", None)
        return super().get_queue_sender(queue_name, **kwargs)

    def get_queue_receiver(self, queue_name: str, **kwargs: Any) -> ServiceBusReceiver:
        kwargs.setdefault("keep_alive", None)
        return super().get_queue_receiver(queue_name, **kwargs)

    def get_topic_sender(self, topic_name: str, **kwargs: Any) -> ServiceBusSender:
        kwargs.setdefault("keep_alive", None)
        return super().get_topic_sender(topic_name, **kwargs)

    def get_subscription_receiver(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> ServiceBusReceiver:
        kwargs.setdefault("keep_alive", None)
        return super().get_subscription_receiver(topic_name, subscription_name, **kwargs)


class QuickCloseAsyncClient(AsyncServiceBusClient):
    """The asyncio ``ServiceBusClient`` with ``keep_alive=None`` handlers: closing an aio
    handler awaits its keep-alive task, which sleeps in 1 s steps (see ``QuickCloseClient``)."""

    def get_queue_sender(self, queue_name: str, **kwargs: Any) -> AsyncServiceBusSender:
        kwargs.setdefault("keep_alive", None)
        return super().get_queue_sender(queue_name, **kwargs)

    def get_queue_receiver(self, queue_name: str, **kwargs: Any) -> AsyncServiceBusReceiver:
        kwargs.setdefault("keep_alive", None)
        return super().get_queue_receiver(queue_name, **kwargs)

    def get_topic_sender(self, topic_name: str, **kwargs: Any) -> AsyncServiceBusSender:
        kwargs.setdefault("keep_alive", None)
        return super().get_topic_sender(topic_name, **kwargs)

    def get_subscription_receiver(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> AsyncServiceBusReceiver:
        kwargs.setdefault("keep_alive", None)
        return super().get_subscription_receiver(topic_name, subscription_name, **kwargs)


# ---------------------------------------------------------------------------- broker handle


class BrokerHandle:
    """A running broker: ``port``, ``connection_string``, ``data_dir``, ``broker``, ``config``.

    ``restart()`` stops the broker and starts a new one over the same data dir and port
    (optionally with another config); ``stop()`` stops it for good. ``call(fn)`` runs
    ``fn`` on the broker's loop (the broker is single-threaded: inspect it only there).
    """

    def __init__(
        self, config: dict[str, Any], data_dir: Path, port: int = 0, clock: Clock | None = None
    ) -> None:
        self.config = config
        self.data_dir = data_dir
        self.port = port
        self.clock = clock
        """The broker's clock when the test gave one (a ``ManualClock``: see ``advance``)."""
        self.broker: Broker | None = None
        self.loop_thread: LoopThread | None = None
        self._start()

    # -- lifecycle

    def _start(self) -> None:
        parsed = parse_config(self.config)
        self.loop_thread = LoopThread(f"broker-loop-{self.port}")

        async def start() -> Broker:
            options = {} if self.clock is None else {"clock": self.clock}
            broker = build_broker(parsed, self.data_dir, HOST, self.port, **options)
            await broker.start()  # closes its store when it cannot listen (the port is taken)
            return broker

        try:
            self.broker = self.loop_thread.run(start())
        except BaseException:
            self.loop_thread.close()
            self.loop_thread = None
            raise
        self.port = self.broker.port

    def stop(self) -> None:
        """Stops the broker on its loop (closing every client connection), joins the thread."""
        if self.loop_thread is None:
            return
        loop_thread, broker = self.loop_thread, self.broker
        self.loop_thread = None
        try:
            if broker is not None:
                loop_thread.run(broker.stop(), timeout=15.0)
        finally:
            loop_thread.close()

    def advance(self, seconds: float) -> None:
        """Moves the broker's ``ManualClock`` on and lets it see what that did (locks and
        sessions expired, TTLs run out, schedules due, transactions timed out) at once."""
        clock = self.clock
        if not isinstance(clock, ManualClock):
            raise TypeError("advance needs a broker started with clock=ManualClock()")

        def move() -> None:
            clock.advance(seconds)
            assert self.broker is not None
            self.broker.sweep(everything=True)

        self.call(move)

    def advance_to(self, when: datetime) -> None:
        """``advance`` until the broker's ``ManualClock`` reads ``when``."""
        assert self.clock is not None
        self.advance(when.timestamp() - self.clock.time())

    def restart(self, config: dict[str, Any] | None = None) -> BrokerHandle:
        """A clean stop and a fresh broker on the same port and data dir (the port the OS
        gave the first start: free from the stop to the restart, the one window in which
        another socket could take it)."""
        self.stop()
        if config is not None:
            self.config = config
        deadline = time.monotonic() + 5.0
        while True:  # the port is ours again once the old listener is gone
            try:
                self._start()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    @property
    def running(self) -> bool:
        return self.loop_thread is not None

    # -- access

    @property
    def connection_string(self) -> str:
        return connection_string(self.port)

    def connection_string_for(self, key_name: str, key: str) -> str:
        return connection_string(self.port, key_name, key)

    @property
    def endpoint(self) -> str:
        """The fully qualified namespace the SDK's credential constructors take."""
        return f"localhost:{self.port}"

    def audience(self, entity: str = "") -> str:
        """The CBS audience / SAS ``sr`` for an entity (``""``: the whole namespace)."""
        return f"sb://localhost:{self.port}/{entity}".rstrip("/")

    def call(self, fn: Callable[[], T], timeout: float = 15.0) -> T:
        assert self.loop_thread is not None, "the broker is stopped"
        return self.loop_thread.call(fn, timeout)

    def run(self, coro: Awaitable[T], timeout: float = 15.0) -> T:
        assert self.loop_thread is not None, "the broker is stopped"
        return self.loop_thread.run(coro, timeout)

    def drop_receiving_connections(self) -> int:
        """Aborts (no close, no detach: a network failure) every connection with a receiving
        link; returns how many."""

        def drop() -> int:
            assert self.broker is not None
            peers = [p for p in self.broker.peers.values() if p.consumers]
            for peer in peers:
                assert peer.driver.transport is not None
                peer.driver.transport.abort()
            return len(peers)

        return self.call(drop)

    def client(self, **kwargs: Any) -> ServiceBusClient:
        """A sync SDK client over the emulator connection string (``conn_str=`` for another
        key), whose senders and receivers run without the SDK's keep-alive thread (see
        ``QuickCloseClient``)."""
        conn = kwargs.pop("conn_str", None) or self.connection_string
        return QuickCloseClient.from_connection_string(conn, **kwargs)

    def aio_client(self, **kwargs: Any) -> AsyncServiceBusClient:
        """An asyncio SDK client over the emulator connection string (create it inside the
        test's loop), with quickly closing handlers (see ``QuickCloseAsyncClient``)."""
        conn = kwargs.pop("conn_str", None) or self.connection_string
        return QuickCloseAsyncClient.from_connection_string(conn, **kwargs)

    def count(self, queue: str) -> int:
        """Messages stored for ``queue`` (any state), read on the broker's loop."""

        def count() -> int:
            assert self.broker is not None
            q = self.broker.queues[queue.lower()]
            return self.broker.store.count(q.entity)

        return self.call(count)

    def message_ids(self, queue: str) -> list[str | None]:
        """The message-id of every message stored for ``queue`` (any state), in order."""

        def ids() -> list[str | None]:
            assert self.broker is not None
            return self.broker.store.message_ids(self.broker.queues[queue.lower()].entity)

        return self.call(ids)


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Callable[..., BrokerHandle]]:
    """``broker_factory(config=None, data_dir=None, port=0, clock=None)`` starts a broker
    (default config: ``make_config()``; ``clock=ManualClock()`` for exact time, see
    ``BrokerHandle.advance``); all are stopped at teardown."""
    handles: list[BrokerHandle] = []

    def start(
        config: dict[str, Any] | None = None, data_dir: Path | None = None, port: int = 0,
        clock: Clock | None = None,
    ) -> BrokerHandle:  # fmt: skip
        if data_dir is None:
            data_dir = tmp_path / f"broker-{len(handles)}"
        data_dir.mkdir(parents=True, exist_ok=True)
        config = make_config() if config is None else config
        handle = BrokerHandle(config, data_dir, port, clock)
        handles.append(handle)
        return handle

    yield start
    failures = []
    for handle in reversed(handles):
        try:
            handle.stop()
        except Exception as exc:  # pragma: no cover - reported below
            failures.append(f"{type(exc).__name__}: {exc}")
    assert not failures, f"broker did not stop cleanly: {failures}"


@pytest.fixture
def broker(
    request: pytest.FixtureRequest, broker_factory: Callable[..., BrokerHandle]
) -> BrokerHandle:
    """One running broker; config from ``@pytest.mark.broker_config(dict)``, else the default."""
    marker = request.node.get_closest_marker("broker_config")
    config = marker.args[0] if marker is not None else None
    return broker_factory(config)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "broker_config(config): the Config.json dict the `broker` fixture uses"
    )


# ---------------------------------------------------------------------------- broker process


class BrokerProcess:
    """``python -m replication broker`` as a child process (for kill -9 style tests)."""

    def __init__(self, config_path: Path, data_dir: Path, port: int, log_path: Path) -> None:
        self.config_path = config_path
        self.data_dir = data_dir
        self.port = port
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def connection_string(self) -> str:
        return connection_string(self.port)

    def start(self, timeout: float = 20.0) -> BrokerProcess:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable, "-m", "replication", "broker",
                    "--config", str(self.config_path), "--port", str(self.port),
                    "--data-dir", str(self.data_dir),
                ],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.data_dir,
                start_new_session=True,  # its own process group: ended whole, as a fixture must
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"broker exited with {self.process.returncode}: {self.log_path.read_text()}"
                )
            # the OS picked it: the log says which; a restart after a kill reuses it (free
            # from the kill to the restart: the one window another socket has to take it)
            if self.port == 0:
                bound = LISTENING.findall(self.log_path.read_text())
                if bound:
                    self.port = int(bound[-1])
            if self.port:
                with contextlib.suppress(OSError), socket.create_connection((HOST, self.port), 0.2):
                    return self
            time.sleep(0.05)
        self.kill()
        raise TimeoutError(f"broker did not listen in {timeout} s: {self.log_path.read_text()}")

    def kill(self) -> None:
        """SIGKILL: no chance to clean up (what a crash looks like)."""
        if self.process is not None and self.process.poll() is None:
            self._signal(signal.SIGKILL)
            self.process.wait(10)

    def _signal(self, number: int) -> None:
        """To the broker's whole process group (whatever it started goes with it)."""
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, number)

    def terminate(self, timeout: float = 10.0) -> int | None:
        """SIGTERM and wait: the broker's graceful stop."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait(10)
        return self.process.returncode


@pytest.fixture
def broker_process(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """``broker_process(config=None, data_dir=None, port=None)`` starts the CLI broker as a
    child process (default config ``make_config()``, a port from the OS); killed at
    teardown."""
    processes: list[BrokerProcess] = []

    def start(
        config: dict[str, Any] | None = None, data_dir: Path | None = None, port: int | None = None
    ) -> BrokerProcess:
        n = len(processes)
        config_path = write_config(tmp_path / f"Config-{n}.json", config or make_config())
        data_dir = data_dir or tmp_path / f"broker-process-{n}"
        data_dir.mkdir(parents=True, exist_ok=True)
        proc = BrokerProcess(config_path, data_dir, port or 0, tmp_path / f"log-{n}.txt")
        processes.append(proc)
        return proc.start()

    yield start
    for proc in processes:
        proc.kill()


# ---------------------------------------------------------------------------- small helpers


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05) -> Any:
    """Polls ``predicate`` until it returns something truthy; fails after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


def concurrently(*calls: Callable[[], T]) -> list[T]:
    """Runs independent calls at once, one thread each, and returns their results in order.
    An SDK handler waits in real time however idle the machine is (its open reads one frame
    per 50 ms sleep, a receiver's or consumer's close joins a keep-alive thread that sleeps
    in 1 s steps): independent readers wait side by side instead of one after another."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.result() for future in futures]


DRAIN_PREFETCH = 100
"""The ``prefetch_count`` of receivers that take whatever an entity holds (``take_all``,
``dead_letters``): what they buffer ahead they take anyway, and the SDK gives a receiver
without prefetch a keep-alive thread that sleeps in 1 s steps and that its close joins."""


def take_all(
    receiver: ServiceBusReceiver, wait: float = 1.0, batch: int = 100
) -> list[ServiceBusReceivedMessage]:
    """Receives and completes whatever the receiver's entity holds now. Done once a peek finds
    nothing (the broker answers at once: no idle wait, not even for an empty entity), or
    once a receive gets nothing in ``wait`` s (what is left cannot be received: deferred,
    scheduled, or locked elsewhere)."""
    out: list[ServiceBusReceivedMessage] = []
    while receiver.peek_messages(max_message_count=1, sequence_number=1):
        received = receiver.receive_messages(max_message_count=batch, max_wait_time=wait)
        if not received:
            break
        for message in received:
            receiver.complete_message(message)
        out += received
    return out


def receive_all(broker: BrokerHandle, queue: str, **kwargs: Any) -> list[ServiceBusReceivedMessage]:
    """Receives and completes whatever ``queue`` holds (``take_all``); ``kwargs`` go to
    ``get_queue_receiver`` (session_id, sub_queue, ...). Prefetching: a receiver without
    prefetch gets the SDK's forced keep-alive thread, which its close waits for (up to 1 s)."""
    kwargs.setdefault("prefetch_count", DRAIN_PREFETCH)
    with broker.client() as client, client.get_queue_receiver(queue, **kwargs) as receiver:
        return take_all(receiver)


def receive_n(
    receiver: ServiceBusReceiver, count: int, timeout: float = 10.0, max_wait_time: float = 1.0
) -> list[ServiceBusReceivedMessage]:
    """Receives until ``count`` messages arrived (fails on more, or on fewer after ``timeout``)."""
    received: list[ServiceBusReceivedMessage] = []
    deadline = time.monotonic() + timeout
    while len(received) < count and time.monotonic() < deadline:
        received += receiver.receive_messages(
            max_message_count=count - len(received), max_wait_time=max_wait_time
        )
    assert len(received) == count, f"received {len(received)} of {count} messages"
    return received


def whole_ms(when: datetime) -> datetime:
    """``when`` in whole milliseconds, as AMQP carries times: a test that steps a
    ``ManualClock`` to half a millisecond before and after it knows what the broker sees."""
    return when.replace(microsecond=when.microsecond // 1000 * 1000)


def body_bytes(message: Any) -> bytes:
    """A received message's data body as one ``bytes``."""
    body = message.body
    if isinstance(body, bytes | bytearray):
        return bytes(body)
    return b"".join(body)


def send(broker: BrokerHandle, queue: str, *messages: ServiceBusMessage) -> None:
    """Sends ``messages`` (as one batch) with a short-lived client."""
    with broker.client() as client, client.get_queue_sender(queue) as sender:
        sender.send_messages(list(messages))


def nothing_more(receiver: ServiceBusReceiver, wait: float = 0.5) -> bool:
    """No message arrives within ``wait`` s (the broker delivers at once when it has one)."""
    return receiver.receive_messages(max_message_count=10, max_wait_time=wait) == []


def dead_letters(
    broker: BrokerHandle, queue: str, count: int, timeout: float = 10.0
) -> list[ServiceBusReceivedMessage]:
    """Receives and completes ``count`` messages from the queue's dead-letter sub-queue."""
    with (
        broker.client() as client,
        client.get_queue_receiver(
            queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER, prefetch_count=DRAIN_PREFETCH
        ) as receiver,
    ):
        messages = receive_n(receiver, count, timeout=timeout)
        for message in messages:
            receiver.complete_message(message)
        assert nothing_more(receiver)
    return messages


def proton_connection(
    port: int,
    user: str | None = EMULATOR_RULE_NAME,
    password: str | None = EMULATOR_KEY,
    timeout: float = 10.0,
    **kwargs: Any,
) -> Any:
    """A python-qpid-proton ``BlockingConnection`` to the broker, SASL PLAIN as ``user``
    (a rule name) with ``password`` (its key); ``user=None`` for ANONYMOUS."""
    from proton.utils import BlockingConnection

    if user is not None:
        kwargs.setdefault("allowed_mechs", "PLAIN")
        kwargs.update(user=user, password=password)
    else:
        kwargs.setdefault("allowed_mechs", "ANONYMOUS")
    return BlockingConnection(f"amqp://{HOST}:{port}", timeout=timeout, **kwargs)
