"""One stream, two protocols: an AMQP 0-9-1 message read over the stream protocol (as an
AMQP 1.0 message) and a stream-protocol message read over AMQP 0-9-1, mapped the way
RabbitMQ's message containers map them.

AMQP 0-9-1 -> 1.0: delivery-mode 2 is header.durable, priority header.priority, an integer
expiration header.ttl; message-id, user-id, reply-to, correlation-id, content-type and
-encoding (symbols) and the timestamp (seconds -> milliseconds) are the properties; the
exchange and routing key are the message annotations `x-exchange` / `x-routing-key`, type
and app-id `x-basic-type` / `x-basic-app-id`; headers are application properties, except
`x-` headers, which are message annotations; the body is one data section.

AMQP 1.0 -> 0-9-1: the reverse, and every application property and `x-` message
annotation becomes a header; a body of data sections is their bytes; any other body (an
amqp-value or amqp-sequence) is its AMQP 1.0 encoding with type `amqp-1.0`.
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from roarmq.protocol.spec import BasicProperties
from roarmq.protocol.stream.amqp10 import (
    DATA,
    Amqp10Error,
    Message10,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    data_message,
    decode_message,
    encode_message,
)

_ANNOTATED = {"x-exchange", "x-routing-key", "x-basic-type", "x-basic-app-id"}


def _simple(value: Any) -> Any:
    """An AMQP 0-9-1 header value as an application property (which holds only simple
    values: a table or array goes as its text)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime.datetime):
        return Timestamp(int(value.timestamp() * 1000))
    return str(value)


def to_amqp10(exchange: str, routing_key: str, props: BasicProperties, body: bytes) -> bytes:
    """An AMQP 0-9-1 message (properties and body) as an AMQP 1.0 message."""
    header: dict[str, Any] = {}
    if props.delivery_mode == 2:
        header["durable"] = True
    if props.priority is not None:
        header["priority"] = UByte(props.priority)
    annotations: dict[Any, Any] = {
        Symbol("x-exchange"): exchange,
        Symbol("x-routing-key"): routing_key,
    }
    if props.expiration is not None:
        try:
            header["ttl"] = UInt(int(props.expiration))
        except ValueError:
            annotations[Symbol("x-basic-expiration")] = props.expiration
    if props.type is not None:
        annotations[Symbol("x-basic-type")] = props.type
    if props.app_id is not None:
        annotations[Symbol("x-basic-app-id")] = props.app_id
    properties: dict[str, Any] = {}
    for name in ("message_id", "correlation_id", "reply_to"):
        value = getattr(props, name)
        if value is not None:
            properties[name] = value
    if props.user_id is not None:
        properties["user_id"] = props.user_id.encode()
    if props.content_type is not None:
        properties["content_type"] = Symbol(props.content_type)
    if props.content_encoding is not None:
        properties["content_encoding"] = Symbol(props.content_encoding)
    if props.timestamp is not None:
        stamp = props.timestamp
        seconds = stamp.timestamp() if isinstance(stamp, datetime.datetime) else int(stamp)  # type: ignore[arg-type]  # an int or a struct_time's seconds
        properties["creation_time"] = Timestamp(int(seconds) * 1000)
    app: dict[str, Any] = {}
    for key, value in (props.headers or {}).items():
        if key.startswith("x-"):
            annotations[Symbol(key)] = _simple(value)
        else:
            app[key] = _simple(value)
    if not header and not properties and not app and not exchange and not routing_key:
        return data_message(body)
    return encode_message(
        Message10(
            header=header or None,
            message_annotations=annotations,
            properties=properties or None,
            application_properties=app or None,
            body=[body],
        )
    )


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
    for name in ("message_id", "correlation_id", "reply_to"):
        if name in p:
            setattr(props, name, _text(p[name]))
    if "user_id" in p:
        props.user_id = _text(p["user_id"])
    if "content_type" in p:
        props.content_type = str(p["content_type"])
    if "content_encoding" in p:
        props.content_encoding = str(p["content_encoding"])
    if "creation_time" in p:
        props.timestamp = int(p["creation_time"]) // 1000
    headers: dict[str, Any] = {}
    for key, value in (msg.application_properties or {}).items():
        headers[str(key)] = _header_value(value)
    for key, value in (msg.message_annotations or {}).items():
        name = str(key)
        if name == "x-basic-type":
            props.type = _text(value)
        elif name == "x-basic-app-id":
            props.app_id = _text(value)
        elif name == "x-basic-expiration":
            props.expiration = _text(value)
        elif name.startswith("x-") and name not in _ANNOTATED:
            headers[name] = _header_value(value)
    if headers:
        props.headers = headers
    if msg.body_kind == DATA:
        return props, msg.data()
    props.type = props.type or "amqp-1.0"
    return props, message
