"""The stream protocol driven by rbfly (its own Cython codec, not rstream's): a named
publisher (deduplication) one message at a time and in batches, subscribing from the
first offset, and resuming from a stored offset reference."""

from __future__ import annotations

import asyncio

import rbfly.streams as rbs


def _uri(broker) -> str:
    return f"rabbitmq-stream://guest:guest@127.0.0.1:{broker.stream_port}/"


async def _take(client, stream: str, offset, count: int) -> list:
    got = []

    async def read() -> None:
        async for body in client.subscribe(stream, offset=offset):
            got.append((rbs.get_message_ctx().stream_offset, body))
            if len(got) == count:
                return

    await asyncio.wait_for(read(), 10)
    return got


async def test_rbfly_publishes_reads_and_resumes_from_a_stored_offset(broker):
    client = rbs.streams_client(_uri(broker))
    try:
        await client.create_stream("rb")
        async with client.publisher("rb", name="rb-app") as publisher:
            for i in range(5):
                await publisher.send(f"one-{i}".encode())
        async with client.publisher("rb", name="rb-app", cls=rbs.PublisherBatchFast) as batch:
            for i in range(20):
                batch.batch(f"batch-{i}".encode())
            await batch.flush()
        got = await _take(client, "rb", rbs.Offset.FIRST, 25)
        assert [o for o, _ in got] == list(range(25))
        assert got[0][1] == b"one-0" and got[-1][1] == b"batch-19"

        await client.write_offset("rb", "rb-reader", 9)
        await asyncio.sleep(0.3)  # store-offset has no answer
        resumed = await _take(client, "rb", rbs.Offset.reference("rb-reader"), 15)
        assert [o for o, _ in resumed] == list(range(10, 25))
    finally:
        await client.disconnect()
