"""AMQP 1.0 messages, the format stream-protocol clients publish and read: a message is a
run of described sections (header, delivery and message annotations, properties,
application properties, the body as data / amqp-sequence / amqp-value, footer).

`decode_message` reads one into a `Message10`; `encode_message` writes one. Values keep
their AMQP 1.0 type where Python would lose it (`Symbol`, `Timestamp`, the unsigned and
narrow integers), so a message read and written again is the same message, and the
mapping to AMQP 0-9-1 (broker/stream_protocol/mapping.py) can follow RabbitMQ's per type.
A malformed message raises `Amqp10Error`, never an IndexError or struct.error.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, field
from typing import Any


class Amqp10Error(ValueError):
    """Bytes that are not an AMQP 1.0 message."""


class Symbol(str):
    """An AMQP 1.0 symbol (ASCII), as opposed to a string."""


class Timestamp(int):
    """Milliseconds since the epoch."""


class UByte(int):
    pass


class UShort(int):
    pass


class UInt(int):
    pass


class ULong(int):
    pass


class Byte(int):
    pass


class Short(int):
    pass


class Int(int):
    pass


class Char(str):
    pass


@dataclass(frozen=True)
class Described:
    """A described value whose descriptor this codec does not know as a section."""

    descriptor: Any
    value: Any


# section descriptors (smallulong codes)
HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78

#: The properties section's fields, in order.
PROPERTY_FIELDS = (
    "message_id",
    "user_id",
    "to",
    "subject",
    "reply_to",
    "correlation_id",
    "content_type",
    "content_encoding",
    "absolute_expiry_time",
    "creation_time",
    "group_id",
    "group_sequence",
    "reply_to_group_id",
)
HEADER_FIELDS = ("durable", "priority", "ttl", "first_acquirer", "delivery_count")


@dataclass
class Message10:
    """One AMQP 1.0 message, by section. `body` is a list of data sections (bytes), or,
    with `body_kind` AMQP_VALUE / AMQP_SEQUENCE, the value / the list of sequences."""

    header: dict[str, Any] | None = None
    delivery_annotations: dict | None = None
    message_annotations: dict | None = None
    properties: dict[str, Any] | None = None
    application_properties: dict | None = None
    body: Any = field(default_factory=list)
    body_kind: int = DATA
    footer: dict | None = None

    def data(self) -> bytes:
        """The body as bytes: the data sections joined; an amqp-value that is binary or a
        string, its bytes (UTF-8); anything else, its AMQP 1.0 encoding."""
        if self.body_kind == DATA:
            return b"".join(self.body)
        if self.body_kind == AMQP_VALUE:
            if isinstance(self.body, bytes):
                return self.body
            if isinstance(self.body, str):
                return self.body.encode()
            return encode_value(self.body)
        return b"".join(encode_value(s) for s in self.body)


_B = struct.Struct(">B")
_H = struct.Struct(">H")
_I = struct.Struct(">I")
_Q = struct.Struct(">Q")
_b = struct.Struct(">b")
_h = struct.Struct(">h")
_i = struct.Struct(">i")
_q = struct.Struct(">q")
_f = struct.Struct(">f")
_d = struct.Struct(">d")


# -- decoding ------------------------------------------------------------------------------


class _Reader:
    __slots__ = ("buf", "pos", "depth")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0
        self.depth = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf) or n < 0:
            raise Amqp10Error("AMQP 1.0 value ends early")
        value = self.buf[self.pos : end]
        self.pos = end
        return value

    def unpack(self, s: struct.Struct) -> Any:
        return s.unpack(self.take(s.size))[0]

    def value(self) -> Any:
        code = self.unpack(_B)
        if code == 0x00:
            self.depth += 1
            if self.depth > 100:
                raise Amqp10Error("AMQP 1.0 value nested too deep")
            descriptor = self.value()
            inner = self.value()
            self.depth -= 1
            return Described(descriptor, inner)
        return self.primitive(code)

    def primitive(self, code: int) -> Any:  # noqa: C901, PLR0911, PLR0912 - one branch per type code
        if code == 0x40:
            return None
        if code == 0x41:
            return True
        if code == 0x42:
            return False
        if code == 0x56:
            return self.unpack(_B) != 0
        if code == 0x50:
            return UByte(self.unpack(_B))
        if code == 0x60:
            return UShort(self.unpack(_H))
        if code == 0x70:
            return UInt(self.unpack(_I))
        if code == 0x52:
            return UInt(self.unpack(_B))
        if code == 0x43:
            return UInt(0)
        if code == 0x80:
            return ULong(self.unpack(_Q))
        if code == 0x53:
            return ULong(self.unpack(_B))
        if code == 0x44:
            return ULong(0)
        if code == 0x51:
            return Byte(self.unpack(_b))
        if code == 0x61:
            return Short(self.unpack(_h))
        if code == 0x71:
            return Int(self.unpack(_i))
        if code == 0x54:
            return Int(self.unpack(_b))
        if code == 0x81:
            return self.unpack(_q)
        if code == 0x55:
            return self.unpack(_b)
        if code == 0x72:
            return self.unpack(_f)
        if code == 0x82:
            return self.unpack(_d)
        if code == 0x73:
            return Char(chr(self.unpack(_I)))
        if code == 0x83:
            return Timestamp(self.unpack(_q))
        if code == 0x98:
            return uuid.UUID(bytes=self.take(16))
        if code in (0x74, 0x84, 0x94):  # decimals: kept as their bytes
            return Described(Symbol("decimal"), self.take({0x74: 4, 0x84: 8, 0x94: 16}[code]))
        if code in (0xA0, 0xA1, 0xA3):
            raw = self.take(self.unpack(_B))
        elif code in (0xB0, 0xB1, 0xB3):
            raw = self.take(self.unpack(_I))
        elif code == 0x45:
            return []
        elif code in (0xC0, 0xC1, 0xE0):
            size, count = self.unpack(_B), None
            count = self.unpack(_B) if size else 0
            return self.compound(code, size - 1, count)
        elif code in (0xD0, 0xD1, 0xF0):
            size = self.unpack(_I)
            count = self.unpack(_I) if size >= 4 else 0
            return self.compound(code, size - 4, count)
        else:
            raise Amqp10Error(f"unknown AMQP 1.0 type code {code:#04x}")
        if code in (0xA0, 0xB0):
            return raw
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise Amqp10Error("an AMQP 1.0 string is not UTF-8") from None
        return Symbol(text) if code in (0xA3, 0xB3) else text

    def compound(self, code: int, size: int, count: int) -> Any:
        end = self.pos + size
        if size < 0 or end > len(self.buf):
            raise Amqp10Error("AMQP 1.0 compound value ends early")
        if code in (0xE0, 0xF0):
            constructor = self.unpack(_B)
            descriptor = None
            if constructor == 0x00:
                descriptor = self.value()
                constructor = self.unpack(_B)
            items = [self.primitive(constructor) for _ in range(count)]
            value: Any = items if descriptor is None else [Described(descriptor, i) for i in items]
        elif code in (0xC0, 0xD0):
            value = [self.value() for _ in range(count)]
        else:
            if count % 2:
                raise Amqp10Error("an AMQP 1.0 map has an odd count")
            value = {}
            for _ in range(count // 2):
                k = self.value()
                if isinstance(k, list | dict):
                    raise Amqp10Error("an AMQP 1.0 map key is a compound value")
                value[k] = self.value()
        if self.pos != end:
            raise Amqp10Error("an AMQP 1.0 compound value's size does not match its items")
        return value


def decode_value(buf: bytes) -> Any:
    return _Reader(buf).value()


def decode_message(buf: bytes) -> Message10:
    """The sections of one AMQP 1.0 message."""
    reader = _Reader(buf)
    msg = Message10()
    body: list = []
    kind = None
    while reader.pos < len(buf):
        section = reader.value()
        if not isinstance(section, Described):
            raise Amqp10Error("an AMQP 1.0 message holds a value that is not a section")
        code = section.descriptor
        if isinstance(code, str):  # the symbolic descriptor, e.g. amqp:data:binary
            code = _SYMBOLIC.get(code)
        value = section.value
        if code == HEADER:
            msg.header = _fields(HEADER_FIELDS, value)
        elif code == DELIVERY_ANNOTATIONS:
            msg.delivery_annotations = _map(value)
        elif code == MESSAGE_ANNOTATIONS:
            msg.message_annotations = _map(value)
        elif code == PROPERTIES:
            msg.properties = _fields(PROPERTY_FIELDS, value)
        elif code == APPLICATION_PROPERTIES:
            msg.application_properties = _map(value)
        elif code in (DATA, AMQP_SEQUENCE):
            if kind not in (None, code):
                raise Amqp10Error("an AMQP 1.0 message mixes body sections")
            kind = code
            if code == DATA and not isinstance(value, bytes):
                raise Amqp10Error("an AMQP 1.0 data section is not binary")
            body.append(value)
        elif code == AMQP_VALUE:
            if kind is not None:
                raise Amqp10Error("an AMQP 1.0 message has two bodies")
            kind = AMQP_VALUE
            body = value
        elif code == FOOTER:
            msg.footer = _map(value)
        else:
            raise Amqp10Error(f"unknown AMQP 1.0 section {section.descriptor!r}")
    msg.body = body
    msg.body_kind = kind or DATA
    return msg


_SYMBOLIC = {
    "amqp:header:list": HEADER,
    "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES,
    "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE,
    "amqp:amqp-value:*": AMQP_VALUE,
    "amqp:footer:map": FOOTER,
}


def _fields(names: tuple[str, ...], value: Any) -> dict[str, Any]:
    if not isinstance(value, list):
        raise Amqp10Error("an AMQP 1.0 header or properties section is not a list")
    return {name: v for name, v in zip(names, value, strict=False) if v is not None}


def _map(value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Amqp10Error("an AMQP 1.0 annotations or properties section is not a map")
    return value


# -- encoding ------------------------------------------------------------------------------


def encode_value(value: Any) -> bytes:  # noqa: C901, PLR0911, PLR0912 - one branch per type
    if value is None:
        return b"\x40"
    if value is True:
        return b"\x41"
    if value is False:
        return b"\x42"
    if isinstance(value, Described):
        return b"\x00" + encode_value(value.descriptor) + encode_value(value.value)
    if isinstance(value, int):
        if isinstance(value, Timestamp):
            return b"\x83" + _q.pack(value)
        if isinstance(value, ULong):
            return b"\x53" + _B.pack(value) if value < 256 else b"\x80" + _Q.pack(value)
        if isinstance(value, UInt):
            return b"\x52" + _B.pack(value) if value < 256 else b"\x70" + _I.pack(value)
        if isinstance(value, UShort):
            return b"\x60" + _H.pack(value)
        if isinstance(value, UByte):
            return b"\x50" + _B.pack(value)
        if isinstance(value, Int):
            return b"\x54" + _b.pack(value) if -128 <= value < 128 else b"\x71" + _i.pack(value)
        if isinstance(value, Short):
            return b"\x61" + _h.pack(value)
        if isinstance(value, Byte):
            return b"\x51" + _b.pack(value)
        if -128 <= value < 128:
            return b"\x55" + _b.pack(value)
        return b"\x81" + _q.pack(value)
    if isinstance(value, float):
        return b"\x82" + _d.pack(value)
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        return (
            b"\xa0" + _B.pack(len(raw)) if len(raw) < 256 else b"\xb0" + _I.pack(len(raw))
        ) + raw
    if isinstance(value, Char):
        return b"\x73" + _I.pack(ord(value))
    if isinstance(value, str):
        raw = value.encode("utf-8")
        small, large = (b"\xa3", b"\xb3") if isinstance(value, Symbol) else (b"\xa1", b"\xb1")
        return (small + _B.pack(len(raw)) if len(raw) < 256 else large + _I.pack(len(raw))) + raw
    if isinstance(value, uuid.UUID):
        return b"\x98" + value.bytes
    if isinstance(value, list | tuple):
        if not value:
            return b"\x45"
        items = b"".join(encode_value(v) for v in value)
        return _compound(0xC0, 0xD0, len(value), items)
    if isinstance(value, dict):
        items = b"".join(encode_value(k) + encode_value(v) for k, v in value.items())
        return _compound(0xC1, 0xD1, 2 * len(value), items)
    raise Amqp10Error(f"no AMQP 1.0 encoding for {type(value).__name__}")


def _compound(small: int, large: int, count: int, items: bytes) -> bytes:
    if len(items) + 1 < 256 and count < 256:
        return bytes((small, len(items) + 1, count)) + items
    return _B.pack(large) + _I.pack(len(items) + 4) + _I.pack(count) + items


def _section(code: int, value: Any) -> bytes:
    return b"\x00\x53" + bytes((code,)) + encode_value(value)


def _listed(names: tuple[str, ...], values: dict[str, Any]) -> list:
    items = [values.get(name) for name in names]
    while items and items[-1] is None:
        items.pop()
    return items


def encode_message(msg: Message10) -> bytes:
    parts = []
    if msg.header:
        parts.append(_section(HEADER, _listed(HEADER_FIELDS, msg.header)))
    if msg.delivery_annotations:
        parts.append(_section(DELIVERY_ANNOTATIONS, msg.delivery_annotations))
    if msg.message_annotations:
        parts.append(_section(MESSAGE_ANNOTATIONS, msg.message_annotations))
    if msg.properties:
        parts.append(_section(PROPERTIES, _listed(PROPERTY_FIELDS, msg.properties)))
    if msg.application_properties:
        parts.append(_section(APPLICATION_PROPERTIES, msg.application_properties))
    if msg.body_kind == DATA:
        body = msg.body if msg.body else [b""]
        parts.extend(_section(DATA, bytes(b)) for b in body)
    elif msg.body_kind == AMQP_SEQUENCE:
        parts.extend(_section(AMQP_SEQUENCE, list(s)) for s in msg.body)
    else:
        parts.append(_section(AMQP_VALUE, msg.body))
    if msg.footer:
        parts.append(_section(FOOTER, msg.footer))
    return b"".join(parts)


def data_message(body: bytes) -> bytes:
    """A message of one data section and nothing else (the common case, cheaply)."""
    n = len(body)
    if n < 256:
        return b"\x00\x53\x75\xa0" + bytes((n,)) + body
    return b"\x00\x53\x75\xb0" + _I.pack(n) + body
