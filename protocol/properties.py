"""The 14 basic content properties carried by a content header frame.

``BasicProperties`` (straight-line ``encode``/``decode``, flag by flag) and the property flag
bits (``FLAG_CONTENT_TYPE`` = bit 15 ... ``FLAG_CLUSTER_ID`` = bit 2) are generated into
``spec.py`` by ``codegen.py`` from the spec's basic class, like the methods: the flags are
defined there once, and this module is where the rest of RoarMQ imports them from.
"""

from __future__ import annotations

import struct

from .spec import (
    BASIC_PROPERTIES,
    FLAG_APP_ID,
    FLAG_CLUSTER_ID,
    FLAG_CONTENT_ENCODING,
    FLAG_CONTENT_TYPE,
    FLAG_CORRELATION_ID,
    FLAG_DELIVERY_MODE,
    FLAG_EXPIRATION,
    FLAG_HEADERS,
    FLAG_MESSAGE_ID,
    FLAG_PRIORITY,
    FLAG_REPLY_TO,
    FLAG_TIMESTAMP,
    FLAG_TYPE,
    FLAG_USER_ID,
    BasicProperties,
)
from .tables import Int64

__all__ = [
    "BASIC_PROPERTIES",
    "FLAG_APP_ID",
    "FLAG_CLUSTER_ID",
    "FLAG_CONTENT_ENCODING",
    "FLAG_CONTENT_TYPE",
    "FLAG_CORRELATION_ID",
    "FLAG_DELIVERY_MODE",
    "FLAG_EXPIRATION",
    "FLAG_HEADERS",
    "FLAG_MESSAGE_ID",
    "FLAG_PRIORITY",
    "FLAG_REPLY_TO",
    "FLAG_TIMESTAMP",
    "FLAG_TYPE",
    "FLAG_USER_ID",
    "BasicProperties",
    "with_long_header",
]

_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")


def with_long_header(raw: bytes, name: str, value: int) -> bytes:
    """The raw property list `raw` with header `name` set to `value` as a signed 64-bit
    integer (field type "l", as RabbitMQ writes `x-stream-offset` and `x-delivery-count`
    whatever the value: typed clients read them as longs). Spliced into the headers table
    (added if there is none) when the table lacks the name, so the publisher's encoding of
    everything else is kept and nothing is decoded; decoded and encoded again when it has
    it (the broker's value wins) or the property flags continue past their first word."""
    key = name.encode()
    field = b"".join((bytes((len(key),)), key, b"l", _I64.pack(value)))
    flags = raw[0] << 8 | raw[1] if len(raw) >= 2 else 1
    if not flags & 1:
        p = 2
        if flags & FLAG_CONTENT_TYPE:  # shortstrs before the headers
            p += 1 + raw[p]
        if flags & FLAG_CONTENT_ENCODING:
            p += 1 + raw[p]
        if not flags & FLAG_HEADERS:
            head = (flags | FLAG_HEADERS).to_bytes(2, "big")
            return b"".join((head, raw[2:p], _U32.pack(len(field)), field, raw[p:]))
        (n,) = _U32.unpack_from(raw, p)
        stop = p + 4 + n
        if raw.find(key, p + 4, stop) < 0:
            return b"".join(
                (raw[:p], _U32.pack(n + len(field)), raw[p + 4 : stop], field, raw[stop:])
            )
    props = BasicProperties.decode(raw)
    headers = dict(props.headers or {})
    headers[name] = Int64(value)
    props.headers = headers
    return props.encode()
