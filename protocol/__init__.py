"""The AMQP 0-9-1 wire codec, sans-IO: frames, methods, content properties, field tables.

Bytes in, events out (``FrameParser.feed``); methods and content out as bytes (``encode_*``).
"""

from .errors import (
    AMQPSyntaxError,
    CommandInvalid,
    FrameError,
    HardError,
    ProtocolError,
    ProtocolHeaderMismatch,
    SoftError,
    UnexpectedFrame,
)
from .frames import (
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    ContentHeader,
    ContentMessage,
    FrameParser,
    Heartbeat,
    MethodFrame,
    ProtocolHeaderReceived,
    encode_content,
    encode_deliver,
    encode_heartbeat,
    encode_method,
)
from .method import Method
from .properties import BasicProperties
from .spec import CONTENT_METHODS, METHODS
from .tables import decode_table, decode_table_typed, encode_table

__all__ = [
    "AMQPSyntaxError",
    "BasicProperties",
    "CONTENT_METHODS",
    "CommandInvalid",
    "ContentHeader",
    "ContentMessage",
    "FrameError",
    "FrameParser",
    "HEARTBEAT_FRAME",
    "HardError",
    "Heartbeat",
    "METHODS",
    "Method",
    "MethodFrame",
    "PROTOCOL_HEADER",
    "ProtocolError",
    "ProtocolHeaderMismatch",
    "ProtocolHeaderReceived",
    "SoftError",
    "UnexpectedFrame",
    "decode_table",
    "decode_table_typed",
    "encode_content",
    "encode_deliver",
    "encode_heartbeat",
    "encode_method",
    "encode_table",
]
