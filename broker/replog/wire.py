"""Frames of the replication port: what a vhost's leader and its followers say to each other.

Every frame is ``u32 length | u8 kind | body`` (big-endian; length counts kind and body).

    HELLO    F->L  JSON {"vhost", "node", "epoch", "offset", "last_epoch", "epochs", "copy",
                   "version", "min_version"}: who I am, the epoch I know, the highest
                   offset I hold durable, the epoch it was written at, my epoch history
                   ([first offset, epoch]...), the identity of my copy of the log, and
                   the protocol versions I speak and need
    WELCOME  L->F  JSON {"epoch", "start", "version", "min_version"}: records follow from
                   offset `start`

Versions: each side refuses a peer whose `min_version` is above the version it speaks (a
missing field is version 1). A newer node joins an older cluster by speaking the older
version until every node speaks the newer one.
    REFUSE   both  JSON {"reason", "epoch"}: then the sender closes
    RECORDS  L->F  u64 epoch, u32 count, count x (u64 offset, u32 length, payload); an
                   empty one is the leader's heartbeat on a quiet log (acked as any)
    RESET    L->F  u64 epoch, u64 start: drop everything you hold; a snapshot (records from
                   `start`) follows, then the stream goes on
    ACK      F->L  u64 epoch, u64 durable offset
    TRUNCATE L->F  u64 epoch, u64 last: drop your records above `last` (they were written
                   at an epoch whose log ends there: a diverged tail); the stream goes on
                   from `last` + 1

Control frames are JSON because they are rare; RECORDS and ACK are packed because they are
the stream. One RECORDS frame is one batch: the leader writes it with one call, the follower
appends all of it and makes it durable with one fsync.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Iterable

HELLO, WELCOME, REFUSE, RECORDS, RESET, ACK, TRUNCATE = range(1, 8)

#: The protocol version this node speaks, and the oldest one it can replicate with.
VERSION = 1
MIN_VERSION = 1
VERSIONS = {"version": VERSION, "min_version": MIN_VERSION}


def unsupported(fields: dict) -> str | None:
    """Why a peer that sent `fields` (its HELLO or WELCOME) cannot be replicated with."""
    needed = int(fields.get("min_version", 1))
    if needed > VERSION:
        return f"the peer needs replication protocol {needed}; this node speaks {VERSION}"
    return None


_HEAD = struct.Struct(">IB")
_U64U32 = struct.Struct(">QI")
_U64U64 = struct.Struct(">QQ")
MAX_FRAME = 256 << 20


class ProtocolError(Exception):
    """The peer sent something this side cannot accept: the connection is dropped."""


def control(kind: int, fields: dict) -> bytes:
    body = json.dumps(fields).encode()
    return _HEAD.pack(len(body) + 1, kind) + body


def records_frame(epoch: int, records: Iterable[tuple[int, bytes]]) -> bytes:
    """One batch as one frame (built with one join: one allocation for the write)."""
    parts = [b"", _U64U32.pack(epoch, 0)]
    count = 0
    for offset, payload in records:
        parts.append(_U64U32.pack(offset, len(payload)))
        parts.append(payload)
        count += 1
    parts[1] = _U64U32.pack(epoch, count)
    size = sum(len(p) for p in parts) + 1
    parts[0] = _HEAD.pack(size, RECORDS)
    return b"".join(parts)


def decode_records(body: bytes) -> tuple[int, list[tuple[int, bytes]]]:
    epoch, count = _U64U32.unpack_from(body, 0)
    pos = _U64U32.size
    out = []
    view = memoryview(body)
    for _ in range(count):
        offset, n = _U64U32.unpack_from(body, pos)
        pos += _U64U32.size
        out.append((offset, bytes(view[pos : pos + n])))
        pos += n
    if pos != len(body):
        raise ProtocolError("RECORDS frame length does not match its records")
    return epoch, out


def pair_frame(kind: int, a: int, b: int) -> bytes:
    """RESET (epoch, start) and ACK (epoch, offset)."""
    return _HEAD.pack(1 + _U64U64.size, kind) + _U64U64.pack(a, b)


def decode_pair(body: bytes) -> tuple[int, int]:
    if len(body) != _U64U64.size:
        raise ProtocolError("bad fixed-size frame")
    return _U64U64.unpack(body)


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """(kind, body); raises asyncio.IncompleteReadError when the peer closed."""
    size, kind = _HEAD.unpack(await reader.readexactly(_HEAD.size))
    if not 1 <= size <= MAX_FRAME:
        raise ProtocolError(f"frame of {size} bytes")
    return kind, await reader.readexactly(size - 1)


def decode_control(body: bytes) -> dict:
    try:
        fields = json.loads(body)
    except ValueError as exc:
        raise ProtocolError("control frame is not JSON") from exc
    if not isinstance(fields, dict):
        raise ProtocolError("control frame is not an object")
    return fields
