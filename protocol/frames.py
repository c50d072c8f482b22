"""AMQP frames: an incremental parser (bytes -> events) and encoders (-> one bytes object).

Wire layout: ``type:u8 channel:u16 size:u32 payload[size] 0xCE``. A content
method (basic.publish, deliver, return, get-ok) is followed on its channel by
one content header frame and then body frames until the declared body size is
reached; other channels' frames may interleave. The parser assembles that
sequence into a single ``ContentMessage``.

Error codes follow RabbitMQ (``rabbit_reader``, ``rabbit_command_assembler``)
except where noted: bad frame end, unknown frame type, oversized frame, a
heartbeat off channel 0 (RabbitMQ: 505, the spec: 501) and a body frame
overrunning the declared size are 501; frames out of order are 505 with
RabbitMQ's texts; undecodable method arguments are 502 (RabbitMQ says 501
"cannot decode"); an unknown class/method id is 503 (RabbitMQ drops the
connection without a code).
"""

from __future__ import annotations

from collections.abc import Callable
from struct import Struct
from struct import error as StructError
from typing import Any, NamedTuple

from .errors import (
    PRECONDITION_FAILED,
    CommandInvalid,
    FrameError,
    HardError,
    ProtocolHeaderMismatch,
    SoftError,
    UnexpectedFrame,
)
from .method import Method
from .properties import BasicProperties
from .spec import (
    CONTENT_METHODS,
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_METHOD,
    METHODS,
    BasicAck,
    BasicDeliver,
    BasicPublish,
)

#: True when this module runs compiled (setup.py): the paths written in C terms below are
#: taken only then. (``cython.compiled`` would need Cython importable at run time.)
_COMPILED = not __file__.endswith(".py")

__all__ = [
    "HEARTBEAT_FRAME",
    "PROTOCOL_HEADER",
    "ContentHeader",
    "ContentMessage",
    "FrameParser",
    "Heartbeat",
    "MethodFrame",
    "ProtocolHeaderReceived",
    "encode_ack",
    "encode_content",
    "encode_deliver",
    "encode_heartbeat",
    "encode_method",
]

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"
FRAME_OVERHEAD = 8  # 7-byte frame header + end octet

_unpack_frame_header = Struct(">BHI").unpack_from
_unpack_u32 = Struct(">I").unpack_from
_unpack_u64 = Struct(">Q").unpack_from
_unpack_content_header = Struct(">HHQ").unpack_from
_unpack_header_frame = Struct(">BHIHHQ").unpack_from  # frame header + content header at once
# Encoders put the previous frame's end octet in front of the next frame's
# header, so a deliver is 11 parts for one b"".join rather than 13.
_pack_method_head = Struct(">BHIHH").pack  # type, channel, size, class id, method id
_pack_header_frame = Struct(
    ">BBHIHHQ"
).pack  # 0xCE, type 2, channel, size, class, weight, body size
_pack_body_head = Struct(">BBHI").pack  # 0xCE, type 3, channel, size
_pack_deliver_head = Struct(">BHIHHB").pack  # method frame head + consumer-tag length
_pack_deliver_mid = Struct(">QBB").pack  # delivery-tag, redelivered bit, exchange length
_pack_u8 = Struct(">B").pack
_pack_ack = Struct(">BHIHHQBB").pack  # a whole basic.ack frame: head, tag, bit, end octet
_END = b"\xce"
_tuple_new = tuple.__new__
_new_object = object.__new__
# Bound decoders by method index: spares a class attribute lookup and a
# classmethod binding per method frame (-4% instructions per publish).
_DECODERS = {index: cls.decode for index, cls in METHODS.items()}
_decode_properties = BasicProperties.decode


# -- events ----------------------------------------------------------------------


class ProtocolHeaderReceived(NamedTuple):
    """The peer opened with the AMQP 0-9-1 protocol header."""

    major: int
    minor: int
    revision: int


class MethodFrame(NamedTuple):
    """A method without content (everything but publish/deliver/return/get-ok)."""

    channel: int
    method: Method


class ContentMessage(NamedTuple):
    """A content method with its header and whole body, assembled from its frames."""

    channel: int
    method: Method
    header: ContentHeader
    body: bytes


class Heartbeat(NamedTuple):
    """A heartbeat frame (always on channel 0)."""

    channel: int


_HEARTBEAT = Heartbeat(0)
_PROTOCOL_HEADER_EVENT = ProtocolHeaderReceived(0, 9, 1)


class ContentHeader:
    """A content header: ``raw`` is the property flags + list exactly as received.

    The broker forwards ``raw`` to consumers untouched; ``properties`` decodes
    it on first use (raising ``AMQPSyntaxError`` if it is malformed) and caches.
    """

    __slots__ = ("class_id", "body_size", "raw", "_properties")

    def __init__(
        self,
        class_id: int,
        body_size: int,
        raw: bytes,
        properties: BasicProperties | None = None,
    ) -> None:
        self.class_id = class_id
        self.body_size = body_size
        self.raw = raw
        self._properties = properties

    @classmethod
    def from_properties(
        cls, properties: BasicProperties, class_id: int = 60, body_size: int = 0
    ) -> ContentHeader:
        return cls(class_id, body_size, properties.encode(), properties)

    @property
    def properties(self) -> BasicProperties:
        props = self._properties
        if props is None:
            props = self._properties = _decode_properties(self.raw)
        return props

    def __eq__(self, other: object) -> bool:
        if type(other) is not ContentHeader:
            return NotImplemented
        return (
            self.class_id == other.class_id
            and self.body_size == other.body_size
            and self.raw == other.raw
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"ContentHeader(class_id={self.class_id}, body_size={self.body_size}, raw={self.raw!r})"
        )


def _frame_head(data, at):
    """A frame header's type, channel and size. Compiled: C loads of the buffer, returned as
    a C struct (frames.pxd); as Python, one struct call beats seven subscripts (so too for
    the content header's fields in FrameParser._parse)."""
    if _COMPILED:
        return data[at], data[at + 1] << 8 | data[at + 2], _u32(data, at + 3)
    return _unpack_frame_header(data, at)


def _u32(data, at):
    """The big-endian 32-bit integer at ``data[at:at + 4]`` (compiled: four C loads)."""
    high = data[at]  # widened first (frames.pxd): a C int shifted by 24 would overflow
    return high << 24 | data[at + 1] << 16 | data[at + 2] << 8 | data[at + 3]


def _header(class_id, body_size, raw):
    """A ContentHeader as the parser's fast path makes it: compiled, a struct filled in place
    rather than a call through ``__init__``'s arguments."""
    header = ContentHeader.__new__(ContentHeader)
    header.class_id = class_id
    header.body_size = body_size
    header.raw = raw
    header._properties = None
    if _COMPILED:
        # Out of the garbage collector's sight: a header holds bytes and properties off the
        # wire, which cannot refer back to it, so reference counting frees it. Tracked, each
        # one in flight was scanned again by every young-generation collection (with 100,000
        # queues those took a sixth of the broker's CPU). Message does the same.
        PyObject_GC_UnTrack(header)  # noqa: F821
    return header


def _decode_publish(data, start, end):
    """basic.publish's arguments (reserved short, exchange, routing key, two bits) in the
    common shape; anything else goes to the generated decoder, which raises the precise error.

    Compiled, this is ~10% of the generic decoder's instructions: C reads of the buffer and a
    method object filled in place (the generated ``decode`` is interpreted Python).
    """
    if end - start >= 5:
        n = data[start + 2]
        at = start + 3 + n  # the routing key's length octet
        if at < end:
            key_end = at + 1 + data[at]
            if key_end + 1 == end:
                method = _new_object(BasicPublish)
                method.exchange = data[start + 3 : at].decode("utf-8", "surrogateescape")
                method.routing_key = data[at + 1 : key_end].decode("utf-8", "surrogateescape")
                bits = data[key_end]
                method.mandatory = (bits & 1) != 0
                method.immediate = (bits & 2) != 0
                return method
    return BasicPublish.decode(data, start, end)


def _decode_ack(data, start, end):
    """basic.ack's arguments (a 64-bit delivery tag, one bit), what a consumer acking each
    delivery sends once per message; any other length goes to the generated decoder, which
    raises the precise error. Compiled: C loads and a method object filled in place."""
    if end - start == 9:
        method = _new_object(BasicAck)
        if _COMPILED:
            high = _u32(data, start)  # widened first (frames.pxd), as in _u32
            method.delivery_tag = high << 32 | _u32(data, start + 4)
        else:
            method.delivery_tag = _unpack_u64(data, start)[0]
        method.multiple = (data[start + 8] & 1) != 0
        return method
    return BasicAck.decode(data, start, end)


# -- parser ----------------------------------------------------------------------

_DISCARD: Any = object()  # in place of the chunk list: this content's body frames are dropped


def _too_big(kind: int, channel: int, size: int, frame_max: int, max_payload: int) -> FrameError:
    return FrameError(
        f"frame of type {kind} on channel {channel} has a {size}-byte payload, larger "
        f"than the negotiated frame_max {frame_max} allows ({max_payload} bytes)"
    )


def _bad_end(kind: int, channel: int, octet: int) -> FrameError:
    return FrameError(
        f"frame of type {kind} on channel {channel} ends with 0x{octet:02x}, expected 0xce"
    )


def _unknown_method(index: int) -> CommandInvalid:
    return CommandInvalid(
        f"unknown method: class {index >> 16}, method {index & 0xFFFF}",
        class_id=index >> 16,
        method_id=index & 0xFFFF,
    )


def _check_heartbeat(channel: int, size: int) -> None:
    if channel != 0:
        raise FrameError(f"heartbeat frame on channel {channel}; heartbeats belong on channel 0")
    if size:
        raise FrameError(f"heartbeat frame with a {size}-byte payload; it must be empty")


class FrameParser:
    """Incremental, sans-IO frame parser: ``feed(bytes)`` returns the complete events.

    Buffering is O(n) in the bytes fed, whatever the chunking, so a peer
    cannot make us do quadratic work (a denial of service) by dribbling a big
    frame a byte at a time: bytes wait in a ``bytearray`` (amortised O(1)
    appends) until the frame they start is complete, which is known from the
    7-byte header without rescanning; each byte is then copied out once. The
    declared size is checked against ``frame_max`` as soon as the header is
    in, so an oversized frame is refused before it is buffered.

    Errors: a ``HardError`` kills the parser (later ``feed`` calls raise it
    again). A ``SoftError`` (``max_body_size`` exceeded: 406 on that channel)
    leaves it usable: the message's body frames are skipped as they arrive and
    the bytes after the offending frame stay buffered, so call ``feed(b"")``
    to continue. Either way, events parsed before the error are in
    ``exc.events``.
    """

    __slots__ = (
        "frame_max",
        "max_body_size",
        "_expect_header",
        "_tail",
        "_need",
        "_pending",
        "_error",
    )

    def __init__(
        self,
        *,
        expect_protocol_header: bool = True,
        frame_max: int = 131072,
        max_body_size: int | None = None,
    ) -> None:
        self.frame_max = frame_max  # 0 means no limit, as in connection.tune
        self.max_body_size = max_body_size
        self._expect_header = expect_protocol_header
        self._tail: bytearray | bytes = b""  # an incomplete frame, awaiting more bytes
        self._need = 0  # parse again once _tail holds this many bytes
        # channel -> [method, header or None, body bytes remaining, chunks or None or _DISCARD]
        self._pending: dict[int, list[Any]] = {}
        self._error: HardError | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> list[Any]:
        """Parse ``data`` (any chunk of the stream) and return the events completed."""
        if self._error is not None:
            raise self._error
        tail = self._tail
        if tail:
            tail += data  # a bytearray: appends in place
            if len(tail) < self._need:
                return []
            data = bytes(tail)
            self._tail = b""
        elif type(data) is not bytes:
            data = bytes(data)
        return self._parse(data)

    def _parse(self, data: bytes) -> list[Any]:
        """The events in ``data`` (whole frames); an incomplete last frame is kept for later."""
        events: list[Any] = []
        pos = 0
        try:
            if self._expect_header:
                pos = self._protocol_header(data, events)
                if pos == 0:
                    return events
            # The hot loop: one header unpack, one end-octet check and a type
            # dispatch per frame; the common single-body-frame publish allocates
            # only the method, the ContentHeader, the body slice and the event.
            # Inlined here rather than in a method of its own: -3% instructions
            # per publish (callgrind, bench/codec.py's 1 KiB publish).
            pending = self._pending
            frame_max = self.frame_max
            max_payload = frame_max - FRAME_OVERHEAD if frame_max else 0xFFFFFFFF
            # The largest body the fast path takes (the general path refuses a bigger one).
            max_body = (
                0xFFFFFFFF if self.max_body_size is None else min(self.max_body_size, 0xFFFFFFFF)
            )
            end = len(data)
            while True:
                if end - pos < 7:
                    need = 7
                    break
                kind, channel, size = _frame_head(data, pos)
                if size > max_payload:
                    raise _too_big(kind, channel, size, frame_max, max_payload)
                nxt = pos + size + 8
                if nxt > end:
                    need = size + 8
                    break
                if data[nxt - 1] != 0xCE:  # FRAME_END; literals beat globals in this loop
                    raise _bad_end(kind, channel, data[nxt - 1])
                if kind == 1:  # FRAME_METHOD
                    if size < 4:
                        raise FrameError(
                            f"method frame payload of {size} bytes is too short for a method id"
                        )
                    if pending and channel in pending:
                        raise self._out_of_order(channel, "method")
                    index = _u32(data, pos + 7) if _COMPILED else _unpack_u32(data, pos + 7)[0]
                    if index == 0x003C0028:  # basic.publish: the bulk of a broker's input
                        method = _decode_publish(data, pos + 11, nxt - 1)
                    elif index == 0x003C0050:  # basic.ack: one per message from consumers
                        events.append(
                            _tuple_new(MethodFrame, (channel, _decode_ack(data, pos + 11, nxt - 1)))
                        )
                        pos = nxt
                        continue
                    else:
                        decode = _DECODERS.get(index)
                        if decode is None:
                            raise _unknown_method(index)
                        method = decode(data, pos + 11, nxt - 1)  # no payload slice
                        if index not in CONTENT_METHODS:
                            events.append(_tuple_new(MethodFrame, (channel, method)))
                            pos = nxt
                            continue
                    # Fast path for the bulk of a broker's input: the content header
                    # and a single body frame already sit behind the method in this
                    # buffer. Any other shape, or anything wrong, falls through to the
                    # general path, which re-reads those frames and raises the precise
                    # error. Measured (callgrind): 30.0k -> 26.9k instructions per 1 KiB publish.
                    # Header frame: type, channel, size, then class, weight and a 64-bit
                    # body size, of which the fast path takes only sizes under 4 GiB.
                    if end - nxt >= 20:
                        if _COMPILED:
                            hkind = data[nxt]
                            hchannel = data[nxt + 1] << 8 | data[nxt + 2]
                            size = _u32(data, nxt + 3)
                            class_id = data[nxt + 7] << 8 | data[nxt + 8]
                            weight = data[nxt + 9] << 8 | data[nxt + 10]
                            body_high = _u32(data, nxt + 11)
                            body_size = _u32(data, nxt + 15)
                        else:
                            hkind, hchannel, size, class_id, weight, body_size = (
                                _unpack_header_frame(data, nxt)
                            )
                            body_high = body_size >> 32
                        hend = nxt + size + 8
                        if (
                            hkind == 2
                            and hchannel == channel
                            and 12 <= size <= max_payload
                            and hend <= end
                            and data[hend - 1] == 0xCE
                            and class_id == index >> 16
                            and not weight
                            and not body_high
                        ):
                            if body_size <= max_body:
                                if body_size == 0:
                                    header = _header(index >> 16, 0, data[nxt + 19 : hend - 1])
                                    events.append(
                                        _tuple_new(ContentMessage, (channel, method, header, b""))
                                    )
                                    pos = hend
                                    continue
                                if end - hend >= 8:
                                    bkind, bchannel, size = _frame_head(data, hend)
                                    bend = hend + size + 8
                                    if (
                                        bkind == 3
                                        and bchannel == channel
                                        and size == body_size
                                        and size <= max_payload
                                        and bend <= end
                                        and data[bend - 1] == 0xCE
                                    ):
                                        header = _header(
                                            index >> 16, body_size, data[nxt + 19 : hend - 1]
                                        )
                                        body = data[hend + 7 : bend - 1]
                                        events.append(
                                            _tuple_new(
                                                ContentMessage, (channel, method, header, body)
                                            )
                                        )
                                        pos = bend
                                        continue
                    pending[channel] = [method, None, 0, None]
                elif kind == 3:  # FRAME_BODY
                    self._body_frame(channel, data, pos, nxt, events.append)
                elif kind == 2:  # FRAME_HEADER
                    self._header_frame(channel, data, pos, nxt, events.append)
                elif kind == 8:  # FRAME_HEARTBEAT
                    _check_heartbeat(channel, size)
                    events.append(_HEARTBEAT)
                else:
                    raise FrameError(f"unknown frame type {kind} on channel {channel}")
                pos = nxt
        except HardError as exc:
            self._error = exc
            exc.events = events
            raise
        except SoftError as exc:
            exc.events = events
            raise
        if pos < end:  # keep the incomplete frame for the next feed
            self._tail = bytearray(memoryview(data)[pos:])
            self._need = need
        return events

    def _body_frame(
        self, channel: int, data: bytes, pos: int, nxt: int, append: Callable[[Any], None]
    ) -> None:
        """A body frame outside the fast path: one of several, or after a lone header."""
        state = self._pending.get(channel)
        if state is None or state[1] is None:
            raise self._out_of_order(channel, "body")
        size = nxt - pos - 8
        remaining = state[2] - size
        if remaining < 0:
            method = state[0]
            raise FrameError(
                f"content body frame of {size} bytes exceeds the remaining content size "
                f"of {state[2]} bytes",
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        chunks = state[3]
        if remaining == 0 and chunks is None:  # the whole body in one frame
            del self._pending[channel]
            append(
                _tuple_new(ContentMessage, (channel, state[0], state[1], data[pos + 7 : nxt - 1]))
            )
        elif chunks is _DISCARD:
            if remaining:
                state[2] = remaining
            else:
                del self._pending[channel]
        else:
            if chunks is None:
                chunks = state[3] = []
            chunks.append(data[pos + 7 : nxt - 1])
            if remaining:
                state[2] = remaining
            else:
                del self._pending[channel]
                append(_tuple_new(ContentMessage, (channel, state[0], state[1], b"".join(chunks))))

    def _header_frame(
        self, channel: int, data: bytes, pos: int, nxt: int, append: Callable[[Any], None]
    ) -> None:
        """A content header outside the fast path (its body not yet in, or something odd)."""
        state = self._pending.get(channel)
        if state is None or state[1] is not None:
            raise self._out_of_order(channel, "header")
        size = nxt - pos - 8
        if size < 12:
            raise FrameError(f"content header frame payload of {size} bytes is shorter than 12")
        method = state[0]
        class_id, weight, body_size = _unpack_content_header(data, pos + 7)
        if class_id != method.CLASS_ID:
            raise UnexpectedFrame(
                f"expected content header for class {method.CLASS_ID}, "
                f"got one for class {class_id} instead",
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        if weight:
            raise UnexpectedFrame(
                f"content header weight must be 0, got {weight}",
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        header = ContentHeader(class_id, body_size, data[pos + 19 : nxt - 1])
        if body_size == 0:
            del self._pending[channel]
            append(_tuple_new(ContentMessage, (channel, method, header, b"")))
            return
        state[1] = header
        state[2] = body_size
        max_body = self.max_body_size
        if max_body is not None and body_size > max_body:
            state[3] = _DISCARD  # its body frames are skipped as they come
            self._keep(data, nxt, 0)
            raise SoftError(
                PRECONDITION_FAILED,
                f"message size {body_size} is larger than configured max size {max_body}",
                channel=channel,
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )

    def _keep(self, data: bytes, pos: int, need: int) -> None:
        """Buffer the unparsed ``data[pos:]``; parse again when it holds ``need`` bytes."""
        if pos < len(data):
            self._tail = bytearray(memoryview(data)[pos:])
            self._need = need
        else:
            self._tail = b""

    def _protocol_header(self, data: bytes, events: list[Any]) -> int:
        head = data[:8]
        if not (PROTOCOL_HEADER[:4].startswith(head[:4])):
            raise _header_mismatch(head)
        if len(head) < 8:
            self._keep(data, 0, 0)  # need 0: look at every byte, to refuse early
            return 0
        if head != PROTOCOL_HEADER:
            raise _header_mismatch(head)
        self._expect_header = False
        events.append(_PROTOCOL_HEADER_EVENT)
        return 8

    def _out_of_order(self, channel: int, got: str) -> UnexpectedFrame:
        """RabbitMQ's texts for a frame that breaks method -> header -> body order."""
        state = self._pending.get(channel)
        if state is None:
            return UnexpectedFrame(
                f"expected method frame, got non method frame instead (a {got} frame)"
            )
        method = state[0]
        if state[1] is None:
            text = (
                f"expected content header for class {method.CLASS_ID}, "
                f"got non content header frame instead (a {got} frame)"
            )
        else:
            text = f"expected content body, got non content body frame instead (a {got} frame)"
        return UnexpectedFrame(text, class_id=method.CLASS_ID, method_id=method.METHOD_ID)


def _header_mismatch(head: bytes) -> ProtocolHeaderMismatch:
    hint = ""
    if head[:4] in (b"GET ", b"POST", b"HEAD", b"PUT "):
        hint = " (looks like HTTP)"
    elif head[:2] == b"\x16\x03":
        hint = " (looks like a TLS ClientHello)"
    elif head[:4] == b"AMQP":
        hint = " (another AMQP version)"
    return ProtocolHeaderMismatch(
        f"expected protocol header {PROTOCOL_HEADER!r}, got {head!r}{hint}", header=bytes(head)
    )


# -- encoders --------------------------------------------------------------------


def encode_heartbeat() -> bytes:
    return HEARTBEAT_FRAME


def encode_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """One basic.ack frame, what ``encode_method(channel, BasicAck(...))`` makes, in one
    struct call: a broker confirming each publish sends one per message, and building and
    encoding the method object cost more than the rest of the confirm (bench/hotpath.py)."""
    try:
        return _pack_ack(1, channel, 13, 60, 80, delivery_tag, 1 if multiple else 0, 0xCE)
    except StructError as exc:
        raise ValueError(f"cannot frame basic.ack on channel {channel!r}: {exc}") from None


def encode_method(channel: int, method: Method) -> bytes:
    """One method frame."""
    args = method.encode()
    try:
        head = _pack_method_head(
            FRAME_METHOD, channel, len(args) + 4, method.CLASS_ID, method.METHOD_ID
        )
    except StructError as exc:
        raise ValueError(f"cannot frame {method.NAME} on channel {channel!r}: {exc}") from None
    return head + args + _END


def _max_payload(frame_max: int) -> int:
    return frame_max - FRAME_OVERHEAD if frame_max else 0xFFFFFFFF


def encode_content(
    channel: int,
    method: Method,
    header: ContentHeader | BasicProperties,
    body: bytes,
    frame_max: int,
) -> bytes:
    """Method + content header + body frames (split at ``frame_max``) as one bytes object.

    The header's body size is taken from ``len(body)``; an empty body sends no body frame.
    """
    if isinstance(header, ContentHeader):
        class_id, raw = header.class_id, header.raw
    elif isinstance(header, BasicProperties):
        class_id, raw = method.CLASS_ID, header.encode()
    else:
        raise TypeError(
            f"header must be ContentHeader or BasicProperties, not {type(header).__name__}"
        )
    args = method.encode()
    limit = _max_payload(frame_max)
    if len(args) + 4 > limit or len(raw) + 12 > limit:
        raise ValueError(
            f"{method.NAME} method or content header does not fit in frame_max {frame_max}"
        )
    size = len(body)
    try:
        parts = [
            _pack_method_head(
                FRAME_METHOD, channel, len(args) + 4, method.CLASS_ID, method.METHOD_ID
            ),
            args,
            _pack_header_frame(FRAME_END, FRAME_HEADER, channel, len(raw) + 12, class_id, 0, size),
            raw,
        ]
    except StructError as exc:
        raise ValueError(f"cannot frame {method.NAME} on channel {channel!r}: {exc}") from None
    if size <= limit:
        if size:
            parts.append(_pack_body_head(FRAME_END, FRAME_BODY, channel, size))
            parts.append(body)
    else:
        view = memoryview(body)
        for start in range(0, size, limit):
            chunk = view[start : start + limit]
            parts.append(_pack_body_head(FRAME_END, FRAME_BODY, channel, len(chunk)))
            parts.append(chunk)
    parts.append(_END)
    return b"".join(parts)


def encode_deliver(
    channel: int,
    consumer_tag: str,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    header_raw: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    """basic.deliver + content header (``header_raw`` forwarded untouched) + body, as one bytes."""
    size = len(body)
    limit = frame_max - FRAME_OVERHEAD if frame_max else 0xFFFFFFFF
    common = 0 < size <= limit and len(header_raw) + 12 <= limit  # one frame of each kind
    if _COMPILED and common and 0 <= delivery_tag <= 0xFFFFFFFFFFFFFFFF:
        frames = _deliver_frames(
            channel,
            consumer_tag,
            delivery_tag,
            redelivered,
            exchange,
            routing_key,
            header_raw,
            body,
        )
        if frames is not None:
            return frames
    tag = consumer_tag.encode("utf-8", "surrogateescape")
    ex = exchange.encode("utf-8", "surrogateescape")
    key = routing_key.encode("utf-8", "surrogateescape")
    try:
        if common:
            # The common case, inlined: 5 packs and one join.
            return b"".join(
                (
                    _pack_deliver_head(
                        FRAME_METHOD, channel, len(tag) + len(ex) + len(key) + 16, 60, 60, len(tag)
                    ),
                    tag,
                    _pack_deliver_mid(delivery_tag, 1 if redelivered else 0, len(ex)),
                    ex,
                    _pack_u8(len(key)),
                    key,
                    _pack_header_frame(
                        FRAME_END, FRAME_HEADER, channel, len(header_raw) + 12, 60, 0, size
                    ),
                    header_raw,
                    _pack_body_head(FRAME_END, FRAME_BODY, channel, size),
                    body,
                    _END,
                )
            )
    except StructError as exc:
        raise ValueError(f"cannot encode basic.deliver: {exc}") from None
    method = BasicDeliver(
        consumer_tag=consumer_tag,
        delivery_tag=delivery_tag,
        redelivered=redelivered,
        exchange=exchange,
        routing_key=routing_key,
    )
    return encode_content(channel, method, ContentHeader(60, size, header_raw), body, frame_max)


# -- compiled only ---------------------------------------------------------------
# encode_deliver's common case as C: one bytes object of the exact size, written in place.
# These functions run only compiled (``_COMPILED`` guards their one caller); the
# C names they use are cimported by frames.pxd.


def _deliver_frames(channel, tag, delivery_tag, redelivered, exchange, routing_key, raw, body):
    """The three frames of a basic.deliver, or None when a field is outside the common case
    (a name that is not ASCII, a string over 255 octets, a channel over 65535, a header or
    body that is not ``bytes``): the caller then takes the general path and its errors."""
    if type(raw) is not bytes or type(body) is not bytes or not 0 <= channel <= 0xFFFF:
        return None
    if not (
        PyUnicode_IS_ASCII(tag)  # noqa: F821
        and PyUnicode_IS_ASCII(exchange)  # noqa: F821
        and PyUnicode_IS_ASCII(routing_key)  # noqa: F821
    ):
        return None
    tag_len = PyUnicode_GET_LENGTH(tag)  # noqa: F821 - ASCII: one octet a character
    ex_len = PyUnicode_GET_LENGTH(exchange)  # noqa: F821
    key_len = PyUnicode_GET_LENGTH(routing_key)  # noqa: F821
    if tag_len > 255 or ex_len > 255 or key_len > 255:
        return None
    raw_len = len(raw)
    size = len(body)
    # method payload: class + method ids, consumer tag, delivery tag, redelivered, exchange, key
    method_size = 4 + 1 + tag_len + 8 + 1 + 1 + ex_len + 1 + key_len
    total = 7 + method_size + 1 + 7 + 12 + raw_len + 1 + 7 + size + 1
    out = _bytes_of_size(total)  # noqa: F821 - uninitialised, filled below
    p = PyBytes_AS_STRING(out)  # noqa: F821
    p[0] = 1  # FRAME_METHOD
    _put16(p, 1, channel)
    _put32(p, 3, method_size)
    _put16(p, 7, 60)  # basic
    _put16(p, 9, 60)  # deliver
    p[11] = tag_len
    memcpy(p + 12, PyUnicode_DATA(tag), tag_len)  # noqa: F821
    at = 12 + tag_len
    _put32(p, at, delivery_tag >> 32)
    _put32(p, at + 4, delivery_tag & 0xFFFFFFFF)
    p[at + 8] = 1 if redelivered else 0
    p[at + 9] = ex_len
    memcpy(p + at + 10, PyUnicode_DATA(exchange), ex_len)  # noqa: F821
    at += 10 + ex_len
    p[at] = key_len
    memcpy(p + at + 1, PyUnicode_DATA(routing_key), key_len)  # noqa: F821
    at += 1 + key_len
    p[at] = 0xCE
    p[at + 1] = 2  # FRAME_HEADER
    _put16(p, at + 2, channel)
    _put32(p, at + 4, 12 + raw_len)
    _put16(p, at + 8, 60)  # class
    _put16(p, at + 10, 0)  # weight
    _put32(p, at + 12, 0)  # body size, high half
    _put32(p, at + 16, size)
    memcpy(p + at + 20, PyBytes_AS_STRING(raw), raw_len)  # noqa: F821
    at += 20 + raw_len
    p[at] = 0xCE
    p[at + 1] = 3  # FRAME_BODY
    _put16(p, at + 2, channel)
    _put32(p, at + 4, size)
    memcpy(p + at + 8, PyBytes_AS_STRING(body), size)  # noqa: F821
    p[at + 8 + size] = 0xCE
    return out


def _put16(p, at, value):
    p[at] = value >> 8
    p[at + 1] = value & 0xFF


def _put32(p, at, value):
    p[at] = value >> 24
    p[at + 1] = (value >> 16) & 0xFF
    p[at + 2] = (value >> 8) & 0xFF
    p[at + 3] = value & 0xFF
