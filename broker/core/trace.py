"""The firehose: RabbitMQ's tracer (rabbit_trace). With tracing on in a vhost (`roarmq ctl
trace_on`, or PUT /api/vhosts/{vhost} with {"tracing": true}), every publish and every
delivery there is copied to the vhost's internal topic exchange `amq.rabbitmq.trace`: routing
key `publish.<exchange>` or `deliver.<queue>`, the message's body, and headers that say
where it went (RabbitMQ 3.10.8's: exchange_name, routing_keys, properties, node,
redelivered (deliver only), vhost, connection, channel, user, routed_queues (publish only)).

The message path reads one flag, `VirtualHost.tracing`: once per publish (Channel._route)
and once per batch a queue hands out (Queue.dispatch; Queue.publish's direct delivery and
basic.get are each a batch of one). Everything here runs only while that flag is set. The
copies are routed on the next turn of the loop, never inside the queue that is delivering
(a queue bound to the trace exchange would otherwise take a copy in the middle of its own
dispatch), and copies of trace messages are never made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import BasicProperties

from .message import FLAG_HEADERS, Message

if TYPE_CHECKING:
    from ..amqp.channel import Channel
    from .queue import Entry
    from .vhost import VirtualHost

__all__ = ["TRACE_EXCHANGE", "delivered", "published", "set_tracing"]

#: Every vhost's internal topic exchange of trace copies (broker/core/vhost.py declares it).
TRACE_EXCHANGE = "amq.rabbitmq.trace"


def set_tracing(vhost: VirtualHost, on: bool) -> bool:
    """Turn the firehose on or off in `vhost`; whether it changed. Not stored: as in
    RabbitMQ, tracing is the running node's, and a restart starts with it off."""
    changed = vhost.tracing != on
    vhost.tracing = on
    return changed


def _routing_keys(msg: Message) -> list[str]:
    """The message's routing key and its CC / BCC keys, as RabbitMQ lists them."""
    keys = [msg.routing_key]
    if msg.flags & FLAG_HEADERS:
        headers = msg.headers or {}
        for name in ("CC", "BCC"):
            extra = headers.get(name)
            if isinstance(extra, (list, tuple)):
                keys.extend(k for k in extra if isinstance(k, str))
    return keys


def _properties(msg: Message) -> dict[str, Any]:
    props = msg.properties
    return {k: v for k in BasicProperties.__slots__ if (v := getattr(props, k)) is not None}


def _who(ch: Channel) -> dict[str, Any]:
    conn = ch.conn
    return {
        "vhost": ch.vhost.name,
        "connection": conn.name,
        "channel": ch.id,
        "user": conn.user.name if conn.user is not None else "",
    }


def published(ch: Channel, msg: Message, queues: Any) -> None:
    """A publish on `ch` was routed to `queues` (tracing is on in its vhost)."""
    if msg.exchange == TRACE_EXCHANGE:
        return
    headers = {
        "exchange_name": msg.exchange,
        "routing_keys": _routing_keys(msg),
        "properties": _properties(msg),
        "node": ch.conn.broker.node_name,
        **_who(ch),
        "routed_queues": [q.name for q in queues],
    }
    _emit(ch.vhost, f"publish.{msg.exchange}", headers, msg.body)


def delivered(ch: Channel, entry: Entry) -> None:
    """`entry` was handed to a consumer on `ch` or answered a basic.get there."""
    msg = entry.msg
    queue = entry.queue
    if msg.exchange == TRACE_EXCHANGE or queue is None:
        return
    body = msg.body
    if body is None:  # paged out: read it back, as the delivery did
        store = queue.store if queue.store is not None else ch.conn.broker.store
        try:
            body = store.body(msg)
        except Exception:  # noqa: BLE001 - gone meanwhile: the copy says so, the delivery is unharmed
            body = b""
    headers = {
        "exchange_name": msg.exchange,
        "routing_keys": _routing_keys(msg),
        "properties": _properties(msg),
        "node": ch.conn.broker.node_name,
        "redelivered": 1 if entry.redelivered else 0,
        **_who(ch),
    }
    _emit(ch.vhost, f"deliver.{queue.name}", headers, body)


def _emit(vhost: VirtualHost, key: str, headers: dict[str, Any], body: bytes) -> None:
    props = BasicProperties(headers=headers)
    msg = Message(TRACE_EXCHANGE, key, ContentHeader.from_properties(props, 60, len(body)), body)
    pending = vhost.trace_pending
    if not pending:
        vhost.clock.loop.call_soon(_flush, vhost)
    pending.append(msg)


def _flush(vhost: VirtualHost) -> None:
    """Route the copies made since the last turn (in order) through amq.rabbitmq.trace."""
    pending, vhost.trace_pending = vhost.trace_pending, []
    exchange = vhost.exchanges.get(TRACE_EXCHANGE)
    if exchange is None or vhost.deleted:
        return
    for msg in pending:
        exchange.stats_in += 1
        queues = vhost.route(exchange, msg)
        if queues:
            vhost.enqueue(msg, queues)
        else:
            exchange.stats_unroutable += 1
