"""The stream protocol's frames, as RabbitMQ 3.10-3.13 speak them (rabbitmq_stream's
PROTOCOL.adoc): a 4-byte size, then key (u16; the top bit set in a response), version (u16)
and the command's fields, big-endian. Strings are an i16 length then UTF-8 (-1: null),
bytes an i32 length, arrays an i32 count.

`FrameSplitter` cuts a byte stream into frames; `Fields` reads one frame's fields and
raises `FrameError` (never an IndexError or struct.error) when a frame is short or
malformed; the `encode_*` functions build the frames a server sends, each one `bytes`.
A delivered chunk is osiris's on-disk chunk (`encode_chunk`): a consumer reads it as
RabbitMQ writes it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gzip
import struct
import zlib
from collections.abc import Callable, Iterable, Sequence
from enum import IntEnum


class Key(IntEnum):
    DECLARE_PUBLISHER = 0x01
    PUBLISH = 0x02
    PUBLISH_CONFIRM = 0x03
    PUBLISH_ERROR = 0x04
    QUERY_PUBLISHER_SEQUENCE = 0x05
    DELETE_PUBLISHER = 0x06
    SUBSCRIBE = 0x07
    DELIVER = 0x08
    CREDIT = 0x09
    STORE_OFFSET = 0x0A
    QUERY_OFFSET = 0x0B
    UNSUBSCRIBE = 0x0C
    CREATE = 0x0D
    DELETE = 0x0E
    METADATA = 0x0F
    METADATA_UPDATE = 0x10
    PEER_PROPERTIES = 0x11
    SASL_HANDSHAKE = 0x12
    SASL_AUTHENTICATE = 0x13
    TUNE = 0x14
    OPEN = 0x15
    CLOSE = 0x16
    HEARTBEAT = 0x17
    ROUTE = 0x18
    PARTITIONS = 0x19
    CONSUMER_UPDATE = 0x1A
    EXCHANGE_COMMAND_VERSIONS = 0x1B
    STREAM_STATS = 0x1C
    CREATE_SUPER_STREAM = 0x1D
    DELETE_SUPER_STREAM = 0x1E


RESPONSE = 0x8000


class Code(IntEnum):
    """Response codes (PROTOCOL.adoc, "Response Codes")."""

    OK = 0x01
    STREAM_DOES_NOT_EXIST = 0x02
    SUBSCRIPTION_ID_ALREADY_EXISTS = 0x03
    SUBSCRIPTION_ID_DOES_NOT_EXIST = 0x04
    STREAM_ALREADY_EXISTS = 0x05
    STREAM_NOT_AVAILABLE = 0x06
    SASL_MECHANISM_NOT_SUPPORTED = 0x07
    AUTHENTICATION_FAILURE = 0x08
    SASL_ERROR = 0x09
    SASL_CHALLENGE = 0x0A
    SASL_AUTHENTICATION_FAILURE_LOOPBACK = 0x0B
    VHOST_ACCESS_FAILURE = 0x0C
    UNKNOWN_FRAME = 0x0D
    FRAME_TOO_LARGE = 0x0E
    INTERNAL_ERROR = 0x0F
    ACCESS_REFUSED = 0x10
    PRECONDITION_FAILED = 0x11
    PUBLISHER_DOES_NOT_EXIST = 0x12
    NO_OFFSET = 0x13


class OffsetType(IntEnum):
    FIRST = 1
    LAST = 2
    NEXT = 3
    OFFSET = 4
    TIMESTAMP = 5


class MetadataCode(IntEnum):
    """A metadata update's code: the stream is gone (or moved)."""

    STREAM_NOT_AVAILABLE = 0x06


#: Commands and the versions this server speaks (exchange-command-versions' answer).
VERSIONS: dict[Key, tuple[int, int]] = {
    **{k: (1, 1) for k in Key},
    Key.PUBLISH: (1, 2),  # 2: a filter value per message (3.13)
    Key.DELIVER: (1, 2),  # 2: the committed chunk id before the chunk (3.11)
}


class FrameError(Exception):
    """A frame that cannot be read: the connection answers with `code` and closes."""

    def __init__(self, message: str, code: int = Code.UNKNOWN_FRAME) -> None:
        super().__init__(message)
        self.code = code


_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_HEAD = struct.Struct(">IHH")  # size, key, version
_RESPONSE = struct.Struct(">IHHIH")  # size, key, version, correlation id, code
_PUBLISHED = struct.Struct(">Qi")  # publishing id, message length


class FrameSplitter:
    """Bytes in, whole frames out (each without its size). A frame over `frame_max` (once
    tuned; 0: no limit) raises FrameError with FRAME_TOO_LARGE."""

    __slots__ = ("_buf", "frame_max")

    def __init__(self, frame_max: int = 0) -> None:
        self._buf = bytearray()
        self.frame_max = frame_max

    def unread(self) -> bytes:
        """What was fed and is not a whole frame yet."""
        return bytes(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf
        buf += data
        frames = []
        p = 0
        n = len(buf)
        while n - p >= 4:
            (size,) = _U32.unpack_from(buf, p)
            if self.frame_max and size + 4 > self.frame_max:
                raise FrameError(
                    f"frame of {size + 4} bytes over frame_max {self.frame_max}",
                    Code.FRAME_TOO_LARGE,
                )
            if n - p - 4 < size:
                break
            frames.append(bytes(buf[p + 4 : p + 4 + size]))
            p += 4 + size
        if p:
            del buf[:p]
        return frames


class Fields:
    """One frame's fields, read in order."""

    __slots__ = ("data", "pos", "key", "version")

    def __init__(self, frame: bytes) -> None:
        if len(frame) < 4:
            raise FrameError(f"frame of {len(frame)} bytes has no key and version")
        self.data = frame
        self.key, self.version = struct.unpack_from(">HH", frame)
        self.pos = 4

    def _take(self, s: struct.Struct) -> int:
        try:
            (value,) = s.unpack_from(self.data, self.pos)
        except struct.error:
            raise FrameError(f"frame {self.key:#06x} ends early") from None
        self.pos += s.size
        return value

    def u8(self) -> int:
        return self._take(_U8)

    def u16(self) -> int:
        return self._take(_U16)

    def u32(self) -> int:
        return self._take(_U32)

    def i32(self) -> int:
        return self._take(_I32)

    def u64(self) -> int:
        return self._take(_U64)

    def i64(self) -> int:
        return self._take(_I64)

    def string(self) -> str | None:
        n = self._take(_I16)
        if n < 0:
            return None
        raw = self.raw(n)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise FrameError(f"frame {self.key:#06x}: a string is not UTF-8") from None

    def text(self) -> str:
        """A string that must be there (null reads as empty)."""
        return self.string() or ""

    def bytes_(self) -> bytes | None:
        n = self._take(_I32)
        if n < 0:
            return None
        return self.raw(n)

    def raw(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise FrameError(f"frame {self.key:#06x} ends early")
        value = self.data[self.pos : end]
        self.pos = end
        return value

    def count(self, least: int = 1) -> int:
        """An array's length, checked against the bytes left (`least` bytes an item)."""
        n = self._take(_I32)
        if n < 0 or n * least > len(self.data) - self.pos:
            raise FrameError(f"frame {self.key:#06x}: an array of {n} items does not fit")
        return n

    def strings(self) -> list[str]:
        return [self.text() for _ in range(self.count(2))]

    def properties(self) -> dict[str, str]:
        out = {}
        for _ in range(self.count(4)):
            key = self.text()
            out[key] = self.text()
        return out

    def remaining(self) -> int:
        return len(self.data) - self.pos


# -- published messages --------------------------------------------------------------------

#: A sub-entry batch's compression (the entry type's bits 4-6): only none and gzip are in
#: every client; the others (snappy, lz4, zstd) need libraries a server cannot assume.
COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1


def published(fields: Fields) -> tuple[int, list[tuple[int, str | None, bytes | list[bytes]]]]:
    """A publish frame: its publisher id and each (publishing id, filter value, message) --
    a sub-entry batch is one publishing id with a list of messages."""
    publisher = fields.u8()
    count = fields.count(12)
    out: list[tuple[int, str | None, bytes | list[bytes]]] = []
    if fields.version >= 2:
        for _ in range(count):
            pid = fields.u64()
            filter_value = fields.string()
            out.append((pid, filter_value, _published_message(fields)))
        return publisher, out
    # version 1, the common case: read in one tight loop
    data = fields.data
    pos = fields.pos
    end = len(data)
    unpack = _PUBLISHED.unpack_from
    for _ in range(count):
        if pos + 12 > end:
            raise FrameError("a publish frame ends early")
        if data[pos + 8] & 0x80:  # a sub-entry batch
            fields.pos = pos
            pid = fields.u64()
            out.append((pid, None, _sub_batch(fields)))
            pos = fields.pos
            continue
        pid, size = unpack(data, pos)
        pos += 12
        if size < 0 or pos + size > end:
            raise FrameError("a published message does not fit its frame")
        out.append((pid, None, data[pos : pos + size]))
        pos += size
    fields.pos = pos
    return publisher, out


def published_entries(fields: Fields) -> tuple[int, list[int], bytes] | None:
    """A version-1 publish frame of plain messages, read in one pass: its publisher id, the
    publishing ids, and the messages as osiris chunk entries (each message keeps its
    length prefix: the frame's bytes without the ids). None, and the fields as they were,
    when it holds a sub-entry batch or is not version 1 (`published` reads those)."""
    if fields.version != 1:
        return None
    start = fields.pos
    publisher = fields.u8()
    count = fields.count(12)
    data = fields.data
    pos = fields.pos
    end = len(data)
    unpack = _PUBLISHED.unpack_from
    ids: list[int] = []
    parts: list[bytes] = []
    for _ in range(count):
        if pos + 12 > end:
            raise FrameError("a publish frame ends early")
        if data[pos + 8] & 0x80:
            fields.pos = start
            return None
        pid, size = unpack(data, pos)
        if size < 0 or pos + 12 + size > end:
            raise FrameError("a published message does not fit its frame")
        ids.append(pid)
        parts.append(data[pos + 8 : pos + 12 + size])
        pos += 12 + size
    fields.pos = pos
    return publisher, ids, b"".join(parts)


def _published_message(fields: Fields) -> bytes | list[bytes]:
    data = fields.data
    if fields.pos < len(data) and data[fields.pos] & 0x80:
        return _sub_batch(fields)
    message = fields.bytes_()
    if message is None:
        raise FrameError("a published message is null")
    return message


def _sub_batch(fields: Fields) -> list[bytes]:
    kind = fields.u8()
    compression = (kind & 0x70) >> 4
    n = fields.u16()
    size = fields.u32()
    data = fields.raw(fields.u32())
    if compression == COMPRESSION_GZIP:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error):
            raise FrameError("a gzip sub-entry batch does not decompress") from None
    elif compression != COMPRESSION_NONE:
        raise FrameError(f"sub-entry compression {compression} is not supported")
    if len(data) != size:
        raise FrameError("a sub-entry batch's size does not match its data")
    messages = []
    p = 0
    for _ in range(n):
        if p + 4 > len(data):
            raise FrameError("a sub-entry batch ends early")
        (m,) = _U32.unpack_from(data, p)
        messages.append(data[p + 4 : p + 4 + m])
        p += 4 + m
    return messages


# -- what the server sends -----------------------------------------------------------------


def _frame(key: int, version: int, body: bytes) -> bytes:
    return _HEAD.pack(4 + len(body), key, version) + body


def encode_string(value: str | None) -> bytes:
    if value is None:
        return _I16.pack(-1)
    raw = value.encode("utf-8")
    return _I16.pack(len(raw)) + raw


def encode_bytes(value: bytes | None) -> bytes:
    if value is None:
        return _I32.pack(-1)
    return _I32.pack(len(value)) + value


def encode_properties(props: dict[str, str]) -> bytes:
    return _I32.pack(len(props)) + b"".join(
        encode_string(k) + encode_string(v) for k, v in props.items()
    )


def encode_strings(values: Sequence[str]) -> bytes:
    return _I32.pack(len(values)) + b"".join(encode_string(v) for v in values)


def encode_response(key: int, correlation_id: int, code: int, extra: bytes = b"") -> bytes:
    """A response: the request's key with the top bit, its correlation id, a code, and what
    the command adds after it."""
    return _RESPONSE.pack(10 + len(extra), key | RESPONSE, 1, correlation_id, code) + extra


def encode_tune(frame_max: int, heartbeat: int) -> bytes:
    return _frame(Key.TUNE, 1, struct.pack(">II", frame_max, heartbeat))


def encode_heartbeat() -> bytes:
    return _frame(Key.HEARTBEAT, 1, b"")


def encode_close(correlation_id: int, code: int, reason: str) -> bytes:
    return _frame(Key.CLOSE, 1, struct.pack(">IH", correlation_id, code) + encode_string(reason))


def encode_publish_confirm(publisher: int, ids: Sequence[int]) -> bytes:
    n = len(ids)
    return _frame(Key.PUBLISH_CONFIRM, 1, struct.pack(f">Bi{n}Q", publisher, n, *ids))


def encode_publish_error(publisher: int, errors: Sequence[tuple[int, int]]) -> bytes:
    return _frame(
        Key.PUBLISH_ERROR,
        1,
        _U8.pack(publisher)
        + _I32.pack(len(errors))
        + b"".join(struct.pack(">QH", i, code) for i, code in errors),
    )


def encode_metadata_update(code: int, stream: str) -> bytes:
    return _frame(Key.METADATA_UPDATE, 1, _U16.pack(code) + encode_string(stream))


def encode_credit_response(code: int, subscription: int) -> bytes:
    return _frame(Key.CREDIT | RESPONSE, 1, struct.pack(">HB", code, subscription))


def encode_consumer_update(correlation_id: int, subscription: int, active: bool) -> bytes:
    return _frame(
        Key.CONSUMER_UPDATE, 1, struct.pack(">IBB", correlation_id, subscription, int(active))
    )


def encode_metadata(
    correlation_id: int,
    brokers: Sequence[tuple[int, str, int]],
    streams: Sequence[tuple[str, int, int, Sequence[int]]],
) -> bytes:
    """brokers: (reference, host, port); streams: (name, code, leader reference, replica
    references) -- a stream that is not there has code STREAM_DOES_NOT_EXIST and leader
    0xFFFF."""
    body = [_U32.pack(correlation_id), _I32.pack(len(brokers))]
    body += [_U16.pack(ref) + encode_string(host) + _U32.pack(port) for ref, host, port in brokers]
    body.append(_I32.pack(len(streams)))
    for name, code, leader, replicas in streams:
        body.append(encode_string(name) + struct.pack(">HH", code, leader))
        body.append(_I32.pack(len(replicas)) + b"".join(_U16.pack(r) for r in replicas))
    return _frame(Key.METADATA | RESPONSE, 1, b"".join(body))


# -- chunks --------------------------------------------------------------------------------

#: osiris's chunk header: magic and version (0x5 << 4 | 0), chunk type, entries, records,
#: timestamp, epoch, first offset, data crc, data length, trailer length, bloom filter size
#: and three reserved bytes.
_CHUNK = struct.Struct(">BbHIqQQIIIB3x")
CHUNK_MAGIC_VERSION = 0x50
CHUNK_USER = 0


def encode_entries(messages: Iterable[bytes]) -> tuple[bytes, int]:
    """Simple entries (a u32 size with the top bit clear, then the message) and their
    count."""
    parts = []
    n = 0
    for message in messages:
        parts.append(_U32.pack(len(message)))
        parts.append(message)
        n += 1
    return b"".join(parts), n


def _zlib_crc32_combine() -> Callable[[int, int, int], int] | None:
    """zlib's crc32_combine, which Python's zlib module does not expose: the CRC-32 of
    A+B from CRC(A), CRC(B) and len(B) in O(log len) steps. None where the process has no
    shared libz to load (a statically linked CPython)."""
    for name in ("libz.so.1", ctypes.util.find_library("z")):
        if not name:
            continue
        try:
            function = ctypes.CDLL(name).crc32_combine
        except (OSError, AttributeError):
            continue
        function.argtypes = (ctypes.c_ulong, ctypes.c_ulong, ctypes.c_long)
        function.restype = ctypes.c_ulong
        return function
    return None


_COMBINE = _zlib_crc32_combine()


def crc32_of_parts(parts: Sequence[bytes], crcs: Sequence[int]) -> int:
    """The CRC-32 of the parts joined, given each part's own CRC-32 (a chunk of stored
    batches, each stored with its CRC): without rereading the bytes where libz can combine
    them (a chunk's bytes are read once, by the socket), else computed over them."""
    if _COMBINE is None:
        crc = 0
        for part in parts:
            crc = zlib.crc32(part, crc)
        return crc
    combine = _COMBINE
    crc = crcs[0]
    for i in range(1, len(parts)):
        crc = combine(crc, crcs[i], len(parts[i]))
    return crc


def crc32_combinable() -> bool:
    """Whether CRC-32s of runs of bytes can be combined without the bytes (libz loaded)."""
    return _COMBINE is not None


def combined_crc32(crcs: Sequence[int], lengths: Sequence[int]) -> int:
    """The CRC-32 of consecutive runs of bytes from each run's own CRC-32 and length, without
    their bytes (runs left in a file); only where `crc32_combinable`."""
    combine = _COMBINE
    if combine is None:
        raise RuntimeError("no libz crc32_combine in this process")
    crc = crcs[0]
    for i in range(1, len(crcs)):
        crc = combine(crc, crcs[i], lengths[i])
    return crc


def encode_deliver_head(
    subscription: int,
    first_offset: int,
    timestamp_ms: int,
    size: int,
    crc: int,
    entries: int,
    *,
    epoch: int = 0,
    committed: int | None = None,
) -> bytes:
    """A deliver frame of one chunk up to its entries (`size` bytes of them, whose CRC-32
    is `crc`, sent after it as they are): version 1, or 2 with the committed chunk id (a
    client that asked for it in exchange-command-versions)."""
    head = _CHUNK.pack(
        CHUNK_MAGIC_VERSION,
        CHUNK_USER,
        entries,
        entries,
        timestamp_ms,
        epoch,
        first_offset,
        crc,
        size,
        0,
        0,
    )
    if committed is None:
        prefix = _HEAD.pack(4 + 1 + len(head) + size, Key.DELIVER, 1) + _U8.pack(subscription)
    else:
        prefix = (
            _HEAD.pack(4 + 9 + len(head) + size, Key.DELIVER, 2)
            + _U8.pack(subscription)
            + _U64.pack(committed)
        )
    return prefix + head
