"""The pump's AMQP-native source (replication.servicebus.client) against the embedded broker.

Receiving from queues, subscriptions and sessions (FIFO, next available, a named session);
settlement outcomes as the broker applies them (complete in one ranged disposition,
abandon -> delivery count, dead-letter with reason, unread prefetch released); credentials
that do not work fail clearly; every field of the ``Message`` it makes equals what
``messages.from_received`` makes of the SDK's view of the same message; tokens are renewed;
TLS with SNI; and the pump on both backends.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.core.credentials import AccessToken, AzureNamedKeyCredential, AzureSasCredential
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue, TransportType
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.amqp import AmqpAnnotatedMessage
from hypothesis import given, settings

from replication.adapters.amqp import decode_to_message, to_message
from replication.amqp.message import Header, Properties, decode_message, encode_message
from replication.amqp.message import Message as AmqpMessage
from replication.amqp.performatives import Disposition
from replication.amqp.transport import ConnectionDriver
from replication.amqp.types import symbol
from replication.broker.clock import ManualClock
from replication.messages import Message, from_received
from replication.servicebus import sas
from replication.servicebus.client import (
    AmqpSource,
    AuthenticationError,
    NoSessionAvailable,
    SourceError,
)
from replication.servicebus.endpoint import Endpoint
from replication.tasks.pump import PumpStats, Source, pump
from replication.tasks.targets import SenderPool, Target
from replication.tasks.task import ReplicationTask
from tests.amqp.strategies import (
    amqp_messages,
)
from tests.broker.conftest import DRAIN_PREFETCH, BrokerHandle, concurrently, make_config, take_all
from tests.ports import unused_port
from tests.wire_witness import performatives, watch_writes

pytestmark = pytest.mark.timeout(120)

CONFIG = make_config(
    {
        "q": {}, "q2": {}, "fields": {}, "dst": {},
        "s": {"RequiresSession": True}, "s-dst": {"RequiresSession": True},
        "fragile": {"MaxDeliveryCount": 5},
    },
    rules=[
        {"Name": "RootManageSharedAccessKey", "Key": "SAS_KEY_VALUE", "Rights": ["Manage"]},
        {"Name": "sender", "Key": "sender-key", "Rights": ["Send"]},
    ],
    topics={"t": {"Subscriptions": {"sub": {}, "other": {}}}},
)  # fmt: skip


def send(broker: BrokerHandle, entity: str, messages: list[Any], *, topic: bool = False) -> None:
    with broker.client() as client:
        sender = client.get_topic_sender(entity) if topic else client.get_queue_sender(entity)
        with sender:
            for start in range(0, len(messages), 100):
                sender.send_messages(messages[start : start + 100])


@contextlib.asynccontextmanager
async def source_for(broker: BrokerHandle, **options: Any) -> AsyncIterator[AmqpSource]:
    async with AmqpSource(Endpoint.from_connection_string(broker.connection_string),
                          **options) as source:  # fmt: skip
        yield source


async def receive_all(receiver: Any, expected: int, timeout: float = 20.0) -> list[Message]:
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(out) < expected:
        assert time.monotonic() < deadline, f"got {len(out)} of {expected}"
        out += await receiver.receive(100, 1.0)
    return out


# ---------------------------------------------------------------------- endpoint, tokens


def test_endpoint_from_connection_strings() -> None:
    emulator = Endpoint.from_connection_string(
        "Endpoint=sb://localhost:6001;SharedAccessKeyName=k;SharedAccessKey=v;"
        "UseDevelopmentEmulator=true;"
    )
    assert (emulator.host, emulator.port, emulator.use_tls) == ("localhost", 6001, False)
    assert emulator.audience("q") == "sb://localhost:6001/q"
    assert emulator.address("t/Subscriptions/s") == "amqps://localhost:6001/t/Subscriptions/s"
    default_port = Endpoint.from_connection_string(
        "Endpoint=sb://localhost;SharedAccessKeyName=k;SharedAccessKey=v;"
        "UseDevelopmentEmulator=true"
    )
    assert (default_port.port, default_port.audience("q")) == (5672, "sb://localhost/q")
    cloud = Endpoint.from_connection_string(
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v;"
        "EntityPath=orders"
    )
    assert (cloud.host, cloud.port, cloud.use_tls) == ("ns.servicebus.windows.net", 5671, True)
    assert cloud.entity == "orders" and cloud.tls_context() is not None
    assert cloud.audience("orders") == "sb://ns.servicebus.windows.net/orders"
    with pytest.raises(ValueError, match="SharedAccessKey"):
        Endpoint.from_connection_string("Endpoint=sb://ns.servicebus.windows.net/")
    with pytest.raises(ValueError, match="Endpoint"):
        Endpoint.from_connection_string("SharedAccessKeyName=k;SharedAccessKey=v")


async def test_token_providers() -> None:
    keyed = Endpoint.from_connection_string(
        "Endpoint=sb://localhost:1;SharedAccessKeyName=rule;SharedAccessKey=secret;"
        "UseDevelopmentEmulator=true", token_lifetime=100,
    )  # fmt: skip
    token, expiry = await keyed.token_provider("sb://localhost:1/q")
    assert abs(expiry - (time.time() + 100)) < 5
    assert token == sas.generate_sas_token("sb://localhost:1/q", "rule", "secret", int(expiry))
    fixed = sas.generate_sas_token("sb://localhost:1/q", "rule", "secret", 2_000_000_000)
    signed = Endpoint.from_connection_string(
        f"Endpoint=sb://localhost:1;SharedAccessSignature={fixed};UseDevelopmentEmulator=true"
    )
    assert await signed.token_provider("sb://localhost:1/q") == (fixed, 2_000_000_000.0)
    assert sas.token_expiry(fixed) == 2_000_000_000


async def test_endpoint_from_sdk_client() -> None:
    conn = (
        "Endpoint=sb://localhost:6001;SharedAccessKeyName=rule;SharedAccessKey=secret;"
        "UseDevelopmentEmulator=true"
    )
    async with ServiceBusClient.from_connection_string(conn) as client:
        endpoint = Endpoint.from_client(client)
    assert (endpoint.host, endpoint.port, endpoint.use_tls) == ("localhost", 6001, False)
    token, _ = await endpoint.token_provider("sb://localhost:6001/q")
    assert "skn=rule" in token
    async with ServiceBusClient.from_connection_string(
        conn, transport_type=TransportType.AmqpOverWebsocket
    ) as client:
        with pytest.raises(ValueError, match="web sockets"):
            Endpoint.from_client(client)
    fixed = sas.generate_sas_token("sb://localhost:6001/q", "rule", "secret", 2_000_000_000)

    class EntraCredential:  # what an azure.identity.aio credential looks like
        async def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
            assert scopes == ("https://servicebus.azure.net/.default",)
            return AccessToken("eyJ-a-jwt", 1_900_000_000)

    for credential, token, token_type in [
        (AzureNamedKeyCredential("rule", "secret"), None, "servicebus.windows.net:sastoken"),
        (AzureSasCredential(fixed), (fixed, 2_000_000_000.0), "servicebus.windows.net:sastoken"),
        (EntraCredential(), ("eyJ-a-jwt", 1_900_000_000.0), "jwt"),
    ]:
        async with ServiceBusClient("localhost:6001", credential, use_tls=False) as client:
            endpoint = Endpoint.from_client(client)
        assert (endpoint.port, endpoint.use_tls, endpoint.token_type) == (6001, False, token_type)
        got = await endpoint.token_provider("sb://localhost:6001/q")
        if token is None:
            assert got[0] == sas.generate_sas_token(
                "sb://localhost:6001/q", "rule", "secret", int(got[1])
            )
        else:
            assert got == token
    async with ServiceBusClient("ns.servicebus.windows.net", EntraCredential()) as client:
        endpoint = Endpoint.from_client(client)
    assert (endpoint.host, endpoint.port, endpoint.use_tls) == (
        "ns.servicebus.windows.net",
        5671,
        True,
    )


# ---------------------------------------------------------------------- receiving


@pytest.mark.broker_config(CONFIG)
async def test_queue_receive_in_order_and_complete(broker: BrokerHandle) -> None:
    send(broker, "q", [ServiceBusMessage(f"body {i}", message_id=f"m{i}") for i in range(250)])
    async with source_for(broker) as source:
        receiver = await source.receiver("q", prefetch=50)
        got = await receive_all(receiver, 250)
        assert [m.message_id for m in got] == [f"m{i}" for i in range(250)]
        assert [m.body for m in got[:2]] == [b"body 0", b"body 1"]
        assert [m.sequence_number for m in got] == list(range(1, 251))
        receiver.complete(got)
        await receiver.close()
    await wait_for_count(broker, "q", 0)


@pytest.mark.broker_config(CONFIG)
async def test_batch_of_completes_is_one_disposition(
    broker: BrokerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    send(broker, "q", [ServiceBusMessage(f"{i}", message_id=f"m{i}") for i in range(100)])
    async with source_for(broker) as source:
        receiver = await source.receiver("q", prefetch=100)
        got = await receive_all(receiver, 100)
        frames: list[Any] = []

        def seen(driver: ConnectionDriver, data: bytes) -> None:
            if not driver.connection.server:  # the receiver's connection, not the broker's
                frames.extend(
                    (p.first, p.last, type(p.state).__name__)
                    for p in performatives(data)
                    if isinstance(p, Disposition)
                )

        watch_writes(monkeypatch, seen)
        assert receiver.complete(got) == 100
        await asyncio.sleep(0.2)
        await receiver.close()
    assert frames == [(got[0].source.delivery.delivery_id, got[-1].source.delivery.delivery_id,
                       "Accepted")]  # fmt: skip
    await wait_for_count(broker, "q", 0)


@pytest.mark.broker_config(CONFIG)
async def test_subscription(broker: BrokerHandle) -> None:
    send(broker, "t", [ServiceBusMessage(f"{i}", message_id=f"t{i}") for i in range(5)],
         topic=True)  # fmt: skip
    async with source_for(broker) as source:
        receiver = await source.receiver("t/Subscriptions/sub")
        got = await receive_all(receiver, 5)
        assert [m.message_id for m in got] == [f"t{i}" for i in range(5)]
        receiver.complete(got)
        await receiver.close()
        other = await source.receiver("t/Subscriptions/other")
        assert len(await receive_all(other, 5)) == 5  # every subscription has its copy
        await other.close()


@pytest.mark.broker_config(CONFIG)
async def test_sessions_fifo_next_available_and_named(broker: BrokerHandle) -> None:
    messages = [
        ServiceBusMessage(f"{sid}-{i}", message_id=f"{sid}-{i}", session_id=sid)
        for i in range(20) for sid in ("a", "b", "c")
    ]  # fmt: skip
    send(broker, "s", messages)
    async with source_for(broker) as source:
        first = await source.receiver("s", session=True, wait=5)
        second = await source.receiver("s", session=True, wait=5)
        assert {first.session_id, second.session_id} <= {"a", "b", "c"}
        assert first.session_id != second.session_id
        assert first.session_locked_until is not None
        assert first.session_locked_until > datetime.now(UTC)
        for receiver in (first, second):
            got = await receive_all(receiver, 20)
            assert [m.message_id for m in got] == [f"{receiver.session_id}-{i}" for i in range(20)]
            assert {m.session_id for m in got} == {receiver.session_id}
            receiver.complete(got)
        (rest,) = {"a", "b", "c"} - {first.session_id, second.session_id}
        named = await source.receiver("s", session=True, session_id=rest)
        assert named.session_id == rest
        got = await receive_all(named, 20)
        assert [m.message_id for m in got] == [f"{rest}-{i}" for i in range(20)]
        named.complete(got)
        for receiver in (first, second, named):
            await receiver.close()
        started = time.monotonic()
        # all three are empty now: none comes in time
        with pytest.raises(NoSessionAvailable, match="no session of 's' became available in time"):
            await source.receiver("s", session=True, wait=1)
        assert time.monotonic() - started < 10
    await wait_for_count(broker, "s", 0)


@pytest.mark.broker_config(CONFIG)
async def test_plain_receiver_on_a_session_queue_is_refused(broker: BrokerHandle) -> None:
    async with source_for(broker) as source:
        with pytest.raises(SourceError, match="'s' requires sessions: accept a session") as caught:
            await source.receiver("s")
        assert caught.value.condition == "amqp:not-allowed" and not caught.value.retryable


@pytest.mark.broker_config(CONFIG)
async def test_prefetch_bounds_what_waits_locked(broker: BrokerHandle) -> None:
    """Credit follows what the pump takes, not what arrives: at most ``prefetch`` messages
    wait unread (each holding a lock), however long the queue."""
    send(broker, "q", [ServiceBusMessage(f"{i}", message_id=f"m{i}") for i in range(50)])

    def locks() -> int:
        assert broker.broker is not None
        return len(broker.broker.queues["q"].locks)

    async with source_for(broker) as source:
        receiver = await source.receiver("q", prefetch=10)
        await wait_until(lambda: receiver.link.queue.qsize() == 10)
        await asyncio.sleep(0.3)
        assert receiver.link.queue.qsize() == 10 and broker.call(locks) == 10
        taken = await receiver.receive(6, 1.0)
        assert len(taken) == 6
        await wait_until(lambda: receiver.link.queue.qsize() == 10)
        await asyncio.sleep(0.3)
        assert broker.call(locks) == 16  # 6 being processed + 10 prefetched
        receiver.complete(taken)
        await receiver.close()
    await wait_for_count(broker, "q", 44)
    assert broker.call(locks) == 0  # the unread ten were released on close


# ---------------------------------------------------------------------- settlement


@pytest.mark.broker_config(CONFIG)
async def test_abandon_counts_a_delivery(broker: BrokerHandle) -> None:
    send(broker, "fragile", [ServiceBusMessage("x", message_id="again")])
    async with source_for(broker) as source:
        receiver = await source.receiver("fragile", prefetch=1)
        counts = []
        for _ in range(3):
            (message,) = await receive_all(receiver, 1)
            counts.append(message.delivery_count)
            assert receiver.abandon([message]) == 1
        (message,) = await receive_all(receiver, 1)
        receiver.complete([message])
        await receiver.close()
    assert counts == [0, 1, 2] and message.delivery_count == 3
    await wait_for_count(broker, "fragile", 0)


@pytest.mark.broker_config(CONFIG)
async def test_dead_letter_with_reason(broker: BrokerHandle) -> None:
    send(broker, "q", [ServiceBusMessage("bad", message_id="bad"),
                       ServiceBusMessage("good", message_id="good")])  # fmt: skip
    async with source_for(broker) as source:
        receiver = await source.receiver("q")
        bad, good = await receive_all(receiver, 2)
        receiver.dead_letter(bad, "NotJson", "Expecting value: line 1 column 1 (char 0)")
        receiver.complete([good])
        await receiver.close()
        dlq = await source.receiver("q/$DeadLetterQueue")
        (dead,) = await receive_all(dlq, 1)
        assert dead.message_id == "bad"
        assert dead.dead_letter_reason == "NotJson"
        assert dead.dead_letter_description == "Expecting value: line 1 column 1 (char 0)"
        dlq.complete([dead])
        await dlq.close()
    await wait_for_count(broker, "q", 0)


@pytest.mark.broker_config(CONFIG)
async def test_unread_prefetch_is_released_without_counting(broker: BrokerHandle) -> None:
    send(broker, "q", [ServiceBusMessage(f"{i}", message_id=f"m{i}") for i in range(10)])
    async with source_for(broker) as source:
        receiver = await source.receiver("q", prefetch=10)
        first = await receiver.receive(3, 5.0)
        while receiver.link.queue.qsize() < 7:  # the rest has arrived, unread
            await asyncio.sleep(0.05)
        receiver.complete(first)
        await receiver.close()
        again = await source.receiver("q", prefetch=10)
        rest = await receive_all(again, 10 - len(first))
        assert [m.message_id for m in rest] == [f"m{i}" for i in range(len(first), 10)]
        assert {m.delivery_count for m in rest} == {0}
        again.complete(rest)
        await again.close()


@pytest.mark.broker_config(CONFIG)
async def test_a_cancelled_receive_takes_no_message_with_it(broker: BrokerHandle) -> None:
    """A receive cancelled while it waits (the pump's stop) leaves nothing behind that takes
    the next arrival, and one cancelled just as it took a message gives it back: the next
    receive gets every message (a lost one stays locked until its lock expires, counted).
    Cancelled after 0..4 turns of the loop, which covers each point of its wait."""
    async with source_for(broker) as source:
        receiver = await source.receiver("q", prefetch=10)
        waiting = asyncio.ensure_future(receiver.receive(10, 30.0))
        await asyncio.sleep(0.1)
        waiting.cancel()
        await asyncio.wait({waiting})
        for turns in range(5):
            send(broker, "q", [ServiceBusMessage("x", message_id=f"after-{turns}")])
            await wait_until(lambda: receiver.link.queue.qsize() == 1, timeout=5.0)
            waiting = asyncio.ensure_future(receiver.receive(10, 30.0))
            for _ in range(turns):
                await asyncio.sleep(0)
            waiting.cancel()
            await asyncio.wait({waiting})
            got = [] if waiting.cancelled() else waiting.result()
            got += await receiver.receive(10, 0.2) if not got else []
            assert [m.message_id for m in got] == [f"after-{turns}"], turns
            receiver.complete(got)
        await receiver.close()
    await wait_for_count(broker, "q", 0)


@pytest.mark.broker_config(CONFIG)
async def test_messages_on_the_wire_as_the_receiver_closes_are_released_too(
    broker: BrokerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages released a moment before the receiver closes go straight back to it (it
    still has credit) and may be on the wire as it closes. Close stops the credit and waits
    for the broker's answer before it releases what is unread and detaches: none is left
    locked to a gone link (which holds it until the lock expires, a delivery counted)."""
    watched: list[ConnectionDriver] = []
    written: list[Any] = []

    def seen(driver: ConnectionDriver, data: bytes) -> None:
        if driver in watched:
            written.extend(performatives(data))

    watch_writes(monkeypatch, seen)

    def orphaned() -> int:
        assert broker.broker is not None
        return len(broker.broker.queues["q"].orphaned_locks)

    for round in range(5):
        send(broker, "q", [ServiceBusMessage(f"{i}", message_id=f"r{round}-{i}") for i in range(5)])
        async with source_for(broker) as source:
            receiver = await source.receiver("q", prefetch=10)
            got = await receive_all(receiver, 5)
            assert receiver.release(got) == 5
            await asyncio.sleep(0)  # the releases go out; the broker gives them straight back
            watched[:] = [receiver.link.client.driver]
            written.clear()
            await receiver.close()
            closing = [type(p).__name__ for p in written if type(p).__name__ != "Disposition"]
            assert closing[:2] == ["Flow", "Detach"], closing
            (flow,) = [p for p in written if type(p).__name__ == "Flow"]
            assert (flow.link_credit, flow.drain, flow.echo) == (0, True, True)
            assert broker.call(orphaned) == 0
            again = await source.receiver("q", prefetch=10)
            back = await receive_all(again, 5, timeout=5.0)
            assert {m.delivery_count for m in back} == {0}
            again.complete(back)
            await again.close()
        await wait_for_count(broker, "q", 0)


# ---------------------------------------------------------------------- failures


@pytest.mark.broker_config(CONFIG)
async def test_wrong_credentials_fail_clearly(broker: BrokerHandle) -> None:
    for key_name, key, expected in [
        ("RootManageSharedAccessKey", "wrong", "signature"),
        ("nobody", "SAS_KEY_VALUE", "Unknown shared access rule 'nobody'"),
    ]:
        endpoint = Endpoint.from_connection_string(broker.connection_string_for(key_name, key))
        async with AmqpSource(endpoint) as source:
            with pytest.raises(AuthenticationError, match=expected) as caught:
                await source.receiver("q")
            assert "sb://localhost" in str(caught.value) and not caught.value.retryable
    # a rule that may send but not listen: the token is taken, the receiver is not
    endpoint = Endpoint.from_connection_string(broker.connection_string_for("sender", "sender-key"))
    async with AmqpSource(endpoint) as source:
        with pytest.raises(AuthenticationError, match="Listen"):
            await source.receiver("q")


@pytest.mark.broker_config(CONFIG)
async def test_missing_entity_and_no_broker(broker: BrokerHandle) -> None:
    async with source_for(broker) as source:
        with pytest.raises(
            SourceError, match=r"cannot receive from no-such-queue: .*'no-such-queue' could not"
        ) as caught:
            await source.receiver("no-such-queue")
    assert caught.value.condition == "amqp:not-found" and not caught.value.retryable
    endpoint = Endpoint.from_connection_string(
        broker.connection_string.replace(str(broker.port), str(unused_port()))
    )
    async with AmqpSource(endpoint, timeout=5) as source:
        with pytest.raises(SourceError, match="cannot connect") as refused:
            await source.receiver("q")
    assert refused.value.retryable


def grant_expiry(broker: BrokerHandle) -> float:
    """When the token the broker holds for our connection runs out (Unix seconds)."""

    def expiry() -> float:
        assert broker.broker is not None
        (peer,) = [p for p in broker.broker.peers.values() if p.grants]
        return max(g.expires_at or 0 for g in peer.grants.values())

    return broker.call(expiry)


async def test_token_is_renewed_on_the_clock_before_it_expires(
    broker_factory: Callable[..., BrokerHandle],
) -> None:
    """Tokens of 4 s minted and renewed on the ``ManualClock`` the broker judges them by,
    stepped 0.2 s at a time for 12 s (three lifetimes): the token is put again with a
    tenth of its life left, so the broker never holds an expired one and the link stays
    open (without renewal the broker detaches it at 4 s)."""
    clock = ManualClock(start=float(int(time.time())))  # whole seconds, as SAS expiries
    broker = broker_factory(CONFIG, clock=clock)
    endpoint = Endpoint.from_connection_string(
        broker.connection_string, token_lifetime=4, clock=clock
    )
    async with AmqpSource(endpoint) as source:
        receiver = await source.receiver("q")
        assert grant_expiry(broker) == clock.time() + 4
        expiries = set()
        for step in range(60):
            deadline = time.monotonic() + 10
            while not (clock.sleeping and (clock.next_wake() or 0) > 0):  # a put in flight
                assert time.monotonic() < deadline, f"no token refresh waits on the clock ({step})"
                await asyncio.sleep(0.005)
            await asyncio.to_thread(broker.advance, 0.2)
            await asyncio.sleep(0.005)
            assert receiver.is_open, f"detached at {step * 0.2 + 0.2:.1f} s"
            expiries.add(grant_expiry(broker))
            assert max(expiries) > clock.time()
        assert len(expiries) >= 4  # put at 0 s, renewed at 3.6 s, 6.7 s, 9.5 s...
        send(broker, "q", [ServiceBusMessage("late", message_id="late")])
        (message,) = await receive_all(receiver, 1)
        assert message.message_id == "late"
        receiver.complete([message])
        await receiver.close()


@pytest.mark.broker_config(CONFIG)
async def test_token_is_renewed_before_it_expires(broker: BrokerHandle) -> None:
    """The real-time smoke test of token renewal (the exact one runs on a ``ManualClock``
    above): tokens of 4 s, 5 s of waiting; without renewal the broker, which looks at
    tokens once a second, would have detached the link by then."""
    endpoint = Endpoint.from_connection_string(broker.connection_string, token_lifetime=4)
    async with AmqpSource(endpoint) as source:
        receiver = await source.receiver("q")
        await asyncio.sleep(5)
        assert receiver.is_open
        send(broker, "q", [ServiceBusMessage("late", message_id="late")])
        (message,) = await receive_all(receiver, 1)
        assert message.message_id == "late"
        receiver.complete([message])
        await receiver.close()
        assert grant_expiry(broker) > time.time()


# ---------------------------------------------------------------------- fields


def rich_messages() -> list[Any]:
    scheduled = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    full = ServiceBusMessage(
        b"\x00binary\xff", message_id="full", correlation_id="corr", subject="subject",
        content_type="application/octet-stream", reply_to="replies",
        reply_to_session_id="reply-session", to="someone", partition_key="pk",
        time_to_live=timedelta(hours=2),
        application_properties={
            "text": "eu", "int": 7, "float": 0.5, "flag": True, "no": False,
            "bytes": b"raw", "uuid": uuid.UUID(int=5), "when": datetime(2024, 5, 6, tzinfo=UTC),
        },
    )  # fmt: skip
    return [
        full,
        ServiceBusMessage("text body", message_id="plain"),
        ServiceBusMessage(b"", message_id="empty"),
        ServiceBusMessage("grouped", message_id="grouped", session_id="group-1"),
        ServiceBusMessage("later", message_id="scheduled", scheduled_enqueue_time_utc=scheduled),
        AmqpAnnotatedMessage(value_body="a value body", properties={"message_id": "value"}),
        AmqpAnnotatedMessage(
            data_body=[b"part one, ", b"part two"], properties={"message_id": "two-parts"}
        ),
    ]


async def test_fields_equal_the_sdk_adapter(broker_factory: Callable[..., BrokerHandle]) -> None:
    """Each message through ``from_received`` (SDK) and through this source, field by field.
    The broker's clock is a ``ManualClock``: the scheduled one is made due by ``advance``."""
    broker = broker_factory(CONFIG, clock=ManualClock())
    send(broker, "fields", rich_messages())
    broker.advance(2)  # the scheduled one (due within 1 s of now) is due
    sdk_view: dict[str, Message] = {}
    async with (
        broker.aio_client() as client,
        client.get_queue_receiver("fields", prefetch_count=10) as sdk_receiver,
    ):
        while len(sdk_view) < 7:
            for received in await sdk_receiver.receive_messages(10, max_wait_time=2):
                sdk_view[from_received(received).message_id or ""] = from_received(received)
                await sdk_receiver.abandon_message(received)
    async with source_for(broker) as source:
        receiver = await source.receiver("fields")
        ours = {m.message_id: m for m in await receive_all(receiver, 7)}
        assert set(ours) == set(sdk_view)
        for message_id, sdk in sdk_view.items():
            mine = ours[message_id]
            assert mine.delivery_count == sdk.delivery_count + 1  # the SDK abandoned it
            assert_same_fields(mine, sdk, skip={"delivery_count"})
            # the one-pass decoder and the general path agree too
            payload = mine.source.delivery.payload
            assert decode_to_message(payload) == to_message(decode_message(payload))
        # dead-lettered: the reason fields
        for message in ours.values():
            receiver.dead_letter(message, f"reason {message.message_id}", "why")
        await receiver.close()
    async with (
        broker.aio_client() as client,
        client.get_queue_receiver("fields", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq,
    ):
        sdk_dead = {m.message_id: from_received(m) for m in await dlq.peek_messages(10)}
    async with source_for(broker) as source:
        receiver = await source.receiver("fields/$DeadLetterQueue")
        ours = {m.message_id: m for m in await receive_all(receiver, 7)}
        assert set(ours) == set(sdk_dead)
        for message_id, sdk in sdk_dead.items():
            assert ours[message_id].dead_letter_reason == f"reason {message_id}"
            assert ours[message_id].dead_letter_description == "why"
            assert_same_fields(ours[message_id], sdk)
        receiver.complete(list(ours.values()))
        await receiver.close()
    full = sdk_view["full"]
    assert full.application_properties["when"] == 1714953600000  # the SDK's int milliseconds
    assert full.scheduled_enqueue_time is None and sdk_view["scheduled"].scheduled_enqueue_time


def assert_same_fields(mine: Message, sdk: Message, skip: frozenset[str] | set[str] = frozenset()
                       ) -> None:  # fmt: skip
    for name in Message.__dataclass_fields__:
        if name in skip or name in ("source", "target", "locked_until"):  # lock: per delivery
            continue
        ours, theirs = getattr(mine, name), getattr(sdk, name)
        assert ours == theirs, f"{mine.message_id}.{name}: {ours!r} != {theirs!r}"
        if name == "application_properties":  # ours keep their AMQP types: the SDK's, marked
            for key, value in ours.items():
                assert isinstance(value, type(theirs[key])), f"{mine.message_id}.{key}"
        else:
            assert type(ours) is type(theirs), f"{mine.message_id}.{name}"


def _outcome(decode: Any) -> Any:
    try:
        return decode()
    except Exception as exc:
        return type(exc)


@settings(max_examples=settings.default.max_examples * 3 // 2)  # 300 on CI, 75 at a desk
@given(amqp_messages())
def test_one_pass_decoder_equals_the_general_path(message: AmqpMessage) -> None:
    payload = encode_message(message)
    fast = _outcome(lambda: decode_to_message(payload))
    assert fast == _outcome(lambda: to_message(decode_message(payload)))
    if isinstance(fast, Message):
        assert {k: type(v) for k, v in fast.application_properties.items()} == {
            k: type(v)
            for k, v in to_message(decode_message(payload)).application_properties.items()
        }


def test_one_pass_decoder_on_wide_encodings() -> None:
    """Sections over 255 bytes use the 32-bit list/map/binary forms."""
    message = AmqpMessage(
        body=[b"x" * 300, b"y" * 5],
        header=Header(ttl=5000, delivery_count=3),
        message_annotations={symbol("x-opt-sequence-number"): 7, symbol("pad"): "p" * 300,
                             symbol("x-opt-partition-key"): "pk"},
        properties=Properties(message_id="m" * 300, group_id="g"),
        application_properties={f"k{i}": "v" * 20 for i in range(20)},
    )  # fmt: skip
    payload = encode_message(message)
    fast = decode_to_message(payload)
    assert fast == to_message(decode_message(payload))
    assert fast.body == b"x" * 300 + b"y" * 5 and fast.sequence_number == 7
    assert (fast.partition_key, fast.session_id, fast.delivery_count) == ("pk", "g", 3)
    assert fast.time_to_live == timedelta(seconds=5)


# ---------------------------------------------------------------------- TLS


@pytest.mark.broker_config(CONFIG)
async def test_tls_with_sni(broker: BrokerHandle, tmp_path: Path) -> None:
    """Without UseDevelopmentEmulator the source speaks TLS, naming the host (SNI); here a
    TLS-terminating proxy stands in front of the broker."""
    from tests.amqp.test_tls import _make_cert

    certs = _make_cert(tmp_path, "localhost")
    server_names: list[str | None] = []
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(certs.cert, certs.key)
    server_context.sni_callback = lambda sock, name, ctx: server_names.append(name)

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", broker.port)
        await asyncio.gather(relay(reader, up_writer), relay(up_reader, writer))

    server = await asyncio.start_server(proxy, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    send(broker, "q", [ServiceBusMessage("secret", message_id="tls")])
    try:
        connection_string = (
            f"Endpoint=sb://localhost:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
            "SharedAccessKey=SAS_KEY_VALUE"
        )
        endpoint = Endpoint.from_connection_string(
            connection_string,
            ssl_context=ssl.create_default_context(cafile=str(certs.cert)),
        )
        assert endpoint.use_tls
        async with AmqpSource(endpoint) as source:
            receiver = await source.receiver("q")
            (message,) = await receive_all(receiver, 1)
            assert message.body == b"secret"
            receiver.complete([message])
            await receiver.close()
        assert server_names and set(server_names) == {"localhost"}
        untrusted = Endpoint.from_connection_string(connection_string)  # system CAs only
        async with AmqpSource(untrusted, timeout=5) as source:
            with pytest.raises(SourceError, match="cannot connect"):
                await source.receiver("q")
    finally:
        server.close()
    await wait_for_count(broker, "q", 0)


# ---------------------------------------------------------------------- the pump


@pytest.mark.slow
@pytest.mark.broker_config(CONFIG)
@pytest.mark.parametrize("backend", ["amqp", "sdk"])
async def test_pump_on_both_backends(broker: BrokerHandle, backend: str) -> None:
    """Plain and session sources, with a connection string or an SDK client: everything
    arrives, sessions keep their order, the source is empty."""
    cs = broker.connection_string
    send(broker, "q2", [ServiceBusMessage(f"{i}", message_id=f"p{i}") for i in range(120)])
    send(broker, "s", [
        ServiceBusMessage(f"{sid}{i}", message_id=f"{sid}{i}", session_id=sid)
        for i in range(30) for sid in ("x", "y", "z")
    ])  # fmt: skip
    plain_pool = SenderPool({None: Target(cs, "dst")})
    session_pool = SenderPool({None: Target(cs, "s-dst")})
    stop = asyncio.Event()
    plain, sessions = PumpStats(), PumpStats()
    async with ServiceBusClient.from_connection_string(cs) as client:
        jobs = [
            asyncio.create_task(pump(ReplicationTask("plain"), cs, Source("q2"), plain_pool,
                                     stop, stats=plain, backend=backend, max_batch=50)),
            asyncio.create_task(pump(ReplicationTask("sessions"), client,
                                     Source("s", sessions=True), session_pool, stop,
                                     stats=sessions, backend=backend, session_workers=2)),
        ]  # fmt: skip
        deadline = time.monotonic() + 60
        while plain.completed < 120 or sessions.completed < 90:
            assert time.monotonic() < deadline, (plain, sessions)
            for job in jobs:
                if job.done():
                    job.result()
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*jobs), 30)
    await plain_pool.close()
    await session_pool.close()
    assert (plain.abandoned, plain.dead_lettered, sessions.abandoned) == (0, 0, 0)

    def drain(queue: str, session: str | None = None) -> list[str | None]:
        with (
            broker.client() as client,
            client.get_queue_receiver(
                queue, session_id=session, prefetch_count=DRAIN_PREFETCH
            ) as receiver,
        ):
            return [m.message_id for m in take_all(receiver)]

    sids = ("x", "y", "z")
    ids, *ordered = await asyncio.to_thread(
        concurrently, lambda: drain("dst"), *(lambda s=s: drain("s-dst", s) for s in sids)
    )
    assert set(ids) == {f"p{i}" for i in range(120)}
    for sid, got in zip(sids, ordered, strict=True):
        assert got == [f"{sid}{i}" for i in range(30)]
    assert broker.count("q2") == 0 and broker.count("s") == 0


@pytest.mark.broker_config(CONFIG)
async def test_pump_raises_on_wrong_credentials(broker: BrokerHandle) -> None:
    cs = broker.connection_string_for("RootManageSharedAccessKey", "wrong")
    pool = SenderPool({None: Target(broker.connection_string, "dst")})
    try:
        with pytest.raises(AuthenticationError, match="signature"):
            await asyncio.wait_for(
                pump(ReplicationTask("x"), cs, Source("q"), pool, asyncio.Event()), 30
            )
    finally:
        await pool.close()


@pytest.mark.broker_config(CONFIG)
async def test_pump_reconnects_after_the_broker_restarts(broker: BrokerHandle) -> None:
    cs = broker.connection_string
    pool = SenderPool({None: Target(cs, "dst")})
    stop, stats = asyncio.Event(), PumpStats()
    job = asyncio.create_task(pump(ReplicationTask("r"), cs, Source("q2"), pool, stop,
                                   stats=stats, backend="amqp"))  # fmt: skip
    try:
        send(broker, "q2", [ServiceBusMessage("1", message_id=f"a{i}") for i in range(20)])
        await wait_until(lambda: stats.completed >= 20)
        await asyncio.to_thread(broker.restart)
        send(broker, "q2", [ServiceBusMessage("2", message_id=f"b{i}") for i in range(20)])
        await wait_until(lambda: stats.completed >= 40, timeout=60)
        assert not job.done()
    finally:
        stop.set()
        await asyncio.wait_for(job, 30)
        await pool.close()
    await wait_for_count(broker, "q2", 0)
    with broker.client() as client, client.get_queue_receiver("dst") as receiver:
        ids = set()
        while batch := receiver.receive_messages(100, max_wait_time=1):
            ids |= {m.message_id for m in batch}
    assert ids == {f"a{i}" for i in range(20)} | {f"b{i}" for i in range(20)}


async def wait_until(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


# ---------------------------------------------------------------------- helpers


async def wait_for_count(broker: BrokerHandle, queue: str, expected: int) -> None:
    deadline = time.monotonic() + 10
    while broker.count(queue) != expected:
        assert time.monotonic() < deadline, f"{queue} holds {broker.count(queue)}"
        await asyncio.sleep(0.05)
