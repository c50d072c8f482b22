"""A stream connection opened on a cluster node that does not serve its vhost: this node logs
in to the one that does, as the client (the same PLAIN credentials, peer properties,
tune and vhost), answers the client's open with that node's answer (its advertised host
and port: clients connect there for what they publish and read), and from then on passes
bytes both ways untouched. A client pointed at any node of a cluster works as it does
against RabbitMQ: metadata names the leader, and the commands it sends this connection
(create, delete, metadata, offsets, super streams) are the leader's to answer."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from roarmq.protocol.stream.codec import (
    Code,
    Fields,
    FrameError,
    FrameSplitter,
    Key,
    encode_bytes,
    encode_properties,
    encode_string,
)

#: How long the leader may take to answer the relayed handshake.
HANDSHAKE_TIMEOUT = 5.0


class RelayRefused(Exception):
    """The leader refused the relayed login or open: the client gets `code`."""

    def __init__(self, code: int) -> None:
        super().__init__(f"refused with {code:#x}")
        self.code = code


def _request(key: int, corr: int, body: bytes) -> bytes:
    return struct.pack(">IHHI", 8 + len(body), key, 1, corr) + body


async def open_upstream(
    host: str,
    port: int,
    *,
    vhost: str,
    properties: dict[str, str],
    sasl: bytes,
    frame_max: int,
    heartbeat: int,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, dict[str, str]]:
    """Log in to the serving node and open `vhost` there; its open answer's properties."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), HANDSHAKE_TIMEOUT)
    splitter = FrameSplitter()
    pending: list[bytes] = []

    async def answer(key: int) -> Fields:
        while True:
            while pending:
                fields = Fields(pending.pop(0))
                if fields.key == key:
                    return fields
            data = await reader.read(65536)
            if not data:
                raise ConnectionError("the serving node closed the relayed connection")
            pending.extend(splitter.feed(data))

    async def call(key: int, corr: int, body: bytes) -> Fields:
        writer.write(_request(key, corr, body))
        fields = await answer(key | 0x8000)
        fields.u32()
        code = fields.u16()
        if code != Code.OK:
            raise RelayRefused(code)
        return fields

    async def handshake() -> dict[str, str]:
        await call(Key.PEER_PROPERTIES, 1, encode_properties(properties))
        await call(Key.SASL_HANDSHAKE, 2, b"")
        await call(Key.SASL_AUTHENTICATE, 3, encode_string("PLAIN") + encode_bytes(sasl))
        await answer(Key.TUNE)
        writer.write(struct.pack(">IHHII", 12, Key.TUNE, 1, frame_max, heartbeat))
        opened = await call(Key.OPEN, 4, encode_string(vhost))
        return opened.properties() if opened.remaining() else {}

    try:
        props = await asyncio.wait_for(handshake(), HANDSHAKE_TIMEOUT)
    except BaseException:
        writer.close()
        raise
    if pending or splitter.feed(b""):
        writer.close()
        raise FrameError("the serving node sent frames before the relay began")
    return reader, writer, props


async def pipe(reader: asyncio.StreamReader, transport: Any) -> None:
    """The serving node's bytes to the client, until either side ends."""
    while True:
        data = await reader.read(1 << 20)
        if not data or transport.is_closing():
            return
        transport.write(data)
