"""Writing rows to a queue or topic from Spark executors.

Each partition turns its rows into messages (``rows.from_row``) and sends them with the
task library's ``send_ordered``: batches bounded by size and count, a session's (and a
partition key's) messages in the order the partition holds them, retries with backoff for
transient errors. A partition that cannot deliver everything raises, so Spark fails the
task (and, streaming, the micro-batch is not committed: its source messages come again).
What a failed partition had already sent is sent again on the retry: duplicates, removed
by message-id at the target (duplicate detection or the ``dedupe`` step).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from ..messages import Message
from .options import Options
from .rows import from_row
from .worker import pool_for, run_async

if TYPE_CHECKING:
    from pyspark.sql import Row

# run_async lives in worker.py (one loop per Python worker, shared with the pipeline
# runner's receivers); callers that knew it from here still find it.
__all__ = ["BatchWriter", "SentCount", "StreamWriter", "run_async", "send_messages"]


@dataclass
class SentCount(WriterCommitMessage):
    sent: int


async def send_messages(options: Options, messages: list[Message]) -> int:
    """Sends ``messages`` in order per session; raises when any was not accepted."""
    from ..tasks.sender import SendPolicy, send_ordered
    from ..tasks.targets import Target

    if not messages:
        return 0
    if options.pipeline is not None:
        from .pipeline import built_pipeline

        built = built_pipeline(*options.pipeline)
        pool, _ = pool_for(options.pipeline, built.targets, built.pipeline.backend)
    else:
        target = Target(options.connection_string, options.entity)
        targets: dict[str | None, Target] = {None: target}
        pool, _ = pool_for((options.connection_string, options.entity), targets)
    result = await send_ordered(messages, pool, SendPolicy(max_batch_messages=options.batch_size))
    failed = result.failed()
    if failed:
        first = result.errors[failed[0]]
        raise RuntimeError(
            f"{len(failed)} of {len(messages)} messages were not accepted by "
            f"{options.entity or 'the targets'!r} (first: {messages[failed[0]].message_id}: "
            f"{first!r})"
        )
    return len(messages)


def _write(options: Options, rows: Iterator[Row]) -> SentCount:
    return SentCount(run_async(send_messages(options, [from_row(row) for row in rows])))


class BatchWriter(DataSourceWriter):
    def __init__(self, options: Options) -> None:
        self.options = options

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        return _write(self.options, iterator)


class StreamWriter(DataSourceStreamWriter):
    def __init__(self, options: Options) -> None:
        self.options = options

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        return _write(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # every partition's sends were accepted before it returned

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # the source is not committed either: its messages come again
