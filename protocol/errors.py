"""Protocol errors that carry their AMQP reply code.

Like wsproto's ``ParseFailed``, an error knows the code the connection (or
channel) must be closed with, so the I/O layer needs no lookup table: a
``HardError`` closes the connection, a ``SoftError`` closes one channel.
Decoding never lets a bare ``IndexError``/``struct.error``/``UnicodeDecodeError``
escape: any input either parses or raises a ``ProtocolError``.
"""

from __future__ import annotations

from typing import Any

REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

REPLY_TEXT: dict[int, str] = {
    REPLY_SUCCESS: "REPLY_SUCCESS",
    CONTENT_TOO_LARGE: "CONTENT_TOO_LARGE",
    NO_ROUTE: "NO_ROUTE",
    NO_CONSUMERS: "NO_CONSUMERS",
    CONNECTION_FORCED: "CONNECTION_FORCED",
    INVALID_PATH: "INVALID_PATH",
    ACCESS_REFUSED: "ACCESS_REFUSED",
    NOT_FOUND: "NOT_FOUND",
    RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
    FRAME_ERROR: "FRAME_ERROR",
    SYNTAX_ERROR: "SYNTAX_ERROR",
    COMMAND_INVALID: "COMMAND_INVALID",
    CHANNEL_ERROR: "CHANNEL_ERROR",
    UNEXPECTED_FRAME: "UNEXPECTED_FRAME",
    RESOURCE_ERROR: "RESOURCE_ERROR",
    NOT_ALLOWED: "NOT_ALLOWED",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    INTERNAL_ERROR: "INTERNAL_ERROR",
}


class ProtocolError(Exception):
    """An AMQP error: ``reply_code`` and ``text`` go into connection/channel.close.

    ``events`` holds the events a ``FrameParser.feed`` call had already parsed
    when the error struck, so the caller can process them first.
    """

    reply_code: int
    text: str
    class_id: int
    method_id: int
    events: list[Any]

    def __init__(self, reply_code: int, text: str, *, class_id: int = 0, method_id: int = 0):
        super().__init__(reply_code, text)
        self.reply_code = reply_code
        self.text = text
        self.class_id = class_id
        self.method_id = method_id
        self.events = []

    @property
    def close_text(self) -> str:
        """RabbitMQ-style reply-text, e.g. ``"NOT_FOUND - no queue 'q'"``, cut to fit a shortstr."""
        name = REPLY_TEXT.get(self.reply_code, "ERROR")
        raw = f"{name} - {self.text}".encode("utf-8", "surrogateescape")[:255]
        return raw.decode("utf-8", "ignore")

    def __str__(self) -> str:
        return f"{self.reply_code} {REPLY_TEXT.get(self.reply_code, 'ERROR')}: {self.text}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(reply_code={self.reply_code}, text={self.text!r}, "
            f"class_id={self.class_id}, method_id={self.method_id})"
        )


class HardError(ProtocolError):
    """A connection-level error: the whole connection is closed with ``reply_code``."""


class SoftError(ProtocolError):
    """A channel-level error: only ``channel`` is closed with ``reply_code``."""

    channel: int

    def __init__(
        self,
        reply_code: int,
        text: str,
        *,
        channel: int = 0,
        class_id: int = 0,
        method_id: int = 0,
    ):
        super().__init__(reply_code, text, class_id=class_id, method_id=method_id)
        self.channel = channel

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, channel={self.channel})"


class _FixedCodeHardError(HardError):
    CODE = INTERNAL_ERROR

    def __init__(self, text: str, *, class_id: int = 0, method_id: int = 0):
        super().__init__(self.CODE, text, class_id=class_id, method_id=method_id)


class FrameError(_FixedCodeHardError):
    """501: a frame could not be delimited or decoded (bad end octet, size, type)."""

    CODE = FRAME_ERROR


class AMQPSyntaxError(_FixedCodeHardError):
    """502: a frame carried illegal or undecodable field values."""

    CODE = SYNTAX_ERROR


class CommandInvalid(_FixedCodeHardError):
    """503: an unknown class/method id, or a method not valid here."""

    CODE = COMMAND_INVALID


class UnexpectedFrame(_FixedCodeHardError):
    """505: a frame arrived out of order (e.g. a body frame with no content pending)."""

    CODE = UNEXPECTED_FRAME


class ProtocolHeaderMismatch(_FixedCodeHardError):
    """The peer did not open with the AMQP 0-9-1 protocol header.

    The spec asks the server to answer with its own header and close the
    socket, so no connection.close is sent and ``reply_code`` (501) is nominal.
    ``header`` holds the bytes received (up to 8).
    """

    CODE = FRAME_ERROR
    header: bytes

    def __init__(self, text: str, *, header: bytes = b"", class_id: int = 0, method_id: int = 0):
        super().__init__(text, class_id=class_id, method_id=method_id)
        self.header = header
