"""Hostile sessions for the stream protocol's port: RabbitMQ's stream handshake (or none,
or part of it), then commands with fields drawn from pools of interesting values, then
the same bytes mutated (flipped, cut, lengths lied about). `closes` reads what the broker
answered: every close frame's code, the one the run fails on being INTERNAL_ERROR."""

from __future__ import annotations

import random
import struct

from roarmq.protocol.stream.codec import Code, Key

_PLAIN = b"\x00guest\x00guest"


def _s(text: bytes) -> bytes:
    return struct.pack(">h", len(text)) + text


def _b(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def frame(key: int, body: bytes, version: int = 1) -> bytes:
    return struct.pack(">IHH", 4 + len(body), key, version) + body


def handshake() -> list[bytes]:
    return [
        frame(Key.PEER_PROPERTIES, struct.pack(">Ii", 1, 1) + _s(b"product") + _s(b"fuzz")),
        frame(Key.SASL_HANDSHAKE, struct.pack(">I", 2)),
        frame(Key.SASL_AUTHENTICATE, struct.pack(">I", 3) + _s(b"PLAIN") + _b(_PLAIN)),
        frame(Key.TUNE, struct.pack(">II", 1 << 20, 0)),
        frame(Key.OPEN, struct.pack(">I", 4) + _s(b"/")),
    ]


_NAMES = [b"fz", b"fz", b"", b"amq.x", b"\xff\xfe", b"n" * 300, b"fz-super", b"fz-0"]
_INTS = [0, 1, 2, 255, 65535, 2**31 - 1, 2**32 - 1]


def _command(rng: random.Random, corr: int) -> bytes:
    name = rng.choice(_NAMES)
    sub = rng.choice((0, 1, 7, 255))
    kind = rng.choice(list(Key))
    c = struct.pack(">I", corr)
    bodies = {
        Key.CREATE: c + _s(name) + struct.pack(">i", 1) + _s(b"max-age") + _s(rng.choice((b"1h", b"x", b""))),
        Key.DELETE: c + _s(name),
        Key.METADATA: c + struct.pack(">i", 2) + _s(name) + _s(rng.choice(_NAMES)),
        Key.DECLARE_PUBLISHER: c + struct.pack(">B", sub) + _s(rng.choice((b"", b"ref"))) + _s(name),
        Key.PUBLISH: struct.pack(">Bi", sub, rng.choice((1, 2, 0, -1, 1000)))
        + struct.pack(">Q", rng.choice(_INTS)) + _b(rng.choice((b"\x00Su\xa0\x01x", b"", b"\x00\x00\xff"))),
        Key.QUERY_PUBLISHER_SEQUENCE: c + _s(b"ref") + _s(name),
        Key.DELETE_PUBLISHER: c + struct.pack(">B", sub),
        Key.SUBSCRIBE: c + struct.pack(">B", sub) + _s(name)
        + struct.pack(">HQH", rng.choice((1, 2, 3, 4, 5, 0, 9)), rng.choice(_INTS), rng.choice((0, 1, 65535)))
        + struct.pack(">i", rng.choice((0, 1))) + (_s(b"filter.1") + _s(b"a")),
        Key.CREDIT: struct.pack(">BH", sub, rng.choice((0, 1, 65535))),
        Key.STORE_OFFSET: _s(b"reader") + _s(name) + struct.pack(">Q", rng.choice(_INTS)),
        Key.QUERY_OFFSET: c + _s(b"reader") + _s(name),
        Key.UNSUBSCRIBE: c + struct.pack(">B", sub),
        Key.ROUTE: c + _s(b"k") + _s(name),
        Key.PARTITIONS: c + _s(name),
        Key.CREATE_SUPER_STREAM: c + _s(name) + struct.pack(">i", 2) + _s(b"fz-0") + _s(b"fz-1")
        + struct.pack(">i", rng.choice((2, 1))) + _s(b"0") + _s(b"1") + struct.pack(">i", 0),
        Key.DELETE_SUPER_STREAM: c + _s(name),
        Key.STREAM_STATS: c + _s(name),
        Key.EXCHANGE_COMMAND_VERSIONS: c + struct.pack(">i", 1) + struct.pack(">HHH", 8, 1, 2),
        Key.HEARTBEAT: b"",
        Key.CLOSE: c + struct.pack(">H", 1) + _s(b"bye"),
    }  # fmt: skip
    body = bodies.get(kind, c + rng.randbytes(rng.randrange(0, 40)))
    return frame(kind, body, rng.choice((1, 1, 1, 2, 3)))


def _mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randrange(1, 6)):
        if not b:
            break
        i = rng.randrange(len(b))
        op = rng.random()
        if op < 0.5:
            b[i] ^= 1 << rng.randrange(8)
        elif op < 0.75:
            del b[i : i + rng.randrange(1, 8)]
        else:
            b[i:i] = rng.randbytes(rng.randrange(1, 8))
    return bytes(b)


def session(rng: random.Random) -> list[bytes]:
    """A connection's bytes: usually a whole handshake, then 1-40 commands, some mutated."""
    frames = handshake()
    if rng.random() < 0.15:
        frames = frames[: rng.randrange(0, len(frames))]
    for i in range(rng.randrange(1, 40)):
        command = _command(rng, 100 + i)
        frames.append(_mutate(rng, command) if rng.random() < 0.3 else command)
    if rng.random() < 0.1:
        frames.append(rng.randbytes(rng.randrange(1, 2048)))
    return frames


def closes(data: bytes) -> list[int]:
    """The code of every close frame the broker sent, and of every response that was an
    INTERNAL_ERROR (what the run fails on)."""
    out = []
    pos = 0
    while pos + 8 <= len(data):
        (size,) = struct.unpack_from(">I", data, pos)
        body = data[pos + 4 : pos + 4 + size]
        if len(body) < size or size < 4:
            break
        key = struct.unpack_from(">H", body)[0]
        if key == Key.CLOSE and len(body) >= 10:
            out.append(struct.unpack_from(">H", body, 8)[0])
        elif key & 0x8000 and key not in (Key.CREDIT | 0x8000, Key.METADATA | 0x8000):
            if len(body) >= 10 and struct.unpack_from(">H", body, 8)[0] == Code.INTERNAL_ERROR:
                out.append(Code.INTERNAL_ERROR)
        pos += 4 + size
    return out
