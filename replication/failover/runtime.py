"""A failover-resolved endpoint at run time: which namespace now, when to ask again, switching.

``Failover`` holds one endpoint's resolver and the connection string it was configured with.
Its ``connection_string()`` is that string pointed at the currently resolved namespace (the
seeds' rule: the namespaces of a failover set are structurally identical, same entities and
same authorization rules, so only the host changes). It asks the resolver again

- when a client reports persistent errors: ``failures`` in a row, or at once for errors that
  say this namespace is the wrong one (connection refused, name not resolvable, entity
  disabled or missing, unauthorized);
- every ``recheck_interval`` seconds, so a planned flip is noticed without any error.

When the answer changes the switch is logged (old -> new), counted in
``replication_failovers`` and announced to listeners (senders retire old clients, receivers
finish their batch and reopen). A resolution that fails keeps the current namespace: a dead
DNS server is a warning and a retry later, never a crash.

``run_switching`` is the receive side: it runs a loop on the current namespace and, on a
switch, lets it finish its in-flight batch (settled on the namespace it came from), then
runs it again on the new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping

from .. import metrics
from ..clock import SYSTEM, Clock, wait_event
from ..servicebus.connection_string import ConnectionString, with_endpoint
from .base import FailoverError, Resolution, Resolver

log = logging.getLogger("replication.failover")

DEFAULT_FAILURES = 3
DEFAULT_RECHECK_INTERVAL = 30.0
RETRY_PAUSE = 1.0
RECHECK_WAIT = 0.5
"""Seconds an operation waits for a due re-check before going on with the current namespace."""

SwitchListener = Callable[[str, str], None]
"""Called with (old connection string, new connection string) after a switch."""


class FailoverSwitched(ConnectionError):
    """The namespace changed while this operation failed: try again (on the new one)."""


class NamespaceUnresolved(ConnectionError):
    """No namespace could be resolved yet (DNS down, file missing): a transient failure, to be
    retried like a refused connection, not a bad message."""


# ---------------------------------------------------------------------- connection strings


def parse_host_map(text: str | None) -> dict[str, str]:
    """``host=address`` pairs separated by ``;`` or ``,`` (the ``REPLICATION_FAILOVER_HOSTS``
    setting): resolved namespace host -> ``127.0.0.1:port`` of a local broker standing in."""
    found: dict[str, str] = {}
    for item in (text or "").replace(",", ";").split(";"):
        if not item.strip():
            continue
        host, sep, address = item.partition("=")
        if not sep or not host.strip() or not address.strip():
            raise ValueError(f"host map entry {item.strip()!r} is not host=address")
        found[host.strip().rstrip(".").lower()] = address.strip()
    return found


def connection_for(base: str, host: str, host_map: Mapping[str, str] | None = None) -> str:
    """``base`` with its Endpoint replaced by ``host`` (keys, rules and options kept).

    A host in ``host_map`` is served by a local broker: the Endpoint becomes that address and
    ``UseDevelopmentEmulator=true`` is set, so the same pipeline config runs on one laptop.
    """
    mapped = (host_map or {}).get(host.lower())
    return with_endpoint(base, mapped or host, emulator=mapped is not None)


def endpoint_host(connection_string: str) -> str:
    try:
        return ConnectionString.parse(connection_string).netloc
    except ValueError:
        return ""


# ---------------------------------------------------------------------- error kinds

_NAMESPACE_ERRORS = (
    "ServiceBusAuthenticationError",
    "ServiceBusAuthorizationError",
    "MessagingEntityDisabledError",
    "MessagingEntityNotFoundError",
)
_NAMESPACE_CONDITIONS = frozenset(
    {
        "amqp:unauthorized-access",
        "com.microsoft:auth-failed",
        "com.microsoft:entity-disabled",
        "amqp:not-found",
    }
)
_NAMESPACE_TEXT = (
    "connection refused",
    "connect call failed",
    "errno 111",
    "name or service not known",
    "nodename nor servname",
    "getaddrinfo failed",
    "temporary failure in name resolution",
    "no address associated",
)


def _chain(error: BaseException) -> list[BaseException]:
    """The error, its causes, and the members of exception groups (task groups raise them)."""
    found: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in found and len(found) < 8:
        found.append(current)
        if isinstance(current, BaseExceptionGroup):
            for member in current.exceptions[:4]:
                found.extend(e for e in _chain(member) if e not in found)
        inner = getattr(current, "inner_exception", None)
        current = (
            inner if isinstance(inner, BaseException) else current.__cause__ or current.__context__
        )
    return found


def points_elsewhere(error: BaseException) -> bool:
    """Errors that say "this namespace is not the one to use": re-resolve at once.

    Connection refused, a host name that does not resolve, an entity that is disabled or
    missing, a credential refused. Timeouts and busy servers are not: they count towards
    ``failures``."""
    for item in _chain(error):
        if isinstance(item, ConnectionRefusedError | socket.gaierror):
            return True
        if isinstance(item, OSError) and item.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH):
            return True
        if type(item).__name__ in _NAMESPACE_ERRORS:
            return True
        if str(getattr(item, "condition", "") or "") in _NAMESPACE_CONDITIONS:
            return True
        text = str(item).lower()
        if any(marker in text for marker in _NAMESPACE_TEXT):
            return True
    return False


# ---------------------------------------------------------------------- the endpoint


class Failover:
    """One endpoint whose namespace is resolved at run time (see the module docstring)."""

    def __init__(
        self,
        name: str,
        resolver: Resolver,
        base_connection: str,
        *,
        host_map: Mapping[str, str] | None = None,
        failures: int = DEFAULT_FAILURES,
        recheck_interval: float = DEFAULT_RECHECK_INTERVAL,
        clock: Clock = SYSTEM,
    ) -> None:
        self.name = name
        self.resolver = resolver
        self.base_connection = base_connection
        self.host_map = dict(host_map or {})
        self.failures = max(1, failures)
        self.recheck_interval = recheck_interval
        self.clock = clock
        self.resolution: Resolution | None = None
        self.version = 0
        """Bumped on every switch (and on the first resolution)."""
        self.switches = 0
        self._consecutive = 0
        self._checked = 0.0
        self._lock: asyncio.Lock | None = None
        self._changed: asyncio.Event | None = None
        self._background: asyncio.Task[bool] | None = None
        self._listeners: list[SwitchListener] = []

    def __repr__(self) -> str:
        host = self.resolution.host if self.resolution else "unresolved"
        return f"Failover({self.name!r}, {self.resolver.describe()}, now {host})"

    # ------------------------------------------------------------------ reading

    @property
    def host(self) -> str | None:
        return self.resolution.host if self.resolution else None

    def connection_for(self, host: str) -> str:
        return connection_for(self.base_connection, host, self.host_map)

    async def connection_string(self) -> str:
        """The connection string of the current namespace. The first call resolves (and
        raises ``FailoverError`` when it cannot); later calls return at once, except when
        ``recheck_interval`` has passed: then a re-check starts and is waited for up to
        ``RECHECK_WAIT`` seconds."""
        if self.resolution is None:
            await self.recheck(force=True, raise_errors=True)
        elif self.clock.monotonic() - self._checked >= self.recheck_interval:
            if self._background is None or self._background.done():
                self._background = asyncio.get_running_loop().create_task(self.recheck())
            # usually answered at once (a cached DNS answer, a stat): then this very send
            # already goes to a new namespace; a slow or dead resolver does not hold it up
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._background), RECHECK_WAIT)
        assert self.resolution is not None
        return self.connection_for(self.resolution.host)

    def on_switch(self, listener: SwitchListener) -> None:
        self._listeners.append(listener)

    async def wait_switch(self, version: int) -> None:
        """Returns once ``version`` is no longer current."""
        while self.version == version:
            await self._event().wait()

    # ------------------------------------------------------------------ reporting

    def report_success(self) -> None:
        self._consecutive = 0

    async def report_failure(self, error: BaseException) -> bool:
        """Counts a failed operation; re-resolves when the failures look persistent.
        True when that switched to another namespace (the caller should retry there)."""
        version, failed_at = self.version, self.clock.monotonic()
        self._consecutive += 1
        if not points_elsewhere(error) and self._consecutive < self.failures:
            return False
        log.info(
            "%s: %s after %d failure(s) (%s): asking %s again",
            self.name,
            "re-resolving",
            self._consecutive,
            _short(error),
            self.resolver.describe(),
        )
        self._consecutive = 0
        switched = await self.recheck(force=True, unless_checked_after=failed_at)
        return switched or self.version != version

    async def recheck(
        self,
        *,
        force: bool = False,
        raise_errors: bool = False,
        unless_checked_after: float | None = None,
    ) -> bool:
        """Resolves again (``force``: past any cache); True when the namespace changed.
        ``unless_checked_after``: skip when a check finished after that time (many senders
        failing together cause one resolution, not one each)."""
        async with self._get_lock():
            if unless_checked_after is not None and self._checked > unless_checked_after:
                return False
            return await self._recheck(force, raise_errors)

    async def _recheck(self, force: bool, raise_errors: bool) -> bool:
        if not force and self.clock.monotonic() - self._checked < self.recheck_interval:
            return False
        if force:
            self.resolver.invalidate()
        try:
            resolution = await asyncio.to_thread(self.resolver.resolve)
        except FailoverError as exc:
            self._checked = self.clock.monotonic()
            if raise_errors and self.resolution is None:
                raise
            log.warning(
                "%s: cannot resolve (%s); staying on %s", self.name, exc, self.host or "nothing yet"
            )
            return False
        self._checked = self.clock.monotonic()
        old = self.resolution
        self.resolution = resolution
        if old is not None and old.host == resolution.host:
            return False
        self.version += 1
        self._event().set()
        self._changed = None
        if old is None:
            log.info("%s: using %s (%s)", self.name, resolution.host, self.resolver.describe())
            return False
        self.switches += 1
        metrics.FAILOVERS.labels(self.name).inc()
        log.warning(
            "%s: failover %s -> %s (%s)",
            self.name,
            old.host,
            resolution.host,
            self.resolver.describe(),
        )
        before, after = self.connection_for(old.host), self.connection_for(resolution.host)
        for listener in list(self._listeners):
            try:
                listener(before, after)
            except Exception:  # a listener must not stop the others
                log.exception("%s: switch listener failed", self.name)
        return True

    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _get_lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock


def _short(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text[:200]


# ---------------------------------------------------------------------- receivers


async def run_switching(
    failover: Failover,
    stop: asyncio.Event,
    run: Callable[[str, asyncio.Event], Awaitable[object]],
    *,
    pause: float = RETRY_PAUSE,
) -> None:
    """Runs ``run(connection_string, inner_stop)`` on the current namespace until ``stop``.

    ``inner_stop`` is set when ``stop`` is or when the failover switches (on an error report
    or the periodic re-check): ``run`` then finishes and settles its in-flight work and
    returns, and is started again on the new namespace. An exception from ``run`` is
    reported as a failure (which may switch) and ``run`` starts again after ``pause``:
    with failover configured, a broken namespace is waited out, not fatal.
    """
    while not stop.is_set():
        try:
            connection = await failover.connection_string()
        except FailoverError as exc:
            log.warning("%s: cannot resolve (%s); retrying in %.0fs", failover.name, exc, pause)
            await wait_event(stop, pause, failover.clock)
            continue
        version = failover.version
        inner = asyncio.Event()
        watcher = asyncio.get_running_loop().create_task(_watch(failover, version, stop, inner))
        try:
            await run(connection, inner)
            if not stop.is_set() and failover.version == version:
                await wait_event(stop, pause, failover.clock)  # returned on its own: no spin
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if failover.version != version or await failover.report_failure(exc):
                continue  # already on another namespace: go there now
            log.warning(
                "%s: %s failed (%s); retrying in %.0fs",
                failover.name,
                endpoint_host(connection),
                _short(exc),
                pause,
            )
            await wait_event(stop, pause, failover.clock)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher


async def _watch(
    failover: Failover, version: int, stop: asyncio.Event, inner: asyncio.Event
) -> None:
    """Sets ``inner`` on stop or on a switch; re-checks every ``recheck_interval`` (on the
    failover's clock)."""
    switch = asyncio.ensure_future(failover.wait_switch(version))
    halt = asyncio.ensure_future(stop.wait())
    try:
        while not (switch.done() or halt.done()):
            tick = asyncio.ensure_future(failover.clock.sleep(failover.recheck_interval))
            try:
                await asyncio.wait({switch, halt, tick}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                tick.cancel()
            if not (switch.done() or halt.done()):
                await failover.recheck()
    finally:
        inner.set()
        switch.cancel()
        halt.cancel()
