"""What our stream readers share, so each of them says only how it plans and settles.

Every reader's offsets carry the id of the reader that made them (``run``: a batch planned
by an earlier run is not replanned from this one's state), its default read limit is
``maxMessagesPerTrigger``, ``Trigger.AvailableNow`` fixes a cutoff when the query starts,
and executors get the reader pickled with its options only. The driver side makes a few
AMQP calls of its own (a ``$management`` peek at the source's head, failover resolution):
``Planner`` runs them on one loop thread, opened on first use.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

if TYPE_CHECKING:
    from ..servicebus.client import AmqpSource
    from .intake import LoopThread

T = TypeVar("T")


class ReaderOptions(Protocol):
    @property
    def max_messages_per_trigger(self) -> int: ...


OptionsT = TypeVar("OptionsT", bound=ReaderOptions)


class RunStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow, Generic[OptionsT]):
    """A stream reader whose offsets are ``{"run": <this reader's id>, <position>: n}``."""

    position = "batch"
    """The offset's counter: batches planned, or (``receiveOn: driver``) messages taken."""

    def __init__(self, options: OptionsT) -> None:
        self.options = options
        self.run = uuid.uuid4().hex
        self.cutoff: datetime | None = None
        """When the ``Trigger.AvailableNow`` query started (None for other triggers)."""

    def __getstate__(self) -> dict[str, Any]:
        """Executors get the reader for ``read``: options only (connections stay here)."""
        return {"options": self.options, "run": self.run}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]  # unpickling: re-initialise
        self.run = state["run"]

    def initialOffset(self) -> dict[str, Any]:
        return {"run": self.run, self.position: 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_messages_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        self.cutoff = datetime.now(UTC)


class Planner:
    """The driver's own AMQP calls, on one loop thread with one source per connection."""

    def __init__(self) -> None:
        self._thread: LoopThread | None = None
        self._sources: dict[str, AmqpSource] = {}

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._thread is None:
            from .intake import LoopThread

            self._thread = LoopThread("servicebus-planner")
        return self._thread.run(coro, timeout=120)

    def nothing_before(self, connection_string: str, path: str, cutoff: datetime) -> bool:
        """True when the entity's oldest message came after ``cutoff`` (or there is none):
        one ``$management`` peek, nothing locked."""
        source = self._sources.get(connection_string)
        if source is None:
            from ..servicebus.client import AmqpSource

            source = AmqpSource.from_connection_string(connection_string)
            self._sources[connection_string] = source
        return self.run(_nothing_before(source, path, cutoff))

    def close(self) -> None:
        if self._thread is None:
            return
        thread, self._thread = self._thread, None
        for source in self._sources.values():
            with contextlib.suppress(Exception):  # stopping: gone anyway
                thread.run(source.close(), timeout=10)
        self._sources.clear()
        thread.close()


async def _nothing_before(source: AmqpSource, path: str, cutoff: datetime) -> bool:
    from ..tasks.locks import management_for

    connection = await source.connection()
    head = await management_for(connection).peek(path, 1)
    if not head:
        return True
    enqueued = head[0].enqueued_time
    return enqueued is not None and enqueued > cutoff
