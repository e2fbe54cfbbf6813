"""Message -> MessageFacts, and SQL conditions / expressions compiled for messages."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from replication.messages import Message
from replication.sqlfilter import SqlEvaluationError, SqlSyntaxError
from replication.tasks.facts import (
    compile_condition,
    compile_expression,
    facts_for,
    json_body,
)

ENQUEUED = datetime(2026, 11, 23, 10, 15, 30, 123456, tzinfo=UTC)


def full_message(**changes: object) -> Message:
    message = Message(
        body=json.dumps({"order": {"id": "o-7", "total": 250, "lines": [{"sku": "A1"}]}}).encode(),
        message_id="m-1",
        session_id="s-1",
        partition_key="s-1",
        correlation_id="c-1",
        subject="order",
        content_type="application/json",
        reply_to="replies",
        reply_to_session_id="rs-1",
        to="shop",
        time_to_live=timedelta(minutes=5),
        scheduled_enqueue_time=ENQUEUED + timedelta(hours=1),
        application_properties={"priority": 3, "Region": "eu", "flag": True},
        enqueued_time=ENQUEUED,
        sequence_number=42,
        delivery_count=2,
        dead_letter_source="orders/$deadletterqueue",
    )
    return message.copy(**changes)


def test_every_message_field_maps_to_its_system_property() -> None:
    message = full_message()
    facts = facts_for(message)
    assert facts.system == {
        "MessageId": "m-1",
        "CorrelationId": "c-1",
        "Label": "order",
        "To": "shop",
        "ReplyTo": "replies",
        "ReplyToSessionId": "rs-1",
        "ContentType": "application/json",
        "SessionId": "s-1",
        "PartitionKey": "s-1",
        "TimeToLive": timedelta(minutes=5),
        "ScheduledEnqueueTimeUtc": ENQUEUED + timedelta(hours=1),
        "EnqueuedTimeUtc": ENQUEUED,
        "ExpiresAtUtc": ENQUEUED + timedelta(minutes=5),
        "SequenceNumber": 42,
        "DeliveryCount": 2,
        "DeadLetterSource": "orders/$deadletterqueue",
        "Size": len(message.body),
    }
    assert facts.user == {"priority": 3, "Region": "eu", "flag": True}
    assert facts.body["order"]["id"] == "o-7"


def test_absent_fields_are_left_out() -> None:
    facts = facts_for(Message(body=b"abc"))
    assert facts.system == {"Size": 3}
    assert facts.user == {}
    assert facts.body is None


def test_expiry_overflow_is_left_out() -> None:
    facts = facts_for(Message(enqueued_time=ENQUEUED, time_to_live=timedelta.max))
    assert "ExpiresAtUtc" not in facts.system
    assert facts.system["TimeToLive"] == timedelta.max


def test_user_properties_are_a_copy() -> None:
    message = full_message()
    facts = facts_for(message)
    facts.user["priority"] = 99
    assert message.application_properties["priority"] == 3


def test_body_parsing_can_be_skipped() -> None:
    assert facts_for(full_message(), body=False).body is None


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"", None),
        (b"not json", None),
        (b"\xff\xfe\x00garbage", None),
        (b"[" * 100_000, None),
        (b'{"a": 1}', {"a": 1}),
        ('\ufeff{"a": 1}'.encode(), {"a": 1}),
        ('{"a": "é"}'.encode("utf-16"), {"a": "é"}),
        (b"5", 5),
    ],
)
def test_json_body(body: bytes, expected: object) -> None:
    assert json_body(Message(body=body)) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sys.Label = 'order'", True),
        ("sys.Subject = 'order'", True),
        ("sys.MessageId = 'm-1' AND sys.SessionId = 's-1'", True),
        ("sys.CorrelationId = 'c-2'", False),
        ("sys.SequenceNumber > 40 AND sys.DeliveryCount = 2", True),
        ("sys.Size > 10", True),
        ("sys.TimeToLive = @ttl", True),
        ("sys.EnqueuedTimeUtc < sys.ExpiresAtUtc", True),
        ("priority >= 3 AND region = 'eu'", True),
        ("user.flag = TRUE", True),
        ("missing = 1", False),
        ("NOT missing = 1", False),
        ("body.order.id = 'o-7'", True),
        ("body.order.total > 200 AND priority = 3", True),
        ("body.order.lines.0.sku LIKE 'A%'", True),
        ("body.order.lines.1.sku = 'B'", False),
        ("body.nope IS NULL", True),
        ("EXISTS(body.order)", True),
    ],
)
def test_conditions_on_properties_and_body(text: str, expected: bool) -> None:
    condition = compile_condition(text, {"ttl": timedelta(minutes=5)})
    assert condition(full_message()) is expected


def test_a_body_that_is_not_json_has_no_fields() -> None:
    message = full_message(body=b"<order id='o-7'/>")
    condition = compile_condition("body.order.id = 'o-7'")
    assert condition.evaluate(message) is None
    assert condition(message) is False
    assert compile_condition("NOT body.order.id = 'o-7'")(message) is False
    assert compile_condition("body.order.id IS NULL")(message) is True


def test_three_valued_evaluate() -> None:
    condition = compile_condition("priority = 3")
    assert condition.evaluate(full_message()) is True
    assert condition.evaluate(Message(application_properties={"priority": 2})) is False
    assert condition.evaluate(Message()) is None
    assert not condition.uses_body
    assert compile_condition("body.a = 1").uses_body
    assert condition.expression == "priority = 3"


def test_conditions_that_need_no_body_do_not_parse_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import replication.tasks.facts as facts_module

    def refuse(message: Message) -> object:
        raise AssertionError("the body was parsed")

    monkeypatch.setattr(facts_module, "json_body", refuse)
    assert compile_condition("sys.Label = 'order'")(full_message())
    with pytest.raises(AssertionError, match="parsed"):
        compile_condition("body.x = 1")(full_message())


def test_bad_conditions_are_refused_when_compiled() -> None:
    with pytest.raises(SqlSyntaxError, match=r"a system property name .* but found 'Nope'"):
        compile_condition("sys.Nope = 1")
    with pytest.raises(SqlSyntaxError, match="given a value but found '@missing'"):
        compile_condition("a = @missing")
    with pytest.raises(SqlEvaluationError, match="3 / 0: division by zero"):
        compile_condition("priority / 0 = 1")(full_message())


def test_expressions() -> None:
    message = full_message()
    assert compile_expression("sys.MessageId")(message) == "m-1"
    assert compile_expression("region + '/' + body.order.id")(message) == "eu/o-7"
    assert compile_expression("body.order.total * 2")(message) == 500
    assert compile_expression("body.missing")(message) is None
    assert compile_expression("body.order.id").uses_body
    assert compile_expression("sys.messageid").expression == "sys.MessageId"
