"""A published message as the broker holds it, shared by every queue it reaches.

The content header arrives as raw bytes and is forwarded to consumers
untouched; the 14 properties are decoded only when a flag we act on is set
(headers, delivery-mode, priority, expiration, user-id, reply-to), so the
common publish pays for none of it.
"""

from __future__ import annotations

from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import (
    FLAG_DELIVERY_MODE,
    FLAG_EXPIRATION,
    FLAG_HEADERS,
    FLAG_PRIORITY,
    FLAG_REPLY_TO,
    FLAG_USER_ID,
    BasicProperties,
)

#: The flags whose properties a publish decodes at once: one global for the test per message.
_DECODE_AT_ONCE = FLAG_DELIVERY_MODE | FLAG_PRIORITY | FLAG_EXPIRATION

#: True when this module runs compiled (setup.py), as in protocol/frames.py.
_COMPILED = not __file__.endswith(".py")

# The flags the channel and the vhost test on a message come from the generated spec too;
# they are imported from here, beside ``Message.flags``.
__all__ = [
    "FLAG_DELIVERY_MODE",
    "FLAG_EXPIRATION",
    "FLAG_HEADERS",
    "FLAG_PRIORITY",
    "FLAG_REPLY_TO",
    "FLAG_USER_ID",
    "Message",
    "copy_properties",
    "parse_expiration",
]

#: Decoded property lists by their raw bytes (flags + values, as received). A publisher
#: repeats its list, so each distinct list is decoded -- and so checked -- once, and every
#: message with it shares the one BasicProperties: nothing may change a message's
#: properties in place (dead-lettering and BCC stripping change a `copy_properties`).
_DECODED: dict[bytes, BasicProperties] = {}
_DECODED_MAX = 4096


class Message:
    """Immutable once routed; per-queue state (redelivered, expiry) lives in the queue's entry."""

    __slots__ = (
        "exchange",
        "routing_key",
        "header",
        "body",
        "size",
        "flags",
        "persistent",
        "priority",
        "expiration_ms",
        "store_id",
    )

    def __init__(self, exchange: str, routing_key: str, header: ContentHeader, body: bytes) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.header = header
        self.body = body
        self.size = len(body)
        raw = header.raw
        flags = (raw[0] << 8 | raw[1]) if len(raw) >= 2 else 0
        self.flags = flags
        self.persistent = False
        self.priority = 0
        self.expiration_ms: int | None = None
        self.store_id: int | None = None  # msg_id in the message store, once persisted
        if raw != b"\x00\x00":
            # Decoding is the check (AMQPSyntaxError, 502): the raw list is forwarded to
            # consumers as is, so a malformed one must be refused here, at the publisher,
            # not found by every consumer's client (RabbitMQ closes the publisher too). A
            # list seen before is taken decoded (a dict lookup, ~0.3k instructions, instead
            # of a decode, ~9k, and again for its headers when routing reads them).
            props = _DECODED.get(raw)
            if props is None:
                props = header.properties
                if len(_DECODED) >= _DECODED_MAX:
                    _DECODED.clear()
                _DECODED[raw] = props
            else:
                header._properties = props
            if flags & _DECODE_AT_ONCE:
                self.persistent = props.delivery_mode == 2
                if props.priority:
                    self.priority = props.priority
                if props.expiration is not None:
                    self.expiration_ms = parse_expiration(props.expiration)
        if _COMPILED:
            # Out of the garbage collector's sight: a message refers to strings, bytes and its
            # content header, never back to anything that refers to it, so it is in no cycle
            # and reference counting frees it. Tracked, every message in flight was scanned
            # again by each young-generation collection: with 100,000 queues (bench/topic_go.py)
            # those took a sixth of the broker's CPU.
            PyObject_GC_UnTrack(self)  # type: ignore[name-defined]  # noqa: F821  # Cython's

    @classmethod
    def _rebuilt(
        cls,
        exchange: str,
        routing_key: str,
        header: ContentHeader,
        body: bytes | None,
        size: int,
        persistent: bool,
        priority: int,
    ) -> Message:
        """A message put back together without __init__'s property decoding."""
        msg = cls.__new__(cls)
        msg.exchange = exchange
        msg.routing_key = routing_key
        msg.header = header
        msg.body = body  # type: ignore[assignment]  # None: paged out, the store holds it
        msg.size = size
        raw = header.raw
        msg.flags = (raw[0] << 8 | raw[1]) if len(raw) >= 2 else 0
        msg.persistent = persistent
        msg.priority = priority
        msg.expiration_ms = None
        msg.store_id = None
        return msg

    @classmethod
    def recovered(
        cls, exchange: str, routing_key: str, header: ContentHeader, size: int
    ) -> Message:
        """A message read back from the message store: persistent, its body left on disk.

        Skips the property decoding of __init__ unless a priority or expiration is set.
        """
        msg = cls._rebuilt(exchange, routing_key, header, None, size, True, 0)
        if msg.flags & (FLAG_PRIORITY | FLAG_EXPIRATION):
            props = header.properties
            msg.priority = props.priority or 0
            if props.expiration is not None:
                try:
                    msg.expiration_ms = parse_expiration(props.expiration)
                except ValueError:
                    pass  # it was accepted once; an unreadable TTL now means none
        return msg

    @classmethod
    def unpacked(
        cls,
        exchange: str,
        routing_key: str,
        header: ContentHeader,
        body: bytes,
        priority: int,
        persistent: bool,
    ) -> Message:
        """A transient message rebuilt from a queue's packed tail (broker/core/ready.py).

        Priority and persistence come from the record, so nothing is decoded again; only a
        per-message TTL (rare) is read back from the header.
        """
        msg = cls._rebuilt(exchange, routing_key, header, body, len(body), persistent, priority)
        if msg.flags & FLAG_EXPIRATION:
            expiration = header.properties.expiration
            if expiration is not None:
                msg.expiration_ms = parse_expiration(expiration)
        return msg

    @property
    def properties(self) -> BasicProperties:
        return self.header.properties

    @property
    def headers(self) -> dict | None:
        if not self.flags & FLAG_HEADERS:
            return None
        return self.header.properties.headers

    def with_properties(
        self, props: BasicProperties, routing_key: str | None = None, exchange: str | None = None
    ) -> Message:
        """A copy with new properties (dead-lettering, BCC stripping, reply-to rewriting)."""
        return Message(
            self.exchange if exchange is None else exchange,
            self.routing_key if routing_key is None else routing_key,
            ContentHeader.from_properties(props, body_size=self.size),
            self.body,
        )


def copy_properties(props: BasicProperties) -> BasicProperties:
    """A shallow copy to modify (the original is shared by every queue holding the message)."""
    return BasicProperties(**{name: getattr(props, name) for name in BasicProperties.__slots__})


def parse_expiration(value: str) -> int:
    """RabbitMQ's per-message TTL: a string holding a non-negative integer of milliseconds.

    Raises ValueError with RabbitMQ's wording; the channel turns it into 406.
    """
    text = value.strip() if isinstance(value, str) else value
    try:
        ms = int(text)
    except (TypeError, ValueError):
        raise ValueError(f"invalid expiration '{value}': no_integer") from None
    if ms < 0:
        raise ValueError(f"invalid expiration '{value}': {{value_negative,{ms}}}")
    return ms
