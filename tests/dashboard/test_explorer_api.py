"""The explorer's message operations through the dashboard's JSON endpoints: peek pages,
peek-lock receive and each settlement, deferred and scheduled messages, typed sends,
search, purge and edit-and-resend. Every effect is checked with the unmodified
``azure-servicebus`` SDK, as the application reading the entity would see it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage
from azure.servicebus import ServiceBusSubQueue as SubQueue

from replication.servicebus.sas import mint
from tests.broker.conftest import BrokerHandle
from tests.dashboard.test_api import CONFIG, Api, _dashboard, _send
from tests.dashboard.test_api import api as api  # the fixture, found by name

LATER = datetime(2099, 1, 1, tzinfo=UTC)


def _peek_sdk(api: Api, entity: str, dead_letter: bool = False) -> list[ServiceBusReceivedMessage]:
    queue = SubQueue.DEAD_LETTER if dead_letter else None
    with (
        api.handle.client() as client,
        client.get_queue_receiver(entity, sub_queue=queue) as receiver,
    ):
        return list(receiver.peek_messages(100))


def test_peek_pages_go_on_from_the_next_sequence_number(api: Api) -> None:
    _send(api.handle, "work", *(ServiceBusMessage(f"p{i}", message_id=f"p{i}") for i in range(5)))
    first = api.ok("messages", entity="work", count=2)
    assert [m["message_id"] for m in first["messages"]] == ["p0", "p1"]
    second = api.ok("messages", entity="work", count=2, **{"from": first["next_from"]})
    assert [m["message_id"] for m in second["messages"]] == ["p2", "p3"]


def test_receive_then_complete_abandon_dead_letter_and_defer(api: Api) -> None:
    _send(api.handle, "work", *(ServiceBusMessage(f"r{i}", message_id=f"r{i}") for i in range(5)))
    got = api.ok("receive", {"count": 4}, entity="work")
    numbers = [m["sequence_number"] for m in got["messages"]]
    assert [m["message_id"] for m in got["messages"]] == ["r0", "r1", "r2", "r3"]
    assert all(m["locked_until"] for m in got["messages"])
    receipt = got["receipt"]

    def settle(action: str, number: int, **extra: str) -> None:
        body = {"receipt": receipt, "sequence_numbers": [number], "action": action, **extra}
        assert api.ok("settle", body, entity="work")["done"] == [number]

    settle("complete", numbers[0])
    settle("abandon", numbers[1])
    settle("dead-letter", numbers[2], reason="Bad total", description="sum is negative")
    settle("defer", numbers[3])
    active = {m.message_id: m for m in _peek_sdk(api, "work")}
    assert "r0" not in active  # completed: gone
    assert active["r1"].delivery_count == 1  # abandoned: back, one delivery counted
    assert active["r4"].delivery_count == 0  # never received by the page
    (dead,) = _peek_sdk(api, "work", dead_letter=True)
    assert (dead.message_id, dead.dead_letter_reason) == ("r2", "Bad total")
    assert dead.dead_letter_error_description == "sum is negative"
    with api.handle.client() as client, client.get_queue_receiver("work") as receiver:
        (deferred,) = receiver.receive_deferred_messages([numbers[3]])
        assert deferred.message_id == "r3"
        receiver.abandon_message(deferred)  # still deferred: the page takes it next
    # the receipt is closed once everything in it is settled
    status, answer = api(
        "settle",
        {"receipt": receipt, "sequence_numbers": [numbers[0]], "action": "complete"},
        entity="work",
    )
    assert status == 410 and "receive again" in answer["error"]

    taken = api.ok("deferred", {"sequence_numbers": [numbers[3]]}, entity="work")
    assert [m["message_id"] for m in taken["messages"]] == ["r3"]
    done = api.ok(
        "settle",
        {"receipt": taken["receipt"], "sequence_numbers": [numbers[3]], "action": "complete"},
        entity="work",
    )
    assert done["done"] == [numbers[3]]
    assert sorted(m.message_id for m in _peek_sdk(api, "work")) == ["r1", "r4"]


def test_release_gives_messages_back_without_a_delivery(api: Api) -> None:
    _send(api.handle, "work", ServiceBusMessage("x", message_id="x"))
    got = api.ok("receive", {"count": 5}, entity="work")
    assert api.ok("release", {"receipt": got["receipt"]}, entity="work") == {"released": 1}
    (back,) = _peek_sdk(api, "work")
    assert back.delivery_count == 0


def test_cancel_a_scheduled_message(api: Api) -> None:
    with api.handle.client() as client, client.get_queue_sender("work") as sender:
        numbers = sender.schedule_messages(
            [ServiceBusMessage("later", message_id=f"s{i}") for i in range(2)], LATER
        )
    answer = api.ok("scheduled/cancel", {"sequence_numbers": numbers[:1]}, entity="work")
    assert answer == {"cancelled": numbers[:1]}
    assert [m.message_id for m in _peek_sdk(api, "work")] == ["s1"]


def test_send_typed_properties_system_properties_and_copies(api: Api) -> None:
    sent = api.ok(
        "send",
        {
            "body": "typed",
            "correlation_id": "c-9",
            "reply_to": "replies",
            "reply_to_session_id": "rs",
            "to": "someone",
            "time_to_live": 3600,
            "copies": 3,
            "application_properties": [
                {"name": "code", "type": "string", "value": "007"},
                {"name": "n", "type": "int", "value": "42"},
                {"name": "x", "type": "double", "value": "2.5"},
                {"name": "ok", "type": "bool", "value": "true"},
                {"name": "at", "type": "timestamp", "value": "2026-02-03T04:05:06Z"},
            ],
        },
        entity="work",
    )
    assert len(set(sent["message_ids"])) == 3
    with api.handle.client() as client, client.get_queue_receiver("work") as receiver:
        got = receiver.receive_messages(5, max_wait_time=5)
        assert len(got) == 3
        first = got[0]
        assert (first.correlation_id, first.reply_to, first.to) == ("c-9", "replies", "someone")
        assert first.reply_to_session_id == "rs"
        assert first.time_to_live is not None and first.time_to_live.total_seconds() == 3600
        props = first.application_properties
        assert props[b"code"] == b"007"  # a string, not the number 7
        assert props[b"n"] == 42 and props[b"x"] == 2.5 and props[b"ok"] is True
        # an AMQP timestamp: the SDK gives application properties' ones as epoch ms
        assert props[b"at"] == datetime(2026, 2, 3, 4, 5, 6, tzinfo=UTC).timestamp() * 1000
        for message in got:
            receiver.complete_message(message)


def test_send_a_batch_and_a_scheduled_one(api: Api) -> None:
    answer = api.ok(
        "send",
        {
            "messages": [
                {"body": "a", "message_id": "b-a"},
                {"body": "b", "message_id": "b-b", "subject": "second"},
                {
                    "body": "c",
                    "message_id": "b-c",
                    "scheduled_enqueue_time": "2099-01-01T00:00:00Z",
                },
            ]
        },
        entity="work",
    )
    assert answer["message_ids"] == ["b-a", "b-b", "b-c"] and len(answer["scheduled"]) == 1
    peeked = {m.message_id: m for m in _peek_sdk(api, "work")}
    assert peeked["b-b"].subject == "second"
    assert peeked["b-c"].scheduled_enqueue_time_utc == LATER
    status, answer = api(
        "send",
        {"body": "x", "application_properties": [{"name": "n", "type": "int", "value": "seven"}]},
        entity="work",
    )
    assert status == 400 and "property 'n' (int)" in answer["error"]


def test_search_over_a_peek_states_how_far_it_looked(api: Api) -> None:
    _send(
        api.handle,
        "work",
        *(
            ServiceBusMessage(
                f"q{i}",
                message_id=f"order-{i}",
                correlation_id=f"c{i % 2}",
                application_properties={"tenant": "contoso" if i == 3 else "fabrikam"},
            )
            for i in range(6)
        ),
    )
    found = api.ok("messages", entity="work", correlation_id="c1", count=20)
    assert [m["message_id"] for m in found["messages"]] == ["order-1", "order-3", "order-5"]
    assert found["scanned"] == 6 and found["limit"] == 5000
    found = api.ok("messages", entity="work", property="tenant=contoso")
    assert [m["message_id"] for m in found["messages"]] == ["order-3"]
    found = api.ok("messages", entity="work", message_id="ORDER-4")
    assert [m["message_id"] for m in found["messages"]] == ["order-4"]
    with api.handle.client() as client, client.get_queue_receiver("work") as receiver:
        for i, message in enumerate(receiver.receive_messages(6, max_wait_time=5)):
            receiver.dead_letter_message(message, "Late" if i < 2 else "Poison", "")
    found = api.ok("messages", entity="work", dead_letter=1, dead_letter_reason="late")
    assert [m["message_id"] for m in found["messages"]] == ["order-0", "order-1"]


def test_purge_needs_the_entity_named(api: Api) -> None:
    _send(api.handle, "work", *(ServiceBusMessage(f"g{i}") for i in range(30)))
    status, answer = api("purge", {"confirm": "wrong"}, entity="work")
    assert status == 400 and '"work"' in answer["error"]
    assert len(_peek_sdk(api, "work")) == 30
    assert api.ok("purge", {"confirm": "work"}, entity="work") == {"purged": 30}
    assert _peek_sdk(api, "work") == []


def test_resend_an_edited_copy_keeps_or_renews_the_identity(api: Api) -> None:
    _send(
        api.handle,
        "work",
        ServiceBusMessage("old body", message_id="e-1", application_properties={"v": 1}),
    )
    with api.handle.client() as client, client.get_queue_receiver("work") as receiver:
        (message,) = receiver.receive_messages(1, max_wait_time=5)
        receiver.dead_letter_message(message, "Poison", "bad body")
    (dead,) = api.ok("messages", entity="work", dead_letter=1)["messages"]
    api.ok(
        "resend",
        {
            "sequence_number": dead["sequence_number"],
            "dead_letter": True,
            "body": "fixed body",
            "application_properties": [{"name": "v", "type": "int", "value": "2"}],
        },
        entity="work",
    )
    api.ok(
        "resend",
        {"sequence_number": dead["sequence_number"], "dead_letter": True, "new_message_id": True},
        entity="work",
    )
    copies = _peek_sdk(api, "work")
    assert (copies[0].message_id, str(copies[0])) == ("e-1", "fixed body")
    assert copies[0].application_properties == {b"v": 2}
    assert copies[1].message_id != "e-1" and str(copies[1]) == "old body"
    assert len(_peek_sdk(api, "work", dead_letter=True)) == 1  # the original stays


def test_off_loopback_each_operation_needs_its_right(
    broker_factory: Callable[..., BrokerHandle],
) -> None:
    handle = broker_factory(CONFIG)
    dashboard = _dashboard(handle, require_token=True)
    api = Api(handle, dashboard)
    try:
        _send(handle, "work", ServiceBusMessage("x", message_id="x"))
        reader = {"authorization": mint(f"sb://localhost:{handle.port}", "reader", "READER_KEY")[0]}
        status, got = api("receive", {"count": 1}, entity="work", headers=reader)
        assert status == 200
        status, _ = api(
            "settle",
            {"receipt": got["receipt"], "action": "complete", "sequence_numbers": [1]},
            entity="work",
            headers=reader,
        )
        assert status == 200
        for route, body, right in (
            ("send", {"body": "x"}, "Send"),
            ("scheduled/cancel", {"sequence_numbers": [1]}, "Send"),
            ("purge", {"confirm": "work"}, "Manage"),
            ("resend", {"sequence_number": 1}, "Send"),
        ):
            status, answer = api(route, body, entity="work", headers=reader)
            assert status == 401 and right in answer["error"], (route, answer)
    finally:
        handle.run(dashboard.stop())
