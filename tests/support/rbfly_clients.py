"""rbfly clients for tests of the stream protocol: `client_of` a broker (a `RunningBroker`,
a RabbitMQ node, anything with `stream_port`); `contexts` and `take`, which subscribe and
return the first n messages (their contexts, or (offset, body) pairs); `stored_offset`,
query-offset until a store-offset (which has no answer) is in; `subscribed`; and `Proxy`,
a relay a test can cut to drop a client's connection as a network failure would. Where
rbfly has no public view (its subscriptions, its queue), rbfly 0.10's attributes are read.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import rbfly.streams as rbs
from rbfly.streams.error import ProtocolError

#: query-offset's answer for a reference never stored (RabbitMQ 3.10.8 and RoarMQ).
NO_OFFSET = 0x13


def client_of(
    broker: Any,
    *,
    user: str = "guest",
    password: str = "guest",
    vhost: str = "/",
    port: int | None = None,
) -> rbs.StreamsClient:
    """An rbfly client of `broker` (it connects on first use); `port`: another port than
    the broker's stream port (a `Proxy`'s)."""
    path = "" if vhost == "/" else vhost
    return rbs.streams_client(
        f"rabbitmq-stream://{user}:{password}@127.0.0.1:{port or broker.stream_port}/{path}"
    )


async def contexts(
    client: rbs.StreamsClient,
    stream: str,
    offset: rbs.Offset,
    count: int,
    *,
    within: float = 10.0,
    **options: Any,
) -> list[rbs.MessageCtx]:
    """Subscribe from `offset` (`options`: subscribe's own, e.g. `amqp`, `filter`,
    `timeout`) until `count` messages came, then unsubscribe: their contexts (offset,
    timestamp, AMQP sections). Read in the caller's task, so `rbs.get_message_ctx()` is
    the last message's context afterwards (what `write_offset` without a value stores)."""
    got: list[rbs.MessageCtx] = []
    messages = client.subscribe(stream, offset=offset, **options)
    try:
        async with asyncio.timeout(within):
            async for _ in messages:
                got.append(rbs.get_message_ctx())
                if len(got) == count:
                    break
    finally:
        await messages.aclose()  # unsubscribes now, not when the generator is collected
    return got


async def take(
    client: rbs.StreamsClient, stream: str, offset: rbs.Offset, count: int, **options: Any
) -> list[tuple[int, Any]]:
    """`contexts`' messages as (offset, body) pairs."""
    return [
        (c.stream_offset, c.body) for c in await contexts(client, stream, offset, count, **options)
    ]


async def stored_offset(
    client: rbs.StreamsClient, stream: str, reference: str, expected: int, within: float = 10.0
) -> int | None:
    """The offset stored under `reference`, asked (query-offset) until it is `expected` or
    `within` seconds have passed (store-offset has no answer): the last answer, None for
    `No offset`."""
    protocol = await client.get_protocol()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        try:
            answer: int | None = await protocol.query_offset(stream, reference)
        except ProtocolError as exc:
            if exc.code != NO_OFFSET:
                raise
            answer = None
        if answer == expected or loop.time() > deadline:
            return answer
        await asyncio.sleep(0.02)


def subscribed(client: rbs.StreamsClient) -> bool:
    """The client has sent its subscribe (rbfly registers a subscription with its
    connection just before it writes the frame): a request it sends after this one is
    answered after it."""
    return client.connected and bool(client._protocol.value._subscribers)


class Proxy:
    """A TCP relay from a loopback port of its own (`port`) to `upstream_port`. `cut()`
    aborts every relayed connection on both sides, as a network failure does; while
    `holding` (until the next cut), what the broker sends is dropped: the client waits
    for answers the broker gave."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.holding = False
        self.connections = 0  # relayed so far
        self._pairs: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self._tasks: set[asyncio.Task] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Proxy:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self.connections += 1
        self._pairs.append((writer, up_writer))
        for task in (
            asyncio.create_task(self._pump(reader, up_writer, downstream=False)),
            asyncio.create_task(self._pump(up_reader, writer, downstream=True)),
        ):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, downstream: bool
    ) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                if downstream and self.holding:
                    continue  # dropped: the client never gets it
                writer.write(data)
        writer.transport.abort()

    def cut(self) -> None:
        for client, upstream in self._pairs:
            client.transport.abort()
            upstream.transport.abort()
        self._pairs.clear()
        self.holding = False
