"""The dashboard's JSON endpoints, asked directly (``Dashboard.handle`` with ``Request``
values) on a real broker's loop: what the page shows and what its buttons do.

Messages are sent, dead-lettered and read back with the real ``azure-servicebus`` SDK; the
dashboard itself goes through the broker's management API and our AMQP client.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from azure.servicebus import ServiceBusMessage

from replication.broker.admin.api import AdminApi
from replication.broker.clock import ManualClock
from replication.broker.httpapi import Request
from replication.dashboard import Dashboard, Namespace
from replication.servicebus.sas import mint
from tests.broker.admin_harness import admin_client
from tests.broker.conftest import BrokerHandle, make_config

pytestmark = pytest.mark.timeout(60)

CONFIG = make_config(
    {
        "work": {},
        "dedupe": {
            "RequiresDuplicateDetection": True, "DuplicateDetectionHistoryTimeWindow": "PT1M",
        },
        "sessions": {"RequiresSession": True},
    },
    [
        {"Name": "RootManageSharedAccessKey", "Key": "SAS_KEY_VALUE", "Rights": ["Manage"]},
        {"Name": "reader", "Key": "READER_KEY", "Rights": ["Listen"]},
    ],
    topics={"events": {"Subscriptions": {
        "eu": {"Rules": [{"Name": "eu", "Properties": {
            "FilterType": "Sql", "SqlFilter": {"SqlExpression": "region = 'eu'"},
        }}]},
        "all": {},
    }}},
)  # fmt: skip


class Api:
    """Calls the dashboard on the broker's loop and returns (status, JSON body)."""

    def __init__(self, handle: BrokerHandle, dashboard: Dashboard) -> None:
        self.handle = handle
        self.dashboard = dashboard
        self.namespace = next(iter(dashboard.namespaces))

    def __call__(
        self, route: str, body: Any = None, *, headers: dict[str, str] | None = None,
        **params: Any,
    ) -> tuple[int, Any]:  # fmt: skip
        query = {"namespace": self.namespace, **params} if "entity" in params else params
        target = f"/$dashboard/api/{route}" + (f"?{urlencode(query)}" if query else "")
        sent = {"host": "127.0.0.1:9464", **(headers or {})}
        method = "GET"
        data = b""
        if body is not None:
            method, data = "POST", json.dumps(body).encode()
            sent.setdefault("content-type", "application/json")
        response = self.handle.run(self.dashboard.handle(Request(method, target, sent, data)))
        assert response is not None, f"{target} is not the dashboard's"
        return response.status, json.loads(response.body)

    def ok(self, route: str, body: Any = None, **params: Any) -> Any:
        status, answer = self(route, body, **params)
        assert status == 200, answer
        return answer


def _dashboard(handle: BrokerHandle, require_token: bool = False) -> Dashboard:
    async def make() -> Dashboard:
        assert handle.broker is not None
        return Dashboard([Namespace.of_broker(handle.broker, "ns")], require_token=require_token)

    return handle.run(make())


@pytest.fixture
def api(broker_factory: Callable[..., BrokerHandle]) -> Iterator[Api]:
    handle = broker_factory(CONFIG, clock=ManualClock())
    dashboard = _dashboard(handle)
    yield Api(handle, dashboard)
    handle.run(dashboard.stop())


def _dead_letter(handle: BrokerHandle, entity: str, count: int, reason: str,
                 description: str) -> None:  # fmt: skip
    """Receives ``count`` messages of a queue (or ``topic/Subscriptions/name``) and
    dead-letters them with the SDK, as a consumer that gave up on them would."""
    with handle.client() as client:
        if "/Subscriptions/" in entity:
            topic, _, subscription = entity.partition("/Subscriptions/")
            receiver = client.get_subscription_receiver(topic, subscription, max_wait_time=5)
        else:
            receiver = client.get_queue_receiver(entity, max_wait_time=5)
        with receiver:
            taken = 0
            while taken < count:
                for message in receiver.receive_messages(count - taken, max_wait_time=5):
                    receiver.dead_letter_message(message, reason, description)
                    taken += 1


def _send(handle: BrokerHandle, entity: str, *messages: ServiceBusMessage) -> None:
    with handle.client() as client:
        sender = (client.get_topic_sender(entity) if entity == "events"
                  else client.get_queue_sender(entity))  # fmt: skip
        with sender:
            sender.send_messages(list(messages))


def _entity(overview: dict[str, Any], name: str) -> dict[str, Any]:
    (namespace,) = overview["namespaces"]
    for queue in namespace["queues"]:
        if queue["name"] == name:
            return dict(queue)
    for topic in namespace["topics"]:
        if topic["name"] == name:
            return dict(topic)
        for sub in topic["subscriptions"]:
            if f"{topic['name']}/Subscriptions/{sub['name']}" == name:
                return dict(sub)
    raise AssertionError(f"{name} not in the overview")


def test_overview_lists_entities_rules_and_counts(api: Api) -> None:
    _send(api.handle, "work", *(ServiceBusMessage(f"m{i}") for i in range(3)))
    _dead_letter(api.handle, "work", 1, "Poison", "cannot parse")
    _send(api.handle, "events", ServiceBusMessage("e", application_properties={"region": "eu"}))
    overview = api.ok("overview")
    assert overview["pipelines"] is None  # the broker alone has no pipelines
    work = _entity(overview, "work")
    assert work["counts"]["active"] == 2
    assert work["counts"]["dead_lettered"] == 1
    assert _entity(overview, "dedupe")["settings"]["RequiresDuplicateDetection"] is True
    assert _entity(overview, "sessions")["settings"]["RequiresSession"] is True
    eu = _entity(overview, "events/Subscriptions/eu")
    assert eu["rules"] == [{"name": "eu", "filter": "region = 'eu'", "action": None}]
    assert eu["counts"]["active"] == 1
    assert _entity(overview, "events/Subscriptions/all")["rules"][0]["filter"] == "1=1"


def test_peek_shows_properties_and_the_stamps_as_a_path(api: Api) -> None:
    _send(api.handle, "work", ServiceBusMessage(
        b"\x00\xff binary", message_id="m-1", correlation_id="c-1", subject="order",
        application_properties={
            "repl-enqueue-time": "2026-01-01T00:00:00.0000000Z;2026-01-01T00:00:01.0000000Z",
            "repl-sequence": "5;17", "repl-path": "primary.example:5671;secondary.example:5671",
            "tenant": "contoso", "amount": 12,
        },
    ))  # fmt: skip
    (message,) = api.ok("messages", entity="work", count=5)["messages"]
    assert message["message_id"] == "m-1"
    assert (message["correlation_id"], message["subject"]) == ("c-1", "order")
    assert message["sequence_number"] == 1
    assert message["application_properties"]["tenant"] == "contoso"
    assert message["application_properties"]["amount"] == 12
    assert message["body_encoding"] == "base64"  # not UTF-8: shown as base64
    assert message["hops"] == [
        {"namespace": "primary.example:5671", "enqueued_time": "2026-01-01T00:00:00.0000000Z",
         "sequence_number": "5"},
        {"namespace": "secondary.example:5671", "enqueued_time": "2026-01-01T00:00:01.0000000Z",
         "sequence_number": "17"},
    ]  # fmt: skip
    # peeking locks nothing: the message is still there for a receiver
    assert api.handle.count("work") == 1


def test_dead_letter_shows_reason_and_resubmit_keeps_identity(api: Api) -> None:
    _send(api.handle, "work", *(
        ServiceBusMessage(f"body {i}", message_id=f"id-{i}", content_type="text/plain",
                          application_properties={"n": i})
        for i in range(3)
    ))  # fmt: skip
    _dead_letter(api.handle, "work", 3, "Poison", "field 'x' missing")
    dead = api.ok("messages", entity="work", dead_letter=1)["messages"]
    assert [(m["dead_letter_reason"], m["dead_letter_description"]) for m in dead] == [
        ("Poison", "field 'x' missing")
    ] * 3
    second = dead[1]["sequence_number"]
    result = api.ok("dead-letters/resubmit", {"sequence_numbers": [second]}, entity="work")
    assert result == {"done": [second], "not_found": [], "target": "work"}
    with api.handle.client() as client, client.get_queue_receiver("work") as receiver:
        (copy,) = receiver.receive_messages(5, max_wait_time=5)
        assert copy.message_id == "id-1"
        assert str(copy) == "body 1"
        assert copy.content_type == "text/plain"
        assert copy.application_properties == {b"n": 1}  # no DeadLetterReason / Description
        assert copy.dead_letter_reason is None
        receiver.complete_message(copy)
    left = api.ok("messages", entity="work", dead_letter=1)["messages"]
    assert [m["message_id"] for m in left] == ["id-0", "id-2"]
    assert all(m["delivery_count"] == dead[0]["delivery_count"] for m in left)  # released


def test_resubmit_all_from_a_subscription_goes_through_its_topic(api: Api) -> None:
    _send(api.handle, "events", *(
        ServiceBusMessage(f"e{i}", message_id=f"e{i}", application_properties={"region": "eu"})
        for i in range(2)
    ))  # fmt: skip
    _dead_letter(api.handle, "events/Subscriptions/eu", 2, "Late", "after the cut-off")
    result = api.ok("dead-letters/resubmit", {"sequence_numbers": "all"},
                    entity="events/Subscriptions/eu")  # fmt: skip
    assert len(result["done"]) == 2 and result["target"] == "events"
    overview = api.ok("overview")
    assert _entity(overview, "events/Subscriptions/eu")["counts"] == {
        "active": 2, "deferred": 0, "dead_lettered": 0, "scheduled": 0, "transfer": 0,
        "transfer_dead_lettered": 0,
    }  # fmt: skip
    # the topic delivered the copies to every subscription whose rules match: 'all' too
    assert _entity(overview, "events/Subscriptions/all")["counts"]["active"] == 4


def test_resubmit_within_the_duplicate_window_needs_new_ids(api: Api) -> None:
    """A copy with the message id of one sent within the detection window is accepted and
    dropped, as Service Bus does: the page warns, and new message ids get through."""
    _send(api.handle, "dedupe", *(ServiceBusMessage(f"d{i}", message_id=f"d{i}") for i in range(3)))
    _dead_letter(api.handle, "dedupe", 3, "Poison", "bad")
    numbers = [m["sequence_number"] for m in api.ok("messages", entity="dedupe", dead_letter=1)[
        "messages"]]  # fmt: skip
    api.ok("dead-letters/resubmit", {"sequence_numbers": numbers[:1]}, entity="dedupe")
    assert api.handle.count("dedupe") == 0  # dropped as a duplicate of d0
    api.ok("dead-letters/resubmit", {"sequence_numbers": numbers[1:2], "new_message_ids": True},
           entity="dedupe")  # fmt: skip
    api.handle.advance(61)  # past the window: the same id is new again
    api.ok("dead-letters/resubmit", {"sequence_numbers": numbers[2:]}, entity="dedupe")
    ids = api.handle.message_ids("dedupe")
    assert len(ids) == 2 and "d2" in ids and "d1" not in ids and "d0" not in ids


def test_delete_removes_only_the_chosen_dead_letters(api: Api) -> None:
    _send(api.handle, "work", *(ServiceBusMessage(f"x{i}", message_id=f"x{i}") for i in range(4)))
    _dead_letter(api.handle, "work", 4, "Poison", "bad")
    dead = api.ok("messages", entity="work", dead_letter=1)["messages"]
    chosen = [dead[0]["sequence_number"], dead[3]["sequence_number"], 999]
    result = api.ok("dead-letters/delete", {"sequence_numbers": chosen}, entity="work")
    assert result["done"] == sorted(chosen[:2]) and result["not_found"] == [999]
    left = api.ok("messages", entity="work", dead_letter=1)["messages"]
    assert [m["message_id"] for m in left] == ["x1", "x2"]
    assert api.handle.count("work") == 0  # nothing was resubmitted


def test_send_a_test_message_with_properties_and_session(api: Api) -> None:
    sent = api.ok("send", {
        "body": '{"hello": 1}', "content_type": "application/json", "session_id": "s-1",
        "application_properties": {"kind": "test", "n": 3, "ok": True},
    }, entity="sessions")  # fmt: skip
    with (
        api.handle.client() as client,
        client.get_queue_receiver("sessions", session_id="s-1", max_wait_time=5) as receiver,
    ):
        (message,) = receiver.receive_messages(1, max_wait_time=5)
        assert message.message_id == sent["sent"]
        assert str(message) == '{"hello": 1}'
        assert message.application_properties == {b"kind": b"test", b"n": 3, b"ok": True}
        receiver.session.set_state("step 2")
        receiver.abandon_message(message)
    assert api.ok("sessions", entity="sessions") == {"sessions": ["s-1"]}
    assert api.ok("session-state", entity="sessions", session="s-1")["state"] == "step 2"
    (peeked,) = api.ok("messages", entity="sessions", session="s-1")["messages"]
    assert peeked["session_id"] == "s-1"


def test_bad_requests_say_what_is_wrong(api: Api) -> None:
    assert api("send", {"body": 5}, entity="work") == (400, {"error": "body: a string"})
    status, answer = api("send", {"body": "x"}, entity="events/Subscriptions/eu")
    assert status == 400 and "not to a subscription" in answer["error"]
    status, answer = api("messages", entity="nowhere")
    assert status == 404 and "nowhere" in answer["error"]
    status, answer = api("messages", entity="work", namespace="other")
    assert status == 404 and "no namespace 'other'" in answer["error"]
    status, answer = api("dead-letters/delete", {"sequence_numbers": ["1"]}, entity="work")
    assert status == 400 and "a list of integers" in answer["error"]
    status, answer = api(
        "send", {"body": "x"}, entity="work", headers={"content-type": "text/plain"}
    )
    assert status == 415  # a form on another site cannot post JSON without asking first


def test_off_loopback_every_call_needs_a_token_with_the_right(
    broker_factory: Callable[..., BrokerHandle],
) -> None:
    handle = broker_factory(CONFIG)
    dashboard = _dashboard(handle, require_token=True)
    api = Api(handle, dashboard)
    try:
        audience = f"sb://localhost:{handle.port}"
        reader = {"authorization": mint(audience, "reader", "READER_KEY")[0]}
        manager = {"authorization": mint(audience, "RootManageSharedAccessKey",
                                         "SAS_KEY_VALUE")[0]}  # fmt: skip
        status, answer = api("overview", headers={"host": "broker.example"})
        assert status == 401 and "SAS token is required" in answer["error"]
        assert api("overview", headers={"host": "broker.example", **reader})[0] == 200
        assert api("messages", entity="work", headers=reader)[0] == 200
        status, answer = api("dead-letters/delete", {"sequence_numbers": []}, entity="work",
                             headers=reader)  # fmt: skip
        assert status == 401 and "Manage" in answer["error"]
        status, answer = api("send", {"body": "x"}, entity="work", headers=reader)
        assert status == 401 and "Send" in answer["error"]
        assert api("dead-letters/delete", {"sequence_numbers": []}, entity="work",
                   headers=manager)[0] == 200  # fmt: skip
        forged = {"authorization": mint(audience, "reader", "WRONG")[0]}
        status, answer = api("messages", entity="work", headers=forged)
        assert status == 401 and "signature" in answer["error"]
    finally:
        handle.run(dashboard.stop())


def test_a_refused_copy_leaves_the_dead_letter_where_it_was(api: Api) -> None:
    """At least once: the dead letter is completed only after its copy was accepted; when the
    entity refuses the copy, the dead letter stays (released, no delivery counted)."""
    from azure.servicebus.management import EntityStatus, ServiceBusAdministrationClient

    _send(api.handle, "work", *(ServiceBusMessage(f"r{i}", message_id=f"r{i}") for i in range(2)))
    _dead_letter(api.handle, "work", 2, "Poison", "bad")
    before = api.ok("messages", entity="work", dead_letter=1)["messages"]
    admin = ServiceBusAdministrationClient.from_connection_string(
        api.handle.connection_string, retry_total=0,
        connection_verify=str(api.handle.data_dir / "tls" / "ca.pem"),
    )  # fmt: skip
    with admin:
        queue = admin.get_queue("work")
        queue.status = EntityStatus.SEND_DISABLED
        admin.update_queue(queue)
        status, answer = api("dead-letters/resubmit", {"sequence_numbers": "all"}, entity="work")
        assert status == 502 and answer["error"].startswith("stopped after 0: "), answer
        after = api.ok("messages", entity="work", dead_letter=1)["messages"]
        assert [(m["message_id"], m["delivery_count"]) for m in after] == [
            (m["message_id"], m["delivery_count"]) for m in before
        ]
        queue.status = EntityStatus.ACTIVE
        admin.update_queue(queue)
    assert len(api.ok("dead-letters/resubmit", {"sequence_numbers": "all"}, entity="work")[
        "done"]) == 2  # fmt: skip
    assert sorted(api.handle.message_ids("work")) == ["r0", "r1"]


def test_deferred_messages_are_counted_among_the_active_ones(api: Api) -> None:
    """Service Bus counts a deferred message as active and has no deferred count; the
    embedded broker adds one (``DeferredMessageCount``), which the SDK's parser ignores."""
    _send(api.handle, "work", *(ServiceBusMessage(f"w{i}", message_id=f"w{i}") for i in range(3)))
    with api.handle.client() as client, client.get_queue_receiver("work", max_wait_time=5) as r:
        (first,) = r.receive_messages(1, max_wait_time=5)
        r.defer_message(first)
    counts = _entity(api.ok("overview"), "work")["counts"]
    assert (counts["active"], counts["deferred"]) == (3, 1)
    assert api.handle.broker is not None
    admin, _ = admin_client(api.handle, AdminApi(api.handle.broker))
    runtime = admin.get_queue_runtime_properties("work")
    assert (runtime.active_message_count, runtime.scheduled_message_count) == (3, 0)
