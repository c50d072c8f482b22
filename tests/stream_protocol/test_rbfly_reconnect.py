"""rbfly when its connection drops and when a stream is not there yet, against RoarMQ and
RabbitMQ 3.10.8 alike (`target`): it connects again, declares its publishers again (a
named one's lost confirm answered by deduplication) and subscribes again from the offset
after the last message it got; a publisher or subscriber of a stream that does not exist
waits (retrying on `Stream does not exist`) until it is created. The connection goes
through a `Proxy` the test cuts, as a network failure would."""

from __future__ import annotations

import asyncio
import logging

import rbfly.streams as rbs
from support.rbfly_clients import Proxy, client_of, take
from support.waiting import until_async


async def test_publisher_and_subscriber_carry_on_after_the_connection_drops(target, name):
    async with Proxy(target.stream_port) as proxy:
        client = client_of(target, port=proxy.port)
        try:
            await client.create_stream(name)
            reading = asyncio.create_task(take(client, name, rbs.Offset.FIRST, 6))
            async with client.publisher(name, name="app") as publisher:
                for i in range(3):
                    await publisher.send(f"before-{i}")
                proxy.cut()
                for i in range(3):
                    await publisher.send(f"after-{i}")
                assert publisher.message_id == 7
            got = await reading
        finally:
            await client.disconnect()
        assert proxy.connections == 2
    assert got == [(i, f"{w}-{i % 3}") for i, w in enumerate(["before"] * 3 + ["after"] * 3)]


async def test_a_publish_whose_confirm_was_lost_is_deduplicated_after_reconnecting(target, name):
    """The broker stored message 4 but its confirm never reached rbfly: rbfly publishes it
    again on the new connection, with the same publishing id, and the broker confirms it
    without storing it twice; a publisher of that name declared later goes on after the
    newest id, 5."""
    watcher = client_of(target)
    async with Proxy(target.stream_port) as proxy:
        client = client_of(target, port=proxy.port)
        try:
            await client.create_stream(name)
            async with client.publisher(name, name="app") as publisher:
                for i in range(1, 4):
                    await publisher.send(f"m{i}")
                proxy.holding = True  # what the broker sends from here on is lost
                sending = asyncio.create_task(publisher.send("m4"))
                watching = await watcher.get_protocol()
                for _ in range(200):  # until the broker has message 4
                    if await watching.query_message_id("app", name) == 4:
                        break
                    await asyncio.sleep(0.02)
                else:
                    raise AssertionError("message 4 was never stored")
                assert not sending.done()  # its confirm is lost
                proxy.cut()
                await asyncio.wait_for(sending, 10)
                await publisher.send("m5")
        finally:
            await client.disconnect()
        assert proxy.connections == 2
    try:
        assert await watching.query_message_id("app", name) == 5
        async with watcher.publisher(name, name="app") as publisher:
            assert publisher.message_id == 6
        got = await take(watcher, name, rbs.Offset.FIRST, 5)
    finally:
        await watcher.disconnect()
    assert got == [(i, f"m{i + 1}") for i in range(5)]


async def test_a_publisher_and_a_subscriber_wait_for_their_stream(target, name, caplog):
    """Declaring a publisher of, or subscribing to, a stream that does not exist is
    refused with `Stream does not exist` (0x02), which rbfly retries each second: both
    go on once the stream is created."""
    caplog.set_level(logging.WARNING, logger="rbfly")
    client = client_of(target)
    creator = client_of(target)
    try:
        reading = asyncio.create_task(take(client, name, rbs.Offset.FIRST, 1))

        async def publish() -> None:
            async with client.publisher(name, name="early") as publisher:
                await publisher.send("first")

        publishing = asyncio.create_task(publish())
        refusal = "code=0x02, message=Stream does not exist"
        assert await until_async(lambda: sum(refusal in m for m in caplog.messages) >= 2, 10), (
            caplog.messages
        )
        assert not reading.done() and not publishing.done()
        await creator.create_stream(name)
        await asyncio.wait_for(publishing, 10)
        assert await asyncio.wait_for(reading, 10) == [(0, "first")]
    finally:
        await client.disconnect()
        await creator.disconnect()
