"""Bad input on the stream port: each gets the protocol's error response or close with
RabbitMQ's code, is logged, and the broker goes on serving everyone else."""

from __future__ import annotations

import asyncio
import struct

from rstream import AMQPMessage
from support.stream_clients import producer_of

from roarmq.protocol.stream.codec import Code, Key


async def _open_raw(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def _frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), 5))
    return await asyncio.wait_for(reader.readexactly(size), 5)


def _peer_properties(corr: int = 1) -> bytes:
    body = struct.pack(">HHII", Key.PEER_PROPERTIES, 1, corr, 0)
    return struct.pack(">I", len(body)) + body


async def test_an_unknown_command_closes_with_unknown_frame(broker):
    reader, writer = await _open_raw(broker.stream_port)
    writer.write(_peer_properties())
    await _frame(reader)  # the server's peer properties
    body = struct.pack(">HHI", 0x7F00, 1, 9)
    writer.write(struct.pack(">I", len(body)) + body)
    close = await _frame(reader)
    key, _version, _corr, code = struct.unpack_from(">HHIH", close)
    assert (key, code) == (Key.CLOSE, Code.UNKNOWN_FRAME)
    assert await asyncio.wait_for(reader.read(), 5) == b""  # then the socket closes
    writer.close()


async def test_a_command_before_login_and_a_short_frame_close_the_connection(broker):
    for payload in (
        struct.pack(">HHI", Key.CREATE, 1, 1) + b"\x00\x01s\x00\x00\x00\x00",  # not logged in
        struct.pack(">HH", Key.PEER_PROPERTIES, 1) + b"\x00",  # ends inside a field
    ):
        reader, writer = await _open_raw(broker.stream_port)
        writer.write(struct.pack(">I", len(payload)) + payload)
        close = await _frame(reader)
        assert struct.unpack_from(">H", close)[0] == Key.CLOSE
        assert struct.unpack_from(">H", close, 8)[0] == Code.UNKNOWN_FRAME
        writer.close()


async def test_a_frame_over_frame_max_closes_with_frame_too_large(broker):
    reader, writer = await _open_raw(broker.stream_port)
    writer.write(struct.pack(">I", 2 << 20) + b"\x00" * 64)
    close = await _frame(reader)
    assert struct.unpack_from(">H", close, 8)[0] == Code.FRAME_TOO_LARGE
    writer.close()


async def test_others_go_on_while_a_peer_sends_garbage(broker):
    async with producer_of(broker) as producer:
        await producer.create_stream("calm")
        reader, writer = await _open_raw(broker.stream_port)
        writer.write(b"\x00\x00\x00\x03\xff\xff\xff" * 10)
        await producer.send_wait("calm", AMQPMessage(body=b"still here"))
        writer.close()


async def test_an_unknown_sasl_mechanism_is_answered_so(broker):
    reader, writer = await _open_raw(broker.stream_port)
    writer.write(_peer_properties())
    await _frame(reader)
    mechanism = b"CRAM-MD5"
    body = struct.pack(">HHIh", Key.SASL_AUTHENTICATE, 1, 2, len(mechanism)) + mechanism
    body += struct.pack(">i", 0)
    writer.write(struct.pack(">I", len(body)) + body)
    answer = await _frame(reader)
    key, _version, corr, code = struct.unpack_from(">HHIH", answer)
    assert (key, corr, code) == (
        Key.SASL_AUTHENTICATE | 0x8000,
        2,
        Code.SASL_MECHANISM_NOT_SUPPORTED,
    )
    writer.close()


async def test_heartbeats_are_sent_and_a_silent_peer_is_closed(broker):
    """Tuned to a 1-s heartbeat, the broker sends heartbeats, and closes a peer that sent
    nothing for two periods."""
    from roarmq.broker.stream_protocol.relay import open_upstream

    reader, writer, _ = await open_upstream(
        "127.0.0.1",
        broker.stream_port,
        vhost="/",
        properties={},
        sasl=b"\x00guest\x00guest",
        frame_max=0,
        heartbeat=1,
    )
    started = asyncio.get_running_loop().time()
    beats = 0
    while True:
        try:
            frame = await _frame(reader)
        except asyncio.IncompleteReadError:
            break
        if struct.unpack_from(">H", frame)[0] == Key.HEARTBEAT:
            beats += 1
    waited = asyncio.get_running_loop().time() - started
    assert beats >= 1 and 2 <= waited < 6, (beats, waited)
    writer.close()
