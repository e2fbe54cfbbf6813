"""Pipelines as Azure Functions (Python v2 programming model): one trigger function per source.

``register_pipelines(app, pipelines)`` adds, for every pipeline and each of its sources, a
``service_bus_queue_trigger`` or ``service_bus_topic_trigger`` function with the source's
connection app-setting name, ``cardinality=many`` and sessions as the source needs them.

Settlement, and why it keeps at-least-once: the Python worker cannot settle single messages
(the SDK-type Service Bus bindings that would allow it are not available to us), so the
functions run with ``autoCompleteMessages: true`` (host.json): the host completes the whole
batch when the function returns and abandons it when the function raises. The function
returns only after every copy of every message was accepted by its target; if any send
failed for good it raises, the batch is abandoned, and Service Bus redelivers it (delivery
count, MaxDeliveryCount dead-lettering). Copies that had already been sent are then sent
again: duplicates, removed by message-id at the target (RequiresDuplicateDetection or the
``dedupe`` step). A step's dead-letter decision cannot dead-letter one message of a batch
here, so that message goes to the pipeline's ``error_target`` with ``DeadLetterReason`` /
``DeadLetterErrorDescription`` properties; without an error target the batch fails.
"""

from __future__ import annotations

import asyncio
import logging
import os
import typing
from collections.abc import Mapping
from typing import Any

import azure.functions as func

from . import metrics
from .messages import Message, from_functions
from .tasks.task import Decision, process_batch

log = logging.getLogger("replication.functions")

ERROR_TARGET = "error_target"


class BatchFailedError(RuntimeError):
    """Raised so the Functions host abandons the batch (it will be redelivered)."""


class PipelineRuntime:
    """One pipeline in a worker: its task and targets, built once, senders kept open."""

    def __init__(self, pipeline: Any, settings: Mapping[str, str]) -> None:
        from .tasks.targets import SenderPool

        self.name: str = pipeline.name
        built = pipeline.build(settings)
        self.tasks = built.tasks
        """One per source (each knows its source namespace for the loop guard)."""
        self.task = built.task
        self.targets = built.targets
        self._pool = SenderPool(self.targets)

    async def handle(self, messages: list[Message], source: int = 0) -> None:
        """Processes one trigger batch; raises ``BatchFailedError`` to have it abandoned."""
        metrics.RECEIVED.labels(self.name).inc(len(messages))
        settlements = await process_batch(self.tasks[source], messages, self._pool)
        dead = [s for s in settlements if s.decision is Decision.DEAD_LETTER]
        failed = [s for s in settlements if s.decision is Decision.ABANDON]
        if dead:
            failed += await self._to_error_target(dead)
        complete = [s for s in settlements if s.decision is Decision.COMPLETE]
        filtered = sum(1 for s in complete if s.outputs == 0)
        metrics.FORWARDED.labels(self.name).inc(len(complete) - filtered)
        metrics.FILTERED.labels(self.name).inc(filtered)
        metrics.DEAD_LETTERED.labels(self.name).inc(len(dead))
        if failed:
            metrics.FAILED.labels(self.name).inc()
            first = failed[0]
            raise BatchFailedError(
                f"{self.name}: {len(failed)} of {len(settlements)} messages not delivered "
                f"(first: {first.message.message_id}: {first.reason} {first.description}); "
                "the batch is abandoned for redelivery"
            )

    async def _to_error_target(self, dead: list[Any]) -> list[Any]:
        from .tasks.sender import send_ordered

        if ERROR_TARGET not in self.targets:
            for item in dead:
                log.error("%s: %s must be dead-lettered (%s) but there is no error_target",
                          self.name, item.message.message_id, item.reason)  # fmt: skip
            return dead
        copies = []
        for item in dead:
            props = dict(item.message.application_properties)
            props["DeadLetterReason"] = item.reason
            props["DeadLetterErrorDescription"] = item.description
            copies.append(item.message.copy(application_properties=props, target=ERROR_TARGET))
        result = await send_ordered(copies, self._pool, self.task.policy)
        return [dead[i] for i in result.failed()]


def register_pipelines(
    app: func.FunctionApp, pipelines: Any, settings: Mapping[str, str] | None = None
) -> list[str]:
    """Adds a trigger function per pipeline source to ``app``; returns their names."""
    settings = os.environ if settings is None else settings
    names = []
    for pipeline in pipelines.pipelines:
        runtime: list[PipelineRuntime] = []  # built on first call: settings exist by then

        for index, (source, name) in enumerate(
            zip(pipeline.sources, pipeline.function_names(), strict=True)
        ):
            handler = _handler(pipeline, runtime, settings, name, index)
            if source.is_subscription:
                trigger = app.service_bus_topic_trigger(
                    arg_name="messages", topic_name=source.topic,
                    subscription_name=source.subscription, connection=source.connection,
                    cardinality=func.Cardinality.MANY, is_sessions_enabled=source.sessions,
                )  # fmt: skip
            else:
                trigger = app.service_bus_queue_trigger(
                    arg_name="messages", queue_name=source.queue, connection=source.connection,
                    cardinality=func.Cardinality.MANY, is_sessions_enabled=source.sessions,
                )  # fmt: skip
            app.function_name(name)(trigger(handler))
            names.append(name)
    return names


def _handler(
    pipeline: Any, runtime: list[PipelineRuntime], settings: Mapping[str, str], name: str,
    source: int,
) -> Any:
    lock = asyncio.Lock()

    async def handler(messages: list[func.ServiceBusMessage]) -> None:
        async with lock:
            if not runtime:
                runtime.append(PipelineRuntime(pipeline, settings))
        await runtime[0].handle([from_functions(m) for m in messages], source)

    handler.__name__ = handler.__qualname__ = name
    handler.pipeline_name = pipeline.name  # type: ignore[attr-defined]  (the host's metrics)
    handler.source_index = source  # type: ignore[attr-defined]  (the host: source failover)
    # per-pipeline trigger settings: host.json-wide in Azure, applied per function locally
    handler.batch_size = pipeline.batch_size  # type: ignore[attr-defined]
    handler.concurrency = pipeline.concurrency  # type: ignore[attr-defined]
    # the worker reads the annotation to pick the binding's data type; keep it a real type
    handler.__annotations__ = {"messages": typing.List[func.ServiceBusMessage], "return": None}  # noqa: UP006
    return handler
