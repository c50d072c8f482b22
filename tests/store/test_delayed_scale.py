"""Scheduled at scale: 1,000,000 persistent delayed messages in a durable delayed exchange
cost the broker under 100 bytes of resident memory each (the store's index entry; the
schedule itself is on disk), do not hold up a message due sooner, and are all scheduled
again after a kill -9. And 40,000 (three of the due index's runs) are routed in due order,
none early. The broker runs as a real subprocess."""

from __future__ import annotations

import asyncio
import random
import time

import pika
import pytest
from support.delayed import delayed_direct_to_queue
from support.faultlib import BrokerProcess, connect
from support.process import process_rss
from support.rawclient import RawClient
from support.waiting import wait_for

from roarmq.protocol import spec
from roarmq.protocol.frames import encode_content
from roarmq.protocol.properties import BasicProperties

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

HOUR_MS = 3_600_000


def _declare(port: int) -> None:
    conn = connect(port)
    ch = conn.channel()
    delayed_direct_to_queue(ch)
    conn.close()


async def _publish(port: int, frames: list[bytes]) -> None:
    """Pre-encoded publishes as fast as the broker reads them, then a round trip."""
    client = await RawClient.connect(port)
    client.send(1, spec.ChannelOpen())
    await client.expect(spec.ChannelOpenOk)
    for at in range(0, len(frames), 10_000):
        client.write(b"".join(frames[at : at + 10_000]))
        await client.writer.drain()
    client.send(1, spec.QueueDeclare(queue="q", durable=True, passive=True))
    await client.expect(spec.QueueDeclareOk, timeout=300)
    client.writer.close()


def _frame(body: bytes, delay: int) -> bytes:
    props = BasicProperties(delivery_mode=2, headers={"x-delay": delay})
    method = spec.BasicPublish(exchange="dx", routing_key="k")
    return encode_content(1, method, props, body, 131072)


def _delayed(broker: BrokerProcess) -> int:
    return broker.api("/api/exchanges/%2F/dx")["messages_delayed"]


def test_a_million_scheduled_cost_under_100_bytes_each_and_survive_kill9(tmp_path):
    n = 1_000_000
    broker = BrokerProcess(tmp_path / "data")
    broker.START_TIMEOUT = 240  # a start after the kill recovers the million
    broker.start()
    try:
        _declare(broker.port)
        before = process_rss(broker.pid)
        frame = _frame(bytes(16), HOUR_MS)
        asyncio.run(_publish(broker.port, [frame] * n))
        wait_for(lambda: _delayed(broker) == n, timeout=120, what="all scheduled")
        per_message = (process_rss(broker.pid) - before) / n
        print(f"resident memory per scheduled message: {per_message:.1f} bytes")
        assert per_message <= 100
        # one due sooner is routed when due, whatever waits behind it
        conn = connect(broker.port)
        ch = conn.channel()
        sent = time.time()
        ch.basic_publish(
            "dx", "k", b"soon", pika.BasicProperties(delivery_mode=2, headers={"x-delay": 300})
        )
        wait_for(
            lambda: ch.queue_declare("q", durable=True, passive=True).method.message_count == 1,
            timeout=10,
            what="the message due sooner",
        )
        assert 0.3 <= time.time() - sent < 5.0
        conn.close()
        broker.kill9()
        restarted = time.monotonic()
        broker.start()
        print(f"started again in {time.monotonic() - restarted:.1f} s")
        assert _delayed(broker) == n  # every one scheduled again, from the message log
        per_message = (process_rss(broker.pid) - before) / n
        print(f"after recovery: {per_message:.1f} bytes")
        assert per_message <= 100
    finally:
        broker.stop()


def test_many_runs_are_routed_in_due_order_none_early(tmp_path):
    """40,000 messages (three runs of the on-disk due index and its in-memory heap),
    shuffled delays of 1-3 s: each is routed at or after its due time, and in due order,
    equal due times in publish order."""
    rng = random.Random(5)
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        _declare(broker.port)
        delays = [rng.choice(range(1000, 3000, 50)) for _ in range(40_000)]
        frames = [_frame(b"%d" % i, d) for i, d in enumerate(delays)]
        started = time.time()
        asyncio.run(_publish(broker.port, frames))
        published = time.time()
        conn = connect(broker.port)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1000)
        got: list[tuple[int, float]] = []

        def on_message(channel, method, props, body):
            got.append((int(body), time.time()))
            channel.basic_ack(method.delivery_tag, multiple=True)

        ch.basic_consume("q", on_message)
        wait_for(
            lambda: conn.process_data_events(0.05) or len(got) == len(delays),
            timeout=120,
            what="every message routed",
        )
        early = [i for i, at in got if at < started + delays[i] / 1000]
        assert early == []
        # Due order: the broker took them between `started` and `published`, so a message
        # due more than that span before another left first; equal delays in publish order.
        span = published - started
        position = {i: p for p, (i, _) in enumerate(got)}
        by_delay: dict[int, list[int]] = {}
        for i, d in enumerate(delays):
            by_delay.setdefault(d, []).append(i)
        for same in by_delay.values():
            assert [position[i] for i in same] == sorted(position[i] for i in same)
        for d, same in by_delay.items():
            later = by_delay.get(d + 50 + int(span * 1000) // 50 * 50 + 50, [])
            if later:
                assert max(position[i] for i in same) < min(position[i] for i in later)
        conn.close()
    finally:
        broker.stop()
