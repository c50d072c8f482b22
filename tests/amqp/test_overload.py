"""Overload: a fast publisher, a client that never reads, and inputs that grow loops.

Functional, not timed: each test checks what the broker's own counters say
(queue lengths, flow-control reasons, the resident memory the kernel reports)
rather than how long something took.
"""

from __future__ import annotations

import asyncio

import pytest
from support.broker_process import BrokerProcess
from support.process import process_rss
from support.rawclient import RawClient

from roarmq.broker.amqp.flow import WRITE_HIGH, WRITES
from roarmq.broker.core.queue import FLOW_HIGH, Queue
from roarmq.broker.ops.alarms import resident_bytes
from roarmq.protocol import spec
from roarmq.protocol.frames import ContentMessage, encode_content, encode_method
from roarmq.protocol.properties import BasicProperties

# slow (load until the broker pushes back): `make check` leaves it out
pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def _publishes(queue: str, body: bytes, count: int, frame_max: int) -> bytes:
    one = encode_content(
        1, spec.BasicPublish(exchange="", routing_key=queue), BasicProperties(), body, frame_max
    )
    return one * count


async def _with_queue(port: int, queue: str, **declare: bool) -> RawClient:
    """A client with channel 1 open and `queue` declared."""
    client = await RawClient.connect(port)
    await client.open_channel(1)
    client.send(1, spec.QueueDeclare(queue=queue, **declare))
    await client.expect(spec.QueueDeclareOk)
    return client


def _server_side(broker, client: RawClient):
    """The broker's Connection for one of our clients."""
    port = client.writer.get_extra_info("sockname")[1]
    return next(c for c in broker.broker.connections if c.peer and c.peer[1] == port)


async def test_manual_ack_consumer_is_served_while_a_publisher_floods(broker):
    """One basic.ack per message at prefetch 100 keeps up; the publisher is held back instead."""
    total = 40_000
    consumer = await _with_queue(broker.port, "wq")
    consumer.send(1, spec.BasicQos(prefetch_count=100))
    await consumer.expect(spec.BasicQosOk)
    consumer.send(1, spec.BasicConsume(queue="wq", consumer_tag="worker"))
    await consumer.expect(spec.BasicConsumeOk)

    pub = await RawClient.connect(broker.port)
    await pub.open_channel(1)
    chunk = _publishes("wq", b"m" * 16, 1000, pub.frame_max)
    queue: Queue = broker.broker.vhosts["/"].queues["wq"]
    pub_conn = _server_side(broker, pub)
    held_by_queue = False
    most_ready = 0

    async def flood() -> None:
        for _ in range(total // 1000):
            pub.write(chunk)
            await pub.writer.drain()

    flooding = asyncio.create_task(flood())
    received = 0
    while received < total:
        ev = await consumer.next_frame(timeout=20)
        if not isinstance(ev, ContentMessage):
            continue
        received += 1
        consumer.send(1, spec.BasicAck(delivery_tag=ev.method.delivery_tag))
        most_ready = max(most_ready, queue.message_count())
        held_by_queue = held_by_queue or queue in pub_conn.flow.reasons
    await flooding
    assert received == total
    assert held_by_queue, "the publisher was paused by the queue's flow state"
    # The backlog is bounded by the flow state, not by how fast the publisher can write.
    assert most_ready < FLOW_HIGH + 3000
    await pub.close()
    await consumer.close()


async def test_pipelined_get_and_recover_of_a_big_message_stop_reading_the_client(broker):
    """A client that asks for 1 MiB replies and never reads them is not read either."""
    big = b"B" * (1024 * 1024)
    setup = await _with_queue(broker.port, "big")
    setup.publish(1, "", "big", big)
    setup.send(1, spec.QueueDeclare(queue="big", passive=True))
    assert (await setup.expect(spec.QueueDeclareOk)).message_count == 1

    before = resident_bytes()
    hog = await RawClient.connect(broker.port)
    await hog.open_channel(1)
    pair = encode_method(1, spec.BasicGet(queue="big")) + encode_method(
        1, spec.BasicRecover(requeue=True)
    )
    hog.write(pair * 2200)  # ~73 KB of requests asking for ~2.2 GB of replies
    await asyncio.sleep(0.5)
    conn = _server_side(broker, hog)
    assert WRITES in conn.flow.reasons, "the hog is not read while its replies are unread"
    assert conn.transport.get_write_buffer_size() <= WRITE_HIGH + 2 * len(big) + 300_000
    assert resident_bytes() - before < 100 * 1024 * 1024

    # Everyone else is served meanwhile.
    setup.send(1, spec.QueueDeclare(queue="other"))
    await setup.expect(spec.QueueDeclareOk)
    setup.publish(1, "", "other", b"hello")
    setup.send(1, spec.BasicGet(queue="other", no_ack=True))
    assert isinstance(await setup.expect(spec.BasicGetOk), spec.BasicGetOk)
    await hog.close()
    await setup.close()


async def test_ascending_nacks_of_20000_messages_interleave_with_other_clients(broker):
    """Requeue one by one in ascending tag order: linear work, handed out in slices."""
    n = 20_000
    c = await _with_queue(broker.port, "nq")
    c.write(_publishes("nq", b"n", n, c.frame_max))
    c.send(1, spec.QueueDeclare(queue="nq", passive=True))
    assert (await c.expect(spec.QueueDeclareOk, timeout=30)).message_count == n
    c.write(encode_method(1, spec.BasicGet(queue="nq")) * n)
    for _ in range(n):
        ev = await c.next_frame(timeout=30)
        assert isinstance(ev, ContentMessage) and isinstance(ev.method, spec.BasicGetOk)

    probe = await RawClient.connect(broker.port)
    await probe.open_channel(1)
    c.write(
        b"".join(
            encode_method(1, spec.BasicNack(delivery_tag=t, multiple=False, requeue=True))
            for t in range(1, n + 1)
        )
    )
    probe.send(1, spec.QueueDeclare(queue="nq", passive=True))
    seen = (await probe.expect(spec.QueueDeclareOk, timeout=30)).message_count
    # Frames are handled READ_BUDGET at a time, so the probe is answered after a few slices,
    # not after the whole 256 KiB read (~12,000 nacks) that holds it up otherwise.
    assert seen < n // 4, f"the probe waited for {seen} nacks"

    c.send(1, spec.QueueDeclare(queue="nq", passive=True))
    assert (await c.expect(spec.QueueDeclareOk, timeout=60)).message_count == n
    # Requeued in their original order, marked redelivered.
    c.write(encode_method(1, spec.BasicGet(queue="nq", no_ack=True)) * 3)
    tags = []
    for _ in range(3):
        ev = await c.next_frame(timeout=10)
        assert ev.method.redelivered
        tags.append(ev.method.delivery_tag)
    assert tags == sorted(tags)
    await probe.close()
    await c.close()


async def test_binds_against_a_full_cache_of_long_keys_flush_instead_of_scanning(broker):
    """10,000 cached 121-word keys, then 20 `#.zzN.#` binds: the cache is flushed, not scanned."""
    c = await RawClient.connect(broker.port)
    await c.open_channel(1)
    c.send(1, spec.ExchangeDeclare(exchange="t", type="topic"))
    await c.expect(spec.ExchangeDeclareOk)
    c.send(1, spec.QueueDeclare(queue="tq", exclusive=True))
    await c.expect(spec.QueueDeclareOk)
    c.send(1, spec.QueueBind(queue="tq", exchange="t", routing_key="k.#"))
    await c.expect(spec.QueueBindOk)
    words = ".".join("abcdefghij"[j % 10] for j in range(119))
    frames = b"".join(
        encode_content(
            1,
            spec.BasicPublish(exchange="t", routing_key=f"k.{i:x}.{words}"),
            BasicProperties(),
            b"",
            c.frame_max,
        )
        for i in range(10_000)
    )
    c.write(frames)
    c.send(1, spec.QueueDeclare(queue="tq", passive=True))
    assert (await c.expect(spec.QueueDeclareOk, timeout=30)).message_count == 10_000
    index = broker.broker.vhosts["/"].exchanges["t"].index
    assert index.cached_keys() == 10_000
    for n in range(20):
        c.send(1, spec.QueueBind(queue="tq", exchange="t", routing_key=f"#.zz{n}.#"))
    for _ in range(20):
        await c.expect(spec.QueueBindOk, timeout=30)
    assert index.cached_keys() == 0
    c.publish(1, "t", "a.zz7.b", b"x")
    c.send(1, spec.QueueDeclare(queue="tq", passive=True))
    assert (await c.expect(spec.QueueDeclareOk)).message_count == 10_001
    await c.close()


def test_a_queue_of_a_million_small_messages_stays_small(tmp_path):
    """1M queued 16-byte messages cost under 100 bytes each of the broker's resident memory."""
    broker = BrokerProcess(tmp_path / "data", log_level="notice").start()
    try:
        before = process_rss(broker.pid)
        n = 1_000_000
        asyncio.run(_publish_million(broker.port, n))
        after = process_rss(broker.pid)
        assert (after - before) / n < 100, f"{(after - before) / n:.0f} bytes per message"
    finally:
        broker.stop(grace=30)


async def _publish_million(port: int, n: int) -> None:
    c = await _with_queue(port, "million")
    chunk = _publishes("million", bytes(16), 10_000, c.frame_max)
    for _ in range(n // 10_000):
        c.write(chunk)
        await c.writer.drain()
    c.send(1, spec.QueueDeclare(queue="million", passive=True))
    assert (await c.expect(spec.QueueDeclareOk, timeout=60)).message_count == n
    await c.close()


async def test_recover_gives_the_consumer_its_credit_back(broker):
    """basic.recover(requeue) at prefetch 1: the message comes back, redelivered."""
    c = await _with_queue(broker.port, "rq", exclusive=True)
    c.send(1, spec.BasicQos(prefetch_count=1))
    await c.expect(spec.BasicQosOk)
    c.publish(1, "", "rq", b"one")
    c.send(1, spec.BasicConsume(queue="rq", consumer_tag="c"))
    await c.expect(spec.BasicConsumeOk)
    first = await c.next_frame()
    assert isinstance(first, ContentMessage) and not first.method.redelivered
    c.send(1, spec.BasicRecover(requeue=True))
    got = []
    while len(got) < 2:
        ev = await c.next_frame()
        got.append(ev if isinstance(ev, ContentMessage) else ev.method)
    again = next(e for e in got if isinstance(e, ContentMessage))
    assert again.method.redelivered and again.body == b"one"
    assert any(isinstance(e, spec.BasicRecoverOk) for e in got)
    await c.close()


async def test_closing_a_channel_with_many_unacked_requeues_them_in_slices(broker):
    """100,000 unacked messages go back to the queue a slice per loop turn, all of them."""
    from roarmq.broker.amqp.channel import REQUEUE_SLICE

    n = 100_000
    c = await _with_queue(broker.port, "uq")
    c.write(_publishes("uq", b"u", n, c.frame_max))
    c.send(1, spec.BasicConsume(queue="uq", consumer_tag="greedy"))  # prefetch 0: unlimited
    await c.expect(spec.BasicConsumeOk, timeout=30)
    received = 0
    while received < n:
        if isinstance(await c.next_frame(timeout=30), ContentMessage):
            received += 1
    queue = broker.broker.vhosts["/"].queues["uq"]
    assert queue.message_count() == 0 and queue.unacked == n
    c.send(1, spec.ChannelClose(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    await c.expect(spec.ChannelCloseOk)
    assert queue.message_count() < n  # the first slices only: the loop was let go
    assert REQUEUE_SLICE < n
    for _ in range(200):
        if queue.message_count() == n:
            break
        await asyncio.sleep(0.01)
    assert queue.message_count() == n and queue.unacked == 0
    probe = await RawClient.connect(broker.port)
    await probe.open_channel(1)
    probe.send(1, spec.BasicGet(queue="uq", no_ack=True))
    first = await probe.next_frame()
    assert first.method.redelivered and first.method.message_count == n - 1
    await probe.close()
    await c.close()
