"""MessageFacts and the table of system properties."""

from __future__ import annotations

import pytest

from replication.sqlfilter import SYSTEM_PROPERTIES, MessageFacts, system_property

READ_ONLY = {
    "DeadLetterSource", "DeliveryCount", "EnqueuedSequenceNumber", "EnqueuedTimeUtc",
    "ExpiresAtUtc", "LockedUntilUtc", "LockToken", "SequenceNumber", "Size", "State",
}  # fmt: skip


def test_the_system_properties_of_the_messages_page() -> None:
    names = {p.name for p in SYSTEM_PROPERTIES}
    assert names == READ_ONLY | {
        "ContentType", "CorrelationId", "ForcePersistence", "Label", "MessageId", "PartitionKey",
        "ReplyTo", "ReplyToSessionId", "ScheduledEnqueueTimeUtc", "SessionId", "TimeToLive", "To",
        "ViaPartitionKey",
    }  # fmt: skip
    assert {p.name for p in SYSTEM_PROPERTIES if not p.settable} == READ_ONLY


@pytest.mark.parametrize(
    ("name", "canonical"),
    [("label", "Label"), ("SUBJECT", "Label"), ("Subject", "Label"), ("to", "To"),
     ("scheduledenqueuetime", "ScheduledEnqueueTimeUtc"),
     ("TransactionPartitionKey", "ViaPartitionKey"), ("Nope", None), ("", None)],
)  # fmt: skip
def test_system_property_lookup(name: str, canonical: str | None) -> None:
    prop = system_property(name)
    assert (prop and prop.name) == canonical


def test_system_keys_are_made_canonical_in_place() -> None:
    system = {"subject": "s", "messageId": "m", "To": "t"}
    message = MessageFacts(system, {})
    assert message.system is system
    assert system == {"Label": "s", "MessageId": "m", "To": "t"}


def test_unknown_system_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown system property 'Nope'"):
        MessageFacts({"Nope": 1}, {})


def test_defaults_and_copy() -> None:
    message = MessageFacts()
    assert message.system == {} and message.user == {}
    copy = message.copy()
    copy.user["a"] = 1
    assert message.user == {}
