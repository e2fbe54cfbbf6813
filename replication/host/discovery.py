"""Finds the functions of a ``function_app.py`` the way the Python worker indexes them."""

from __future__ import annotations

import importlib.util
import inspect
import sys
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import azure.functions as func
from azure.functions.decorators.core import BindingDirection

from .settings import resolve

if TYPE_CHECKING:
    from azure.functions.decorators.function_app import Function


@dataclass(slots=True, frozen=True)
class ServiceBusTrigger:
    """One function with a Service Bus trigger, its binding resolved against the settings."""

    name: str
    function: Callable[..., Any]
    arg_name: str
    connection: str
    """The app-setting name (the binding's ``connection``)."""
    queue: str | None
    topic: str | None
    subscription: str | None
    sessions: bool
    many: bool
    auto_complete: bool | None = None
    """The binding's ``autoCompleteMessages`` (None: host.json decides)."""
    annotation: Any = None
    """The trigger parameter's type (the SDK types make it an SDK-type binding)."""
    settlement_arg: str | None = None
    """The parameter that takes ``ServiceBusMessageActions``, if the function has one."""

    @property
    def entity(self) -> str:
        return self.queue or f"{self.topic}/Subscriptions/{self.subscription}"


class DiscoveryError(ValueError):
    pass


def load_app(path: Path) -> func.FunctionApp:
    """Imports ``function_app.py`` (its folder on sys.path, as the worker does)."""
    if not path.is_file():
        raise DiscoveryError(f"{path}: no such file")
    sys.path.insert(0, str(path.parent.resolve()))
    spec = importlib.util.spec_from_file_location("function_app", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["function_app"] = module
    spec.loader.exec_module(module)
    apps = [v for v in vars(module).values() if isinstance(v, func.FunctionApp)]
    if len(apps) != 1:
        raise DiscoveryError(f"{path}: expected one FunctionApp, found {len(apps)}")
    return apps[0]


_FUNCTIONS: weakref.WeakKeyDictionary[func.FunctionApp, list[Function]] = (
    weakref.WeakKeyDictionary()
)


def functions_of(app: func.FunctionApp) -> list[Function]:
    """The app's functions, built once: ``get_functions()`` refuses to run twice (it takes
    the names it saw before for duplicates), and each kind of trigger is found in them."""
    functions = _FUNCTIONS.get(app)
    if functions is None:
        functions = _FUNCTIONS[app] = app.get_functions()
    return functions


RUN_TRIGGERS: tuple[str, ...] = ("serviceBusTrigger", "eventHubTrigger", "timerTrigger")
"""The triggers the local host runs."""


def triggered_by(app: func.FunctionApp, kind: str) -> Iterator[tuple[Function, dict[str, Any]]]:
    """Each function of ``app`` whose trigger is of ``kind`` (``serviceBusTrigger``,
    ``eventHubTrigger``, ``timerTrigger``) with its trigger's binding, less those the
    local host leaves out (``left_out``)."""
    for function in functions_of(app):
        trigger = function.get_trigger()
        if trigger is None or left_out(function) is not None:
            continue
        binding = trigger.get_dict_repr()
        if binding.get("type") == kind:
            yield function, binding


def not_run(app: func.FunctionApp) -> list[str]:
    """Why each function of ``app`` the local host leaves out is left out (``left_out``)."""
    reasons = (left_out(function) for function in functions_of(app))
    return [reason for reason in reasons if reason is not None]


def left_out(function: Function) -> str | None:
    """Why the local host does not run ``function``, or None when it does. Not a trigger of
    its kinds; not a function with input or output bindings, which is not run at all: run
    without them, a ``$return`` would be dropped and its messages completed, an ``Out``
    argument never passed; left out, its messages wait where they are. Nor an Event Hubs
    function taking the Event Hubs SDK-type binding's type (``_unbound_sdk_type``)."""
    name = function.get_function_name()
    trigger = function.get_trigger()
    kind = trigger.get_dict_repr().get("type") if trigger is not None else None
    if kind not in RUN_TRIGGERS:
        return f"function {name}: the local host does not run {kind} triggers"
    unbound = _unbound_sdk_type(function)
    if unbound:
        return (
            f"function {name} is not run: the local host does not bind {unbound} (the "
            "Event Hubs SDK-type binding); take azure.functions.EventHubEvent"
        )
    others = [b for b in function.get_bindings() if b is not trigger]
    if others:
        named = ", ".join(
            f"{b.name} ({b.type}, {BindingDirection(b.direction).name.lower()})" for b in others
        )
        return (
            f"function {name} is not run: the local host does not provide its "
            f"bindings besides the trigger: {named}"
        )
    return None


def _unbound_sdk_type(function: Function) -> str | None:
    """The trigger parameter's type when it is one of the Event Hubs SDK-type binding's
    (``azurefunctions-extensions-bindings-eventhub``), which the local host does not bind:
    run with an ``EventHubEvent`` instead, the function would fail and, without a retry
    policy, be checkpointed past its events."""
    trigger = function.get_trigger()
    if trigger is None:
        return None
    annotation = _annotations(function.get_user_function()).get(trigger.name)
    module = getattr(annotation, "__module__", "") or ""
    if module.startswith("azurefunctions.extensions.bindings.eventhub"):
        return f"{module}.{getattr(annotation, '__qualname__', annotation)}"
    return None


def service_bus_triggers(
    app: func.FunctionApp, settings: Mapping[str, str]
) -> list[ServiceBusTrigger]:
    triggers = []
    for function, binding in triggered_by(app, "serviceBusTrigger"):

        def value(key: str, binding: dict[str, Any] = binding) -> str | None:
            raw = binding.get(key)
            return None if raw is None else resolve(str(raw), settings)

        cardinality = binding.get("cardinality")
        user_function = function.get_user_function()
        arg_name = str(binding["name"])
        annotations = _annotations(user_function)
        auto_complete = binding.get("autoCompleteMessages")
        triggers.append(
            ServiceBusTrigger(
                name=str(function.get_function_name()),
                function=user_function,
                arg_name=arg_name,
                connection=str(binding["connection"]),
                queue=value("queueName"),
                topic=value("topicName"),
                subscription=value("subscriptionName"),
                sessions=bool(binding.get("isSessionsEnabled")),
                many=str(getattr(cardinality, "value", cardinality)) == "many",
                auto_complete=None if auto_complete is None else bool(auto_complete),
                annotation=annotations.get(arg_name),
                settlement_arg=_settlement_arg(user_function, arg_name, annotations),
            )
        )
    return triggers


def _annotations(function: Callable[..., Any]) -> dict[str, Any]:
    try:
        return inspect.get_annotations(function, eval_str=True)
    except Exception:  # a name the module does not define: take what is there
        return dict(getattr(function, "__annotations__", {}) or {})


def _settlement_arg(
    function: Callable[..., Any], trigger_arg: str, annotations: dict[str, Any]
) -> str | None:
    """The one parameter besides the trigger's, when it takes the settlement client (as
    the worker decides: a single unbound parameter of a gRPC client type)."""
    from .bindings import is_settlement_client

    others = [p for p in inspect.signature(function).parameters if p != trigger_arg]
    if len(others) != 1 or not is_settlement_client(annotations.get(others[0])):
        return None
    return others[0]
