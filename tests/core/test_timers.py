"""TTL, x-expires and heartbeats on a VirtualClock: hours pass in microseconds, no sleeping."""

from __future__ import annotations

import asyncio

import pytest
from support.rawclient import RawClient

from roarmq.protocol import spec
from roarmq.protocol.frames import Heartbeat
from roarmq.protocol.properties import BasicProperties

pytestmark = pytest.mark.timeout(20)


async def settle() -> None:
    """Let the broker's writes and the client's reads go round the loop."""
    for _ in range(5):
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)


async def declare(client: RawClient, name: str, **kwargs) -> str:
    client.send(1, spec.QueueDeclare(queue=name, **kwargs))
    return (await client.expect(spec.QueueDeclareOk)).queue


async def get(client: RawClient, queue: str):
    """basic.get: the ContentMessage, or the BasicGetEmpty method."""
    client.send(1, spec.BasicGet(queue=queue, no_ack=True))
    frame = await client.next_frame()
    return frame if hasattr(frame, "body") else frame.method


async def test_queue_ttl_expires_after_virtual_time(vbroker):
    c = await RawClient.connect(vbroker.port)
    await c.open_channel(1)
    q = await declare(c, "ttl-1h", arguments={"x-message-ttl": 3_600_000})
    c.publish(1, "", q, b"x")
    await settle()
    vbroker.clock.advance(3599)
    assert (await get(c, q)).body == b"x"
    c.publish(1, "", q, b"y")
    await settle()
    vbroker.clock.advance(3601)
    await settle()
    assert isinstance((await get(c, q)), spec.BasicGetEmpty)
    await c.close()


async def test_per_message_expiration_dead_letters(vbroker):
    c = await RawClient.connect(vbroker.port)
    await c.open_channel(1)
    c.send(1, spec.ExchangeDeclare(exchange="vdlx", type="fanout"))
    await c.expect(spec.ExchangeDeclareOk)
    dead = await declare(c, "vdead")
    c.send(1, spec.QueueBind(queue=dead, exchange="vdlx"))
    await c.expect(spec.QueueBindOk)
    q = await declare(c, "vwork", arguments={"x-dead-letter-exchange": "vdlx"})
    c.publish(1, "", q, b"soon", BasicProperties(expiration="30000"))
    await settle()
    vbroker.clock.advance(29)
    await settle()
    client_get = await get(c, dead)
    assert isinstance(client_get, spec.BasicGetEmpty)
    vbroker.clock.advance(2)
    await settle()
    got = await get(c, dead)
    assert got.body == b"soon"
    death = got.header.properties.headers["x-death"][0]
    assert death["reason"] == "expired" and death["original-expiration"] == "30000"
    await c.close()


async def test_x_expires_deletes_unused_queue(vbroker):
    c = await RawClient.connect(vbroker.port)
    await c.open_channel(1)
    await declare(c, "idle", arguments={"x-expires": 60_000})
    vbroker.clock.advance(59)
    await settle()
    await declare(c, "idle", passive=True)  # use resets the countdown
    vbroker.clock.advance(59)
    await settle()
    await declare(c, "idle", passive=True)
    vbroker.clock.advance(61)
    await settle()
    c.send(1, spec.QueueDeclare(queue="idle", passive=True))
    close = await c.expect(spec.ChannelClose)
    assert close.reply_code == 404
    await c.close()


async def test_x_expires_waits_while_consumers_exist(vbroker):
    c = await RawClient.connect(vbroker.port)
    await c.open_channel(1)
    q = await declare(c, "watched", arguments={"x-expires": 1000})
    c.send(1, spec.BasicConsume(queue=q, consumer_tag="w"))
    await c.expect(spec.BasicConsumeOk)
    vbroker.clock.advance(10)
    await settle()
    await declare(c, "watched", passive=True)
    await c.close()


async def test_heartbeats_sent_and_silent_peer_closed(vbroker):
    c = await RawClient.connect(vbroker.port, heartbeat=10)
    for _ in range(2):  # the first half-interval tick sees the handshake's own traffic
        vbroker.clock.advance(5)
        await settle()
    ev = await c.next_event(timeout=2)
    assert isinstance(ev, Heartbeat)
    # The client stays silent: two full intervals later the broker drops it.
    for _ in range(4):
        vbroker.clock.advance(5)
        await settle()
    assert await c.closed(timeout=2)
    await c.close()


async def test_talking_peer_is_not_closed(vbroker):
    c = await RawClient.connect(vbroker.port, heartbeat=10)
    for _ in range(10):
        c.write(b"\x08\x00\x00\x00\x00\x00\x00\xce")
        await settle()
        vbroker.clock.advance(5)
        await settle()
    await c.open_channel(1)
    await c.close()


async def test_handshake_timeout_closes_idle_socket(vbroker):
    reader, writer = await asyncio.open_connection("127.0.0.1", vbroker.port)
    await settle()
    vbroker.clock.advance(11)
    await settle()
    assert await asyncio.wait_for(reader.read(100), 2) == b""
    writer.close()


async def test_many_messages_expiring_at_once_are_dropped_in_slices(vbroker):
    """5,000 messages due at the same instant: expired a batch per loop turn, all of them."""
    from roarmq.broker.core.queue import DISPATCH_BATCH

    c = await RawClient.connect(vbroker.port)
    await c.open_channel(1)
    c.send(1, spec.QueueDeclare(queue="ttl-many", arguments={"x-message-ttl": 1000}))
    await c.expect(spec.QueueDeclareOk)
    for _ in range(5000):
        c.publish(1, "", "ttl-many", b"t")
    c.send(1, spec.QueueDeclare(queue="ttl-many", passive=True))
    assert (await c.expect(spec.QueueDeclareOk, timeout=20)).message_count == 5000
    queue = vbroker.broker.vhosts["/"].queues["ttl-many"]
    ran = vbroker.clock.advance(1.5)
    assert ran >= -(-5000 // DISPATCH_BATCH)  # one timer turn per slice, not one long one
    assert queue.message_count() == 0
    await c.close()
