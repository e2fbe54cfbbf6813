"""A replicated message's application properties keep their AMQP types, end to end.

python-qpid-proton, a client that writes and reads every AMQP type as it is, sends a message
whose properties hold each type .NET's Service Bus SDK writes (``decimal`` as decimal128,
``char``, ``long``, ``DateTime`` as a timestamp, ``Uri``/``TimeSpan``/``DateTimeOffset`` as
described values) and the rest; the pump replicates it over our AMQP stack; proton reads the
copy. Before, the copy had a long 7 as an int, the decimal as a garbled string, the char as
a string, the timestamp as a long, and a ulong beyond a long's range could not be sent at
all: that message was abandoned until it was dead-lettered.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from proton import (
    Described,
    Message,
    byte,
    char,
    decimal32,
    decimal64,
    decimal128,
    float32,
    int32,
    short,
    symbol,
    timestamp,
    ubyte,
    uint,
    ulong,
    ushort,
)

from replication.tasks.pump import Source
from replication.tasks.targets import Target
from replication.tasks.task import ReplicationTask
from tests.broker.conftest import BrokerHandle, make_config, proton_connection
from tests.tasks.test_replicate import running, wait_until

pytestmark = pytest.mark.timeout(120)

SENT: dict[str, Any] = {
    "decimal": decimal128(bytes(range(16))),
    "char": char("€"),
    "long": 7,
    "big long": 2**40,
    "when": timestamp(1_764_000_000_123),
    "uri": Described(symbol("com.microsoft:uri"), "https://example.com/"),
    "timespan": Described(symbol("com.microsoft:timespan"), 10_000_000),
    "offset": Described(symbol("com.microsoft:datetime-offset"), 638_000_000_000_000_000),
    "int": int32(-70_000),
    "short": short(-300),
    "byte": byte(-3),
    "ubyte": ubyte(3),
    "ushort": ushort(300),
    "uint": uint(70_000),
    "ulong": ulong(2**64 - 1),
    "float": float32(0.5),
    "double": 0.25,
    "decimal32": decimal32(5),
    "decimal64": decimal64(7),
    "symbol": symbol("sym"),
    "uuid": uuid.UUID(int=5),
    "string": "text",
    "boolean": True,
    "null": None,
}


def typed(properties: dict[str, Any]) -> dict[str, tuple[type, Any]]:
    """Each value with its proton type (proton reads binary as a memoryview: as bytes here)."""
    return {
        key: (bytes, bytes(value)) if isinstance(value, memoryview) else (type(value), value)
        for key, value in properties.items()
    }


@pytest.mark.broker_config(make_config({"src": {}, "dst": {}}))
async def test_every_property_type_reaches_the_copy(broker: BrokerHandle) -> None:
    sent = {**SENT, "binary": b"\x00\xff"}
    connection = proton_connection(broker.port)
    try:
        connection.create_sender("src").send(Message(body=b"x", id="typed", properties=sent))
    finally:
        connection.close()
    targets = {None: Target(broker.connection_string, "dst")}
    async with running(
        ReplicationTask("copy"), broker.connection_string, Source("src"), targets
    ) as stats:
        await wait_until(lambda: stats.completed + stats.abandoned >= 1)
    assert (stats.completed, stats.abandoned) == (1, 0)
    connection = proton_connection(broker.port)
    try:
        receiver = connection.create_receiver("dst", credit=1)
        copy = receiver.receive(timeout=10)
        receiver.accept()
    finally:
        connection.close()
    assert copy.id == "typed"
    stamps = {key for key in copy.properties if key.startswith("repl-")}
    got = {key: value for key, value in copy.properties.items() if key not in stamps}
    assert typed(got) == typed(sent)
