"""The host's channel to its worker process: pickled frames on a socket pair.

The Functions host and its language worker speak gRPC (``FunctionRpc.EventStream``) over
TCP, because the worker may be any language. Ours is always this Python, a child of the
host on the same machine, so the channel is an AF_UNIX socket pair the host makes and the
worker inherits: no port, no listener another local user could reach, and a frame costs a
``pickle`` and one ``send`` (a few microseconds, against about 100 us a message for a gRPC
call in Python at each end). A frame is a 4-byte big-endian length and a pickle.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from typing import Any

HEADER = struct.Struct(">I")


def write_frame(writer: asyncio.StreamWriter, value: Any) -> None:
    """Queues one frame (the caller drains when it wants to wait for the socket)."""
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    writer.write(HEADER.pack(len(data)) + data)


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next frame's value; ``EOFError`` when the other end is gone."""
    try:
        header = await reader.readexactly(HEADER.size)
        (length,) = HEADER.unpack(header)
        data = await reader.readexactly(length)
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        raise EOFError("the channel is closed") from exc
    return pickle.loads(data)
