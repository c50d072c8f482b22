"""One stream, two protocols: an AMQP 0-9-1 message read over the stream protocol (as an
AMQP 1.0 message) and a stream-protocol message read over AMQP 0-9-1, mapped as RabbitMQ
3.10.8 maps them (probed with pika, aio-pika and rstream: tests/stream_protocol/).

AMQP 0-9-1 -> 1.0: message annotations `x-routing-key`, `x-exchange`, and the properties
without a place of their own, `x-basic-priority` and `x-basic-delivery-mode` (ubyte),
`x-basic-expiration` (string); the properties section holds message-id, user-id (binary),
reply-to, correlation-id, content-type and -encoding (symbols) and creation-time (the
timestamp in milliseconds); application properties hold `x-basic-type`, `x-basic-app-id`
and every header with a simple value, typed as in the header (a table or array header is
dropped, as RabbitMQ drops it); no header section; the body is one data section.

AMQP 1.0 -> 0-9-1: the reverse, plus what a 1.0 client may set that 0-9-1 has no field for:
header.durable is delivery-mode 2, header.priority the priority, header.ttl the expiration;
other message annotations are headers; a body of data sections is their bytes, any other
body (amqp-value, amqp-sequence) is its AMQP 1.0 encoding with type `amqp-1.0`.
"""

from __future__ import annotations

import base64
import datetime
import struct
import uuid
from typing import Any

from roarmq.protocol.spec import BasicProperties
from roarmq.protocol.stream.amqp10 import (
    DATA,
    Amqp10Error,
    Byte,
    Int,
    Message10,
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
    decode_message,
    encode_message,
)
from roarmq.protocol.tables import AMQPSyntaxError, decode_table_typed

#: Annotations a 0-9-1 property has a place for (read back into it, not into headers).
_ANNOTATED = {
    "x-exchange",
    "x-routing-key",
    "x-basic-priority",
    "x-basic-delivery-mode",
    "x-basic-expiration",
}

#: An AMQP 0-9-1 header's type -> the AMQP 1.0 type it keeps (None: as Python has it).
_TYPES: dict[str, Any] = {
    "b": Byte,
    "B": UByte,
    "s": Short,
    "u": UShort,
    "I": Int,
    "i": UInt,
    "l": None,
    "L": None,
    "t": None,
    "f": None,
    "d": None,
    "S": None,
    "x": None,
    "V": None,
}


def _typed_headers(raw: bytes) -> list[tuple[str, Any]]:
    """A raw AMQP 0-9-1 property list's headers as (name, AMQP 1.0 value), simple values
    only, each keeping its width and sign."""
    if len(raw) < 2:
        return []
    flags = raw[0] << 8 | raw[1]
    if not flags & 0x2000:
        return []
    p = 2 + (2 if flags & 1 else 0)
    if flags & 0x8000:
        p += 1 + raw[p]
    if flags & 0x4000:
        p += 1 + raw[p]
    try:
        table, _ = decode_table_typed(raw, p)
    except AMQPSyntaxError:
        return []
    out = []
    for name, (kind, value) in table.items():
        if kind == "T":
            stamp = value.timestamp() if isinstance(value, datetime.datetime) else int(value)
            out.append((name, Timestamp(int(stamp) * 1000)))
        elif kind in _TYPES:
            if kind == "f":
                value = struct.unpack(">f", struct.pack(">f", value))[0]
            wrap = _TYPES[kind]
            out.append((name, wrap(value) if wrap is not None else value))
    return out


def to_amqp10(
    exchange: str, routing_key: str, raw: bytes, props: BasicProperties, body: bytes
) -> bytes:
    """An AMQP 0-9-1 message (its raw property list, decoded, and body) as an AMQP 1.0
    message."""
    annotations: dict[Any, Any] = {
        Symbol("x-routing-key"): routing_key,
        Symbol("x-exchange"): exchange,
    }
    if props.priority is not None:
        annotations[Symbol("x-basic-priority")] = UByte(props.priority)
    if props.delivery_mode is not None:
        annotations[Symbol("x-basic-delivery-mode")] = UByte(props.delivery_mode)
    if props.expiration is not None:
        annotations[Symbol("x-basic-expiration")] = props.expiration
    properties: dict[str, Any] = {}
    typed = dict(_typed_headers(raw))
    if props.message_id is not None:
        properties["message_id"] = _id_value(props.message_id, typed.pop("x-message-id-type", None))
    if props.user_id is not None:
        properties["user_id"] = props.user_id.encode()
    if props.reply_to is not None:
        properties["reply_to"] = props.reply_to
    if props.correlation_id is not None:
        properties["correlation_id"] = _id_value(
            props.correlation_id, typed.pop("x-correlation-id-type", None)
        )
    if props.content_type is not None:
        properties["content_type"] = Symbol(props.content_type)
    if props.content_encoding is not None:
        properties["content_encoding"] = Symbol(props.content_encoding)
    if props.timestamp is not None:
        stamp = props.timestamp
        seconds = stamp.timestamp() if isinstance(stamp, datetime.datetime) else int(stamp)  # type: ignore[arg-type]  # an int or a struct_time's seconds
        properties["creation_time"] = Timestamp(int(seconds) * 1000)
    app: dict[str, Any] = {}
    if props.type is not None:
        app["x-basic-type"] = props.type
    if props.app_id is not None:
        app["x-basic-app-id"] = props.app_id
    app.update(typed)
    return encode_message(
        Message10(
            message_annotations=annotations,
            properties=properties or None,
            application_properties=app or None,
            body=[body],
        )
    )


#: The header that names the AMQP 1.0 type of a message-id / correlation-id in 0-9-1.
_ID_TYPE = {"message_id": "x-message-id-type", "correlation_id": "x-correlation-id-type"}


def _id_text(value: Any) -> tuple[str, str | None]:
    """A 1.0 message-id or correlation-id as 0-9-1's string, and its type when it was not a
    string (RabbitMQ's `x-message-id-type`: uuid, ulong, binary as base64)."""
    if isinstance(value, uuid.UUID):
        return str(value), "uuid"
    if isinstance(value, bytes):
        return base64.b64encode(value).decode(), "binary"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(int(value)), "ulong"
    return str(value), None


def _id_value(text: str, kind: Any) -> Any:
    """The reverse: a 0-9-1 id with its type header as the typed 1.0 value."""
    try:
        if kind == "uuid":
            return uuid.UUID(text)
        if kind == "ulong":
            return ULong(int(text))
        if kind == "binary":
            return base64.b64decode(text, validate=True)
    except ValueError:
        pass
    return text


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, uuid.UUID):
        return str(value)
    return str(value)


def _header_value(value: Any) -> Any:
    if isinstance(value, Timestamp):
        return datetime.datetime.fromtimestamp(value / 1000, datetime.UTC)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict | list):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, Symbol):
        return str(value)
    return value


def to_amqp091(message: bytes) -> tuple[BasicProperties, bytes]:
    """An AMQP 1.0 message as AMQP 0-9-1 properties and body. A message that does not
    decode is delivered as its bytes with type `amqp-1.0`."""
    try:
        msg = decode_message(message)
    except Amqp10Error:
        return BasicProperties(type="amqp-1.0"), message
    props = BasicProperties()
    header = msg.header or {}
    if header.get("durable"):
        props.delivery_mode = 2
    if "priority" in header:
        props.priority = int(header["priority"])
    if "ttl" in header:
        props.expiration = str(int(header["ttl"]))
    p = msg.properties or {}
    headers: dict[str, Any] = {}
    for name in ("message_id", "correlation_id"):  # 0-9-1 has strings: the type in a header
        if name in p:
            text, kind = _id_text(p[name])
            setattr(props, name, text)
            if kind is not None:
                headers[_ID_TYPE[name]] = kind
    if "reply_to" in p:
        props.reply_to = _text(p["reply_to"])
    if "user_id" in p:
        props.user_id = _text(p["user_id"])
    if "content_type" in p:
        props.content_type = str(p["content_type"])
    if "content_encoding" in p:
        props.content_encoding = str(p["content_encoding"])
    if "creation_time" in p:
        props.timestamp = int(p["creation_time"]) // 1000
    for key, value in (msg.application_properties or {}).items():
        name = str(key)
        if name == "x-basic-type":
            props.type = _text(value)
        elif name == "x-basic-app-id":
            props.app_id = _text(value)
        else:
            headers[name] = _header_value(value)
    for key, value in (msg.message_annotations or {}).items():
        name = str(key)
        if name == "x-basic-priority" and isinstance(value, int):
            props.priority = int(value)
        elif name == "x-basic-delivery-mode" and isinstance(value, int):
            props.delivery_mode = int(value)
        elif name == "x-basic-expiration":
            props.expiration = _text(value)
        elif name not in _ANNOTATED:
            headers[name] = _header_value(value)
    if headers:
        props.headers = headers
    if msg.body_kind == DATA:
        return props, msg.data()
    props.type = props.type or "amqp-1.0"
    return props, message
