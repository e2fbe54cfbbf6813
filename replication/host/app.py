"""``python -m replication start``: the local host, end to end.

Loads the settings, starts embedded brokers for local emulator connections (with the
entities the pipelines use), discovers ``function_app.py``'s Service Bus triggers, runs them
(``trigger.TriggerRunner``), serves ``/metrics``, ``/health`` and the dashboard on 127.0.0.1
(for loopback Hosts and Origins only: ``broker/loopback.py``), and shows progress. Ctrl-C
(or SIGTERM) stops receiving, lets every in-flight batch finish and settle, stops the
brokers: nothing received is lost (unsettled messages would simply come back).

A ``transactional: true`` pipeline is not run as a function: its copies and its source's
completes must be one Service Bus transaction, and the Functions host (which this host
emulates, and Azure's alike) receives and settles a function's messages on its own
connection, which that transaction cannot include. ``register_pipelines`` hands such
pipelines to this host (``functions.pumped_by_host``), and each of their sources runs with
the task pump instead (``pumped.PumpRunner``: our receiver, the transaction per batch),
started, stopped and reported like the triggers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .. import metrics
from ..broker.loopback import refusal
from ..clock import SYSTEM, Clock
from ..dashboard.threaded import serve
from ..generated import generated, pipeline_name
from .discovery import ServiceBusTrigger, load_app, not_run, service_bus_triggers
from .embedded import plan_brokers, start_brokers, trigger_endpoints
from .eventhubs import EventHubOptions, EventHubTriggerRunner, event_hub_triggers
from .invocation import Invoker
from .process import WorkerPool
from .pumped import PumpRunner
from .relay import runtime_targets
from .settings import load_settings
from .settlement import SettlementService
from .timer import TimerRunner, timer_triggers
from .trigger import HostOptions, TriggerRunner
from .worker import Worker

if TYPE_CHECKING:
    from ..broker.server import Broker
    from ..dashboard import Dashboard
    from ..failover.runtime import Failover
    from ..pipeline import Pipeline, PipelineFile

log = logging.getLogger("replication.host")

MAX_REFUSED_BODY = 1024 * 1024
"""A refused request's body is read (and dropped) up to this size before the answer, so the
close after it does not reset the connection under the client's feet."""


@dataclass(slots=True)
class HostConfig:
    directory: Path = field(default_factory=Path.cwd)
    settings_file: Path | None = None
    metrics_port: int | None = 9464
    """``/metrics`` (Prometheus) and ``/health``; None: no HTTP server."""
    progress: bool = True
    stop_when: Callable[[Host], bool] | None = None
    """Ends the run when true (checked twice a second): the demo stops once it is done."""
    before_stop: Callable[[Host], Awaitable[None]] | None = None
    """Awaited after the triggers stopped, while the brokers still run (the demo's report)."""
    data_dir: Path | None = None
    """The embedded brokers' state; None: ``<directory>/.replication``."""
    stop_grace: float = 30.0
    """Seconds a stop waits for the batches in flight before it cancels them."""
    ui: bool = True
    """The dashboard on the metrics port (``/``; ``replication.dashboard``)."""
    clock: Clock = SYSTEM
    """What the triggers, pumps, timers, functions and embedded brokers wait on and stamp
    with (tests pass a ``ManualClock``)."""
    worker_process: bool = True
    """The functions run in a worker process of their own (``process.py``), as in Azure;
    False, or a clock other than the system's (it cannot cross a process boundary): on a
    worker thread of the host's process (``worker.py``)."""


class Host:
    """The running host (also what tests drive)."""

    def __init__(self, config: HostConfig) -> None:
        self.config = config
        self.settings, self.settings_path = load_settings(config.directory, config.settings_file)
        host_json = config.directory / "host.json"
        data = json.loads(host_json.read_text()) if host_json.is_file() else {}
        self.options = HostOptions.from_host_json(data)
        self.triggers: list[ServiceBusTrigger] = []
        self.event_hub_options = EventHubOptions.from_host_json(data)
        self.runners: list[TriggerRunner | PumpRunner | EventHubTriggerRunner] = []
        """The triggers' runners, then the transactional pipelines' pumps, then the Event
        Hubs triggers' runners."""
        self.timers: list[TimerRunner] = []
        """The timer functions' runners (the sources' recovery point probes among them)."""
        self.brokers: list[Broker] = []
        self.pipeline_set: list[Pipeline] = []
        """The pipelines file's pipelines (the dashboard shows their targets)."""
        self.dashboard: Dashboard | None = None
        self.worker: Invoker | None = None
        """Where the functions run (``HostConfig.worker_process``), once running."""
        self.stop = asyncio.Event()
        self.started = time.monotonic()
        self.healthy = False

    async def run(self) -> int:
        """Runs until stopped. The app settings are in the environment meanwhile (functions
        read them there, as in Azure) and are put back as they were afterwards, so a host
        run inside another program (tests, notebooks) leaves its environment alone."""
        with _environment(self.settings):
            return await self._run()

    async def _run(self) -> int:
        from ..functions import pumped_by_host
        from ..pipeline import load_pipelines

        named = self.settings.get("REPLICATION_PIPELINES")
        pipelines_path = self.config.directory / (named or "pipelines.yaml")
        pipelines = None  # any function app runs, with or without a pipeline file
        if named or pipelines_path.is_file():
            pipelines = load_pipelines(pipelines_path, settings=self.settings)
            self.pipeline_set = list(pipelines.pipelines)
        data_dir = self.config.data_dir or self.config.directory / ".replication"
        clock = self.config.clock
        with pumped_by_host(clock) as transactional:
            app = load_app(self.config.directory / "function_app.py")
        for reason in not_run(app):
            log.warning("%s", reason)
        self.triggers = [t for t in service_bus_triggers(app, self.settings) if self._connected(t)]
        hub_triggers = [h for h in event_hub_triggers(app, self.settings) if self._connected(h)]
        timers = timer_triggers(app, self.settings)
        plan = plan_brokers(
            pipelines.pipelines if pipelines else [],
            self.settings,
            trigger_endpoints([*self.triggers, *hub_triggers]),
        )
        self.brokers = await start_brokers(plan, data_dir, clock)
        for broker in self.brokers:
            log.info(
                "embedded broker on localhost:%d (%d entities)", broker.port, len(broker.entities)
            )
        if not self.triggers and not transactional and not hub_triggers and not timers:
            log.warning(
                "function_app.py has no Service Bus, Event Hubs or timer triggers: nothing to run"
            )
        worker = self.worker = self._worker(clock)
        self.runners = [
            TriggerRunner(
                t,
                self.settings[t.connection],
                self.options.for_trigger(t),
                failover=source_failover(pipelines, t, self.settings),
                worker=worker,
                clock=clock,
            )
            for t in self.triggers
        ]
        for pipeline in transactional:
            log.info(
                "%s is transactional: its sources run with the task pump, not as functions",
                pipeline.name,
            )
            self.runners += PumpRunner.for_pipeline(pipeline, self.settings, self.options, clock)
        self.timers = [TimerRunner(t, worker, clock) for t in timers]
        checkpoints = None
        if hub_triggers:
            from .checkpoints import SqliteCheckpointStore

            checkpoints = SqliteCheckpointStore.in_directory(data_dir)
        for hub in hub_triggers:
            assert checkpoints is not None
            self.runners.append(
                EventHubTriggerRunner(
                    hub,
                    self.settings[hub.connection],
                    checkpoints,
                    worker,
                    self.event_hub_options.for_function(hub.function),
                )
            )
        server = self._serve_metrics()
        self._install_signals()
        jobs: list[asyncio.Task[None]] = []
        try:
            if isinstance(worker, WorkerPool) and (self.triggers or hub_triggers or timers):
                await worker.start()  # the app imported there before anything is received
            self.healthy = True
            jobs += [asyncio.create_task(runner.run(self.stop)) for runner in self.runners]
            jobs += [asyncio.create_task(timer.run(self.stop)) for timer in self.timers]
            await self._watch()
        finally:
            self.stop.set()
            log.info("stopping: in-flight batches finish and settle")
            late: set[asyncio.Task[None]] = set()
            if jobs:
                _, late = await asyncio.wait(jobs, timeout=self.config.stop_grace)
            if late:  # e.g. held for a target that is down: released, no delivery spent
                log.warning(
                    "%d trigger(s) still busy after %g s: their messages are released",
                    len(late),
                    self.config.stop_grace,
                )
                for job in late:
                    job.cancel()
            results = await asyncio.gather(*jobs, return_exceptions=True)
            worker.stop()
            if checkpoints is not None:
                checkpoints.close()
            log.info("triggers stopped")
            for result in results:
                if isinstance(result, BaseException) and not isinstance(
                    result, asyncio.CancelledError
                ):
                    log.error("trigger ended with %r", result)
            if self.config.before_stop is not None:
                await self.config.before_stop(self)
            if self.dashboard is not None:  # its clients close before the brokers go
                await self.dashboard.stop()
            for broker in self.brokers:
                await broker.stop()
            if server is not None:
                server.shutdown()
            self.healthy = False
        return 0

    def _connected(self, trigger: Any) -> bool:
        """Whether the trigger's connection setting is defined; a function whose is not is
        left out with the reason, as the Functions host leaves it (the others run)."""
        if trigger.connection in self.settings:
            return True
        log.error(
            "function %s is not run: its connection setting %r is not defined; make sure "
            'it is an app setting (local.settings.json "Values", or the environment)',
            trigger.name,
            trigger.connection,
        )
        return False

    def _worker(self, clock: Clock) -> Invoker:
        """The worker the functions run in (``HostConfig.worker_process``)."""
        if not self.config.worker_process or clock is not SYSTEM:
            return Worker()
        settlement = SettlementService.shared().worker_arguments()
        app = self.config.directory / "function_app.py"
        return WorkerPool.from_settings(app, settlement, self.settings)

    async def _watch(self) -> None:
        display = _Progress(self) if self.config.progress else None
        try:
            while not self.stop.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), 0.5)
                await self._update_backlog()
                if display is not None:
                    display.update()
                if self.config.stop_when is not None and self.config.stop_when(self):
                    return
        finally:
            if display is not None:
                display.close()

    def runtime_targets(self, runner: Any) -> list[Any]:
        """The targets of the pipeline a trigger's function runs (``tasks.targets.Target``),
        once its first batch built them (``functions.PipelineRuntime``); of a function in a
        worker process, its failover targets as the worker last told (``relay.py``)."""
        trigger = getattr(runner, "trigger", None)
        info = generated(getattr(trigger, "function", None))
        if trigger is None or info is None:
            return []
        if info.runtime:
            return list(info.runtime[0].targets.values())
        return runtime_targets(trigger.name)

    def pipelines(self) -> list[str]:
        """The pipelines (or other functions) running, by the names the metrics use."""
        return sorted({_runs(runner)[0] for runner in self.runners})

    async def _update_backlog(self) -> None:
        for broker in self.brokers:
            for runner in self.runners:
                pipeline, entity = _runs(runner)
                if broker.port != _port(runner.connection_string):
                    continue
                if isinstance(runner, EventHubTriggerRunner):
                    hub = broker.event_hubs.hubs.get(entity.lower())
                    if hub is not None:
                        metrics.BACKLOG.labels(pipeline).set(runner.backlog(hub.partitions))
                    continue
                queue = broker.queues.get(entity.lower())
                if queue is not None:
                    metrics.BACKLOG.labels(pipeline).set(len(queue.ready) + len(queue.locks))

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stop.set)

    def _serve_metrics(self) -> ThreadingHTTPServer | None:
        if self.config.metrics_port is None:
            return None
        host = self
        dashboard = self.dashboard = self._dashboard()
        loop = asyncio.get_running_loop()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self._refused():
                    return
                if dashboard is None or not serve(self, dashboard, loop):
                    self.send_error(404)

            def do_GET(self) -> None:
                if self._refused():
                    return
                if self.path.startswith("/metrics"):
                    body, kind, code = generate_latest(metrics.REGISTRY), CONTENT_TYPE_LATEST, 200
                elif self.path.startswith("/health"):
                    ok = host.healthy
                    body = json.dumps({"status": "ok" if ok else "starting"}).encode()
                    kind, code = "application/json", 200 if ok else 503
                elif dashboard is not None and serve(self, dashboard, loop):
                    return
                else:
                    body, kind, code = b"not found\n", "text/plain", 404
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _refused(self) -> bool:
                """Bound to 127.0.0.1: other Hosts and Origins are refused (``loopback.py``)."""
                headers = self.headers
                why = refusal(self.command, headers.get("Host"), headers.get("Origin"))
                if why is None:
                    return False
                with contextlib.suppress(ValueError):  # read what was sent: no reset at close
                    length = int(headers.get("Content-Length") or 0)
                    self.rfile.read(length if 0 < length <= MAX_REFUSED_BODY else 0)
                body = why.message.encode() + b"\n"
                self.send_response(why.status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return True

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.config.metrics_port), Handler)
        self.config.metrics_port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        log.info(
            "metrics on http://127.0.0.1:%d/metrics, health on /health", self.config.metrics_port
        )
        if dashboard is not None:
            log.info("dashboard on http://127.0.0.1:%d/", self.config.metrics_port)
        return server

    def _connections_by_service(self) -> tuple[set[str], set[str]]:
        """The connection settings the pipelines use for Service Bus, and for event hubs."""
        service_bus: set[str] = set()
        hubs: set[str] = set()
        for pipeline in self.pipeline_set:
            for endpoint in [*pipeline.sources, *pipeline.target_endpoints().values()]:
                (hubs if endpoint.is_event_hub else service_bus).add(endpoint.connection)
        return service_bus, hubs

    def _dashboard(self) -> Dashboard | None:
        """The dashboard over the embedded brokers' namespaces and the pipelines (None with
        ``ui`` off); its sampling starts now, on the host's loop."""
        if not self.config.ui:
            return None
        from ..dashboard import Dashboard, Namespace, PipelineBoard
        from ..dashboard.eventhubs_view import EventHubsView, catalog_of

        service_bus, hubs = self._connections_by_service()
        namespaces = []
        catalogs = {}
        for broker in self.brokers:
            names = [
                name for name, value in sorted(self.settings.items()) if _port(value) == broker.port
            ]
            # the page shows a namespace's Service Bus entities: it is named by the settings
            # pipelines reach them with (a local broker may serve event hubs too)
            names = (
                [n for n in names if n in service_bus]
                or [n for n in names if n not in hubs]
                or names
            )
            namespaces.append(Namespace.of_broker(broker, " / ".join(names) or None))
            catalogs[namespaces[-1].name] = catalog_of(broker)  # its event hubs, if any
        dashboard = Dashboard(namespaces, PipelineBoard(self), event_hubs=EventHubsView(catalogs))
        dashboard.start()
        return dashboard


@contextlib.contextmanager
def _environment(settings: dict[str, str]) -> Iterator[None]:
    import os

    before = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def source_failover(
    pipelines: PipelineFile | None, trigger: ServiceBusTrigger, settings: dict[str, str]
) -> Failover | None:
    """The ``Failover`` of the pipeline source a generated function reads, if it has one
    (what the Functions host cannot do in Azure, our host does: read where it resolves)."""
    info = generated(trigger.function)
    if pipelines is None or info is None:
        return None
    pipeline, index, name = info.pipeline, info.source_index, info.pipeline.name
    endpoint = pipeline.sources[index]
    if endpoint.failover is None:
        return None
    role = "source" if len(pipeline.sources) == 1 else f"sources[{index}]"
    return endpoint.failover.build(
        f"{name}/{role}", settings[trigger.connection], settings, pipeline.base_dir
    )


def _port(connection_string: str) -> int | None:
    from .embedded import emulator_port

    return emulator_port(connection_string)


def _pipeline(trigger: ServiceBusTrigger | Any) -> str:
    """The pipeline a generated function belongs to (its name without the source suffix)."""
    return pipeline_name(trigger.function, trigger.name)


def _runs(runner: TriggerRunner | PumpRunner | EventHubTriggerRunner) -> tuple[str, str]:
    """The pipeline (metrics label) and the source entity a runner reads."""
    if isinstance(runner, PumpRunner):
        return runner.pipeline, runner.entity
    return _pipeline(runner.trigger), runner.trigger.entity


class _Progress:
    """A live table per pipeline: received, forwarded, filtered, dead-lettered, msgs/s, backlog."""

    def __init__(self, host: Host) -> None:
        from rich.console import Console
        from rich.live import Live

        self.host = host
        self.console = Console(stderr=True)
        self.live = Live(console=self.console, refresh_per_second=4, transient=False)
        self.terminal = self.console.is_terminal
        if self.terminal:
            self.live.start()
        self.last: dict[str, tuple[float, float]] = {}
        self.logged = 0.0

    def update(self) -> None:
        from rich.table import Table

        if not self.terminal:  # a log line every few seconds instead of a live table
            if time.monotonic() - self.logged >= 3.0:
                self.logged = time.monotonic()
                for name in self.host.pipelines():
                    c = metrics.counts(name)
                    log.info(
                        "%s: received %d, forwarded %d, filtered %d, dead-lettered %d, backlog %d",
                        name,
                        c["received"],
                        c["forwarded"],
                        c["filtered"],
                        c["dead_lettered"],
                        c["backlog"],
                    )
            return

        table = Table(title="replication: local host", expand=False)
        for column in (
            "pipeline",
            "received",
            "forwarded",
            "filtered",
            "dead-lettered",
            "msgs/s",
            "backlog",
        ):
            table.add_column(column, justify="right" if column != "pipeline" else "left")
        now = time.monotonic()
        for name in self.host.pipelines():
            c = metrics.counts(name)
            before, at = self.last.get(name, (c["forwarded"], now))
            rate = (c["forwarded"] - before) / (now - at) if now > at else 0.0
            self.last[name] = (c["forwarded"], now)
            table.add_row(
                name,
                f"{c['received']:.0f}",
                f"{c['forwarded']:.0f}",
                f"{c['filtered']:.0f}",
                f"{c['dead_lettered']:.0f}",
                f"{rate:,.0f}",
                f"{c['backlog']:.0f}",
            )
        self.live.update(table)

    def close(self) -> None:
        if self.terminal:
            self.update()
            self.live.stop()
