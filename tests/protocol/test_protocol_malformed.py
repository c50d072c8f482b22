"""A corpus of malformed input, each mapped to the error, reply code and text it must raise."""

from __future__ import annotations

import struct
from typing import NamedTuple

import pytest
from support.protocol_strategies import header_payload, method_payload, raw_frame

from roarmq.protocol import spec
from roarmq.protocol.errors import (
    AMQPSyntaxError,
    CommandInvalid,
    FrameError,
    HardError,
    ProtocolError,
    ProtocolHeaderMismatch,
    UnexpectedFrame,
)
from roarmq.protocol.frames import PROTOCOL_HEADER, FrameParser

PUBLISH = method_payload(spec.BasicPublish(exchange="amq.topic", routing_key="k"))
HEADER_5 = header_payload(5)


class Case(NamedTuple):
    name: str
    data: bytes
    error: type[ProtocolError]
    reply_code: int
    text: str
    class_id: int = 0
    method_id: int = 0


CORPUS = [
    # 501 FRAME_ERROR: the frame itself cannot be delimited or read.
    Case(
        "bad frame end",
        raw_frame(8, 0, b"", end=0x00),
        FrameError,
        501,
        "ends with 0x00, expected 0xce",
    ),
    Case("unknown frame type", raw_frame(4, 1, b"abc"), FrameError, 501, "unknown frame type 4"),
    Case(
        "frame over frame_max", raw_frame(1, 1, bytes(4089)), FrameError, 501, "4089-byte payload"
    ),
    Case(
        "heartbeat off channel 0",
        raw_frame(8, 3, b""),
        FrameError,
        501,
        "heartbeat frame on channel 3",
    ),
    Case("heartbeat with payload", raw_frame(8, 0, b"x"), FrameError, 501, "must be empty"),
    Case(
        "method frame too short",
        raw_frame(1, 1, b"\x00\x3c"),
        FrameError,
        501,
        "too short for a method id",
    ),
    Case(
        "header frame too short",
        raw_frame(1, 1, PUBLISH) + raw_frame(2, 1, b"\x00\x3c\x00\x00"),
        FrameError,
        501,
        "shorter than 12",
    ),
    Case(
        "body overruns declared size",
        raw_frame(1, 1, PUBLISH) + raw_frame(2, 1, HEADER_5) + raw_frame(3, 1, b"123456"),
        FrameError,
        501,
        "exceeds the remaining content size of 5 bytes",
        60,
        40,
    ),
    Case(
        "second body frame overruns",
        raw_frame(1, 1, PUBLISH)
        + raw_frame(2, 1, HEADER_5)
        + raw_frame(3, 1, b"123")
        + raw_frame(3, 1, b"456"),
        FrameError,
        501,
        "exceeds the remaining content size of 2 bytes",
        60,
        40,
    ),
    # 502 SYNTAX_ERROR: the method arguments cannot be decoded.
    Case(
        "truncated arguments",
        raw_frame(1, 1, PUBLISH[:-3]),
        AMQPSyntaxError,
        502,
        "basic.publish: arguments truncated",
        60,
        40,
    ),
    Case(
        "trailing bytes after arguments",
        raw_frame(1, 1, method_payload(spec.BasicAck()) + b"zz"),
        AMQPSyntaxError,
        502,
        "basic.ack: 2 unexpected bytes",
        60,
        80,
    ),
    Case(
        "shortstr overruns frame",
        raw_frame(1, 1, b"\x00\x3c\x00\x28\x00\x00\xff"),
        AMQPSyntaxError,
        502,
        "arguments truncated",
        60,
        40,
    ),
    Case(
        "unknown table value type",
        raw_frame(
            1, 1, method_payload(spec.QueueDeclare())[:-4] + struct.pack(">I", 3) + b"\x01kZ"
        ),
        AMQPSyntaxError,
        502,
        "queue.declare.arguments: unknown field value type 'Z'",
        50,
        10,
    ),
    Case(
        "table length overruns frame",
        raw_frame(1, 1, method_payload(spec.QueueDeclare())[:-4] + struct.pack(">I", 100)),
        AMQPSyntaxError,
        502,
        "declares 100 bytes but only 0 remain",
        50,
        10,
    ),
    Case(
        "longstr length overruns frame",
        raw_frame(1, 0, b"\x00\x0a\x00\x15\xff\xff\xff\xff"),
        AMQPSyntaxError,
        502,
        "connection.secure-ok: arguments truncated",
        10,
        21,
    ),
    # 503 COMMAND_INVALID: no such method.
    Case(
        "unknown method id",
        raw_frame(1, 1, b"\x00\x3c\x00\x63"),
        CommandInvalid,
        503,
        "unknown method: class 60, method 99",
        60,
        99,
    ),
    Case(
        "unknown class id",
        raw_frame(1, 1, b"\x00\x63\x00\x0a"),
        CommandInvalid,
        503,
        "unknown method: class 99, method 10",
        99,
        10,
    ),
    # 505 UNEXPECTED_FRAME: frames out of order (RabbitMQ's texts).
    Case(
        "header without method",
        raw_frame(2, 1, HEADER_5),
        UnexpectedFrame,
        505,
        "expected method frame, got non method frame instead",
    ),
    Case(
        "body without method",
        raw_frame(3, 1, b"hello"),
        UnexpectedFrame,
        505,
        "expected method frame, got non method frame instead",
    ),
    Case(
        "method while header expected",
        raw_frame(1, 1, PUBLISH) + raw_frame(1, 1, PUBLISH),
        UnexpectedFrame,
        505,
        "expected content header for class 60, got non content header frame instead",
        60,
        40,
    ),
    Case(
        "body while header expected",
        raw_frame(1, 1, PUBLISH) + raw_frame(3, 1, b"hello"),
        UnexpectedFrame,
        505,
        "expected content header for class 60, got non content header frame instead",
        60,
        40,
    ),
    Case(
        "method while body expected",
        raw_frame(1, 1, PUBLISH) + raw_frame(2, 1, HEADER_5) + raw_frame(1, 1, PUBLISH),
        UnexpectedFrame,
        505,
        "expected content body, got non content body frame instead",
        60,
        40,
    ),
    Case(
        "second header",
        raw_frame(1, 1, PUBLISH) + raw_frame(2, 1, HEADER_5) + raw_frame(2, 1, HEADER_5),
        UnexpectedFrame,
        505,
        "expected content body, got non content body frame instead",
        60,
        40,
    ),
    Case(
        "header of another class",
        raw_frame(1, 1, PUBLISH) + raw_frame(2, 1, header_payload(5, class_id=50)),
        UnexpectedFrame,
        505,
        "expected content header for class 60, got one for class 50 instead",
        60,
        40,
    ),
    Case(
        "header with weight",
        raw_frame(1, 1, PUBLISH) + raw_frame(2, 1, header_payload(5, weight=1)),
        UnexpectedFrame,
        505,
        "weight must be 0",
        60,
        40,
    ),
]


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.name)
def test_malformed_frame_raises_its_reply_code(case: Case) -> None:
    parser = FrameParser(expect_protocol_header=False, frame_max=4096)
    with pytest.raises(case.error) as info:
        parser.feed(case.data)
    err = info.value
    assert isinstance(err, HardError)
    assert err.reply_code == case.reply_code
    assert case.text in err.text
    assert (err.class_id, err.method_id) == (case.class_id, case.method_id)
    # A hard error is final: the connection is going down, the parser stays dead.
    with pytest.raises(case.error):
        parser.feed(b"")


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.name)
def test_malformed_frame_fed_byte_by_byte(case: Case) -> None:
    parser = FrameParser(expect_protocol_header=False, frame_max=4096)
    with pytest.raises(case.error):
        for i in range(len(case.data)):
            parser.feed(case.data[i : i + 1])


def test_protocol_header_mismatch_is_a_hard_error() -> None:
    with pytest.raises(ProtocolHeaderMismatch) as info:
        FrameParser().feed(b"AMQP\x00\x00\x08\x00")
    assert isinstance(info.value, HardError) and info.value.reply_code == 501
    assert FrameParser().feed(PROTOCOL_HEADER)  # the control
