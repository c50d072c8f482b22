"""A bare AMQP client over a real socket, built on our own codec.

Raw-socket tests need to send what no well-behaved client library would
(bad frames, out-of-order methods) and to see exactly which close comes back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from roarmq.protocol import spec
from roarmq.protocol.frames import (
    PROTOCOL_HEADER,
    ContentMessage,
    FrameParser,
    Heartbeat,
    MethodFrame,
    encode_content,
    encode_method,
)
from roarmq.protocol.properties import BasicProperties


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.parser = FrameParser(expect_protocol_header=False)
        self.events: list[Any] = []
        self.frame_max = 131072

    @classmethod
    async def connect(
        cls,
        port: int,
        *,
        handshake: bool = True,
        heartbeat: int = 0,
        capabilities: dict | None = None,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
    ) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer)
        if handshake:
            await client.handshake(
                heartbeat=heartbeat,
                capabilities=capabilities,
                user=user,
                password=password,
                vhost=vhost,
            )
        return client

    async def handshake(
        self,
        *,
        heartbeat: int = 0,
        capabilities: dict | None = None,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
    ) -> Any:
        self.write(PROTOCOL_HEADER)
        await self.expect(spec.ConnectionStart)
        caps = {
            "authentication_failure_close": True,
            "consumer_cancel_notify": True,
            "connection.blocked": True,
            "basic.nack": True,
            "publisher_confirms": True,
        }
        caps.update(capabilities or {})
        self.send(
            0,
            spec.ConnectionStartOk(
                client_properties={"product": "rawclient", "capabilities": caps},
                mechanism="PLAIN",
                response=b"\x00" + user.encode() + b"\x00" + password.encode(),
                locale="en_US",
            ),
        )
        got = await self.next_method()
        if not isinstance(got, spec.ConnectionTune):
            return got
        self.frame_max = got.frame_max
        self.tune = got
        self.send(
            0,
            spec.ConnectionTuneOk(
                channel_max=got.channel_max, frame_max=got.frame_max, heartbeat=heartbeat
            ),
        )
        self.send(0, spec.ConnectionOpen(virtual_host=vhost))
        return await self.next_method()

    def write(self, data: bytes) -> None:
        self.writer.write(data)

    def send(self, channel: int, method: Any) -> None:
        self.writer.write(encode_method(channel, method))

    def publish(
        self,
        channel: int,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: BasicProperties | None = None,
        mandatory: bool = False,
    ) -> None:
        method = spec.BasicPublish(exchange=exchange, routing_key=routing_key, mandatory=mandatory)
        self.writer.write(
            encode_content(channel, method, properties or BasicProperties(), body, self.frame_max)
        )

    async def next_event(self, timeout: float = 5.0) -> Any:
        while not self.events:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                raise ConnectionError("server closed the socket")
            self.events.extend(self.parser.feed(data))
        return self.events.pop(0)

    async def next_method(self, timeout: float = 5.0, skip_heartbeats: bool = True) -> Any:
        while True:
            ev = await self.next_event(timeout)
            if isinstance(ev, Heartbeat) and skip_heartbeats:
                continue
            if isinstance(ev, (MethodFrame, ContentMessage)):
                return ev.method
            return ev

    async def next_frame(self, timeout: float = 5.0) -> Any:
        while True:
            ev = await self.next_event(timeout)
            if isinstance(ev, Heartbeat):
                continue
            return ev

    async def expect(self, kind: type, timeout: float = 5.0) -> Any:
        method = await self.next_method(timeout)
        assert isinstance(method, kind), f"expected {kind.__name__}, got {method!r}"
        return method

    async def bind_all(
        self, channel: int, queue: str, exchange: str, bindings: Sequence[tuple[str, dict | None]]
    ) -> None:
        """``queue.bind`` each ``(routing key, arguments)`` with no-wait, pipelined, then wait
        for a passive ``queue.declare``'s reply, which comes once the broker has them all."""
        for i, (key, arguments) in enumerate(bindings):
            self.send(
                channel,
                spec.QueueBind(
                    queue=queue,
                    exchange=exchange,
                    routing_key=key,
                    no_wait=True,
                    arguments=arguments or {},
                ),
            )
            if i % 5000 == 4999:
                await self.writer.drain()
        self.send(channel, spec.QueueDeclare(queue=queue, passive=True))
        await self.expect(spec.QueueDeclareOk, timeout=60)

    async def unbind_all(
        self, channel: int, queue: str, exchange: str, bindings: Sequence[tuple[str, dict | None]]
    ) -> None:
        """``queue.unbind`` each ``(routing key, arguments)``, pipelined (the method has no
        no-wait), reading the unbind-oks meanwhile so that neither side's writes stall."""

        async def send() -> None:
            for i, (key, arguments) in enumerate(bindings):
                unbind = spec.QueueUnbind(
                    queue=queue, exchange=exchange, routing_key=key, arguments=arguments or {}
                )
                self.send(channel, unbind)
                if i % 5000 == 4999:
                    await self.writer.drain()

        sending = asyncio.ensure_future(send())
        for _ in bindings:
            await self.expect(spec.QueueUnbindOk, timeout=60)
        await sending

    async def open_channel(self, channel: int = 1) -> None:
        self.send(channel, spec.ChannelOpen())
        await self.expect(spec.ChannelOpenOk)

    async def closed(self, timeout: float = 5.0) -> bool:
        """True once the server has closed the socket."""
        try:
            while True:
                data = await asyncio.wait_for(self.reader.read(65536), timeout)
                if not data:
                    return True
        except (TimeoutError, ConnectionError):
            return False

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
