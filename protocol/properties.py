"""The 14 basic content properties carried by a content header frame.

``BasicProperties`` (straight-line ``encode``/``decode``, flag by flag) and the property flag
bits (``FLAG_CONTENT_TYPE`` = bit 15 ... ``FLAG_CLUSTER_ID`` = bit 2) are generated into
``spec.py`` by ``codegen.py`` from the spec's basic class, like the methods: the flags are
defined there once, and this module is where the rest of RoarMQ imports them from.
"""

from __future__ import annotations

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
]
