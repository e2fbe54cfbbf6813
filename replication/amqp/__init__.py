"""Our AMQP 1.0 engine: a sans-IO protocol core with a thin asyncio transport.

Layers, each importing only the ones before it:
  types, codec                    Python values <-> AMQP encoding (spec part 1)
  composite, performatives, terminus, outcomes, message
                                  the described types of the spec, registered with the codec
  frames                          protocol headers and frames over a byte stream
  sasl, link, session, connection the state machines; ``Connection`` is the entry point
  events                          what the state machines report
  transport, client, memory_node  asyncio sockets/TLS around a Connection; a small client;
                                  an in-memory peer for demos and tests
"""

from .codec import decode, decode_all, encode
from .connection import Connection
from .errors import AMQPError, DecodeError, EncodeError, FramingError, ProtocolError
from .message import Message, Properties, decode_message, encode_message

__all__ = [
    "AMQPError",
    "Connection",
    "DecodeError",
    "EncodeError",
    "FramingError",
    "Message",
    "Properties",
    "ProtocolError",
    "decode",
    "decode_all",
    "decode_message",
    "encode",
    "encode_message",
]
