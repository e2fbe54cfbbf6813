"""One invocation as the host hands it to the worker, and the worker's binding of it.

The Functions host sends the language worker an ``InvocationRequest``: the function's id and
its input data, binding data the worker decodes (for a Service Bus trigger with the SDK-type
bindings: model binding data, ``bindings.py``). ``Invocation`` is ours: the function by
name, the arguments bound as they are (a timer's ``TimerRequest``, an event hub batch's
``EventHubEvent`` list), and a Service Bus batch as binding contents (or, for
``backend: sdk``, the SDK's detached messages); a batch is one invocation
(``cardinality=many``), so the channel carries one request per batch, not per message.
``arguments`` is what the worker does with it, in whichever worker runs the function
(``worker.Worker``: a thread of the host's process; ``process.WorkerProcess``: a process of
its own), so the decoding is one piece of code whichever it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..adapters.functions import to_functions_message
from . import bindings
from .discovery import ServiceBusTrigger


@dataclass(slots=True, frozen=True)
class Invocation:
    """What the worker needs to call one function once (picklable: it may cross processes)."""

    function: str
    """The function's name in the app (``get_function_name()``)."""
    arguments: dict[str, Any] = field(default_factory=dict)
    """Arguments bound as they are."""
    contents: list[bytes] | None = None
    """A Service Bus batch as binding data (``bindings.binding_content``), to decode."""
    received: list[Any] | None = None
    """A Service Bus batch as the SDK received it (``backend: sdk``), detached."""


def arguments(trigger: Any, invocation: Invocation, actions: Callable[[], Any]) -> dict[str, Any]:
    """The function's keyword arguments: the binding data decoded as the Python worker
    decodes it (the extension's converter, one message or a list as the cardinality says;
    ``azure.functions.ServiceBusMessage`` without the SDK types), and the settlement client
    (``actions()``) for a function that takes one."""
    bound = dict(invocation.arguments)
    if not isinstance(trigger, ServiceBusTrigger):
        return bound
    many = trigger.many
    messages: Any
    if invocation.received is not None:
        messages = invocation.received if many else invocation.received[0]
    else:
        assert invocation.contents is not None, "a Service Bus invocation without messages"
        messages = bindings.decode(invocation.contents, many, trigger.annotation)
    if not bindings.is_sdk_type(trigger.annotation):
        messages = (
            [to_functions_message(m) for m in messages] if many else to_functions_message(messages)
        )
    bound[trigger.arg_name] = messages
    if trigger.settlement_arg is not None:
        bound[trigger.settlement_arg] = actions()
    return bound


class Invoker(Protocol):
    """A worker the host hands invocations to (``worker.Worker``, ``process.WorkerProcess``)."""

    async def invoke(self, trigger: Any, invocation: Invocation) -> None: ...

    def stop(self) -> None: ...
