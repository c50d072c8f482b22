"""The stream protocol driven by rbfly 0.10 (its own Cython codec, not rstream's), each
feature it has, against RoarMQ and RabbitMQ 3.10.8 alike (`target`): its three AMQP
publishers and two binary ones, named publishers and their sequence, explicit publishing
ids (deduplication), subscribing at each offset specification and from a stored offset
reference, write_offset, credit, AMQP 1.0 bodies, properties and application properties
both ways between the two protocols, create and delete, and the refusals it raises.
Reconnecting: test_rbfly_reconnect.py; filtering, permissions, TLS, heartbeats and peer
properties: test_rbfly_roarmq.py. rbfly 0.10 has no single active consumer, super
streams, sub-entry batches or stream stats: nothing of those to drive."""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
import uuid

import aio_pika
import pytest
import rbfly.streams as rbs
from rbfly.streams import const
from rbfly.streams._client import PublisherBin, PublisherBinBatch
from rbfly.streams.error import ProtocolError
from support.rbfly_clients import client_of, contexts, stored_offset, subscribed, take
from support.waiting import until_async

TS = datetime.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.UTC)
#: One body of each AMQPBody type rbfly encodes (an amqp-value section; bytes: data).
BODIES = [
    "text",
    "zażółć",
    b"\x00binary",
    42,
    -(2**40),
    2**63 + 1,
    1.5,
    True,
    False,
    None,
    [1, "a", [2.5]],
    {"k": 1, "nested": {"x": b"y"}},
    TS,
    uuid.UUID(int=5),
    rbs.Symbol("sym"),
]
#: Application properties of the types RabbitMQ 3.10.8 maps to AMQP 0-9-1 headers.
MAPPED_PROPERTIES = {
    "s": "x",
    "i": 7,
    "l": 2**40,
    "neg": -3,
    "f": 1.5,
    "t": True,
    "n": None,
    "bin": b"\x01",
    "ts": TS,
}


async def test_each_publisher_class_stores_its_messages_in_order(target, name):
    """Publisher (a confirm per message), PublisherBatchFast (a batch of 2.5 MB, which
    rbfly splits into frames of the frame_max tune agreed), PublisherBatchLimit (batch()
    waits while max_len messages are queued, until flush()); a named publisher goes on
    from its stored sequence each time it is declared again."""
    client = client_of(target)
    try:
        await client.create_stream(name)
        async with client.publisher(name, name="app") as one:
            assert one.message_id == 1  # query-publisher-sequence: 0 for a new name
            for i in range(3):
                await one.send(f"one-{i}")
        big = [bytes([i % 256]) * 1000 for i in range(2500)]
        async with client.publisher(name, name="app", cls=rbs.PublisherBatchFast) as fast:
            assert fast.message_id == 4
            for body in big:
                fast.batch(body)
            await fast.flush()
        async with client.publisher(name, name="app", cls=rbs.PublisherBatchLimit) as limit:
            assert limit.message_id == 2504

            async def fill() -> None:
                for i in range(25):
                    await limit.batch(f"limit-{i}", max_len=10)

            filling = asyncio.create_task(fill())
            flushed = []
            while not filling.done() or limit._data:
                assert await until_async(lambda: len(limit._data) == 10 or filling.done(), 10)
                flushed.append(len(limit._data))
                await limit.flush()
            await filling
            assert flushed == [10, 10, 5]
        protocol = await client.get_protocol()
        assert await protocol.query_message_id("app", name) == 2528
        got = await take(client, name, rbs.Offset.FIRST, 2528)
    finally:
        await client.disconnect()
    assert [o for o, _ in got] == list(range(2528))
    expected = ["one-0", "one-1", "one-2", *big, *(f"limit-{i}" for i in range(25))]
    assert [b for _, b in got] == expected


async def test_explicit_publishing_ids_are_deduplicated(target, name):
    """A message context with its own publishing id (`stream_message_ctx(publish_id=)`):
    an id at or below the named publisher's newest is confirmed and not stored, and the
    publisher's next id follows the id it sent; an id further on is stored and becomes
    the publisher's sequence."""
    client = client_of(target)
    try:
        await client.create_stream(name)
        async with client.publisher(name, name="ids") as publisher:
            for i in range(5):
                await publisher.send(f"m{i}")  # ids 1..5
            await publisher.send(rbs.stream_message_ctx("again", publish_id=3))
            assert publisher.message_id == 4
            await publisher.send("also-again")  # id 4: stored already
            await publisher.send(rbs.stream_message_ctx("jump", publish_id=100))
            assert publisher.message_id == 101
            await publisher.send("after")
        protocol = await client.get_protocol()
        assert await protocol.query_message_id("ids", name) == 101
        assert await protocol.query_message_id("someone-else", name) == 0
        got = await take(client, name, rbs.Offset.FIRST, 7)
    finally:
        await client.disconnect()
    assert got == [(i, b) for i, b in enumerate(["m0", "m1", "m2", "m3", "m4", "jump", "after"])]


async def test_amqp_bodies_and_application_properties_come_back_as_sent(target, name):
    """Every AMQPBody type rbfly encodes, and application properties of every AMQPScalar
    type, read back with the stream protocol exactly as sent."""
    properties = {**MAPPED_PROPERTIES, "u": uuid.UUID(int=3), "sym": rbs.Symbol("y")}
    client = client_of(target)
    try:
        await client.create_stream(name)
        async with client.publisher(name) as publisher:
            for body in BODIES:
                await publisher.send(body)
            await publisher.send(rbs.stream_message_ctx("with", app_properties=properties))
        got = await contexts(client, name, rbs.Offset.FIRST, len(BODIES) + 1)
    finally:
        await client.disconnect()
    assert [c.stream_offset for c in got] == list(range(len(BODIES) + 1))
    assert [c.body for c in got[:-1]] == BODIES
    assert [type(c.body) for c in got[:-1]] == [type(b) for b in BODIES]  # True is not 1
    assert [c.app_properties for c in got[:-1]] == [{}] * len(BODIES)
    assert got[-1].body == "with"
    assert got[-1].app_properties == properties


async def test_a_stream_message_read_over_amqp_0_9_1(target, name):
    """A message rbfly published with a binary body and application properties reaches an
    AMQP 0-9-1 consumer as RabbitMQ 3.10.8 maps it: the body, each property a header of
    its type. (An amqp-value body, or a uuid or symbol application property, makes
    3.10.8 close the consumer's connection with 541; RoarMQ maps those as later versions
    do, docs/streams.md.)"""
    client = client_of(target)
    try:
        await client.create_stream(name)
        async with client.publisher(name) as publisher:
            await publisher.send(
                rbs.stream_message_ctx(b"payload", app_properties=MAPPED_PROPERTIES)
            )
            await publisher.send(b"plain")
    finally:
        await client.disconnect()
    connection = await aio_pika.connect(target.url)
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=2)
        queue = await channel.get_queue(name)
        seen = []
        async with queue.iterator(arguments={"x-stream-offset": "first"}) as it:
            async for message in it:
                seen.append(message)
                await message.ack()
                if len(seen) == 2:
                    break
    finally:
        await connection.close()
    assert [m.body for m in seen] == [b"payload", b"plain"]
    assert seen[0].headers == {
        **MAPPED_PROPERTIES,
        "bin": bytearray(b"\x01"),
        "ts": TS.replace(microsecond=0),  # an AMQP 0-9-1 timestamp is whole seconds
        "x-stream-offset": 0,
    }
    assert seen[1].headers == {"x-stream-offset": 1}
    assert [(m.content_type, m.type, m.message_id) for m in seen] == [(None, None, None)] * 2


async def test_an_amqp_0_9_1_message_read_with_its_sections(target, name):
    """rbfly's message context of a message published over AMQP 0-9-1: RabbitMQ 3.10.8's
    mapping (message annotations, the properties section, application properties; no
    header section), and the chunk's timestamp."""
    connection = await aio_pika.connect(target.url)
    try:
        channel = await connection.channel()
        await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "stream"})
        before = time.time()
        await channel.default_exchange.publish(
            aio_pika.Message(
                b"from-091",
                content_type="text/plain",
                content_encoding="gzip",
                message_id="id-1",
                correlation_id="c-1",
                reply_to="replies",
                user_id="guest",
                app_id="app",
                type="kind",
                expiration=60,
                priority=3,
                delivery_mode=2,
                timestamp=TS,
                headers={"app": "a", "n": 5, "f": 1.5, "b": True, "table": {"x": 1}},
            ),
            routing_key=name,
        )
    finally:
        await connection.close()
    client = client_of(target)
    try:
        [ctx] = await contexts(client, name, rbs.Offset.FIRST, 1)
    finally:
        await client.disconnect()
    assert (ctx.stream_offset, ctx.body) == (0, b"from-091")
    assert before - 5 < ctx.stream_timestamp < time.time() + 5
    header = ctx.header  # absent: AMQP 1.0's defaults
    assert (header.durable, header.priority, header.ttl, header.delivery_count) == (
        False,
        4,
        None,
        0,
    )
    assert ctx.delivery_annotations == {} and ctx.footer == {}
    assert ctx.annotations == {
        rbs.Symbol("x-routing-key"): name,
        rbs.Symbol("x-exchange"): "",
        rbs.Symbol("x-basic-priority"): 3,
        rbs.Symbol("x-basic-delivery-mode"): 2,
        rbs.Symbol("x-basic-expiration"): "60000",
    }
    p = ctx.properties
    assert (p.message_id, p.correlation_id, p.user_id, p.reply_to) == (
        "id-1",
        "c-1",
        b"guest",
        "replies",
    )
    assert (p.content_type, p.content_encoding) == (rbs.Symbol("text/plain"), rbs.Symbol("gzip"))
    assert p.creation_time == TS.replace(microsecond=0)  # AMQP 0-9-1's are whole seconds
    assert (p.to, p.subject, p.absolute_expiry_time, p.group_id) == (None, None, None, None)
    assert ctx.app_properties == {  # the table header is dropped, as 3.10.8 drops it
        "x-basic-type": "kind",
        "x-basic-app-id": "app",
        "app": "a",
        "n": 5,
        "f": 1.5,
        "b": True,
    }


async def test_each_offset_specification(target, name):
    """FIRST, LAST (the newest chunk: a batch flushed in one frame), NEXT (only what comes
    after the subscription; nothing at all within rbfly's `timeout`), an offset inside a
    chunk, and a timestamp between two publishes."""
    client = client_of(target)
    try:
        await client.create_stream(name)
        async with client.publisher(name) as one:
            for i in range(5):
                await one.send(f"one-{i}")
        confirmed = time.time()  # the five are stamped before this; the batch after `stamp`
        assert await until_async(lambda: time.time() > confirmed + 0.005, 5)
        stamp = time.time()
        assert await until_async(lambda: time.time() > stamp + 0.005, 5)
        async with client.publisher(name, cls=rbs.PublisherBatchFast) as batch:
            for i in range(10):
                batch.batch(f"batch-{i}")
            await batch.flush()
        batch_read = [(5 + i, f"batch-{i}") for i in range(10)]
        assert await take(client, name, rbs.Offset.FIRST, 15) == [
            *((i, f"one-{i}") for i in range(5)),
            *batch_read,
        ]
        assert await take(client, name, rbs.Offset.LAST, 10) == batch_read
        assert await take(client, name, rbs.Offset.offset(8), 7) == batch_read[3:]
        assert await take(client, name, rbs.Offset.timestamp(stamp), 10) == batch_read

        with pytest.raises(TimeoutError):  # rbfly's own timeout: NEXT has nothing to read
            await take(client, name, rbs.Offset.NEXT, 1, timeout=0.3)
        reading = asyncio.create_task(take(client, name, rbs.Offset.NEXT, 1))
        assert await until_async(lambda: subscribed(client), 5)
        async with client.publisher(name) as one:  # declared after: answered after it
            await one.send("next")
        assert await reading == [(15, "next")]
    finally:
        await client.disconnect()


async def test_each_message_carries_its_chunks_timestamp(target, name):
    """rbfly's `stream_timestamp` is the delivered chunk's timestamp. Three messages
    published a few milliseconds apart are three chunks, each stamped when written:
    read back from the first, each has a timestamp of its own, within its publish (a
    delivered chunk never spans stored chunks of different timestamps)."""
    client = client_of(target)
    windows = []
    try:
        await client.create_stream(name)
        async with client.publisher(name) as publisher:
            for i in range(3):
                before = time.time()
                await publisher.send(f"m{i}")
                windows.append((before, time.time()))
                assert await until_async(lambda: time.time() > windows[-1][1] + 0.005, 5)
        got = await contexts(client, name, rbs.Offset.FIRST, 3)
    finally:
        await client.disconnect()
    assert [c.body for c in got] == ["m0", "m1", "m2"]
    for ctx, (before, after) in zip(got, windows, strict=True):
        # chunk timestamps are whole milliseconds
        assert before - 0.001 <= ctx.stream_timestamp <= after + 0.001, (ctx, before, after)


async def test_write_offset_and_resuming_from_a_reference(target, name):
    """Offset.reference: a reference never stored reads from the first message (rbfly
    reads query-offset's `No offset` as 0), a stored one from the message after it;
    write_offset stores the offset given, or without one the last message read's."""
    client = client_of(target)
    try:
        await client.create_stream(name)
        async with client.publisher(name, cls=rbs.PublisherBatchFast) as batch:
            for i in range(20):
                batch.batch(f"m{i}")
            await batch.flush()
        messages = [(i, f"m{i}") for i in range(20)]
        assert await take(client, name, rbs.Offset.reference("reader"), 3) == messages[:3]
        await client.write_offset(name, "reader")  # the context's: offset 2
        assert await stored_offset(client, name, "reader", 2) == 2
        assert await take(client, name, rbs.Offset.reference("reader"), 5) == messages[3:8]
        await client.write_offset(name, "reader", 15)
        assert await stored_offset(client, name, "reader", 15) == 15
        assert await take(client, name, rbs.Offset.reference("reader"), 4) == messages[16:]
        assert await stored_offset(client, name, "other", 0, within=0) is None
    finally:
        await client.disconnect()


async def test_credit_holds_back_a_subscriber_that_stops_reading(target, name):
    """rbfly subscribes with 128 credits and returns one per chunk while fewer than 256
    messages wait in its queue. A subscriber that stops reading while messages are
    published one at a time (a chunk each, on both brokers) gets exactly 256 + 127 more,
    the broker holding the rest back, and reads everything, in order, once it reads again
    (its queue empty, it returns the credit)."""
    held = const.QUEUE_MAX_SIZE + const.INITIAL_CREDIT - 1
    total = 1 + held + 60
    client = client_of(target)
    try:
        await client.create_stream(name)
        messages = client.subscribe(name, offset=rbs.Offset.FIRST)
        async with client.publisher(name) as publisher:
            await publisher.send("m0")
            assert await asyncio.wait_for(anext(messages), 10) == "m0"
            [subscription] = (await client.get_protocol())._subscribers.values()
            queue = subscription.subscriber.queue  # what rbfly received and nobody read
            for i in range(1, total):
                await publisher.send(f"m{i}")
        assert await until_async(lambda: len(queue.data) >= held, 10), len(queue.data)
        assert len(queue.data) == held
        got = []
        async with asyncio.timeout(10):
            async for body in messages:
                got.append((rbs.get_message_ctx().stream_offset, body))
                if len(got) == total - 1:
                    break
        await messages.aclose()
    finally:
        await client.disconnect()
    assert got == [(i, f"m{i}") for i in range(1, total)]


async def test_binary_publishers_and_a_subscription_without_amqp_decoding(target, name):
    """PublisherBin and PublisherBinBatch send the application's bytes as they are (no AMQP
    1.0 encoding); subscribe(amqp=False) reads them back as those bytes."""
    raw = [b"\x00\xffnot amqp", b"", b"x" * 300, *(b"batch-%d" % i for i in range(5))]
    client = client_of(target)
    try:
        await client.create_stream(name)
        async with client.publisher(name, name="bin", cls=PublisherBin) as one:
            for body in raw[:3]:
                await one.send(body)
        async with client.publisher(name, name="bin", cls=PublisherBinBatch) as batch:
            for body in raw[3:]:
                batch.batch(body)
            await batch.flush()
        protocol = await client.get_protocol()
        assert await protocol.query_message_id("bin", name) == 8
        got = await take(client, name, rbs.Offset.FIRST, 8, amqp=False)
    finally:
        await client.disconnect()
    assert got == list(enumerate(raw))


async def test_create_delete_and_the_refusals_rbfly_raises(target, name, caplog):
    """create_stream of an existing stream: `Stream already exists`, which rbfly takes as
    done (and logs); delete_stream of a missing one: `Stream does not exist` (0x02, which
    rbfly raises: it lets only 0x06 pass); a stream deleted and created again starts
    empty. A wrong password or user: `Authentication failure` (0x08); a vhost that does
    not exist: `Virtual host access failure` (0x0c)."""
    caplog.set_level(logging.INFO, logger="rbfly")
    client = client_of(target)
    try:
        await client.create_stream(name)
        async with client.publisher(name) as publisher:
            await publisher.send("kept")
        await client.create_stream(name)
        assert f"rabbitmq stream exists: {name}" in caplog.messages
        assert await take(client, name, rbs.Offset.FIRST, 1) == [(0, "kept")]
        await client.delete_stream(name)
        with pytest.raises(ProtocolError) as refused:
            await client.delete_stream(name)
        assert refused.value.code == 0x02
        await client.create_stream(name)
        async with client.publisher(name) as publisher:
            await publisher.send("new")
        assert await take(client, name, rbs.Offset.FIRST, 1) == [(0, "new")]
    finally:
        await client.disconnect()
    assert not client.connected
    for options, code in (
        ({"password": "wrong"}, 0x08),
        ({"user": "nobody"}, 0x08),
        ({"vhost": "no-such-vhost"}, 0x0C),
    ):
        with pytest.raises(ProtocolError) as refused:
            await asyncio.wait_for(client_of(target, **options).create_stream(name), 10)
        assert refused.value.code == code, options


async def test_the_connection_decorator_closes_its_client(target, name):
    """`rbs.connection`: the client is connected on first use and disconnected (close,
    answered) when the decorated coroutine returns."""

    @rbs.connection
    async def publish(client: rbs.StreamsClient) -> int:
        await client.create_stream(name)
        async with client.publisher(name, name="decorated") as publisher:
            await publisher.send("one")
        return client.connected

    client = client_of(target)
    assert await asyncio.wait_for(publish(client), 10) is True
    assert not client.connected
    assert await asyncio.wait_for(publish(client), 10) is True  # connects again
    assert not client.connected
    reader = client_of(target)
    try:
        assert await take(reader, name, rbs.Offset.FIRST, 2) == [(0, "one"), (1, "one")]
    finally:
        await reader.disconnect()
