"""A client's durable change made again once its write, off the loop, is done
(broker/core/persistence.py), where something it depends on changed meanwhile.

In-process, with a real client: the store's writes thread is held at a gate before it
writes, so the test can change what the waiting change depends on. A permission revoked
meanwhile makes the change, made again, refused (403, as it would be if asked now), and the
queue its write stored is deleted again: the store and memory agree, before and after a
restart.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import aio_pika
import pytest
from aiormq.exceptions import ChannelAccessRefused
from support.waiting import until_async

from roarmq.broker.testing import ephemeral_config, running_broker


def gated(store: Any) -> threading.Event:
    """Hold each write handed to the store's writes thread until the event is set."""
    gate = threading.Event()
    submit = store._writer.submit

    def held(call: Any, done: Any) -> None:
        def after_the_gate() -> Any:
            gate.wait(30)
            return call()

        submit(after_the_gate, done)

    store._writer.submit = held
    return gate


async def test_a_permission_revoked_while_the_write_waits_undoes_the_write(tmp_path, caplog):
    cfg = ephemeral_config(data_dir=str(tmp_path / "d"))
    async with running_broker(cfg) as b:
        persistence = b.broker.persistence
        gate = gated(persistence.definitions)
        conn = await aio_pika.connect(b.url)
        channel = await conn.channel()
        declare = asyncio.ensure_future(channel.declare_queue("q", durable=True))
        assert await until_async(lambda: persistence._in_flight is not None, 5, 0.01)
        b.broker.set_permission("guest", "/", "^$", ".*", ".*")  # configure: nothing
        gate.set()
        with pytest.raises(ChannelAccessRefused):
            await declare
        assert "q" not in b.broker.vhosts["/"].queues
        assert [q.name for q in persistence.definitions.queues()] == []
        assert "a definitions write was not followed by its change" in caplog.text
        await conn.close()
    async with running_broker(cfg) as b:
        assert "q" not in b.broker.vhosts["/"].queues


async def test_a_change_the_broker_decides_meanwhile_waits_for_the_write(tmp_path, caplog):
    """A delete the broker decides (here the vhost's) waits for the write under way and
    lets its change be made first: the queue declared meanwhile goes with the vhost."""
    cfg = ephemeral_config(data_dir=str(tmp_path / "d"))
    async with running_broker(cfg) as b:
        broker = b.broker
        broker.add_vhost("v")
        broker.set_permission("guest", "v", ".*", ".*", ".*")
        persistence = broker.persistence
        gate = gated(persistence.definitions)
        conn = await aio_pika.connect(b.url + "/v")
        channel = await conn.channel()
        declare = asyncio.ensure_future(channel.declare_queue("q", durable=True))
        assert await until_async(lambda: persistence._in_flight is not None, 5, 0.01)
        threading.Timer(0.2, gate.set).start()
        vhost = broker.vhosts["v"]
        broker.delete_vhost("v")  # holds the loop until the write is done, then goes on
        assert await until_async(lambda: gate.is_set() and persistence._in_flight is None, 5)
        await asyncio.sleep(0.05)  # (whatever would come of the write has come)
        assert vhost.deleted and "q" not in vhost.queues
        assert [q.name for q in persistence.definitions.queues()] == []
        assert "was not followed by its change" not in caplog.text  # made, then deleted
        declare.cancel()
        await conn.close()
