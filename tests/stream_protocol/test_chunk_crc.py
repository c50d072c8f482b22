"""Delivered chunks read as a client that checks them reads them: each deliver frame's
chunk header says how many entries follow and their CRC-32 (the Java client verifies it by
default), whether the chunk is one stored batch, several batches sent on as stored (their
CRC combined from theirs, not recomputed), or single messages published over AMQP 0-9-1.
The same reader runs against RabbitMQ 3.10.8."""

from __future__ import annotations

import asyncio
import struct
import zlib

import aio_pika
from support.stream_clients import producer_of

from roarmq.broker.stream_protocol.publishing import HOLD_BYTES
from roarmq.protocol.stream import codec
from roarmq.protocol.stream.amqp10 import data_message
from roarmq.protocol.stream.codec import Code, FrameSplitter, Key, OffsetType, encode_string

_CHUNK = struct.Struct(">BbHIqQQIIIB3x")  # osiris's chunk header


class _RawClient:
    """Just enough of the protocol to subscribe and read deliver frames whole."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.splitter = FrameSplitter()
        self.frames: list[bytes] = []
        self.corr = 0

    async def next_frame(self) -> bytes:
        while not self.frames:
            data = await asyncio.wait_for(self.reader.read(1 << 20), 10)
            assert data, "the broker closed the connection"
            self.frames.extend(self.splitter.feed(data))
        return self.frames.pop(0)

    async def call(self, key: int, body: bytes) -> bytes:
        self.corr += 1
        frame = struct.pack(">HHI", key, 1, self.corr) + body
        self.writer.write(struct.pack(">I", len(frame)) + frame)
        while True:
            answer = await self.next_frame()
            if struct.unpack_from(">H", answer)[0] == key | 0x8000:
                assert struct.unpack_from(">H", answer, 8)[0] == Code.OK, hex(key)
                return answer

    @classmethod
    async def connect(cls, port: int) -> _RawClient:
        client = cls(*await asyncio.open_connection("127.0.0.1", port))
        await client.call(Key.PEER_PROPERTIES, b"\x00\x00\x00\x00")
        await client.call(Key.SASL_HANDSHAKE, b"")
        sasl = b"\x00guest\x00guest"
        await client.call(
            Key.SASL_AUTHENTICATE, encode_string("PLAIN") + struct.pack(">i", len(sasl)) + sasl
        )
        tune = await client.next_frame()
        assert struct.unpack_from(">H", tune)[0] == Key.TUNE
        client.writer.write(struct.pack(">IHH", 12, Key.TUNE, 1) + tune[4:12])
        await client.call(Key.OPEN, encode_string("/"))
        return client


async def _chunks(
    port: int, stream: str, total: int, credit: int = 5, pause: float = 0.0
) -> list[tuple[int, int, bytes, int]]:
    """(first offset, entries, data, CRC the header states) of each chunk from `first`
    until `total` messages came (after `pause` seconds of not reading)."""
    client = await _RawClient.connect(port)
    try:
        body = (
            struct.pack(">B", 1)
            + encode_string(stream)
            + struct.pack(">HH", OffsetType.FIRST, credit)
            + b"\x00\x00\x00\x00"
        )
        await client.call(Key.SUBSCRIBE, body)
        await asyncio.sleep(pause)
        chunks = []
        got = 0
        while got < total:
            frame = await client.next_frame()
            key, version = struct.unpack_from(">HH", frame)
            if key != Key.DELIVER:
                continue
            at = 5 if version == 1 else 13
            (_magic, _type, entries, _records, _ts, _epoch, first, crc, size, _trailer, bloom) = (
                _CHUNK.unpack_from(frame, at)
            )
            start = at + _CHUNK.size + bloom  # (a Bloom filter, then the data)
            data = frame[start : start + size]
            assert len(data) == size
            chunks.append((first, entries, data, crc))
            got += entries
            credit = struct.pack(">HHBH", Key.CREDIT, 1, 1, 1)
            client.writer.write(struct.pack(">I", len(credit)) + credit)
        return chunks
    finally:
        client.writer.close()


def _messages(data: bytes) -> list[bytes]:
    out, p = [], 0
    while p < len(data):
        (n,) = struct.unpack_from(">I", data, p)
        assert not n & 0x80000000  # simple entries only
        out.append(data[p + 4 : p + 4 + n])
        p += 4 + n
    return out


async def test_every_delivered_chunk_has_the_crc_of_its_entries(target, name):
    async with producer_of(target) as producer:
        await producer.create_stream(name)
        for frame in range(6):  # six publish frames of 50: batches merged into chunks
            await producer.send_batch(
                name, [data_message(b"b%d-%d" % (frame, i)) for i in range(50)]
            )
    connection = await aio_pika.connect(target.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        for i in range(20):  # then single messages over AMQP 0-9-1
            await channel.default_exchange.publish(
                aio_pika.Message(b"a-%d" % i, delivery_mode=2), routing_key=name
            )
    async with producer_of(target) as producer:
        await producer.send_batch(name, [data_message(b"c-%d" % i) for i in range(30)])

    chunks = await _chunks(target.stream_port, name, 350)
    expected = 0
    for first, entries, data, crc in chunks:
        assert crc == zlib.crc32(data), (first, entries)
        assert len(_messages(data)) == entries
        assert first == expected
        expected += entries
    assert expected == 350


async def _publish_frames(port: int, stream: str, frames: int, per_frame: int) -> None:
    """`frames` publish frames of `per_frame` numbered 100-byte messages, written at once
    (so the broker reads several together and stores them as one batch record), then
    every confirm awaited."""
    client = await _RawClient.connect(port)
    try:
        await client.call(Key.CREATE, encode_string(stream) + b"\x00\x00\x00\x00")
        await client.call(
            Key.DECLARE_PUBLISHER, b"\x01" + encode_string("") + encode_string(stream)
        )
        out = []
        for f in range(frames):
            parts = [struct.pack(">HHBi", Key.PUBLISH, 1, 1, per_frame)]
            for i in range(f * per_frame, (f + 1) * per_frame):
                message = data_message(b"%08d" % i + b"x" * 92)
                parts.append(struct.pack(">QI", i + 1, len(message)) + message)
            frame = b"".join(parts)
            out.append(struct.pack(">I", len(frame)) + frame)
        client.writer.write(b"".join(out))
        confirmed = 0
        while confirmed < frames * per_frame:
            frame = await client.next_frame()
            if struct.unpack_from(">H", frame)[0] == Key.PUBLISH_CONFIRM:
                confirmed += struct.unpack_from(">i", frame, 5)[0]
    finally:
        client.writer.close()


def _check_numbered(chunks: list[tuple[int, int, bytes, int]], total: int) -> None:
    expected = 0
    for first, entries, data, crc in chunks:
        assert crc == zlib.crc32(data), (first, entries)
        messages = _messages(data)
        assert len(messages) == entries
        assert first == expected
        for k, message in enumerate(messages):
            assert message == data_message(b"%08d" % (first + k) + b"x" * 92)
        expected += entries
    assert expected == total


async def test_large_stored_batches_go_from_their_files_whole_and_in_order(broker, name):
    """Frames read together are one batch record; one of 64 KiB or more goes to a
    subscription from its segment file (sendfile), its bytes exactly as stored, and
    consecutive ones go as one chunk (their CRC combined from theirs)."""
    await _publish_frames(broker.stream_port, name, 40, 1000)
    chunks = await _chunks(broker.stream_port, name, 40_000)
    _check_numbered(chunks, 40_000)
    largest = max(entries for _first, entries, _data, _crc in chunks)
    assert largest > 1000  # frames joined
    # more than one batch record holds (one is at most HOLD_BYTES and the frame that
    # passed it, of 1,000 entries of 112 bytes): stored batches sent as one chunk
    assert largest > HOLD_BYTES // 112 + 1000
    assert (
        broker.broker.totals.stream_file_bytes_sent > 3_000_000
    )  # most of the 4.4 MB went by sendfile


async def test_without_libz_each_stored_batch_is_a_chunk_of_its_own(broker, name, monkeypatch):
    """No crc32_combine to join stored CRCs with: batches go from their files one a chunk,
    each with the CRC it was stored with."""
    monkeypatch.setattr(codec, "_COMBINE", None)
    await _publish_frames(broker.stream_port, name, 40, 1000)
    chunks = await _chunks(broker.stream_port, name, 40_000)
    _check_numbered(chunks, 40_000)
    assert max(entries for _first, entries, _data, _crc in chunks) <= HOLD_BYTES // 112 + 1000


async def test_a_consumer_that_stops_reading_gets_every_chunk_whole_afterwards(broker, name):
    """With 100 chunks of credit and the consumer not reading, the socket fills while
    chunks are sent from their files: what it does not take goes through the transport
    (read into memory), after what it took, and the consumer later reads every chunk
    whole and in order."""
    await _publish_frames(broker.stream_port, name, 120, 1000)
    chunks = await _chunks(broker.stream_port, name, 120_000, credit=100, pause=1.0)
    _check_numbered(chunks, 120_000)
    assert (
        broker.broker.totals.stream_file_bytes_copied > 0
    )  # the socket was full at least once: the fallback ran
