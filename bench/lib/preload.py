"""A queue filled with persistent messages, each confirmed by its broker (any AMQP 0-9-1
broker), pipelined: what a shovel benchmark or a shovel fault test starts from."""

from __future__ import annotations

import asyncio

from roarmq.broker.links.client import AmqpClient
from roarmq.broker.links.uri import parse_uri
from roarmq.protocol import spec
from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import BasicProperties

#: Publishes between two yields to the loop (so confirms come in as they are made).
BATCH = 1000


async def preload(url: str, queue: str, count: int, body_size: int = 0) -> None:
    """`count` persistent messages into the durable queue `queue` (declared), bodies
    b"m{i}" padded to `body_size`; returns once the broker confirmed every one (a nack
    raises)."""
    client = await AmqpClient.connect(parse_uri(url))
    ch = await client.channel()
    await ch.call(spec.QueueDeclare(queue=queue, durable=True))
    confirmed = asyncio.get_running_loop().create_future()
    acked = 0

    def on_confirm(tag: int, multiple: bool, ack: bool) -> None:
        nonlocal acked
        if not ack and not confirmed.done():
            confirmed.set_exception(RuntimeError(f"publish {tag} nacked"))
        acked = tag if multiple else acked + 1
        if acked >= count and not confirmed.done():
            confirmed.set_result(None)

    ch.on_confirm = on_confirm
    await ch.confirm_select()
    persistent = BasicProperties(delivery_mode=2)
    for i in range(count):
        body = (b"m%d" % i).ljust(body_size, b".")
        ch.publish("", queue, ContentHeader.from_properties(persistent, 60, len(body)), body)
        if i % BATCH == BATCH - 1:
            await asyncio.sleep(0)
    await asyncio.wait_for(confirmed, 300)
    await client.close()
