"""Transactions (AMQP 1.0 part 4) and send-via, driven with python-qpid-proton.

Proton's own transaction API needs its reactor ``Container``; these tests use the blocking
API and write what it would: a sender whose target is a ``Coordinator`` (with capability
``amqp:local-transactions``) carrying ``Declare``/``Discharge`` in an amqp-value, and the
``transactional-state`` (0x34) set on a transfer or a disposition before it goes out.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage
from proton import Delivery, Described, Message, Terminus, symbol, ulong
from proton.reactor import LinkOption
from proton.utils import LinkDetached

from replication.broker.auth import EMULATOR_KEY, EMULATOR_RULE_NAME
from replication.broker.clock import ManualClock
from replication.broker.transactions import TIMEOUT_SECONDS
from replication.servicebus.sas import generate_sas_token

from .conftest import BrokerHandle, make_config, proton_connection, send, wait_for

pytestmark = pytest.mark.timeout(60)

TIMEOUT = 5
DECLARED = 0x33
TRANSACTIONAL_STATE = 0x34
TRANSFER_DESTINATION = symbol("com.microsoft:transfer-destination-address")
CONFIG = make_config({"q": {}, "via": {}, "dest": {}, "other": {}})


# ---------------------------------------------------------------------------- helpers


class CoordinatorTarget(LinkOption):
    """What proton's ``Container.declare_transaction`` sets on its controller link."""

    def apply(self, link: Any) -> None:
        link.target.type = Terminus.COORDINATOR
        link.target.capabilities.put_object(symbol("amqp:local-transactions"))


class TransferDestination(LinkOption):
    """Send-via: the link targets the via entity, this property names the destination."""

    def __init__(self, destination: str) -> None:
        self.destination = destination

    def apply(self, link: Any) -> None:
        link.properties = {TRANSFER_DESTINATION: self.destination}


class Controller:
    """A transaction controller link on a proton ``BlockingConnection``."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.link = conn.create_sender(
            None, name=f"txn-ctrl-{uuid.uuid4()}", options=CoordinatorTarget()
        )

    def _control(self, descriptor: str, fields: list[Any]) -> Any:
        body = Described(symbol(descriptor), fields)
        return self.link.send(Message(body=body), error_states=[])

    def declare(self) -> bytes:
        delivery = self._control("amqp:declare:list", [None])
        assert delivery.remote_state == DECLARED, delivery.remote_state
        (txn_id,) = delivery.remote.data
        return bytes(txn_id)

    def discharge(self, txn_id: bytes, fail: bool) -> Any:
        """The discharge's delivery (remote_state ACCEPTED, or REJECTED with a condition)."""
        return self._control("amqp:discharge:list", [txn_id, fail])

    def commit(self, txn_id: bytes) -> None:
        delivery = self.discharge(txn_id, False)
        assert delivery.remote_state == Delivery.ACCEPTED, delivery.remote.condition

    def rollback(self, txn_id: bytes) -> None:
        delivery = self.discharge(txn_id, True)
        assert delivery.remote_state == Delivery.ACCEPTED, delivery.remote.condition


def send_in(conn: Any, sender: Any, message: Message, txn_id: bytes) -> Any:
    """A transfer carrying ``transactional-state(txn_id)``; returns it once settled."""
    delivery = sender.link.send(message)
    delivery.local.data = [txn_id]
    delivery.update(TRANSACTIONAL_STATE)
    conn.wait(lambda: delivery.settled, timeout=TIMEOUT, msg="transactional send")
    return delivery


def settle_in(conn: Any, receiver: Any, txn_id: bytes, outcome: int = Delivery.ACCEPTED,
              fields: list[Any] | None = None) -> Any:  # fmt: skip
    """A disposition ``transactional-state(txn_id, outcome)`` for the oldest unsettled
    message taken from ``receiver``; returns its delivery once the broker settled it."""
    delivery = receiver.fetcher.unsettled.popleft()
    delivery.local.data = [txn_id, Described(ulong(outcome), fields or [])]
    delivery.update(TRANSACTIONAL_STATE)
    conn.wait(lambda: delivery.settled, timeout=TIMEOUT, msg="transactional disposition")
    return delivery


def condition(delivery: Any) -> str | None:
    cond = delivery.remote.condition
    return None if cond is None else str(cond.name)


def count(broker: BrokerHandle, queue: str) -> int:
    return broker.count(queue)


def ids(messages: list[Message]) -> list[str]:
    return [m.id for m in messages]


def receive_all(receiver: Any, n: int) -> list[Message]:
    got = []
    for _ in range(n):
        got.append(receiver.receive(timeout=TIMEOUT))
        receiver.accept()
    return got


def nothing_arrives(receiver: Any, wait: float = 0.5) -> bool:
    from proton import Timeout

    try:
        receiver.receive(timeout=wait)
    except Timeout:
        return True
    return False


def shorten_lock(broker: BrokerHandle, queue: str, seconds: float = 1.0) -> None:
    def apply() -> None:
        assert broker.broker is not None
        broker.broker.queues[queue].settings.lock_duration = timedelta(seconds=seconds)

    broker.call(apply)


def open_transactions(broker: BrokerHandle) -> int:
    assert broker.broker is not None
    return broker.call(lambda: len(broker.broker.transactions.transactions))  # type: ignore[union-attr]


@pytest.fixture
def broker(broker_factory: Any) -> BrokerHandle:
    return broker_factory(CONFIG)


# ---------------------------------------------------------------------------- declare / discharge


def test_coordinator_attach_declare_and_unique_ids(broker: BrokerHandle) -> None:
    conn = proton_connection(broker.port)
    try:
        controller = Controller(conn)
        capabilities = controller.link.remote_target.capabilities
        capabilities.rewind()
        capabilities.next()
        assert symbol("amqp:local-transactions") in capabilities.get_object().elements
        first, second = controller.declare(), controller.declare()
        assert first and second and first != second
        assert open_transactions(broker) == 2
        controller.commit(first)  # nothing enlisted: commits trivially
        controller.rollback(second)
        assert open_transactions(broker) == 0
    finally:
        conn.close()


def test_send_commit_makes_messages_visible(broker: BrokerHandle) -> None:
    conn = proton_connection(broker.port)
    try:
        controller = Controller(conn)
        sender = conn.create_sender("q")
        receiver = conn.create_receiver("q", credit=10)
        txn = controller.declare()
        for i in range(3):
            delivery = send_in(conn, sender, Message(body=f"m{i}", id=f"m{i}"), txn)
            assert delivery.remote_state == TRANSACTIONAL_STATE
            txn_id, outcome = delivery.remote.data
            assert bytes(txn_id) == txn
            assert outcome.descriptor == 0x24  # accepted, provisionally
        assert count(broker, "q") == 0
        assert nothing_arrives(receiver)
        controller.commit(txn)
        assert ids(receive_all(receiver, 3)) == ["m0", "m1", "m2"]
    finally:
        conn.close()
    assert count(broker, "q") == 0


def test_send_rollback_leaves_nothing(broker: BrokerHandle) -> None:
    conn = proton_connection(broker.port)
    try:
        controller = Controller(conn)
        sender = conn.create_sender("q")
        txn = controller.declare()
        send_in(conn, sender, Message(body="doomed", id="doomed"), txn)
        sender.send(Message(body="plain", id="plain"))  # outside the transaction
        controller.rollback(txn)
        receiver = conn.create_receiver("q", credit=10)
        assert ids(receive_all(receiver, 1)) == ["plain"]
        assert nothing_arrives(receiver)
    finally:
        conn.close()
    assert count(broker, "q") == 0


def test_unknown_transaction_id_is_refused(broker: BrokerHandle) -> None:
    conn = proton_connection(broker.port)
    try:
        controller = Controller(conn)
        unknown = uuid.uuid4().bytes
        delivery = controller.discharge(unknown, False)
        assert delivery.remote_state == Delivery.REJECTED
        assert condition(delivery) == "amqp:transaction:unknown-id"
        sender = conn.create_sender("q")
        delivery = send_in(conn, sender, Message(body="x"), unknown)
        assert delivery.remote_state == Delivery.REJECTED
        assert condition(delivery) == "amqp:transaction:unknown-id"
        txn = controller.declare()
        controller.commit(txn)
        delivery = controller.discharge(txn, False)  # discharged already
        assert condition(delivery) == "amqp:transaction:unknown-id"
    finally:
        conn.close()
    assert count(broker, "q") == 0


def test_transaction_ids_belong_to_their_connection(broker: BrokerHandle) -> None:
    owner = proton_connection(broker.port)
    other = proton_connection(broker.port)
    try:
        txn = Controller(owner).declare()
        delivery = send_in(other, other.create_sender("q"), Message(body="x"), txn)
        assert condition(delivery) == "amqp:transaction:unknown-id"
        delivery = Controller(other).discharge(txn, False)
        assert condition(delivery) == "amqp:transaction:unknown-id"
    finally:
        other.close()
        owner.close()


# ---------------------------------------------------------------------------- settlement


def test_complete_rolled_back_keeps_the_lock_then_committed_complete_removes(
    broker: BrokerHandle,
) -> None:
    send(broker, "q", ServiceBusMessage("work", message_id="work"))
    shorten_lock(broker, "q", 1.0)
    conn = proton_connection(broker.port)
    try:
        controller = Controller(conn)
        receiver = conn.create_receiver("q", credit=1)
        assert receiver.receive(timeout=TIMEOUT).id == "work"
        txn = controller.declare()
        delivery = settle_in(conn, receiver, txn)
        assert delivery.remote_state == TRANSACTIONAL_STATE
        assert delivery.remote.data[1].descriptor == 0x24  # the accepted echo
        assert count(broker, "q") == 1  # applies at commit
        controller.rollback(txn)
        assert count(broker, "q") == 1
        # still locked after the rollback: back only when the lock expires, one attempt counted
        again = receiver.receive(timeout=TIMEOUT)
        assert (again.id, again.delivery_count) == ("work", 1)
        txn = controller.declare()
        settle_in(conn, receiver, txn)
        assert count(broker, "q") == 1
        controller.commit(txn)
        assert count(broker, "q") == 0
    finally:
        conn.close()


def test_dead_letter_and_abandon_in_a_transaction(broker: BrokerHandle) -> None:
    send(broker, "q", *(ServiceBusMessage(body, message_id=body) for body in "ab"))
    conn = proton_connection(broker.port)
    try:
        controller = Controller(conn)
        receiver = conn.create_receiver("q", credit=2)
        assert [receiver.receive(timeout=TIMEOUT).id for _ in range(2)] == ["a", "b"]
        txn = controller.declare()
        dead = settle_in(conn, receiver, txn, Delivery.REJECTED)
        assert dead.remote.data[1].descriptor == 0x25
        abandoned = settle_in(conn, receiver, txn, Delivery.MODIFIED, [True, False])
        assert abandoned.remote.data[1].descriptor == 0x27
        assert nothing_arrives(receiver)  # both still locked
        controller.commit(txn)
        back = receiver.receive(timeout=TIMEOUT)
        assert (back.id, back.delivery_count) == ("b", 1)
        receiver.accept()
        dlq = conn.create_receiver("q/$DeadLetterQueue", credit=1)
        assert ids(receive_all(dlq, 1)) == ["a"]
    finally:
        conn.close()


def test_commit_fails_whole_when_a_lock_expired(broker_factory: Any) -> None:
    broker = broker_factory(CONFIG, clock=ManualClock())
    send(broker, "q", ServiceBusMessage("work", message_id="work"))
    shorten_lock(broker, "q", 1.0)
    conn = proton_connection(broker.port)
    try:
        controller = Controller(conn)
        receiver = conn.create_receiver("q", credit=1)
        sender = conn.create_sender("other")
        assert receiver.receive(timeout=TIMEOUT).id == "work"
        txn = controller.declare()
        send_in(conn, sender, Message(body="result", id="result"), txn)
        settle_in(conn, receiver, txn)
        broker.advance(1.001)  # the lock expires before the commit
        delivery = controller.discharge(txn, False)
        assert delivery.remote_state == Delivery.REJECTED
        assert condition(delivery) == "amqp:transaction:rollback"
        assert "expired" in delivery.remote.condition.description
        assert count(broker, "other") == 0  # all or nothing: the send is gone too
        assert count(broker, "q") == 1
        assert open_transactions(broker) == 0
    finally:
        conn.close()


def test_update_disposition_over_management_in_a_transaction(broker: BrokerHandle) -> None:
    """The .NET/Java SDKs send $management requests with the transactional state on the
    request transfer (deferred messages are settled only this way)."""
    send(broker, "q", ServiceBusMessage("work", message_id="work"))
    conn = proton_connection(broker.port)
    try:
        controller = Controller(conn)
        receiver = conn.create_receiver("q", credit=1)
        requests = conn.create_sender("q/$management")
        responses = conn.create_receiver("q/$management", credit=10)
        token = receiver.receive(timeout=TIMEOUT).instructions[symbol("x-opt-lock-token")]

        def request(txn: bytes, status: str = "completed") -> Message:
            send_in(conn, requests, Message(
                id=str(uuid.uuid4()), reply_to="q/$management",
                properties={"operation": "com.microsoft:update-disposition"},
                body={"disposition-status": status, "lock-tokens": [token]},
            ), txn)  # fmt: skip
            return responses.receive(timeout=TIMEOUT)  # pre-settled

        txn = controller.declare()
        assert request(txn).properties["statusCode"] == 200
        controller.rollback(txn)
        assert count(broker, "q") == 1
        txn = controller.declare()
        assert request(txn).properties["statusCode"] == 200
        assert count(broker, "q") == 1
        controller.commit(txn)
        assert count(broker, "q") == 0
        bad = request(uuid.uuid4().bytes)
        assert bad.properties["errorCondition"] == "amqp:transaction:unknown-id"
    finally:
        conn.close()


# ---------------------------------------------------------------------------- send-via


def test_send_via_without_a_transaction_goes_to_the_destination(broker: BrokerHandle) -> None:
    conn = proton_connection(broker.port)
    try:
        sender = conn.create_sender("via", options=TransferDestination("dest"))
        assert sender.remote_properties == {TRANSFER_DESTINATION: "dest"}
        sender.send(Message(body="forwarded", id="f"))
        assert count(broker, "via") == 0
        assert ids(receive_all(conn.create_receiver("dest", credit=1), 1)) == ["f"]
    finally:
        conn.close()


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_receive_from_via_and_send_to_destination_atomically(
    broker: BrokerHandle, commit: bool
) -> None:
    send(broker, "via", ServiceBusMessage("input", message_id="input"))
    conn = proton_connection(broker.port)
    try:
        controller = Controller(conn)
        receiver = conn.create_receiver("via", credit=1)
        sender = conn.create_sender("via", options=TransferDestination("dest"))
        assert receiver.receive(timeout=TIMEOUT).id == "input"
        txn = controller.declare()
        settle_in(conn, receiver, txn)
        send_in(conn, sender, Message(body="output", id="output"), txn)
        assert (count(broker, "via"), count(broker, "dest")) == (1, 0)
        if commit:
            controller.commit(txn)
            assert (count(broker, "via"), count(broker, "dest")) == (0, 1)
            assert ids(receive_all(conn.create_receiver("dest", credit=1), 1)) == ["output"]
        else:
            controller.rollback(txn)
            assert (count(broker, "via"), count(broker, "dest")) == (1, 0)
    finally:
        conn.close()


def test_send_via_attach_is_refused_for_a_bad_destination(broker: BrokerHandle) -> None:
    conn = proton_connection(broker.port)
    try:
        with pytest.raises(LinkDetached, match="amqp:not-found"):
            conn.create_sender("via", options=TransferDestination("no-such-queue"))
        # (another name: proton reuses <container>-via)
        with pytest.raises(LinkDetached, match="amqp:not-allowed"):
            conn.create_sender(
                "via", name="to-dlq", options=TransferDestination("dest/$DeadLetterQueue")
            )
    finally:
        conn.close()


def put_token(conn: Any, broker: BrokerHandle, entity: str) -> None:
    """CBS put-token for one entity (a SAS token of the emulator's root rule)."""
    audience = broker.audience(entity)
    token = generate_sas_token(audience, EMULATOR_RULE_NAME, EMULATOR_KEY, int(time.time()) + 600)
    requests = conn.create_sender("$cbs", name=f"cbs-{entity}")
    responses = conn.create_receiver("$cbs", name=f"cbs-replies-{entity}", credit=1)
    requests.send(Message(id=uuid.uuid4(), body=token, properties={
        "operation": "put-token", "type": "servicebus.windows.net:sastoken", "name": audience,
    }))  # fmt: skip
    assert responses.receive(timeout=TIMEOUT).properties["status-code"] == 202


def test_send_via_needs_send_on_both_entities(broker: BrokerHandle) -> None:
    conn = proton_connection(broker.port, user=None)  # ANONYMOUS, then CBS tokens per entity
    try:
        put_token(conn, broker, "via")
        with pytest.raises(LinkDetached, match="amqp:unauthorized-access"):
            conn.create_sender("via", name="no-token", options=TransferDestination("dest"))
        put_token(conn, broker, "dest")
        sender = conn.create_sender("via", options=TransferDestination("dest"))
        sender.send(Message(body="authorised", id="ok"))
    finally:
        conn.close()
    assert (count(broker, "via"), count(broker, "dest")) == (0, 1)


# ---------------------------------------------------------------------------- endings


def test_connection_drop_rolls_back_open_transactions(broker_factory: Any) -> None:
    broker = broker_factory(CONFIG, clock=ManualClock())
    send(broker, "q", ServiceBusMessage("held", message_id="held"))
    conn = proton_connection(broker.port)
    controller = Controller(conn)
    receiver = conn.create_receiver("q", credit=1)
    assert receiver.receive(timeout=TIMEOUT).id == "held"
    txn = controller.declare()
    send_in(conn, conn.create_sender("other"), Message(body="lost", id="lost"), txn)
    settle_in(conn, receiver, txn)
    conn.close()  # no discharge
    wait_for(lambda: open_transactions(broker) == 0)
    assert count(broker, "other") == 0
    assert count(broker, "q") == 1  # the complete never happened
    broker.advance(61)  # the lock outlived its link until it expired
    again = proton_connection(broker.port)
    try:
        receiver = again.create_receiver("q", credit=1)
        assert ids(receive_all(receiver, 1)) == ["held"]
    finally:
        again.close()


def test_closing_the_controller_link_rolls_back(broker: BrokerHandle) -> None:
    conn = proton_connection(broker.port)
    try:
        controller = Controller(conn)
        txn = controller.declare()
        send_in(conn, conn.create_sender("q"), Message(body="lost"), txn)
        controller.link.close()
        wait_for(lambda: open_transactions(broker) == 0)
        delivery = Controller(conn).discharge(txn, False)
        assert condition(delivery) == "amqp:transaction:unknown-id"
    finally:
        conn.close()
    assert count(broker, "q") == 0


def test_transaction_times_out(broker_factory: Any) -> None:
    """Exact, on the broker's clock: the time starts with the first operation (not the
    declare), and a transaction is still good just before its timeout."""
    broker = broker_factory(CONFIG, clock=ManualClock())
    conn = proton_connection(broker.port)
    try:
        controller = Controller(conn)
        txn = controller.declare()
        sender = conn.create_sender("q")
        broker.advance(200.0)  # longer than the timeout, but nothing was done in it yet
        send_in(conn, sender, Message(body="late"), txn)
        broker.advance(TIMEOUT_SECONDS - 0.001)
        assert open_transactions(broker) == 1
        kept = controller.declare()
        send_in(conn, sender, Message(body="kept"), kept)
        broker.advance(0.001)
        delivery = controller.discharge(txn, False)
        assert condition(delivery) == "amqp:transaction:timeout"
        assert condition(controller.discharge(txn, False)) == "amqp:transaction:unknown-id"
        assert controller.discharge(kept, False).remote_state == Delivery.ACCEPTED
    finally:
        conn.close()
    assert count(broker, "q") == 1  # the second one's send


def test_committed_work_survives_a_restart(broker: BrokerHandle) -> None:
    send(broker, "q", ServiceBusMessage("input", message_id="input"))
    conn = proton_connection(broker.port)
    try:
        controller = Controller(conn)
        receiver = conn.create_receiver("q", credit=1)
        assert receiver.receive(timeout=TIMEOUT).id == "input"
        txn = controller.declare()
        settle_in(conn, receiver, txn)
        send_in(conn, conn.create_sender("other"), Message(body="output", id="output"), txn)
        controller.commit(txn)
    finally:
        conn.close()
    broker.restart()
    assert (count(broker, "q"), count(broker, "other")) == (0, 1)
