"""rstream clients for tests of the stream protocol: a producer and a consumer of a broker
(a `RunningBroker` or anything with `stream_port`), and `collect`, which subscribes and
returns the first n (offset, body) pairs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from rstream import Consumer, ConsumerOffsetSpecification, MessageContext, Producer, amqp_decoder


@contextlib.asynccontextmanager
async def _started(cls: type, broker: Any, user: str, password: str, vhost: str) -> AsyncIterator:
    client = cls(
        "127.0.0.1", port=broker.stream_port, username=user, password=password, vhost=vhost
    )
    await client.start()
    try:
        yield client
    finally:
        await client.close()


def producer_of(
    broker: Any, *, user: str = "guest", password: str = "guest", vhost: str = "/"
) -> contextlib.AbstractAsyncContextManager[Producer]:
    return _started(Producer, broker, user, password, vhost)


def consumer_of(
    broker: Any, *, user: str = "guest", password: str = "guest", vhost: str = "/"
) -> contextlib.AbstractAsyncContextManager[Consumer]:
    return _started(Consumer, broker, user, password, vhost)


async def collect(
    consumer: Consumer,
    stream: str,
    offset: ConsumerOffsetSpecification,
    count: int,
    *,
    decoder: Callable[[bytes], Any] = amqp_decoder,
    timeout: float = 10.0,
    unsubscribe: bool = True,
) -> list[tuple[int, Any]]:
    """Subscribe from `offset` until `count` messages came: (offset, body) each (the body
    of an AMQP message, or what `decoder` made of the bytes); then unsubscribe (unless
    told not to: the subscription stays, as a consumer the test looks at)."""
    got: list[tuple[int, Any]] = []
    done = asyncio.Event()

    async def on_message(message: Any, context: MessageContext) -> None:
        body = bytes(message.body) if hasattr(message, "body") else message
        got.append((context.offset, body))
        if len(got) >= count:
            done.set()

    sid = await consumer.subscribe(stream, on_message, decoder=decoder, offset_specification=offset)
    try:
        await asyncio.wait_for(done.wait(), timeout)
    finally:
        if unsubscribe:
            await consumer.unsubscribe(sid)
    return got[:count]
