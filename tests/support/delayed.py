"""The topology the delayed-exchange tests share: a durable `x-delayed-message` exchange
routing as a direct one to one durable queue."""

from __future__ import annotations

from typing import Any


def delayed_direct_to_queue(
    ch: Any, exchange: str = "dx", queue: str = "q", key: str = "k"
) -> None:
    """Declare (over a pika channel) the durable delayed exchange, the durable queue and the
    binding with `key` between them."""
    ch.exchange_declare(
        exchange, "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"}
    )
    ch.queue_declare(queue, durable=True)
    ch.queue_bind(queue, exchange, key)
