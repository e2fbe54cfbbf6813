"""A second, independent client against the broker: the JavaScript SDK, through node.

``tests/interop_js/roundtrip.mjs`` drives ``@azure/service-bus`` (rhea underneath, pinned in
``tests/interop_js/package-lock.json``) over the emulator connection string. Each test starts a
broker, runs one of the script's modes with ``node`` and checks the JSON line it prints, then
looks at the broker's side: what is left in the store, and what the Python SDK reads of the
messages the JS client sent (and the other way round).

The ``js_node`` fixture installs the pinned packages with ``npm ci`` when ``node_modules`` is
missing or was installed from another ``package-lock.json``, and skips the tests when ``node``
or ``npm`` is not on PATH (a machine with only Python). A failing ``npm ci`` fails them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.amqp import AmqpAnnotatedMessage, AmqpMessageBodyType

from .conftest import (
    NAMESPACE,
    BrokerHandle,
    body_bytes,
    make_config,
    nothing_more,
    proton_connection,
    receive_n,
)

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no lock, one test run at a time
    fcntl = None  # type: ignore[assignment]

pytestmark = pytest.mark.timeout(300)  # a cold npm ci, then node runs of a few seconds each

JS_DIR = Path(__file__).resolve().parents[1] / "interop_js"
SCRIPT = JS_DIR / "roundtrip.mjs"
LOCKFILE = JS_DIR / "package-lock.json"
STAMP = JS_DIR / "node_modules" / ".package-lock.sha256"
"""The hash of the lock file ``node_modules`` was installed from (``npm ci`` deletes it)."""
INSTALL_LOCK = JS_DIR / ".npm-ci.lock"
NPM_CI_TIMEOUT = 600.0
NODE_TIMEOUT = 120.0

APP_PROPERTIES = {"text": "héllo", "int": 42, "negative": -7, "float": 1.5, "flag": True}
"""What roundtrip.mjs puts in every message (and ``off: false``, ``index: <n>``)."""


# ---------------------------------------------------------------------------- node + npm


def _lock_digest() -> str:
    return hashlib.sha256(LOCKFILE.read_bytes()).hexdigest()


@contextlib.contextmanager
def _install_lock() -> Iterator[None]:
    """Serialises ``npm ci`` between test runs that start at the same time."""
    if fcntl is None:
        yield
        return
    with INSTALL_LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def js_node() -> str:
    """The ``node`` executable, with tests/interop_js's packages installed as locked."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        missing = " and ".join(name for name, path in (("node", node), ("npm", npm)) if not path)
        pytest.skip(f"the JS client tests need Node.js: {missing} not on PATH")
    with _install_lock():
        digest = _lock_digest()
        if not (STAMP.is_file() and STAMP.read_text().strip() == digest):
            try:
                proc = subprocess.run(
                    [npm, "ci", "--no-audit", "--no-fund"], cwd=JS_DIR, capture_output=True,
                    text=True, timeout=NPM_CI_TIMEOUT,
                )  # fmt: skip
            except subprocess.TimeoutExpired as exc:
                pytest.fail(f"npm ci in {JS_DIR} took over {exc.timeout:g} s", pytrace=False)
            if proc.returncode != 0:
                pytest.fail(
                    f"npm ci in {JS_DIR} failed with exit code {proc.returncode}:\n"
                    f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}",
                    pytrace=False,
                )
            STAMP.write_text(digest + "\n")
    return node


def run_js(
    node: str, mode: str, broker: BrokerHandle, *args: str, expect_ok: bool = True
) -> dict[str, Any]:
    """Runs ``roundtrip.mjs <mode>`` against ``broker``; returns its JSON result line.

    With ``expect_ok`` (the default) any failure fails the test, with the script's stderr.
    """
    command = [node, str(SCRIPT), mode, "--connection-string", broker.connection_string, *args]
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "NODE_OPTIONS")}
    try:
        proc = subprocess.run(
            command, cwd=JS_DIR, capture_output=True, text=True, timeout=NODE_TIMEOUT, env=env
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"node roundtrip.mjs {mode} did not finish in {exc.timeout:g} s:\n{exc.stderr!r}"
        ) from None
    lines = proc.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise AssertionError(
            f"node roundtrip.mjs {mode} exited with {proc.returncode} and no JSON result:\n"
            f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-4000:]}"
        ) from None
    assert result.get("mode") == mode, result
    assert result["ok"] == (proc.returncode == 0), (proc.returncode, result)
    if expect_ok:
        assert result["ok"], (
            f"node roundtrip.mjs {mode} failed (exit {proc.returncode}): "
            f"{result.get('error')} {result.get('problems')}\n{proc.stderr[-4000:]}"
        )
    return result


def ids(entries: list[dict[str, Any]]) -> list[str]:
    return [e["messageId"] for e in entries]


def js_properties(index: int, **extra: Any) -> dict[str, Any]:
    """The application properties roundtrip.mjs sends, as JSON gives them back."""
    return {**APP_PROPERTIES, "off": False, "index": index, **extra}


# ---------------------------------------------------------------------------- queues


@pytest.mark.broker_config(make_config({"q": {}}))
def test_js_sends_python_receives(js_node: str, broker: BrokerHandle) -> None:
    """What the JS SDK puts on the wire, as the Python SDK reads it back through the broker:
    message-id, subject, content type, correlation-id and application properties intact; the
    JS SDK's bodies are data sections, JSON text unless the body was a Buffer."""
    result = run_js(js_node, "send", broker, "--queue", "q")
    assert ids(result["sent"]) == ["js-single", "js-batch-0", "js-batch-1", "js-batch-2"]
    assert broker.count("q") == 4

    with broker.client() as client, client.get_queue_receiver("q") as receiver:
        messages = receive_n(receiver, 4)
        assert [m.message_id for m in messages] == [e["messageId"] for e in result["sent"]]
        assert [m.sequence_number for m in messages] == sorted(m.sequence_number for m in messages)
        for message, sent in zip(messages, result["sent"], strict=True):
            assert message.subject == sent["subject"]
            assert message.content_type == sent["contentType"]
            assert message.correlation_id == sent["correlationId"]
            assert message.delivery_count == 0
            assert message.session_id is None
            assert message.body_type == AmqpMessageBodyType.DATA
            # The Python SDK hands string keys and values back as bytes.
            props = {k.decode(): v for k, v in (message.application_properties or {}).items()}
            assert props == {
                "text": "héllo".encode(), "int": 42, "negative": -7, "float": 1.5,
                "flag": True, "off": False, "index": sent["applicationProperties"]["index"],
            }  # fmt: skip
            assert type(props["int"]) is int and type(props["float"]) is float
        assert [body_bytes(m) for m in messages] == [
            '{"kind":"single","n":0,"text":"héllo"}'.encode(),  # JSON.stringify of an object
            b'"batch text"',  # a string body is JSON too
            b"\x00\x01\x02\xfe\xff",  # a Buffer goes as it is
            b"[1,2,3]",
        ]
        for message in messages:
            receiver.complete_message(message)
        assert nothing_more(receiver)
    assert broker.count("q") == 0


@pytest.mark.broker_config(make_config({"q": {}}))
def test_python_sends_js_receives(js_node: str, broker: BrokerHandle) -> None:
    """The other way round: what the Python SDK sent, as the JS SDK reads it."""
    properties = {"text": "héllo", "int": 42, "negative": -7, "float": 1.5, "flag": True}
    with broker.client() as client, client.get_queue_sender("q") as sender:
        sender.send_messages([
            ServiceBusMessage(
                b'{"from": "python", "n": 1}', message_id="py-json", subject="py-subject",
                content_type="application/json", correlation_id="py-corr",
                application_properties=properties,
            ),
            ServiceBusMessage(b"\x00raw\xff", message_id="py-raw", subject="py-subject"),
        ])  # fmt: skip
    assert broker.count("q") == 2

    result = run_js(js_node, "receive", broker, "--queue", "q", "--count", "2")
    first, second = result["received"]
    assert ids(result["received"]) == ["py-json", "py-raw"]
    assert first["body"] == {"from": "python", "n": 1}  # the JS SDK JSON-parses data bodies
    assert second["body"] == {"base64": "AHJhd/8="}  # ... and leaves the rest as a Buffer
    assert first["subject"] == second["subject"] == "py-subject"
    assert first["contentType"] == "application/json"
    assert first["correlationId"] == "py-corr"
    assert first["applicationProperties"] == properties
    assert second["applicationProperties"] == {}
    assert first["deliveryCount"] == second["deliveryCount"] == 0
    assert first["hasLockToken"] and second["hasLockToken"]
    assert int(second["sequenceNumber"]) > int(first["sequenceNumber"])
    assert broker.count("q") == 0  # the JS client completed both


@pytest.mark.broker_config(make_config({"q": {}}))
def test_js_queue_round_trip(js_node: str, broker: BrokerHandle) -> None:
    """Send one message and a batch, peek-lock them, complete / abandon / dead-letter, read
    the dead-letter queue, receive-and-delete: all with the JS SDK.

    The JS SDK abandons with ``modified`` and no ``delivery-failed`` (rhea leaves it out, as
    the .NET SDK does); Service Bus counts that delivery attempt all the same."""
    result = run_js(js_node, "queue", broker, "--queue", "q")

    received = result["received"]
    assert [(e["step"], e["messageId"]) for e in received] == [
        ("peekLock", "js-single"),
        ("peekLock", "js-batch-0"),
        ("peekLock", "js-batch-1"),
        ("peekLock", "js-batch-2"),
        ("redelivered", "js-batch-1"),
        ("deadLetterQueue", "js-batch-2"),
        ("receiveAndDelete", "js-receive-and-delete"),
    ]
    by_step = {(e["step"], e["messageId"]): e for e in received}
    for index, entry in enumerate(e for e in received if e["step"] == "peekLock"):
        assert entry["applicationProperties"] == js_properties(index)
        assert entry["deliveryCount"] == 0
        assert entry["hasLockToken"]
    assert [e["body"] for e in received if e["step"] == "peekLock"] == [
        {"kind": "single", "n": 0, "text": "héllo"}, "batch text",
        {"base64": "AAEC/v8="}, [1, 2, 3],
    ]  # fmt: skip
    sequence_numbers = [int(e["sequenceNumber"]) for e in received if e["step"] == "peekLock"]
    assert sequence_numbers == sorted(set(sequence_numbers))
    again = by_step["redelivered", "js-batch-1"]
    assert int(again["sequenceNumber"]) == sequence_numbers[2]
    assert again["deliveryCount"] == 1
    dead = by_step["deadLetterQueue", "js-batch-2"]
    assert dead["deadLetterReason"] == "js-reason"
    assert dead["deadLetterErrorDescription"] == "dead-lettered by the JS client"
    assert dead["applicationProperties"] == js_properties(
        3, DeadLetterReason="js-reason", DeadLetterErrorDescription="dead-lettered by the JS client"
    )
    deleted = by_step["receiveAndDelete", "js-receive-and-delete"]
    assert not deleted["hasLockToken"]

    # The broker's side: everything settled, nothing left anywhere.
    assert broker.count("q") == 0
    assert broker.count("q/$DeadLetterQueue") == 0
    with broker.client() as client, client.get_queue_receiver("q") as receiver:
        assert nothing_more(receiver)


@pytest.mark.broker_config(make_config({"q": {}}))
def test_js_management_operations(js_node: str, broker: BrokerHandle) -> None:
    """peekMessages, scheduleMessages and cancelScheduledMessages, each on a connection of its
    own (so the management token is the only one there), then renewMessageLock."""
    result = run_js(js_node, "management", broker, "--queue", "q", expect_ok=False)
    assert result["ok"], (result.get("error"), result["problems"])
    assert ids(result["peeked"]) == ["mgmt-0", "mgmt-1"]
    assert [e["applicationProperties"] for e in result["peeked"]] == [
        js_properties(0),
        js_properties(1),
    ]
    assert all(e["deliveryCount"] == 0 for e in result["peeked"])
    assert ids(result["received"]) == ["mgmt-0", "mgmt-1"]  # peeking locked nothing
    (scheduled,) = result["scheduled"]
    assert int(scheduled) > max(int(e["sequenceNumber"]) for e in result["received"])
    assert broker.count("q") == 0  # received and completed; the scheduled one cancelled


# ---------------------------------------------------------------------------- sessions


@pytest.mark.broker_config(make_config({"sq": {"RequiresSession": True, "LockDuration": "PT30S"}}))
def test_js_sessions(js_node: str, broker: BrokerHandle) -> None:
    """acceptSession(queue, "s1") and acceptNextSession: FIFO inside each session, session
    state set and read back (and read by the Python SDK), and acceptNextSession giving up
    after its timeout when no session has messages."""
    empty_timeout_ms = 3000
    result = run_js(
        js_node, "session", broker, "--queue", "sq", "--empty-timeout-ms", str(empty_timeout_ms)
    )
    received = result["received"]
    assert [(e["step"], e["messageId"], e["sessionId"]) for e in received] == [
        ("s1", "s1-0", "s1"), ("s1", "s1-1", "s1"), ("s1", "s1-2", "s1"),
        ("s2", "s2-0", "s2"), ("s2", "s2-1", "s2"),
    ]  # fmt: skip
    for entry in received:
        assert entry["deliveryCount"] == 0
        assert entry["applicationProperties"] == {
            "session": entry["sessionId"], "n": int(entry["messageId"][-1])
        }  # fmt: skip
    state = result["sessionState"]
    assert state["s1Before"] is None and state["s2Before"] is None
    assert state["s1"] == state["s1AfterReaccept"] == {"step": "s1 done", "count": 3}
    assert state["s2"] == {"base64": "cmF3IHN0YXRlIG9mIHMy"}  # b"raw state of s2"

    # No session has messages: the broker answers the next-session attach with
    # com.microsoft:timeout (ServiceTimeout in JS) once the client's timeout is up.
    empty = result["acceptNextSessionWhenEmpty"]
    assert empty["code"] == "ServiceTimeout", empty
    assert empty_timeout_ms - 500 <= empty["elapsedMs"] <= empty_timeout_ms + 2500, empty

    assert broker.count("sq") == 0
    # The JS SDK stores session state as JSON text (or a Buffer's bytes): the Python SDK
    # reads the same bytes back.
    with broker.client() as client:
        with client.get_queue_receiver("sq", session_id="s1") as receiver:
            assert receiver.session.get_state() == b'{"step":"s1 done","count":3}'
        with client.get_queue_receiver("sq", session_id="s2") as receiver:
            assert receiver.session.get_state() == b"raw state of s2"


# ---------------------------------------------------------------------------- topics


TOPIC_CONFIG: dict[str, Any] = {
    "UserConfig": {
        "Namespaces": [
            {
                "Name": NAMESPACE,
                "Queues": [],
                "Topics": [
                    {
                        "Name": "t",
                        "Properties": {
                            "DefaultMessageTimeToLive": "PT1H",
                            "DuplicateDetectionHistoryTimeWindow": "PT20S",
                            "RequiresDuplicateDetection": False,
                        },
                        "Subscriptions": [
                            {
                                "Name": "s",
                                "Properties": {
                                    "DeadLetteringOnMessageExpiration": False,
                                    "LockDuration": "PT30S",
                                    "MaxDeliveryCount": 10,
                                    "RequiresSession": False,
                                },
                                "Rules": [],  # none: Service Bus's $Default (1=1)
                            },
                            {
                                "Name": "red",
                                "Properties": {"MaxDeliveryCount": 10},
                                "Rules": [
                                    {
                                        "Name": "red-only",
                                        "Properties": {
                                            "FilterType": "Correlation",
                                            "CorrelationFilter": {"Properties": {"color": "red"}},
                                        },
                                    }
                                ],
                            },
                        ],
                    }
                ],
            }
        ],
        "Logging": {"Type": "File"},
    }
}
"""Topic ``t`` with subscription ``s`` (every message) and ``red`` (color = 'red' only)."""


@pytest.mark.broker_config(TOPIC_CONFIG)
def test_js_topic(js_node: str, broker: BrokerHandle) -> None:
    """Send to a topic and receive from a subscription with the JS SDK; the JS client's
    application properties reach the broker's correlation filter intact."""
    result = run_js(js_node, "topic", broker, "--topic", "t", "--subscription", "s")
    received = result["received"]
    assert ids(received) == ["topic-0", "topic-1", "topic-2"]
    for n, entry in enumerate(received):
        assert entry["body"] == {"topic": True, "n": n}
        assert entry["applicationProperties"] == js_properties(n, color="red" if n == 1 else "blue")
        assert entry["deliveryCount"] == 0
    assert broker.count("t/Subscriptions/s") == 0  # the JS client completed them

    with (
        broker.client() as client,
        client.get_subscription_receiver("t", "red") as receiver,
    ):
        (message,) = receive_n(receiver, 1)
        assert message.message_id == "topic-1"
        assert body_bytes(message) == b'{"topic":true,"n":1}'
        receiver.complete_message(message)
        assert nothing_more(receiver)
    assert broker.count("t/Subscriptions/red") == 0


def test_js_administration_client(js_node: str, broker: BrokerHandle) -> None:
    """The JavaScript ServiceBusAdministrationClient, unchanged, over HTTPS on the broker's
    port with the broker's CA trusted through NODE_EXTRA_CA_CERTS: it creates and lists
    entities, and the runtime count sees what the JS AMQP client then sent."""
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "NODE_OPTIONS")}
    env["NODE_EXTRA_CA_CERTS"] = str(broker.data_dir / "tls" / "ca.pem")
    proc = subprocess.run(
        [js_node, str(JS_DIR / "admin.mjs"), broker.connection_string, "js"],
        cwd=JS_DIR, capture_output=True, text=True, timeout=NODE_TIMEOUT, env=env,
    )  # fmt: skip
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"], (result.get("error"), proc.stderr[-3000:])
    assert result["maxDeliveryCount"] == 7
    assert "js-q" in result["queues"] and "js-t" in result["topics"]
    assert result["subscriptions"] == ["all"]
    assert sorted(result["rules"]) == ["$Default", "eu"]
    assert result["activeMessageCount"] == 3
    assert result["missing"] == "MessageEntityNotFoundError"  # Service Bus: 200, empty feed
    assert result["namespace"] == "sbemulatorns"
    assert broker.count("js-q") == 3


# ---------------------------------------------------------------------------- message-id

GUID_HEX = re.compile(r"[0-9a-f]{32}")
"""A message-id the broker assigns: a new GUID, 32 hex digits (Service Bus: a GUID)."""


@pytest.mark.broker_config(make_config({"q": {}}, topics={"t": {"Subscriptions": {"s": {}}}}))
def test_js_messages_without_message_id(js_node: str, broker: BrokerHandle) -> None:
    """Messages the JS SDK sends without a messageId get one from the broker, as Service Bus
    gives every message one: the JS receiver's lock auto-renewal is keyed by it (without it,
    completeMessage throws "Failed to stop auto lock renewal - no message ID" and the
    message comes back). Queue, batch, redelivery, subscribe() and a topic subscription."""
    result = run_js(
        js_node, "no-message-id", broker, "--queue", "q", "--topic", "t", "--subscription", "s"
    )
    received = result["received"]
    assert [(e["step"], e["applicationProperties"]["n"]) for e in received] == [
        ("peekLock", 0), ("peekLock", 1), ("peekLock", 2), ("peekLock", 3),
        ("redelivered", 1), ("subscribe", 3), ("subscription", 10),
    ]  # fmt: skip
    for entry in received:
        assert GUID_HEX.fullmatch(entry["messageId"]), entry
    first = [e["messageId"] for e in received if e["step"] == "peekLock"]
    assert len(set(first)) == 4  # one each
    assert received[4]["messageId"] == first[1]  # the same one on redelivery
    assert received[5]["messageId"] == first[3]
    assert broker.count("q") == 0 and broker.count("t/Subscriptions/s") == 0


@pytest.mark.broker_config(make_config({"q": {}}))
def test_python_messages_without_message_id(broker: BrokerHandle) -> None:
    """What the Python SDK sees of the same rule. Its ServiceBusMessage always carries a
    message-id of the SDK's own (a dashed UUID), kept as it is; an AmqpAnnotatedMessage sent
    without one (no properties section at all, or one without message-id) is received with
    the broker's, the same after a restart (it is stored with the message), the other
    properties and the body untouched."""
    with broker.client() as client, client.get_queue_sender("q") as sender:
        own = ServiceBusMessage(b"sdk id")
        sender.send_messages(own)
        sender.send_messages([
            AmqpAnnotatedMessage(data_body=b"no properties"),
            AmqpAnnotatedMessage(
                data_body=b"no id", properties={"subject": "subj", "correlation_id": "corr"},
                application_properties={"k": "v"},
            ),
        ])  # fmt: skip
    assert broker.count("q") == 3
    stored = broker.message_ids("q")
    assert stored[0] == own.message_id
    assert all(GUID_HEX.fullmatch(i or "") for i in stored[1:]) and stored[1] != stored[2]

    broker.restart()
    with broker.client() as client, client.get_queue_receiver("q") as receiver:
        messages = receive_n(receiver, 3)
        assert [m.message_id for m in messages] == stored
        assert [body_bytes(m) for m in messages] == [b"sdk id", b"no properties", b"no id"]
        assert messages[2].subject == "subj" and messages[2].correlation_id == "corr"
        assert messages[2].application_properties == {b"k": b"v"}
        for message in messages:
            receiver.complete_message(message)


# ---------------------------------------------------------------------------- session locks

SESSION_LOCK_CONFIG = make_config(
    {"sq": {"RequiresSession": True, "LockDuration": "PT1M"}},
    topics={"t": {"Subscriptions": {"ss": {"Properties": {
        "RequiresSession": True, "LockDuration": "PT1M"
    }}}}},
)  # fmt: skip


@pytest.mark.broker_config(SESSION_LOCK_CONFIG)
def test_js_session_locks(js_node: str, broker: BrokerHandle) -> None:
    """acceptSession on a fresh session (nothing sent to it yet) and acceptNextSession, on a
    queue and a subscription with a 60 s lock: the session lock the JS SDK decodes from the
    attach (.NET ticks), renewSessionLock's (a timestamp) and the messages' locks are all
    about a minute ahead, and state, receive and complete work (no SessionLockLost)."""
    result = run_js(
        js_node, "session-locks", broker, "--queue", "sq", "--topic", "t",
        "--subscription", "ss", "--lock-ms", "60000",
    )  # fmt: skip
    sessions = result["sessions"]
    assert sorted(sessions) == [
        "queue fresh", "queue next", "subscription fresh", "subscription next"
    ]  # fmt: skip
    for name, report in sessions.items():
        assert 55_000 <= report["lockAheadMs"] <= 61_000, (name, report)
        assert 55_000 <= report["renewedAheadMs"] <= 61_000, (name, report)
        assert report["stateBefore"] is None, (name, report)
    assert sessions["queue next"]["received"] == ["queue-next-0", "queue-next-1"]
    assert sessions["subscription next"]["received"] == [
        "subscription-next-0", "subscription-next-1"
    ]  # fmt: skip
    assert broker.count("sq") == 0 and broker.count("t/Subscriptions/ss") == 0
    # The same sessions as the Python SDK sees them: state kept, lock a minute ahead.
    with (
        broker.client() as client,
        client.get_queue_receiver("sq", session_id="queue-fresh") as receiver,
    ):
        assert receiver.session.get_state() == b'{"what":"queue fresh"}'
        ahead = receiver.session.locked_until_utc.timestamp() - time.time()
        assert 55 <= ahead <= 61, ahead


# ---------------------------------------------------------------------------- large messages


@pytest.mark.broker_config(
    make_config({"q": {}, "sq": {"RequiresSession": True, "LockDuration": "PT1M"}})
)
def test_js_large_messages(js_node: str, broker: BrokerHandle) -> None:
    """250 KiB messages (a single one, one in a batch with a small one, subscribe(), a
    session) received and completed by the JS SDK: each completion is answered, nothing is
    delivered again."""
    result = run_js(js_node, "large", broker, "--queue", "q", "--session-queue", "sq")
    assert [(e["step"], e["messageId"], e["size"]) for e in result["received"]] == [
        ("peekLock", "large-0", 256_000), ("peekLock", "large-1", 256_000),
        ("peekLock", "small-2", 5), ("peekLock", "large-3", 256_000),
        ("subscribe", "large-subscribe", 256_000), ("session", "large-session", 256_000),
    ]  # fmt: skip
    assert broker.count("q") == 0 and broker.count("sq") == 0


TTL_MINUTES = 10 * 60_000
DAY_MS = 24 * 3600 * 1000


@pytest.mark.broker_config(make_config({"ttl": {"DefaultMessageTimeToLive": "P90D"}}))
def test_js_reads_back_the_time_to_live_that_was_sent(js_node: str, broker: BrokerHandle) -> None:
    """The JS SDK reads TimeToLive as absolute-expiry-time - creation-time: whatever clock
    the sender's creation-time came from, and for a message that had none (proton writes
    only the header ttl), the difference must be the TTL sent, exactly, and past 49 days
    too; a message without one gets the entity's default."""
    from proton import Message

    conn = proton_connection(broker.port)
    try:
        conn.create_sender("ttl").send(
            Message(body="proton", id="ttl-no-creation-time", ttl=TTL_MINUTES / 1000)
        )
    finally:
        conn.close()

    result = run_js(js_node, "ttl", broker, "--queue", "ttl", "--count", "1")
    got = {m["messageId"]: m for m in result["received"]}
    assert {k: got[k].get("timeToLive") for k in sorted(got)} == {
        "ttl-60-days": 60 * DAY_MS,
        "ttl-clock-behind": TTL_MINUTES,
        "ttl-default": 90 * DAY_MS,
        "ttl-no-creation-time": TTL_MINUTES,
        "ttl-plain": TTL_MINUTES,
    }
    for message in got.values():  # expiry counts from the enqueued time, exactly
        enqueued = datetime.fromisoformat(message["enqueuedTimeUtc"])
        expires = datetime.fromisoformat(message["expiresAtUtc"])
        assert expires - enqueued == timedelta(milliseconds=message["timeToLive"])
