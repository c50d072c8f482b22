"""Just enough AMQP over asyncio streams for a script that declares, binds and publishes
pre-encoded frames itself (bench/memory.py, bench/binds.py): the broker, not this client, is
what they measure. (lib/amqp_load.py's client is the fast one, for load processes.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from roarmq.protocol import spec
from roarmq.protocol.frames import PROTOCOL_HEADER, FrameParser, encode_method


class Client:
    """Just enough AMQP to declare a queue, publish pre-encoded frames and notice blocks."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.parser = FrameParser(expect_protocol_header=False)
        self.methods: list[Any] = []
        self.blocked = False
        self.frame_max = 131072

    @classmethod
    async def connect(cls, port: int) -> Client:
        c = cls(*await asyncio.open_connection("127.0.0.1", port))
        c.writer.write(PROTOCOL_HEADER)
        await c.expect(spec.ConnectionStart)
        caps = {"connection.blocked": True}
        c.send(
            0,
            spec.ConnectionStartOk(
                client_properties={"product": "bench", "capabilities": caps},
                mechanism="PLAIN",
                response=b"\0guest\0guest",
                locale="en_US",
            ),
        )
        tune = await c.expect(spec.ConnectionTune)
        c.frame_max = tune.frame_max
        c.send(
            0,
            spec.ConnectionTuneOk(
                channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0
            ),
        )
        c.send(0, spec.ConnectionOpen(virtual_host="/"))
        await c.expect(spec.ConnectionOpenOk)
        c.send(1, spec.ChannelOpen())
        await c.expect(spec.ChannelOpenOk)
        return c

    def send(self, channel: int, method: Any) -> None:
        self.writer.write(encode_method(channel, method))

    async def expect(self, kind: type, timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            for i, m in enumerate(self.methods):
                if isinstance(m, kind):
                    del self.methods[: i + 1]
                    return m
            data = await asyncio.wait_for(self.reader.read(65536), deadline - time.monotonic())
            if not data:
                raise ConnectionError("broker closed the connection")
            self._take(data)

    def _take(self, data: bytes) -> None:
        for ev in self.parser.feed(data):
            method = getattr(ev, "method", None)
            if isinstance(method, spec.ConnectionBlocked):
                self.blocked = True
            elif method is not None:
                self.methods.append(method)

    def poll(self) -> None:
        """Read whatever arrived, without waiting (connection.blocked among it)."""
        buf = self.reader._buffer  # noqa: SLF001 - a peek, as the tests do
        if buf:
            data = bytes(buf)
            buf.clear()
            self._take(data)

    async def count(self, queue: str, durable: bool) -> int:
        self.send(1, spec.QueueDeclare(queue=queue, durable=durable, passive=True))
        return (await self.expect(spec.QueueDeclareOk)).message_count

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()
