"""The broker process's collector schedule (broker/ops/gc_schedule.py): cyclic garbage is still
collected, a closed connection's objects freed by a full pass at an idle moment, and the
idle passes wait for something to collect and for their gap."""

from __future__ import annotations

import asyncio
import gc

import aio_pika
import pytest

from roarmq.broker.amqp.channel import Channel
from roarmq.broker.amqp.connection import Connection
from roarmq.broker.ops import gc_schedule
from roarmq.broker.testing import ephemeral_config, running_broker

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def tuned():
    """This process's collector as `roarmq serve` sets it (start-up frozen, the thresholds),
    put back as it was afterwards."""
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(gc_schedule.GEN0, gc_schedule.GEN1, gc_schedule.GEN2)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


async def _ignore(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    pass


def _broker_objects() -> int:
    """Connections and channels of the broker that no collection has freed yet."""
    return sum(1 for o in gc.get_objects() if type(o) in (Connection, Channel))


async def test_a_closed_connections_objects_are_freed_at_an_idle_moment(tmp_path, tuned):
    async with running_broker(ephemeral_config(data_dir=str(tmp_path / "d"))) as b:
        schedule = gc_schedule.GcSchedule(asyncio.get_running_loop(), check=0.05, gap=0)
        conn = await aio_pika.connect(b.url)
        channel = await conn.channel()
        queue = await channel.declare_queue("gc.q", auto_delete=True)
        await queue.consume(_ignore)
        await channel.default_exchange.publish(aio_pika.Message(b"x"), routing_key="gc.q")
        await asyncio.sleep(0.1)
        gc.collect(1)  # the connection is old now: only a full pass looks at it again
        await conn.close()
        await asyncio.sleep(0.2)
        # A connection leaves cycles behind: nothing frees them but a pass of their
        # generation, and theirs is the oldest.
        assert _broker_objects() >= 1
        schedule.start()
        try:
            for _ in range(100):
                if schedule.idle_passes:
                    break
                await asyncio.sleep(0.05)
        finally:
            schedule.stop()
        assert schedule.idle_passes >= 1
        assert _broker_objects() == 0


async def test_idle_passes_wait_for_something_to_collect_and_for_their_gap(tuned):
    loop = asyncio.get_running_loop()
    schedule = gc_schedule.GcSchedule(loop, check=0.02, gap=3600)
    gc.collect()  # generation 2 just passed: nothing was promoted since
    schedule.start()
    try:
        await asyncio.sleep(0.2)
        assert schedule.idle_passes == 0
        gc.collect(1)  # something promoted: the next idle look collects
        await asyncio.sleep(0.2)
        assert schedule.idle_passes == 1
        gc.collect(1)
        await asyncio.sleep(0.2)
        assert schedule.idle_passes == 1  # within the gap
    finally:
        schedule.stop()


async def test_a_busy_loop_is_not_idle(tuned):
    loop = asyncio.get_running_loop()
    schedule = gc_schedule.GcSchedule(loop, check=0.05, gap=0)
    gc.collect(1)
    schedule.start()
    try:
        end = loop.time() + 0.5
        while loop.time() < end:  # the loop busy: a slice of work every turn
            sum(range(20_000))
            await asyncio.sleep(0)
        assert schedule.idle_passes == 0
    finally:
        schedule.stop()
