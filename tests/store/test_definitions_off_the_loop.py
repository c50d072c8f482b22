"""A durable declare, bind or delete waits for its definitions fsync off the event loop.

A real broker subprocess; strace holds every fdatasync of definitions.sqlite3-wal for
DELAY seconds (`delay_enter`), as a disk busy with other files' writes does. The client
that changed something waits that long for its reply (so the fault took effect), while
other connections publish and have their confirms in milliseconds: the fsync holds the
store's writes thread, not the loop. A change another client asks for meanwhile is decided
after the waiting one is made (never on a memory about to change), a server-named durable
queue is stored under the name its client was told, and a client gone before its reply
leaves the broker and the store agreeing.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time

import aio_pika
import pytest
from aio_pika.exceptions import ChannelPreconditionFailed
from support.faultlib import BrokerProcess, inject
from support.rawclient import RawClient

from roarmq.protocol import spec

# slow (strace on a broker process): `make check` leaves it out
pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

#: Seconds each fdatasync of the definitions WAL is held.
DELAY = 0.5


def slow_fsyncs(broker: BrokerProcess):  # type: ignore[no-untyped-def]
    delay = f"fdatasync:delay_enter={int(DELAY * 1_000_000)}"
    return inject(broker.pid, broker.data_dir / "definitions.sqlite3-wal", delay)


def url(broker: BrokerProcess) -> str:
    return f"amqp://guest:guest@127.0.0.1:{broker.port}/"


def stored_queues(broker: BrokerProcess) -> list[str]:
    db = sqlite3.connect(broker.data_dir / "definitions.sqlite3")
    try:
        return [name for (name,) in db.execute("SELECT name FROM queues ORDER BY name")]
    finally:
        db.close()


async def timed(awaitable) -> float:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    await awaitable
    return time.monotonic() - started


async def declare_slow(broker: BrokerProcess, by: str) -> None:
    """A durable queue "slow", declared by an AMQP client or through the management API."""
    if by == "amqp":
        conn = await aio_pika.connect(url(broker))
        await (await conn.channel()).declare_queue("slow", durable=True)
        await conn.close()
    else:
        path = "/api/queues/%2F/slow"
        status, _ = await asyncio.to_thread(broker.call, path, "PUT", {"durable": True})
        assert status == 201


@pytest.mark.parametrize("by", ["amqp", "api"])
async def test_other_connections_are_served_while_a_declare_waits_for_its_fsync(broker, by):
    publisher = await aio_pika.connect(url(broker))
    channel = await publisher.channel(publisher_confirms=True)
    await channel.declare_queue("other", durable=False)
    with slow_fsyncs(broker):
        started = time.monotonic()
        declare = asyncio.ensure_future(declare_slow(broker, by))
        round_trips: list[float] = []
        while not declare.done():
            round_trips.append(
                await timed(channel.default_exchange.publish(aio_pika.Message(b"m"), "other"))
            )
        await declare
        waited = time.monotonic() - started
    print(
        f"{by}: declare {waited * 1000:.0f} ms; {len(round_trips)} confirms meanwhile, "
        f"longest {max(round_trips) * 1000:.1f} ms"
    )
    assert waited >= DELAY  # its fsync was held
    assert len(round_trips) >= 20  # publishes went on meanwhile...
    assert max(round_trips) < DELAY / 2  # ... none held for the fsync
    assert "slow" in stored_queues(broker)
    other = await channel.declare_queue("other", passive=True)
    assert other.declaration_result.message_count == len(round_trips)
    await publisher.close()


async def test_a_change_asked_for_meanwhile_is_decided_after_the_waiting_one(broker):
    first = await RawClient.connect(broker.port)
    await first.open_channel(1)
    second = await aio_pika.connect(url(broker))
    with slow_fsyncs(broker):
        first.send(1, spec.QueueDeclare(queue="q", durable=True))
        await asyncio.sleep(DELAY / 4)  # its write waits in the writes thread
        channel = await second.channel()
        # Decided before the durable declare is made, this would create a transient "q"
        # and the durable declare would then fail; it is decided after, and fails itself.
        with pytest.raises(ChannelPreconditionFailed) as refused:
            await channel.declare_queue("q", durable=False)
        assert "inequivalent arg 'durable' for queue 'q'" in str(refused.value)
        await first.expect(spec.QueueDeclareOk, timeout=10)
    channel = await second.channel()
    assert (await channel.declare_queue("q", passive=True)).name == "q"
    await second.close()
    await first.close()


async def test_a_server_named_durable_queue_is_stored_under_the_name_given(broker):
    conn = await aio_pika.connect(url(broker))
    channel = await conn.channel()
    with slow_fsyncs(broker):
        queue = await channel.declare_queue("", durable=True, auto_delete=False)
    assert queue.name.startswith("amq.gen-")
    assert stored_queues(broker) == [queue.name]  # its one write, under that name
    await conn.close()
    broker.kill9()
    broker.start()
    conn = await aio_pika.connect(url(broker))
    channel = await conn.channel()
    assert (await channel.declare_queue(queue.name, passive=True)).name == queue.name
    await conn.close()


async def test_a_client_gone_before_its_reply_leaves_broker_and_store_agreeing(broker):
    with slow_fsyncs(broker):
        gone = await RawClient.connect(broker.port)
        await gone.open_channel(1)
        gone.send(1, spec.QueueDeclare(queue="orphan", durable=True))
        await asyncio.sleep(DELAY / 4)
        await gone.close()  # the socket, without connection.close
        conn = await aio_pika.connect(url(broker))
        channel = await conn.channel()
        queue = await channel.declare_queue("orphan", passive=True)  # in memory...
        assert queue.name == "orphan"
        await conn.close()
    assert stored_queues(broker) == ["orphan"]  # ... and stored
