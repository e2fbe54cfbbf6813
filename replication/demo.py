"""The quick-start job until the broker and host land: real AMQP messages over a real socket.

Starts the in-memory AMQP node on our engine, then a client on the same engine sends messages
with Service Bus-style properties to a queue address and receives and settles them, printing
progress. Everything goes through SASL PLAIN, sessions, credit and dispositions on TCP.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

from .amqp.client import Client
from .amqp.memory_node import start_memory_server
from .amqp.message import Message, Properties
from .amqp.sasl import PLAIN, SaslClient
from .amqp.types import timestamp


def _message(index: int, body_size: int) -> Message:
    return Message.from_bytes(
        bytes(body_size),
        properties=Properties(
            message_id=str(uuid.uuid4()),
            group_id=f"session-{index % 4}",
            content_type="application/octet-stream",
        ),
        application_properties={"index": index, "tenant": "contoso"},
        message_annotations={"x-opt-enqueued-time": timestamp(int(time.time() * 1000))},
    )


async def run(count: int, body_size: int, port: int, forever: bool) -> int:
    users = {"demo": "demo-secret"}
    server, _ = await start_memory_server("127.0.0.1", port, users=users)
    bound = server.sockets[0].getsockname()[1]
    print(f"[demo] AMQP 1.0 node on amqp://127.0.0.1:{bound} (SASL PLAIN demo/demo-secret)")
    client = await Client.connect(
        "127.0.0.1", bound, sasl=SaslClient(PLAIN, username="demo", password="demo-secret")
    )
    sender = await client.sender("demo-queue")
    receiver = await client.receiver("demo-queue", credit=200)
    started = time.perf_counter()
    step = max(1, count // 10)
    for index in range(count):
        outcome = await sender.send(_message(index, body_size))
        if type(outcome).__name__ != "Accepted":
            print(f"[demo] message {index} not accepted: {outcome!r}")
            return 1
        if (index + 1) % step == 0:
            print(f"[demo] sent {index + 1}/{count}")
    received = 0
    while received < count:
        item = await receiver.receive(timeout=10)
        item.accept()
        received += 1
        if received % step == 0:
            props = item.message.properties
            print(
                f"[demo] received {received}/{count} (last: message-id {props.message_id}, "
                f"session {props.group_id})"
            )
    elapsed = time.perf_counter() - started
    print(f"[demo] {count} messages sent, accepted, received and settled in {elapsed:.2f} s "
          f"({count / elapsed:,.0f} msg/s round trip)")  # fmt: skip
    await client.close()
    if forever:
        print("[demo] node keeps running; Ctrl+C to stop")
        await asyncio.Event().wait()
    server.close()
    await server.wait_closed()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replication start", description=__doc__)
    parser.add_argument("--count", type=int, default=1000, help="messages to move (1000)")
    parser.add_argument("--body-size", type=int, default=256, help="body bytes (256)")
    parser.add_argument("--port", type=int, default=0, help="listen port (0 = any free)")
    parser.add_argument("--forever", action="store_true", help="keep the node running")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(run(args.count, args.body_size, args.port, args.forever))
    except KeyboardInterrupt:
        return 130
