"""Super streams, as RabbitMQ 3.13 makes them: a durable direct exchange (argument
`x-super-stream: true`) bound to its partition streams, each binding with its routing key
and `x-stream-partition-order`. Created and deleted here for the stream protocol's
commands; an AMQP 0-9-1 client sees an ordinary exchange and streams (and may publish to
the exchange: it routes by key like any direct exchange)."""

from __future__ import annotations

from typing import Any

from ..core.stream import Stream

PARTITION_ORDER = "x-stream-partition-order"
SUPER_STREAM = "x-super-stream"


def create(
    vhost: Any, name: str, partitions: list[str], keys: list[str], arguments: dict[str, Any]
) -> None:
    """The exchange, the partitions (with the create's stream arguments) and the bindings,
    in that order. The caller checked names, permissions and that none exists."""
    exchange, _ = vhost.declare_exchange(
        name, "direct", durable=True, arguments={SUPER_STREAM: True}
    )
    for order, (partition, key) in enumerate(zip(partitions, keys, strict=True)):
        queue, _ = vhost.declare_queue(partition, None, durable=True, arguments=arguments)
        vhost.bind_queue(queue, exchange, key, {PARTITION_ORDER: order})


def exchange_of(vhost: Any, name: str) -> Any:
    """The super stream's exchange, or None if there is none of that name."""
    exchange = vhost.exchanges.get(name) if name else None
    if exchange is None or exchange.deleted:
        return None
    return exchange


def _bound(exchange: Any) -> list[tuple[int, str, Stream]]:
    rows = []
    for key, dest, args in exchange.index.bindings():
        if type(dest) is Stream and not dest.deleted:
            order = (args or {}).get(PARTITION_ORDER)
            rows.append((order if isinstance(order, int) else 1 << 30, key, dest))
    rows.sort(key=lambda row: (row[0], row[2].name))
    return rows


def partitions(exchange: Any) -> list[str]:
    """Its partitions in partition order (duplicates of one stream listed once)."""
    seen: dict[str, None] = {}
    for _order, _key, stream in _bound(exchange):
        seen.setdefault(stream.name, None)
    return list(seen)


def route(exchange: Any, routing_key: str) -> list[str]:
    """The partitions a routing key goes to (the bindings with that key), in order."""
    seen: dict[str, None] = {}
    for _order, key, stream in _bound(exchange):
        if key == routing_key:
            seen.setdefault(stream.name, None)
    return list(seen)


def partition_index(vhost: Any, super_stream: str, stream: Stream) -> int:
    """A stream's place among its super stream's partitions (0 if it is not one)."""
    exchange = exchange_of(vhost, super_stream)
    names = partitions(exchange) if exchange is not None else []
    return names.index(stream.name) if stream.name in names else 0


def delete(vhost: Any, exchange: Any) -> None:
    """The partitions, then the exchange."""
    for name in partitions(exchange):
        queue = vhost.queues.get(name)
        if queue is not None:
            vhost.delete_queue(queue)
    vhost.delete_exchange(exchange.name)
