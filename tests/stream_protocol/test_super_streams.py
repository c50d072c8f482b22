"""Super streams and single active consumer over the stream protocol, with rstream's own
super-stream producer and consumer (RabbitMQ 3.13's commands: create and delete with
partitions and binding keys, partitions, route; consumer-update)."""

from __future__ import annotations

import asyncio

import aio_pika
from rstream import (
    AMQPMessage,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetSpecification,
    OffsetType,
    RouteType,
    SuperStreamConsumer,
    SuperStreamCreationOption,
    SuperStreamProducer,
    amqp_decoder,
)
from rstream import exceptions as rex
from rstream.consumer import EventContext
from support.stream_clients import consumer_of, producer_of


def _kw(broker) -> dict:
    return {
        "host": "127.0.0.1",
        "port": broker.stream_port,
        "username": "guest",
        "password": "guest",
    }


async def _routing_key(message: AMQPMessage) -> str:
    return message.application_properties["id"]


async def test_a_super_stream_routes_by_key_and_every_message_is_read_once(broker):
    async with SuperStreamProducer(
        **_kw(broker),
        super_stream="orders",
        super_stream_creation_option=SuperStreamCreationOption(n_partitions=3),
        routing=RouteType.Hash,
        routing_extractor=_routing_key,
    ) as producer:
        for i in range(60):
            await producer.send(AMQPMessage(body=b"%d" % i, application_properties={"id": str(i)}))
        await asyncio.sleep(0.5)  # send() batches; confirms come back meanwhile

    connection = await aio_pika.connect(broker.url)  # what AMQP 0-9-1 sees
    channel = await connection.channel()
    exchange = await channel.get_exchange("orders")
    assert exchange is not None
    lengths = []
    for i in range(3):
        queue = await channel.declare_queue(f"orders-{i}", passive=True)
        lengths.append(queue.declaration_result.message_count)
    assert sum(lengths) == 60 and all(n > 0 for n in lengths), lengths
    await connection.close()

    got: list[bytes] = []
    done = asyncio.Event()

    async def on_message(message, context: MessageContext) -> None:
        got.append(bytes(message.body))
        if len(got) == 60:
            done.set()

    consumer = SuperStreamConsumer(**_kw(broker), super_stream="orders")
    await consumer.start()
    await consumer.subscribe(
        on_message,
        decoder=amqp_decoder,
        offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
    )
    await asyncio.wait_for(done.wait(), 10)
    await consumer.close()
    assert sorted(got) == sorted(b"%d" % i for i in range(60))

    async with producer_of(broker) as plain:
        client = await plain.default_client
        assert await client.partitions("orders") == ["orders-0", "orders-1", "orders-2"]
        assert await client.route("1", "orders") == ["orders-1"]
        await client.delete_super_stream("orders")
        assert await client.partitions("orders") == []  # (rstream drops the code)
        assert not await plain.stream_exists("orders-0")
    assert "orders-0" not in broker.broker.vhosts["/"].queues
    assert "orders" not in broker.broker.vhosts["/"].exchanges


async def test_single_active_consumer_hands_over_where_the_last_one_stopped(broker):
    async with producer_of(broker) as producer:
        await producer.create_stream("sac")
        await producer.send_batch("sac", [AMQPMessage(body=b"%d" % i) for i in range(10)])

    seen: dict[str, list[int]] = {"a": [], "b": []}
    updates: list[tuple[str, bool]] = []

    def listener(name: str):
        async def on_update(active: bool, context: EventContext):
            updates.append((name, active))
            try:
                stored = await context.consumer.query_offset("sac", "group")
                return OffsetSpecification(OffsetType.OFFSET, stored + 1)
            except rex.OffsetNotFound:
                return OffsetSpecification(OffsetType.FIRST, 0)

        return on_update

    def handler(name: str):
        async def on_message(message, context: MessageContext) -> None:
            seen[name].append(context.offset)
            await context.consumer.store_offset("sac", "group", context.offset)

        return on_message

    async with consumer_of(broker) as a, consumer_of(broker) as b:
        props = {"single-active-consumer": "true", "name": "group"}
        await a.subscribe("sac", handler("a"), decoder=amqp_decoder, properties=props,
                          subscriber_name="group", consumer_update_listener=listener("a"))  # fmt: skip
        await b.subscribe("sac", handler("b"), decoder=amqp_decoder, properties=props,
                          subscriber_name="group", consumer_update_listener=listener("b"))  # fmt: skip
        for _ in range(100):
            if len(seen["a"]) == 10:
                break
            await asyncio.sleep(0.05)
        assert seen == {"a": list(range(10)), "b": []}
        assert updates == [("a", True)]
        await asyncio.sleep(0.3)  # the stored offset (no answer to store-offset) is written
        await a.close()
        async with producer_of(broker) as producer:
            await producer.send_batch("sac", [AMQPMessage(body=b"more")] * 5)
        for _ in range(100):
            if len(seen["b"]) == 5:
                break
            await asyncio.sleep(0.05)
        assert seen["b"] == list(range(10, 15))  # from the stored offset on: nothing twice
        assert updates == [("a", True), ("b", True)]
