"""Benchmark: our AMQP codec against python-qpid-proton's, in the same process.

    python bench/codec.py [--seconds 3] [--rounds 5]

Line 1: a typical Service Bus message built, encoded and decoded again: ours
(``Message(...)`` + ``encode_message`` + ``decode_message``) against proton's
(``proton.Message(...)`` + ``encode()`` + ``Message().decode()``).
Lines 2-3: a Transfer performative encoded, and decoded, alone (proton through its generic
``Data`` codec, as a described list, since its performatives live in C).

Contestants run in interleaved rounds (the order alternates each round) and the best round of
each counts, so a noisy neighbour or a frequency change hurts both sides alike.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import proton

from replication.amqp.codec import decode, encode
from replication.amqp.message import (
    Message,
    Properties,
    decode_message,
    encode_message,
)
from replication.amqp.performatives import Transfer
from replication.amqp.types import int32, symbol, timestamp

BODY = bytes(range(256))
MESSAGE_ID = "3f2504e0-4f89-11d3-9a0c-0305e82c3301"
SESSION_ID = "session-42"
ENQUEUED = 1_700_000_000_123
APP_PROPERTIES = {
    "tenant": "contoso",
    "attempt": 3,
    "priority": int32(7),
    "urgent": True,
    "score": 0.75,
}
ANNOTATIONS = {
    symbol("x-opt-sequence-number"): 123_456_789,
    symbol("x-opt-enqueued-time"): timestamp(ENQUEUED),
    symbol("x-opt-partition-key"): "partition-7",
}
PROTON_PROPERTIES = {
    "tenant": "contoso",
    "attempt": 3,
    "priority": proton.int32(7),
    "urgent": True,
    "score": 0.75,
}
PROTON_ANNOTATIONS = {
    proton.symbol("x-opt-sequence-number"): 123_456_789,
    proton.symbol("x-opt-enqueued-time"): proton.timestamp(ENQUEUED),
    proton.symbol("x-opt-partition-key"): "partition-7",
}


def ours_message() -> Message:
    message = Message(
        body=[BODY],
        properties=Properties(message_id=MESSAGE_ID, group_id=SESSION_ID),
        application_properties=APP_PROPERTIES,
        message_annotations=ANNOTATIONS,
    )
    return decode_message(encode_message(message))


def proton_message() -> proton.Message:
    message = proton.Message(
        body=BODY,
        inferred=True,  # the body as a data section, as Service Bus sends it
        id=MESSAGE_ID,
        group_id=SESSION_ID,
        properties=PROTON_PROPERTIES,
        annotations=PROTON_ANNOTATIONS,
    )
    back = proton.Message()
    back.decode(message.encode())
    return back


TRANSFER = Transfer(
    handle=1,
    delivery_id=12345,
    delivery_tag=uuid.UUID(int=7).bytes,
    message_format=0,
    settled=False,
)
TRANSFER_WIRE = encode(TRANSFER)
PROTON_TRANSFER = proton.Described(
    proton.ulong(0x14),
    [proton.uint(1), proton.uint(12345), uuid.UUID(int=7).bytes, proton.uint(0), False],
)


def ours_transfer_encode() -> bytes:
    return encode(TRANSFER)


def ours_transfer_decode() -> Transfer:
    return decode(TRANSFER_WIRE)  # type: ignore[no-any-return]


def proton_transfer_encode() -> bytes:
    data = proton.Data()
    data.put_object(PROTON_TRANSFER)
    return data.encode()


PROTON_TRANSFER_WIRE = proton_transfer_encode()


def proton_transfer_decode() -> proton.Described:
    data = proton.Data()
    data.decode(PROTON_TRANSFER_WIRE)
    data.rewind()
    data.next()
    return data.get_object()


def check() -> None:
    """Both sides do the real work, and read each other's bytes."""
    ours = ours_message()
    assert ours.data == BODY and ours.properties is not None
    assert ours.properties.message_id == MESSAGE_ID and ours.properties.group_id == SESSION_ID
    assert ours.application_properties == APP_PROPERTIES
    assert ours.message_annotations == ANNOTATIONS
    theirs = proton_message()
    assert theirs.body == BODY and theirs.id == MESSAGE_ID and theirs.group_id == SESSION_ID
    assert theirs.properties == APP_PROPERTIES and theirs.annotations == ANNOTATIONS
    cross = proton.Message()
    cross.decode(encode_message(ours))
    assert cross.body == BODY and cross.properties == APP_PROPERTIES
    assert decode(PROTON_TRANSFER_WIRE) == TRANSFER
    assert proton_transfer_decode().value[1] == 12345


def rate(fn: Callable[[], object], seconds: float) -> float:
    """Calls per second of ``fn`` over about ``seconds``."""
    batch = 50
    calls = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(batch):
            fn()
        calls += batch
        now = time.perf_counter()
        if now >= deadline:
            return calls / (now - start)


def best_of(
    contestants: dict[str, Callable[[], object]], seconds: float, rounds: int
) -> dict[str, float]:
    names = list(contestants)
    best = dict.fromkeys(names, 0.0)
    share = seconds / (rounds * len(names))
    for name in names:  # warm up (caches, lazy imports, proton's first allocations)
        rate(contestants[name], min(0.05, share))
    for round_ in range(rounds):
        order = names if round_ % 2 == 0 else names[::-1]
        for name in order:
            best[name] = max(best[name], rate(contestants[name], share))
    return best


def line(label: str, ours: float, theirs: float, unit: str) -> str:
    return (
        f"{label:<26} ours {ours:>10,.0f} {unit}  proton {theirs:>10,.0f} {unit}  "
        f"ratio {ours / theirs:.2f}x"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="total run time (default 3)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    args = parser.parse_args()
    check()
    rounds = max(1, args.rounds)
    message = best_of({"ours": ours_message, "proton": proton_message}, args.seconds * 0.6, rounds)
    print(line("message encode+decode", message["ours"], message["proton"], "msg/s"))
    transfer = best_of(
        {
            "ours-encode": ours_transfer_encode,
            "proton-encode": proton_transfer_encode,
            "ours-decode": ours_transfer_decode,
            "proton-decode": proton_transfer_decode,
        },
        args.seconds * 0.4,
        rounds,
    )
    print(line("transfer encode", transfer["ours-encode"], transfer["proton-encode"], "op/s"))
    print(line("transfer decode", transfer["ours-decode"], transfer["proton-decode"], "op/s"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
