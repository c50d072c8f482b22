"""Back-pressure and fairness: slow consumers, fast publishers, and whole messages on the wire."""

from __future__ import annotations

import asyncio

import pytest
from support.rawclient import RawClient

from roarmq.broker.amqp.connection import FLUSH_THRESHOLD
from roarmq.broker.amqp.flow import WRITE_HIGH
from roarmq.broker.testing import ephemeral_config, running_broker
from roarmq.protocol import spec
from roarmq.protocol.frames import ContentMessage

pytestmark = pytest.mark.timeout(60)


async def test_slow_consumer_does_not_slow_others_or_grow_buffers(broker):
    """A consumer that never reads its socket stops getting deliveries; the other keeps going."""
    body = b"x" * 4096
    stuck = await RawClient.connect(broker.port)
    await stuck.open_channel(1)
    stuck.send(1, spec.QueueDeclare(queue="slow-q"))
    await stuck.expect(spec.QueueDeclareOk)
    stuck.send(1, spec.BasicConsume(queue="slow-q", consumer_tag="stuck", no_ack=True))
    await stuck.expect(spec.BasicConsumeOk)
    # From here on `stuck` never reads again.

    fast = await RawClient.connect(broker.port)
    await fast.open_channel(1)
    fast.send(1, spec.QueueDeclare(queue="fast-q"))
    await fast.expect(spec.QueueDeclareOk)
    fast.send(1, spec.BasicConsume(queue="fast-q", consumer_tag="fast", no_ack=True))
    await fast.expect(spec.BasicConsumeOk)

    pub = await RawClient.connect(broker.port)
    await pub.open_channel(1)
    n = 3000  # 12 MB to the stuck consumer: far more than any socket buffer holds
    for i in range(n):
        pub.publish(1, "", "slow-q", body)
        pub.publish(1, "", "fast-q", body)
        if i % 200 == 0:
            await pub.writer.drain()
    await pub.writer.drain()

    received = 0
    while received < n:
        frame = await fast.next_frame(timeout=10)
        if isinstance(frame, ContentMessage):
            received += 1
    assert received == n

    vhost = broker.broker.vhosts["/"]
    slow_q = vhost.queues["slow-q"]
    assert slow_q.message_count() > 0, "the stuck consumer must not have been handed everything"
    conn = next(
        c
        for c in broker.broker.connections
        if "stuck" in next(iter(ch.consumers for ch in c.channels.values()), {})
    )
    assert not conn.writable
    buffered = conn.transport.get_write_buffer_size()
    assert buffered <= WRITE_HIGH + FLUSH_THRESHOLD + len(body) + 1024
    for c in (stuck, fast, pub):
        await c.close()


async def test_memory_alarm_fires_on_resident_memory_and_clears_when_drained(tmp_path):
    """The alarm watches the process's RSS: it blocks publishers, consumers drain, it clears."""
    from roarmq.broker.ops.alarms import resident_bytes

    high = resident_bytes() + 48 * 1024 * 1024  # this process already holds pytest and more
    cfg = ephemeral_config(data_dir=str(tmp_path), memory={"high_watermark": high})
    async with running_broker(cfg) as b:
        assert b.broker.resources.high == high
        pub = await RawClient.connect(b.port)
        await pub.open_channel(1)
        pub.send(1, spec.QueueDeclare(queue="fill"))
        await pub.expect(spec.QueueDeclareOk)
        body = b"y" * 65536
        blocked = False
        for _i in range(3000):  # 196 MB offered, four times the headroom
            pub.publish(1, "", "fill", body)
            try:
                await asyncio.wait_for(pub.writer.drain(), 0.5)
            except TimeoutError:
                break  # the broker stopped reading us: our socket is full
            while pub.reader._buffer:  # noqa: SLF001 - peek at what the broker sent
                ev = await pub.next_method(timeout=1)
                if isinstance(ev, spec.ConnectionBlocked):
                    blocked = True
        if not blocked:
            ev = await pub.next_method(timeout=5)
            blocked = isinstance(ev, spec.ConnectionBlocked)
        assert blocked, "a client announcing connection.blocked is told when it is blocked"
        assert b.broker.blocked and "memory" in b.broker.alarms
        # Bounded: resident memory stays within 10% over the watermark.
        await asyncio.sleep(0.3)
        assert resident_bytes() <= high * 1.1
        held = b.broker.vhosts["/"].queues["fill"].message_count()
        assert 0 < held < 3000

        # A consumer (a connection that does not publish) is still served while blocked.
        consumer = await RawClient.connect(b.port, capabilities={"connection.blocked": False})
        await consumer.open_channel(1)
        consumer.send(1, spec.BasicConsume(queue="fill", consumer_tag="c", no_ack=True))
        await consumer.expect(spec.BasicConsumeOk)
        for _ in range(held):
            frame = await consumer.next_frame(timeout=10)
            assert isinstance(frame, ContentMessage)
        ev = await pub.next_method(timeout=10)
        assert isinstance(ev, spec.ConnectionUnblocked)
        assert not b.broker.blocked
        await pub.close()
        await consumer.close()


async def test_disk_alarm_blocks_publishers_until_space_returns(tmp_path):
    """[storage] disk_free_limit above the free space: a connection is blocked when it publishes.

    As RabbitMQ: connection.blocked goes to publishing connections only; one that just
    consumes or declares is neither told nor stopped.
    """
    cfg = ephemeral_config(data_dir=str(tmp_path), storage={"disk_free_limit": 2**62})
    async with running_broker(cfg) as b:
        assert "disk" in b.broker.alarms
        pub = await RawClient.connect(b.port)
        await pub.open_channel(1)  # not blocked yet: it has not published
        pub.send(1, spec.QueueDeclare(queue="d"))
        await pub.expect(spec.QueueDeclareOk)
        pub.publish(1, "", "d", b"first")  # handled, then the connection is blocked
        pub.publish(1, "", "d", b"second")
        pub.send(1, spec.QueueDeclare(queue="d", passive=True))
        blocked = await pub.expect(spec.ConnectionBlocked)
        assert blocked.reason == "low on disk"
        with pytest.raises(TimeoutError):
            await pub.next_method(timeout=0.5)  # not read while blocked

        other = await RawClient.connect(b.port)
        await other.open_channel(1)
        other.send(1, spec.QueueDeclare(queue="d", passive=True))
        assert (await other.expect(spec.QueueDeclareOk)).message_count == 1

        monitor = b.broker.resources
        monitor.disk_limit = 1
        monitor._check_disk()  # noqa: SLF001 - as the next sample would
        assert isinstance(await pub.next_method(), spec.ConnectionUnblocked)
        ok = await pub.expect(spec.QueueDeclareOk)
        assert ok.message_count == 2
        await pub.close()
        await other.close()


async def test_many_channels_many_consumers_frames_never_interleave(broker):
    """Multi-frame messages on 4 channels x 4 consumers of one connection arrive whole."""
    c = await RawClient.connect(broker.port)
    body_len = 300_000  # three frames at frame-max 131072
    tags = []
    for ch in range(1, 5):
        await c.open_channel(ch)
        for k in range(4):
            q = f"il-{ch}-{k}"
            c.send(ch, spec.QueueDeclare(queue=q, exclusive=True))
            await c.expect(spec.QueueDeclareOk)
            c.send(ch, spec.BasicConsume(queue=q, consumer_tag=q, no_ack=True))
            await c.expect(spec.BasicConsumeOk)
            tags.append(q)
    pub = await RawClient.connect(broker.port)
    await pub.open_channel(1)
    for round_ in range(5):
        for q in tags:
            pub.publish(1, "", q, bytes([round_]) * body_len)
    await pub.writer.drain()
    seen = 0
    while seen < 5 * len(tags):
        frame = await c.next_frame(timeout=10)  # the parser raises 505 on any interleaving
        assert isinstance(frame, ContentMessage)
        assert len(frame.body) == body_len and len(set(frame.body)) == 1
        assert frame.method.consumer_tag.startswith(f"il-{frame.channel}-")
        seen += 1
    await c.close()
    await pub.close()


async def test_resource_and_loop_lag_metrics(tmp_path):
    """/metrics shows the alarms' inputs and, with the probe on, the longest loop stall."""
    import time

    import aiohttp

    cfg = ephemeral_config(data_dir=str(tmp_path), diagnostics={"loop_lag_probe_ms": 1})
    async with running_broker(cfg, management=True) as b:
        await asyncio.sleep(0.05)
        time.sleep(0.08)  # stall the loop on purpose: the probe must see it
        await asyncio.sleep(0.01)
        async with aiohttp.ClientSession() as http:
            async with http.get(b.mgmt_url + "/metrics") as resp:
                text = await resp.text()
            async with http.get(b.mgmt_url + "/metrics") as resp:
                again = await resp.text()

        def value(body: str, name: str) -> float:
            line = next(x for x in body.splitlines() if x.startswith(name + " "))
            return float(line.split()[1])

        assert value(text, "roarmq_event_loop_lag_max_seconds") >= 0.07
        assert value(again, "roarmq_event_loop_lag_max_seconds") < 0.07  # reset by the scrape
        assert value(text, "roarmq_resident_memory_bytes") > 0
        assert value(text, "roarmq_memory_alarm") == 0
        assert value(text, "roarmq_disk_alarm") == 0
        assert value(text, "roarmq_disk_free_bytes") > value(text, "roarmq_disk_free_limit_bytes")
