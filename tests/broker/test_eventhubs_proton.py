"""The Event Hubs face with a plain AMQP 1.0 client (python-qpid-proton): what the SDK
checks itself before it reaches the broker (partition ids), proton's own selector filter,
and the refusals an address of the wrong shape gets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from proton import Message, symbol
from proton.reactor import LinkOption, Selector
from proton.utils import LinkDetached

from .conftest import BrokerHandle, proton_connection
from .eventhubs_support import HUB, eventhub_config

pytestmark = pytest.mark.timeout(60)
StartBroker = Callable[..., BrokerHandle]


@pytest.fixture
def conn(broker_factory: StartBroker) -> Any:
    connection = proton_connection(broker_factory(eventhub_config()).port)
    yield connection
    connection.close()


def test_send_and_read_from_a_sequence_number_with_protons_selector(conn: Any) -> None:
    sender = conn.create_sender(f"{HUB}/Partitions/1")
    for n in range(3):
        sender.send(Message(body=f"p{n}"))
    receiver = conn.create_receiver(
        f"{HUB}/ConsumerGroups/$Default/Partitions/1", credit=10,
        options=Selector("amqp.annotation.x-opt-sequence-number > '0'"),
    )  # fmt: skip
    got = [receiver.receive(timeout=5) for _ in range(2)]
    assert [m.body for m in got] == ["p1", "p2"]
    assert [m.annotations[symbol("x-opt-sequence-number")] for m in got] == [1, 2]
    assert all(isinstance(m.annotations[symbol("x-opt-offset")], str) for m in got)


@pytest.mark.parametrize(
    ("make", "condition", "words"),
    [
        (lambda c: c.create_receiver(f"{HUB}/ConsumerGroups/$Default/Partitions/9"),
         "amqp:not-found", "has partitions 0, 1"),
        (lambda c: c.create_sender(f"{HUB}/ConsumerGroups/$Default/Partitions/0"),
         "amqp:not-allowed", f"send to '{HUB}'"),
        (lambda c: c.create_receiver(HUB), "amqp:not-allowed",
         "ConsumerGroups/<group>/Partitions/<id>"),
        (lambda c: c.create_receiver(f"{HUB}/Subscriptions/x"), "amqp:not-found",
         "could not be found"),
        (lambda c: c.create_receiver(f"{HUB}/ConsumerGroups/$Default/Partitions/0",
                                     options=Selector("sys.label = 'x'")),
         "com.microsoft:argument-error", "cannot read the selector filter"),
    ],
    ids=["unknown-partition", "send-to-group", "receive-from-hub", "other-shape", "selector"],
)  # fmt: skip
def test_addresses_of_the_wrong_shape_are_refused_saying_what_is_right(
    conn: Any, make: Callable[[Any], Any], condition: str, words: str
) -> None:
    with pytest.raises(LinkDetached, match=condition) as caught:
        make(conn)
    assert words in str(caught.value)


def test_an_offset_past_the_partitions_end_is_refused(broker_factory: StartBroker) -> None:
    """A checkpoint kept from a stream the partition no longer holds (its data wiped, the
    blobs kept): Event Hubs refuses the receiver with an argument error naming the last
    offset, rather than reading from the end under a filter the later events would not
    pass. (azure-eventhub retries the refusal without telling its ``on_error``: proton
    shows it.) Each receiver on a connection of its own: proton names a connection's links
    by their address."""
    port = broker_factory(eventhub_config()).port
    partition = f"{HUB}/ConsumerGroups/$Default/Partitions/0"
    connections: list[Any] = []

    def connection() -> Any:
        connections.append(proton_connection(port))
        return connections[-1]

    def receiver(offset: str, **options: Any) -> Any:
        selector = Selector(f"amqp.annotation.x-opt-offset > '{offset}'")
        return connection().create_receiver(partition, options=selector, **options)

    try:
        connection().create_sender(f"{HUB}/Partitions/0").send(Message(body="a"))
        last = receiver("-1", credit=1).receive(timeout=5).annotations[symbol("x-opt-offset")]
        beyond = int(last) + 1_000
        with pytest.raises(LinkDetached, match=r"com\.microsoft:argument-error") as caught:
            receiver(str(beyond))
        said = str(caught.value)
        assert f"The supplied offset '{beyond}' is invalid" in said
        assert f"The last offset in the system is '{last}'" in said
        receiver(last)  # the end itself is a fine place to start
    finally:
        for each in connections:
            each.close()


class MaxMessageSize(LinkOption):
    def __init__(self, size: int) -> None:
        self.size = size

    def apply(self, link: Any) -> None:
        link.max_message_size = self.size


def test_an_event_larger_than_the_readers_max_message_size_ends_its_link(conn: Any) -> None:
    conn.create_sender(f"{HUB}/Partitions/0").send(Message(body="x" * 500))
    with pytest.raises(LinkDetached, match="event 0 of eh1/Partitions/0 does not fit"):
        receiver = conn.create_receiver(
            f"{HUB}/ConsumerGroups/$Default/Partitions/0", credit=10,
            options=[Selector("amqp.annotation.x-opt-offset > '-1'"), MaxMessageSize(300)],
        )  # fmt: skip
        receiver.receive(timeout=5)  # the detach comes with the attach or just after it
