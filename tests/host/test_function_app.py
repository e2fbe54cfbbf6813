"""function_app.py generates one Service Bus trigger per pipeline source, as configured."""

from __future__ import annotations

from typing import Any

import azure.functions as func

from replication.functions import register_pipelines
from replication.generated import generated
from replication.host.discovery import load_app, not_run, service_bus_triggers
from replication.host.eventhubs import event_hub_triggers
from replication.pipeline import load_pipelines, parse_pipelines
from tests.broker.conftest import REPO_ROOT

SETTINGS = {"PrimaryServiceBus": "x", "SecondaryServiceBus": "y", "SecondaryEventHubs": "z"}


def test_sample_functions_match_the_pipelines() -> None:
    app = load_app(REPO_ROOT / "function_app.py")
    triggers = {t.name: t for t in service_bus_triggers(app, SETTINGS)}
    pipelines = load_pipelines(REPO_ROOT / "pipelines.yaml")
    expected = {
        name: (pipeline, source)
        for pipeline in pipelines.pipelines
        for name, source in zip(pipeline.function_names(), pipeline.sources, strict=True)
        if not source.is_event_hub
    }
    assert set(triggers) == set(expected)
    for name, (pipeline, source) in expected.items():
        trigger = triggers[name]
        assert trigger.connection == source.connection
        assert (trigger.queue, trigger.topic, trigger.subscription) == (
            source.queue, source.topic, source.subscription,
        )  # fmt: skip
        assert trigger.sessions == source.sessions and trigger.many
        info = generated(trigger.function)
        assert info is not None and info.pipeline.name == pipeline.name
        assert info.pipeline.sources[info.source_index] == source
    assert triggers["orders_to_secondary"].sessions is True
    assert triggers["events_router"].topic == "events"


def test_names_are_stable_and_unique_for_merges() -> None:
    text = """\
pipelines:
  - name: merge-all
    sources:
      - {connection: A, queue: one}
      - {connection: B, topic: t, subscription: s, sessions: true}
    target: {connection: C, queue: merged}
"""
    app = func.FunctionApp()
    names = register_pipelines(app, parse_pipelines(text), settings={})
    assert names == ["merge_all_1", "merge_all_1_rpo", "merge_all_2", "merge_all_2_rpo"]
    again = register_pipelines(func.FunctionApp(), parse_pipelines(text), settings={})
    assert again == names
    bindings = {f.get_function_name(): f.get_trigger().get_dict_repr() for f in app.get_functions()}
    assert bindings["merge_all_1"]["queueName"] == "one"
    assert bindings["merge_all_2"]["topicName"] == "t"
    assert bindings["merge_all_2"]["subscriptionName"] == "s"
    assert bindings["merge_all_2"]["isSessionsEnabled"] is True


def test_pipeline_batch_size_concurrency_and_backend_reach_the_local_host() -> None:
    from replication.host.trigger import HostOptions

    text = """\
pipelines:
  - name: tuned
    source: {connection: A, queue: q, sessions: true}
    target: {connection: B, queue: q}
    batch_size: 25
    concurrency: 3
    backend: sdk
  - name: plain
    source: {connection: A, queue: r}
    target: {connection: B, queue: r}
"""
    app = func.FunctionApp()
    register_pipelines(app, parse_pipelines(text), settings={})
    functions = {f.get_function_name(): f.get_user_function() for f in app.get_functions()}
    base = HostOptions(prefetch_count=100, max_message_batch_size=100, max_concurrent_sessions=8)
    tuned = base.for_function(functions["tuned"])
    assert (tuned.max_message_batch_size, tuned.max_concurrent_sessions) == (25, 3)
    assert tuned.backend == "sdk"  # the local host receives through azure-servicebus
    plain = base.for_function(functions["plain"])
    assert plain.max_message_batch_size == 100  # the pipeline default
    assert plain.max_concurrent_sessions == 8  # no concurrency given: host.json's
    assert plain.backend == "amqp"  # the default: our AMQP client


async def test_the_batch_locks_are_renewed_through_the_actions_while_a_target_is_held() -> None:
    """Past the host's maxAutoLockRenewalDuration only the function can keep its locks: it
    renews them through ServiceBusMessageActions every half lock period, while a breaker is
    open, and not otherwise."""
    import asyncio
    from datetime import UTC, datetime, timedelta

    from replication.functions import _keep_locks
    from replication.messages import Message
    from replication.tasks.breaker import Breakers

    now = datetime.now(UTC).timestamp()
    locked = datetime.fromtimestamp(now + 30, UTC)
    messages = [Message(b"x", message_id=f"m{i}", locked_until=locked) for i in range(3)]
    for message in messages:
        message.source = message.message_id  # what the actions are called with
    renewed: list[str] = []
    pauses: list[float] = []

    class Actions:
        def renew_message_lock(self, received: str) -> None:
            renewed.append(received)

    breakers = Breakers()
    turns = asyncio.Queue[None]()

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)
        await turns.get()

    keeper = asyncio.create_task(
        _keep_locks(messages, Actions(), False, breakers, clock=lambda: now, sleep=sleep)
    )
    await turns.put(None)  # a half period passes, every target fine: nothing renewed
    await asyncio.sleep(0.05)
    assert renewed == []
    breakers("target").trip(ConnectionError("down"))
    await turns.put(None)  # the next half period, a target held
    while len(renewed) < 3:
        await asyncio.sleep(0.01)
    keeper.cancel()
    assert renewed == ["m0", "m1", "m2"]
    assert pauses[0] == timedelta(seconds=15).total_seconds()


def test_with_auto_complete_only_what_is_not_completed_goes_through_the_actions() -> None:
    """A plain source's function leaves its completes to the host (auto-complete). When a
    settlement of its own fails, it completes the good ones itself and reports the failure
    (the function then raises, so the host abandons the one left instead of completing a
    message meant for the dead-letter queue)."""
    from replication.functions import _settle_all
    from replication.messages import Message
    from replication.tasks.task import Decision, Settlement

    calls: list[tuple[str, str]] = []

    class Actions:
        def __init__(self, failing: set[str]) -> None:
            self.failing = failing

        def _call(self, name: str, received: str) -> None:
            calls.append((name, received))
            if name in self.failing:
                raise RuntimeError(f"{name} refused")

        def complete(self, received: str) -> None:
            self._call("complete", received)

        def deadletter(self, received: str, reason: str, description: str) -> None:
            self._call("deadletter", received)

        def abandon(self, received: str) -> None:
            self._call("abandon", received)

    def message(name: str, session: str | None = None) -> Message:
        item = Message(b"x", message_id=name, session_id=session)
        item.source = name  # what the actions are called with
        return item

    settlements = [
        Settlement(message("good"), Decision.COMPLETE, outputs=1),
        Settlement(message("bad"), Decision.DEAD_LETTER, "validate: invalid", "not JSON"),
        Settlement(message("refused"), Decision.ABANDON, "SendFailed", "too big"),
        Settlement(message("behind", "s"), Decision.RELEASE, "SendFailed", "held back"),
    ]
    assert _settle_all(Actions(set()), settlements, auto_complete=True) == []
    # a plain source cannot release: the held-back one is abandoned, never left to complete
    assert sorted(calls) == [("abandon", "behind"), ("abandon", "refused"), ("deadletter", "bad")]

    calls.clear()
    failures = _settle_all(Actions({"deadletter"}), settlements, auto_complete=True)
    assert failures == ["deadletter: deadletter refused"]
    assert ("complete", "good") in calls

    calls.clear()
    assert _settle_all(Actions(set()), settlements[:1], auto_complete=False) == []
    assert calls == [("complete", "good")]  # a session source's function completes itself


def test_functions_with_bindings_besides_their_trigger_are_left_out_and_named() -> None:
    """Run without its output binding, a ``$return`` would be dropped and its message
    completed (lost), an ``Out`` never passed (every delivery fails): such functions are
    not run, and the host says why at start; their messages wait where they are."""
    app = func.FunctionApp()

    @app.service_bus_queue_trigger(arg_name="msg", queue_name="a", connection="Bus")
    @app.service_bus_queue_output(arg_name="$return", queue_name="out", connection="Bus")
    def returns(msg: func.ServiceBusMessage) -> str:
        return msg.get_body().decode()

    @app.service_bus_queue_trigger(arg_name="msg", queue_name="b", connection="Bus")
    @app.service_bus_queue_output(arg_name="copy", queue_name="out", connection="Bus")
    def sets(msg: func.ServiceBusMessage, copy: func.Out[str]) -> None:
        copy.set(msg.get_body().decode())

    @app.event_hub_message_trigger(arg_name="event", event_hub_name="h", connection="Bus")
    @app.blob_input(arg_name="blob", path="c/b", connection="Storage")
    def reads(event: func.EventHubEvent, blob: str) -> None: ...

    @app.route(route="hello")
    def hello(req: func.HttpRequest) -> func.HttpResponse:
        return func.HttpResponse("hi")

    @app.service_bus_queue_trigger(arg_name="msg", queue_name="c", connection="Bus")
    def plain(msg: func.ServiceBusMessage) -> None: ...

    settings = {"Bus": "Endpoint=sb://localhost;SharedAccessKeyName=k;SharedAccessKey=v"}
    assert [t.name for t in service_bus_triggers(app, settings)] == ["plain"]
    assert event_hub_triggers(app, settings) == []
    assert not_run(app) == [
        "function returns is not run: the local host does not provide its bindings besides "
        "the trigger: $return (serviceBus, out)",
        "function sets is not run: the local host does not provide its bindings besides the "
        "trigger: copy (serviceBus, out)",
        "function reads is not run: the local host does not provide its bindings besides the "
        "trigger: blob (blob, in)",
        "function hello: the local host does not run httpTrigger triggers",
    ]


def test_an_event_hub_function_taking_the_sdk_binding_type_is_left_out_and_named() -> None:
    """The Event Hubs SDK-type binding (azurefunctions-extensions-bindings-eventhub, a beta
    this project does not install: a class of that module's name stands for its EventData)
    is not bound: run with an ``EventHubEvent`` the function failed and its events were
    checkpointed past."""
    event_data = type(
        "EventData", (), {"__module__": "azurefunctions.extensions.bindings.eventhub.eventData"}
    )
    app = func.FunctionApp()

    def reads(event: Any) -> None: ...

    reads.__annotations__["event"] = event_data
    app.event_hub_message_trigger(arg_name="event", event_hub_name="h", connection="Bus")(reads)
    settings = {"Bus": "Endpoint=sb://localhost;SharedAccessKeyName=k;SharedAccessKey=v"}
    assert event_hub_triggers(app, settings) == []
    assert not_run(app) == [
        "function reads is not run: the local host does not bind "
        "azurefunctions.extensions.bindings.eventhub.eventData.EventData (the Event Hubs "
        "SDK-type binding); take azure.functions.EventHubEvent"
    ]
