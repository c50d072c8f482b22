"""A client's connection.close, as aiormq 7.2.4's own suite checks it against RabbitMQ.

RabbitMQ answers close-ok only after its channel processes have shut down; aiormq relies on
that gap. Answered at once, its close observer lost the error the client closed with
(`test_connection.py::test_closing_waiter_cancellation[...-connection-True]`) and a publish
in flight failed with a bare Exception (`test_connection_futures.py::
test_connection_close_during_publish_drain`). The same steps, against a real broker.
"""

from __future__ import annotations

import asyncio

import aiormq
import pytest
from aiormq.exceptions import AMQPConnectionError, ConnectionClosed

from roarmq.broker.amqp import connection as connection_module
from roarmq.protocol import spec
from roarmq.protocol.frames import PROTOCOL_HEADER, encode_method


@pytest.mark.parametrize("attempt", range(5))
async def test_close_observer_raises_the_clients_error(broker, attempt):
    conn = aiormq.Connection(broker.url + "/")
    await conn.connect()
    channel = await conn.channel()
    observer = conn.closing

    async def wait_for_close():
        await conn.closing

    with pytest.raises(asyncio.TimeoutError):  # a waiter that gives up (aiormq's case)
        await asyncio.wait_for(wait_for_close(), 0.01)
    await channel.basic_qos(prefetch_count=1)
    reason = AMQPConnectionError("test close")
    await conn.close(exc=reason)
    with pytest.raises(AMQPConnectionError) as raised:
        await observer
    assert raised.value is reason


@pytest.mark.parametrize("attempt", range(3))
async def test_publish_in_flight_fails_with_connection_closed(broker, attempt):
    async with aiormq.Connection(broker.url + "/") as conn:
        channel = await conn.channel()
        entered = asyncio.Event()

        class Stalled:  # the publish's frames never leave: it is in flight at the close
            async def put(self, frame):
                entered.set()

        channel.write_queue = Stalled()
        task = asyncio.create_task(channel.basic_publish(b"test"))
        await asyncio.wait_for(entered.wait(), 2)
        await conn.close(ConnectionClosed(320, "CONNECTION_FORCED"))
        with pytest.raises(ConnectionClosed):
            await task


async def test_close_ok_comes_after_the_channels_are_released(broker, monkeypatch):
    """Raw frames: close-ok follows the close only once the open channel has let go. The
    gap is stretched to a second, so that the close-ok the feature would send at once
    cannot pass for a late one however slow the machine."""
    monkeypatch.setattr(connection_module, "CLOSE_OK_AFTER_CHANNELS", 1.0)
    reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
    writer.write(PROTOCOL_HEADER)
    await reader.readuntil(b"\xce")  # connection.start
    writer.write(
        encode_method(
            0,
            spec.ConnectionStartOk(
                client_properties={}, mechanism="PLAIN", response=b"\0guest\0guest", locale="en_US"
            ),
        )
    )
    await reader.readuntil(b"\xce")  # tune
    writer.write(encode_method(0, spec.ConnectionTuneOk(channel_max=0, frame_max=131072)))
    writer.write(encode_method(0, spec.ConnectionOpen(virtual_host="/")))
    await reader.readuntil(b"\xce")  # open-ok
    writer.write(encode_method(1, spec.ChannelOpen()))
    await reader.readuntil(b"\xce")  # channel open-ok
    writer.write(encode_method(0, spec.ConnectionClose(reply_code=200, reply_text="bye")))
    answer = asyncio.ensure_future(reader.readuntil(b"\xce"))
    done, _ = await asyncio.wait({answer}, timeout=0.5)
    assert not done, "close-ok before the channel was let go"
    frame = await asyncio.wait_for(answer, 5)
    assert frame[7:11] == b"\x00\x0a\x00\x33"  # connection.close-ok
    writer.close()
