"""The stream protocol driven by rstream, unmodified, as an application written for
RabbitMQ's port 5552 drives it: create and delete, publish with confirms (one at a time,
batched, sub-entry batches), subscribe at each offset specification, deduplication of a
named publisher, server-side offsets, refusals with RabbitMQ's codes, and one stream read
and written over both protocols."""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid

import aio_pika
import pika
import pytest
from rstream import (
    AMQPMessage,
    ConsumerOffsetSpecification,
    FilterConfiguration,
    MessageContext,
    OffsetType,
    Producer,
    Properties,
    amqp_decoder,
    schema,
)
from rstream import exceptions as rex
from rstream.client import Client
from rstream.compression import CompressionType
from support.stream_clients import collect, consumer_of, producer_of

from roarmq.broker.core.auth import hash_password
from roarmq.broker.testing import ephemeral_config, running_broker
from roarmq.protocol.stream.amqp10 import Symbol, decode_message


async def test_publish_then_read_from_each_offset_spec(target, name):
    async with producer_of(target) as producer:
        await producer.create_stream(name)
        for i in range(10):
            await producer.send_wait(name, AMQPMessage(body=f"m{i}".encode()))
        await producer.send_batch(name, [AMQPMessage(body=f"b{i}".encode()) for i in range(90)])
    async with consumer_of(target) as consumer:
        first = await collect(consumer, name, ConsumerOffsetSpecification(OffsetType.FIRST), 100)
        assert [o for o, _ in first] == list(range(100))
        assert [b for _, b in first[:2]] == [b"m0", b"m1"]
        assert first[-1][1] == b"b89"
        at = await collect(consumer, name, ConsumerOffsetSpecification(OffsetType.OFFSET, 42), 58)
        assert [o for o, _ in at] == list(range(42, 100))
        # last: the newest chunk (the batch of 90 went in one loop turn)
        last = await collect(consumer, name, ConsumerOffsetSpecification(OffsetType.LAST), 1)
        assert last[0][0] >= 10


async def test_next_waits_for_new_messages_and_timestamp_finds_them(target, name):
    async with producer_of(target) as producer:
        await producer.create_stream(name)
        await producer.send_batch(name, [AMQPMessage(body=b"old")] * 5)
        await asyncio.sleep(0.05)
        stamp = int(time.time() * 1000)
        await asyncio.sleep(0.05)
        async with consumer_of(target) as consumer:
            got: list = []
            arrived = asyncio.Event()

            async def on_message(msg, ctx: MessageContext) -> None:
                got.append((ctx.offset, bytes(msg.body)))
                arrived.set()

            await consumer.subscribe(
                name,
                on_message,
                decoder=amqp_decoder,
                offset_specification=ConsumerOffsetSpecification(OffsetType.NEXT),
            )
            await asyncio.sleep(0.2)
            assert got == []
            await producer.send_wait(name, AMQPMessage(body=b"new"))
            await asyncio.wait_for(arrived.wait(), 5)
            assert got == [(5, b"new")]
        async with consumer_of(target) as consumer:
            since = await collect(
                consumer, name, ConsumerOffsetSpecification(OffsetType.TIMESTAMP, stamp), 1
            )
            assert since == [(5, b"new")]


async def test_sub_entry_batches_plain_and_gzip(target, name):
    async with producer_of(target) as producer:
        await producer.create_stream(name)
        confirmed = asyncio.Event()
        count = 0

        async def on_confirm(status) -> None:
            nonlocal count
            assert status.is_confirmed
            count += 1
            if count == 2:
                confirmed.set()

        for compression in (CompressionType.No, CompressionType.Gzip):
            await producer.send_sub_entry(
                name,
                [AMQPMessage(body=f"{compression.name}{i}".encode()) for i in range(20)],
                compression_type=compression,
                on_publish_confirm=on_confirm,
            )
        await asyncio.wait_for(confirmed.wait(), 10)
    async with consumer_of(target) as consumer:
        got = await collect(consumer, name, ConsumerOffsetSpecification(OffsetType.FIRST), 40)
        assert [b for _, b in got] == [f"No{i}".encode() for i in range(20)] + [
            f"Gzip{i}".encode() for i in range(20)
        ]


async def _raw_client(broker) -> Client:
    client = Client("127.0.0.1", broker.stream_port, frame_max=1 << 20, heartbeat=60)
    await client.start()
    await client.authenticate(vhost="/", username="guest", password="guest")
    return client


async def _publish_raw(client: Client, publisher: int, ids) -> None:
    await client.send_frame(
        schema.Publish(
            publisher_id=publisher,
            messages=[
                schema.Message(i, None, bytes(AMQPMessage(body=str(i).encode()))) for i in ids
            ],
        ),
    )


async def test_a_named_publisher_is_deduplicated(target, name):
    """Publishing ids at or below the newest a named publisher stored are confirmed and
    not stored again; query-publisher-sequence answers that newest id (0 for a name the
    stream never saw)."""
    client = await _raw_client(target)
    await client.create_stream(name)
    await client.declare_publisher(name, "app-1", 1)
    confirms: list[int] = []

    async def on_confirm(frame: schema.PublishConfirm) -> None:
        confirms.extend(frame.publishing_ids)

    client.add_handler(schema.PublishConfirm, on_confirm)
    await _publish_raw(client, 1, range(1, 11))
    for _ in range(100):
        if len(confirms) >= 10:
            break
        await asyncio.sleep(0.05)
    await _publish_raw(client, 1, range(5, 16))  # 5..10 again: confirmed, not stored
    for _ in range(100):
        if len(confirms) >= 21:
            break
        await asyncio.sleep(0.05)
    assert sorted(confirms) == sorted([*range(1, 11), *range(5, 16)])
    assert await client.query_publisher_sequence(name, "app-1") == 15
    assert await client.query_publisher_sequence(name, "someone-else") == 0
    await client.close()
    async with consumer_of(target) as consumer:
        got = await collect(consumer, name, ConsumerOffsetSpecification(OffsetType.FIRST), 15)
        assert [b for _, b in got] == [str(i).encode() for i in range(1, 16)]


async def test_a_publishers_sequence_and_stored_offsets_survive_a_restart(tmp_path):
    """Both are rebuilt from the stream's own files: the publisher's from its records, the
    offsets from the stream's offsets file."""
    config = ephemeral_config(data_dir=str(tmp_path / "data"))
    async with running_broker(config) as broker:
        client = await _raw_client(broker)
        await client.create_stream("kept")
        await client.declare_publisher("kept", "app-1", 1)
        await _publish_raw(client, 1, range(1, 8))
        for _ in range(100):
            if await client.query_publisher_sequence("kept", "app-1") == 7:
                break
            await asyncio.sleep(0.05)
        await client.store_offset("kept", "reader", 4)
        await client.close()
        await asyncio.sleep(0.3)  # store-offset has no answer
    async with running_broker(config) as broker:
        client = await _raw_client(broker)
        assert await client.query_publisher_sequence("kept", "app-1") == 7
        assert await client.query_offset("kept", "reader") == 4
        await client.close()


async def test_stored_offsets_are_queried_back(target, name):
    async with producer_of(target) as producer:
        await producer.create_stream(name)
        await producer.send_batch(name, [AMQPMessage(body=b"x")] * 10)
    async with consumer_of(target) as consumer:
        with pytest.raises(rex.OffsetNotFound):
            await consumer.query_offset(name, "reader")
        await consumer.store_offset(name, "reader", 7)
        for _ in range(50):
            try:
                if await consumer.query_offset(name, "reader") == 7:
                    break
            except rex.OffsetNotFound:
                pass
            await asyncio.sleep(0.02)
        assert await consumer.query_offset(name, "reader") == 7


async def test_refusals_carry_rabbitmqs_codes(target, name):
    async with producer_of(target) as producer:
        await producer.create_stream(name)
        with pytest.raises(rex.StreamAlreadyExists):
            await producer.create_stream(name)
        with pytest.raises(rex.StreamDoesNotExist):
            await producer.delete_stream(name + "-missing")
    with pytest.raises(rex.AuthenticationFailure):
        async with producer_of(target, password="wrong"):
            pass
    with pytest.raises(rex.VirtualHostAccessFailure):
        async with producer_of(target, vhost="no-such-vhost"):
            pass


async def test_a_bad_argument_and_a_user_without_permissions_are_refused(broker):
    """A create argument of the wrong type: precondition failed (RabbitMQ 3.11+'s answer;
    3.10.8 never answers that create). A user without permissions: access refused."""
    broker.broker.put_user("nobody", hash_password("pw"), ())
    broker.broker.set_permission("nobody", "/", "^$", "^$", "^$")
    async with producer_of(broker) as producer:
        await producer.create_stream("taken")
        with pytest.raises(rex.PreconditionFailed):
            await producer.create_stream("bad", arguments={"max-length-bytes": "lots"})
    client = Client("127.0.0.1", broker.stream_port, frame_max=1 << 20, heartbeat=60)
    await client.start()
    await client.authenticate(vhost="/", username="nobody", password="pw")
    with pytest.raises(rex.AccessRefused):
        await client.create_stream("mine")
    with pytest.raises(rex.AccessRefused):
        await client.declare_publisher("taken", "p", 1)
    await client.close()


async def test_amqp_0_9_1_and_the_stream_protocol_read_each_others_messages(target, name):
    connection = await aio_pika.connect(target.url)
    channel = await connection.channel()
    await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "stream"})
    await channel.default_exchange.publish(
        aio_pika.Message(
            b"from-091",
            content_type="text/plain",
            message_id="id-1",
            correlation_id="c-1",
            delivery_mode=2,
            timestamp=datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC),
            headers={"app": "a", "n": 5, "x-trace": "t"},
        ),
        routing_key=name,
    )
    async with producer_of(target) as producer:
        await producer.send_wait(
            name,
            AMQPMessage(
                body=b"from-stream",
                application_properties={"kind": "k"},
            ),
        )
    async with consumer_of(target) as consumer:
        raw = await collect(
            consumer, name, ConsumerOffsetSpecification(OffsetType.FIRST), 2, decoder=bytes
        )
    first = decode_message(raw[0][1])  # RabbitMQ 3.10.8's mapping, on both
    assert first.data() == b"from-091"
    assert first.header is None
    assert first.properties == {
        "message_id": "id-1",
        "correlation_id": "c-1",
        "content_type": Symbol("text/plain"),
        "creation_time": 1767312000000,
    }
    assert first.message_annotations == {
        "x-routing-key": name,
        "x-exchange": "",
        "x-basic-delivery-mode": 2,
        "x-basic-priority": 0,  # (aio-pika sends priority 0)
    }
    assert first.application_properties == {"app": "a", "n": 5, "x-trace": "t"}
    assert decode_message(raw[1][1]).data() == b"from-stream"

    await channel.set_qos(prefetch_count=10)
    queue = await channel.get_queue(name)
    got = []
    async with queue.iterator(arguments={"x-stream-offset": "first"}) as it:
        async for message in it:
            got.append(message)
            await message.ack()
            if len(got) == 2:
                break
    assert got[0].body == b"from-091" and got[0].headers["app"] == "a"
    assert got[1].body == b"from-stream"
    assert got[1].headers["kind"] == "k"
    assert got[1].headers["x-stream-offset"] == 1
    await connection.close()


async def test_a_stream_deleted_over_amqp_sends_a_metadata_update(target, name):
    async with producer_of(target) as producer:
        await producer.create_stream(name)
        await producer.send_wait(name, AMQPMessage(body=b"x"))
    client = await _raw_client(target)
    updates: list[tuple[int, str]] = []
    updated = asyncio.Event()

    async def on_update(frame: schema.MetadataUpdate) -> None:
        updates.append((frame.metadata_info.code, frame.metadata_info.stream))
        updated.set()

    client.add_handler(schema.MetadataUpdate, on_update)
    await client.declare_publisher(name, "", 3)
    connection = await aio_pika.connect(target.url)
    channel = await connection.channel()
    await channel.queue_delete(name)
    await asyncio.wait_for(updated.wait(), 5)
    assert updates == [(0x06, name)]  # stream not available
    await connection.close()
    await client.close()


async def test_a_stream_read_no_more_sends_no_metadata_update_when_deleted(target, name):
    """Unsubscribed (or its publisher deleted), a connection no longer hears of the stream;
    one still publishing to it does."""
    async with producer_of(target) as producer:
        await producer.create_stream(name)
        await producer.send_wait(name, AMQPMessage(body=b"x"))
    quiet, still = await _raw_client(target), await _raw_client(target)
    updates: dict[str, list[str]] = {"quiet": [], "still": []}
    updated = asyncio.Event()

    def recorder(who: str):
        async def on_update(frame: schema.MetadataUpdate) -> None:
            updates[who].append(frame.metadata_info.stream)
            updated.set()

        return on_update

    quiet.add_handler(schema.MetadataUpdate, recorder("quiet"))
    still.add_handler(schema.MetadataUpdate, recorder("still"))
    await quiet.declare_publisher(name, "", 2)
    await quiet.delete_publisher(2)
    await quiet.subscribe(name, subscription_id=1, offset_spec=schema.OffsetSpec(OffsetType.NEXT))
    await quiet.unsubscribe(1)
    await still.declare_publisher(name, "", 3)
    connection = await aio_pika.connect(target.url)
    channel = await connection.channel()
    await channel.queue_delete(name)
    await asyncio.wait_for(updated.wait(), 5)
    assert await quiet.stream_exists(name) is False  # a round trip after the deletion
    assert updates == {"quiet": [], "still": [name]}
    await connection.close()
    await quiet.close()
    await still.close()


async def test_credit_is_counted_in_chunks(target, name):
    async with producer_of(target) as producer:
        await producer.create_stream(name)
        for _ in range(40):  # forty publish batches: more than five chunks
            await producer.send_batch(name, [AMQPMessage(body=b"m")] * 3000)
    client = await _raw_client(target)
    chunks: list[int] = []

    async def on_deliver(frame: schema.Deliver) -> None:
        chunks.append(frame.num_entries)

    client.add_handler(schema.Deliver, on_deliver, name="1")  # rstream: by subscription id
    await client.run_queue_listener_task(1, on_deliver)
    await client.subscribe(
        name,
        subscription_id=1,
        offset_spec=schema.OffsetSpec(OffsetType.FIRST),
        initial_credit=2,
    )
    await asyncio.sleep(0.3)
    assert len(chunks) == 2  # one chunk a credit
    await client.credit(1, 3)
    await asyncio.sleep(0.3)
    assert len(chunks) == 5
    assert sum(chunks) < 40 * 3000  # credit held the rest back
    await client.close()


async def _region(message: AMQPMessage) -> str:
    return message.application_properties["region"]


async def test_filter_values_sent_with_messages_filter_on_the_broker(broker):
    """Publish version 2 carries a filter value per message (RabbitMQ 3.13); a subscription
    with `filter.N` properties gets exactly the messages with one of its values (no
    predicate: the broker's filter is exact), and AMQP 0-9-1 consumers filter on the same
    values."""
    producer = Producer(
        "127.0.0.1",
        port=broker.stream_port,
        username="guest",
        password="guest",
        filter_value_extractor=_region,
    )
    await producer.start()
    await producer.create_stream("regions")
    for i in range(30):
        region = ("emea", "apac", "amer")[i % 3]
        await producer.send_wait(
            "regions", AMQPMessage(body=b"%d" % i, application_properties={"region": region})
        )
    await producer.close()
    async with consumer_of(broker) as consumer:
        got: list[int] = []
        done = asyncio.Event()

        async def on_message(message, context: MessageContext) -> None:
            got.append(context.offset)
            if len(got) == 10:
                done.set()

        await consumer.subscribe(
            "regions",
            on_message,
            decoder=amqp_decoder,
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
            filter_input=FilterConfiguration(values_to_filter=["apac"]),
        )
        await asyncio.wait_for(done.wait(), 10)
        await asyncio.sleep(0.2)
    assert got == list(range(1, 30, 3))

    connection = await aio_pika.connect(broker.url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=50)
    queue = await channel.get_queue("regions")
    offsets = []
    args = {"x-stream-offset": "first", "x-stream-filter": "apac"}
    async with queue.iterator(arguments=args) as it:
        async for message in it:
            offsets.append(message.headers["x-stream-offset"])
            await message.ack()
            if len(offsets) == 10:
                break
    assert offsets == list(range(1, 30, 3))
    await connection.close()


async def test_batches_read_back_from_disk_over_both_protocols_and_after_a_restart(tmp_path):
    """A publish frame is one batch record: 20 frames of 1,000 messages over segments of
    200 KB (well past what the stream keeps in memory) read back from an offset inside a
    batch over the stream protocol and from the first over AMQP 0-9-1, then again after a
    restart (segments taken from their summaries)."""
    config = ephemeral_config(data_dir=str(tmp_path / "data"))
    bodies = [b"message %05d" % i for i in range(20_000)]
    async with running_broker(config) as broker:
        client = await _raw_client(broker)
        await client.create_stream("batches", {"stream-max-segment-size-bytes": 200_000})
        await client.declare_publisher("batches", "", 1)
        for k in range(20):
            frame = [
                schema.Message(i + 1, None, bytes(AMQPMessage(body=bodies[i])))
                for i in range(1000 * k, 1000 * (k + 1))
            ]
            await client.send_frame(schema.Publish(publisher_id=1, messages=frame))
        for _ in range(200):
            if broker.broker.vhosts["/"].queues["batches"].message_count() == 20_000:
                break
            await asyncio.sleep(0.05)
        await client.close()
        stream = broker.broker.vhosts["/"].queues["batches"]
        assert len(stream.segs) >= 3
        await _check_batches(broker, bodies)
    async with running_broker(config) as broker:
        await _check_batches(broker, bodies)


async def _check_batches(broker, bodies: list[bytes]) -> None:
    async with consumer_of(broker) as consumer:
        got = await collect(
            consumer, "batches", ConsumerOffsetSpecification(OffsetType.OFFSET, 1234), 18_766
        )
    assert [o for o, _ in got] == list(range(1234, 20_000))
    assert [b for _, b in got] == bodies[1234:]
    connection = await aio_pika.connect(broker.url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=10)  # no more than it reads: a stream refuses nacks
    queue = await channel.get_queue("batches")
    seen = []
    ten = asyncio.Event()

    async def on_message(message) -> None:
        seen.append((message.headers["x-stream-offset"], message.body))
        if len(seen) == 10:
            ten.set()

    # no ack, no cancel: the connection's close ends it (a stream answers a nack with 540)
    await queue.consume(on_message, arguments={"x-stream-offset": 2_495})
    await asyncio.wait_for(ten.wait(), 10)
    assert seen == [(i, bodies[i]) for i in range(2_495, 2_505)]  # across two batches, on disk
    await connection.close()


async def test_typed_message_ids_read_over_amqp_0_9_1(target, name):
    """An AMQP 1.0 message-id or correlation-id that is not a string reaches an AMQP 0-9-1
    consumer as a string with its type in `x-message-id-type` / `x-correlation-id-type`
    (uuid, ulong, binary as base64), as RabbitMQ maps it."""
    uid = uuid.UUID("12345678-1234-5678-1234-567812345678")
    async with producer_of(target) as producer:
        await producer.create_stream(name)
        for body, mid, cid in ((b"u", uid, 7), (b"b", b"\x01\x02", "c"), (b"n", 42, None)):
            props = Properties(message_id=mid, correlation_id=cid)
            await producer.send_wait(name, AMQPMessage(body=body, properties=props))
    connection = await aio_pika.connect(target.url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=3)
    queue = await channel.get_queue(name)
    seen = []
    three = asyncio.Event()

    async def on_message(message) -> None:
        headers = {k: v for k, v in message.headers.items() if k != "x-stream-offset"}
        seen.append((message.body, message.message_id, message.correlation_id, headers))
        if len(seen) == 3:
            three.set()

    await queue.consume(on_message, arguments={"x-stream-offset": "first"})
    await asyncio.wait_for(three.wait(), 10)
    await connection.close()
    assert seen == [
        (b"u", str(uid), "7", {"x-message-id-type": "uuid", "x-correlation-id-type": "ulong"}),
        (b"b", "AQI=", "c", {"x-message-id-type": "binary"}),
        (b"n", "42", None, {"x-message-id-type": "ulong"}),
    ]


async def test_connection_limits_count_both_protocols(broker):
    """A vhost's max-connections counts AMQP and stream connections together (open answers
    `Virtual host access failure` past it), and so does a user's."""
    broker.broker.set_limit("vhost", "/", "max-connections", 1)
    connection = await aio_pika.connect(broker.url)
    with pytest.raises(rex.VirtualHostAccessFailure):
        async with producer_of(broker):
            pass
    await connection.close()
    async with producer_of(broker):
        loop = asyncio.get_running_loop()
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError, match="connection limit"):
            await loop.run_in_executor(
                None, pika.BlockingConnection, pika.URLParameters(broker.url)
            )


async def test_a_permission_change_reaches_open_stream_connections(broker):
    broker.broker.put_user("changing", hash_password("pw"), ())
    broker.broker.set_permission("changing", "/", ".*", ".*", ".*")
    client = Client("127.0.0.1", broker.stream_port, frame_max=1 << 20, heartbeat=60)
    await client.start()
    await client.authenticate(vhost="/", username="changing", password="pw")
    await client.create_stream("guarded")
    broker.broker.set_permission("changing", "/", ".*", "^$", ".*")  # no more writing
    with pytest.raises(rex.AccessRefused):
        await client.declare_publisher("guarded", "p", 1)
    await client.close()


async def test_a_resource_alarm_stops_reading_publishers_until_it_clears(broker):
    """As over AMQP: a publisher's connection is not read while an alarm is set (what it
    sent waits, unconfirmed), and is read again, and confirmed, once it clears."""
    client = await _raw_client(broker)
    await client.create_stream("alarmed")
    await client.declare_publisher("alarmed", "", 1)
    confirms: list[int] = []

    async def on_confirm(frame: schema.PublishConfirm) -> None:
        confirms.extend(frame.publishing_ids)

    client.add_handler(schema.PublishConfirm, on_confirm)
    # (the fenced-cluster alarm: the resource monitor's sampling does not clear it)
    broker.broker.set_cluster_fenced(True)
    await _publish_raw(client, 1, range(1, 4))  # read (then the connection is paused)
    await asyncio.sleep(0.3)
    await _publish_raw(client, 1, range(4, 7))  # waits in the socket
    await asyncio.sleep(0.5)
    assert sorted(confirms) == [1, 2, 3]
    broker.broker.set_cluster_fenced(False)
    for _ in range(100):
        if len(confirms) == 6:
            break
        await asyncio.sleep(0.02)
    assert sorted(confirms) == [1, 2, 3, 4, 5, 6]
    await client.close()
