"""A receiver whose link takes smaller messages than the queue holds: the broker ends that
link saying which message does not fit, and the message stays for a receiver that can take
it (its lock given back, its delivery count untouched), as the Event Hubs face does."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from proton import Message
from proton.reactor import AtMostOnce
from proton.utils import LinkDetached

from .conftest import BrokerHandle, make_config, proton_connection
from .test_eventhubs_proton import MaxMessageSize

pytestmark = pytest.mark.timeout(60)
StartBroker = Callable[..., BrokerHandle]


def test_a_message_larger_than_the_receivers_max_message_size_ends_its_link(
    broker_factory: StartBroker,
) -> None:
    broker = broker_factory(make_config({"q": {}}))
    conn = proton_connection(broker.port)
    try:
        sender = conn.create_sender("q")
        sender.send(Message(body="x" * 500, id="big"))
        sender.send(Message(body="small", id="small"))
        with pytest.raises(LinkDetached, match="message 1 of q does not fit the link"):
            small_only = conn.create_receiver("q", credit=10, options=[MaxMessageSize(300)])
            small_only.receive(timeout=5)
        other = proton_connection(broker.port)  # proton names a link by container + address
        try:
            receiver = other.create_receiver("q", credit=10)
            first, second = receiver.receive(timeout=5), receiver.receive(timeout=5)
            assert (first.id, second.id) == ("big", "small")
            assert first.delivery_count == 0  # the refused link did not count as a delivery
            receiver.accept()
        finally:
            other.close()
    finally:
        conn.close()


def test_receive_and_delete_sends_what_fits_and_keeps_the_rest(broker_factory: StartBroker) -> None:
    broker = broker_factory(make_config({"q": {}}))
    conn = proton_connection(broker.port)
    try:
        sender = conn.create_sender("q")
        sender.send(Message(body="small", id="small"))
        sender.send(Message(body="x" * 500, id="big"))
        with pytest.raises(LinkDetached, match="message 2 of q does not fit the link"):
            receiver = conn.create_receiver(
                "q", credit=10, options=[MaxMessageSize(300), AtMostOnce()]
            )
            receiver.receive(timeout=5)
            receiver.receive(timeout=5)
        assert broker.message_ids("q") == ["big"]  # the small one went, the big one stays
    finally:
        conn.close()
