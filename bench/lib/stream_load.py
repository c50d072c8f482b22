"""A stream-protocol load client for benchmarks, on RoarMQ's own sans-IO codec
(protocol/stream/codec.py): the same bytes to RoarMQ and to RabbitMQ's rabbitmq_stream.

`publish` sends N messages of one AMQP 1.0 data section each, in publish frames of
`batch` messages with at most `window` unconfirmed (the batching producer of every stream
client), and times first write to last confirm; `consume` subscribes from `first` with
`credit` chunks outstanding (one more granted per chunk received) and times the
subscription to the N-th message. Neither decodes a message: a chunk's entry count is
read from its header."""

from __future__ import annotations

import asyncio
import struct
import time

from roarmq.protocol.stream.amqp10 import data_message
from roarmq.protocol.stream.codec import (
    Code,
    Fields,
    FrameSplitter,
    Key,
    OffsetType,
    encode_string,
)

_FRAME = struct.Struct(">IHH")


def _request(key: int, corr: int, body: bytes) -> bytes:
    return _FRAME.pack(8 + len(body), key, 1) + struct.pack(">I", corr) + body


class StreamClient:
    """One connection: handshake, requests answered by correlation id, frames by key."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.splitter = FrameSplitter()
        self.corr = 0
        self.pending: list[bytes] = []

    @classmethod
    async def connect(cls, port: int, user: str = "guest", password: str = "guest") -> StreamClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=8 << 20)
        client = cls(reader, writer)
        await client.call(Key.PEER_PROPERTIES, b"\x00\x00\x00\x00")
        await client.call(Key.SASL_HANDSHAKE, b"")
        sasl = b"\x00" + user.encode() + b"\x00" + password.encode()
        await client.call(
            Key.SASL_AUTHENTICATE, encode_string("PLAIN") + struct.pack(">i", len(sasl)) + sasl
        )
        tune = await client.frame(Key.TUNE)
        writer.write(_FRAME.pack(12, Key.TUNE, 1) + tune.data[4:12])
        await client.call(Key.OPEN, encode_string("/"))
        return client

    async def frame(self, key: int) -> Fields:
        """The next frame of `key` (others in between are dropped)."""
        while True:
            while self.pending:
                fields = Fields(self.pending.pop(0))
                if fields.key == key:
                    return fields
            data = await self.reader.read(1 << 20)
            if not data:
                raise ConnectionError("the broker closed the connection")
            self.pending.extend(self.splitter.feed(data))

    async def call(self, key: int, body: bytes) -> Fields:
        self.corr += 1
        self.writer.write(_request(key, self.corr, body))
        answer = await self.frame(key | 0x8000)
        answer.u32()
        code = answer.u16()
        if code != Code.OK:
            raise RuntimeError(f"command {key:#x} answered {code:#x}")
        return answer

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass


async def create_stream(port: int, stream: str) -> None:
    client = await StreamClient.connect(port)
    try:
        await client.call(Key.CREATE, encode_string(stream) + b"\x00\x00\x00\x00")
    finally:
        await client.close()


async def publish(port: int, stream: str, n: int, body: int = 100, batch: int = 100,
                  window: int = 10_000) -> float:  # fmt: skip
    """Seconds from the first write to the last confirm of `n` messages."""
    client = await StreamClient.connect(port)
    await client.call(
        Key.DECLARE_PUBLISHER, struct.pack(">B", 1) + encode_string("") + encode_string(stream)
    )
    message = data_message(b"x" * body)
    entry = struct.pack(">I", len(message)) + message
    head = struct.Struct(">IHHBi")
    pid = struct.Struct(">Q")
    confirmed = 0
    sent = 0
    started = time.perf_counter()
    writer = client.writer
    while confirmed < n:
        while sent < n and sent - confirmed < window:
            k = min(batch, n - sent)
            parts = [head.pack(4 + 1 + 4 + k * (8 + len(entry)), Key.PUBLISH, 1, 1, k)]
            for i in range(sent, sent + k):
                parts.append(pid.pack(i + 1))
                parts.append(entry)
            writer.write(b"".join(parts))
            sent += k
        data = await client.reader.read(1 << 20)
        if not data:
            raise ConnectionError("the broker closed the connection")
        for frame in client.splitter.feed(data):
            key = struct.unpack_from(">H", frame)[0]
            if key == Key.PUBLISH_CONFIRM:
                confirmed += struct.unpack_from(">i", frame, 5)[0]
            elif key == Key.PUBLISH_ERROR:
                raise RuntimeError("publish error")
    elapsed = time.perf_counter() - started
    await client.close()
    return elapsed


class _ChunkCounter(asyncio.BufferedProtocol):
    """Counts delivered messages as bytes arrive, reading only each frame's head in place
    (its size, key and the chunk's entry count) and skipping the rest without copying it:
    the consumer's own cost per byte is the kernel's copy, so the rate measured is the
    broker's. One credit is granted back per chunk counted."""

    _HEAD = struct.Struct(">IHH")  # size, key, version
    _NEED = 4 + 2 + 2 + 1 + 8 + 1 + 1 + 2  # to a v2 deliver's entry count

    def __init__(self, transport: asyncio.BaseTransport, n: int) -> None:
        self.transport = transport
        self.n = n
        self.got = 0
        self.buf = bytearray(4 << 20)
        self.view = memoryview(self.buf)
        self.start = self.end = 0
        self.skip = 0  # bytes of the current frame still to pass over
        self.done: asyncio.Future = asyncio.get_running_loop().create_future()
        self.one_credit = _FRAME.pack(7, Key.CREDIT, 1) + struct.pack(">BH", 1, 1)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.start == self.end:
            self.start = self.end = 0
        elif len(self.buf) - self.end < 65536:  # only a frame head's first bytes are kept
            kept = self.end - self.start
            self.buf[:kept] = self.buf[self.start : self.end]
            self.start, self.end = 0, kept
        return self.view[self.end :]

    def buffer_updated(self, nbytes: int) -> None:
        self.end += nbytes
        buf = self.buf
        grants = 0
        while True:
            if self.skip:
                step = min(self.skip, self.end - self.start)
                self.start += step
                self.skip -= step
                if self.skip:
                    break
            avail = self.end - self.start
            if avail < 8:
                break
            size, key, version = self._HEAD.unpack_from(buf, self.start)
            if avail < min(self._NEED, 4 + size):  # a deliver's head, or a whole short frame
                break
            if key == Key.DELIVER:
                at = self.start + 8 + (1 if version == 1 else 9) + 2  # to the entry count
                self.got += struct.unpack_from(">H", buf, at)[0]
                grants += 1
            elif key == Key.SUBSCRIBE | 0x8000:
                code = struct.unpack_from(">H", buf, self.start + 12)[0]
                if code != Code.OK and not self.done.done():
                    self.done.set_exception(RuntimeError(f"subscribe answered {code:#x}"))
            self.skip = 4 + size
        if grants:
            self.transport.write(self.one_credit * grants)  # type: ignore[attr-defined]
        if self.got >= self.n and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError("the broker closed the connection"))


async def consume_steady(
    port: int, stream: str, n: int, seconds: float = 8.0, credit: int = 10
) -> dict[str, float]:
    """Steady-state consuming: the stream's `n` messages read from `first` again and again
    (one subscription after another), one pass as a warm-up, then passes until `seconds`
    have gone by; messages/s over those passes, and the slowest and fastest pass."""
    await consume(port, stream, n, credit)
    passes: list[float] = []
    while sum(passes) < seconds:
        passes.append(await consume(port, stream, n, credit))
    return {
        "msg_per_s": n * len(passes) / sum(passes),
        "passes": len(passes),
        "seconds": sum(passes),
        "slowest_pass_msg_per_s": n / max(passes),
        "fastest_pass_msg_per_s": n / min(passes),
    }


async def consume(port: int, stream: str, n: int, credit: int = 10) -> float:
    """Seconds from subscribing at `first` to the n-th message."""
    client = await StreamClient.connect(port)
    transport = client.writer.transport
    counter = _ChunkCounter(transport, n)
    transport.set_protocol(counter)  # the handshake is over: nothing more is buffered
    started = time.perf_counter()
    client.corr += 1
    transport.write(
        _request(
            Key.SUBSCRIBE,
            client.corr,
            struct.pack(">B", 1) + encode_string(stream) + struct.pack(">H", OffsetType.FIRST)
            + struct.pack(">H", credit) + b"\x00\x00\x00\x00",
        )
    )  # fmt: skip
    await counter.done
    elapsed = time.perf_counter() - started
    transport.close()
    return elapsed
