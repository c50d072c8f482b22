"""A stream-protocol request refused with a response code (the connection goes on), and the
AMQP reply codes the core raises as the stream protocol's codes."""

from __future__ import annotations

from roarmq.protocol.errors import ACCESS_REFUSED, NOT_FOUND, PRECONDITION_FAILED
from roarmq.protocol.stream.codec import Code

#: A refusal's AMQP reply code as the stream protocol's response code.
CODES = {
    ACCESS_REFUSED: Code.ACCESS_REFUSED,
    NOT_FOUND: Code.STREAM_DOES_NOT_EXIST,
    PRECONDITION_FAILED: Code.PRECONDITION_FAILED,
}


class Refused(Exception):
    """A request answered with `code` (the connection goes on)."""

    def __init__(self, code: int, text: str = "") -> None:
        super().__init__(text)
        self.code = code
