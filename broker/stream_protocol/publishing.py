"""Publishing over the stream protocol: declared publishers, publish frames into their
stream (a publisher's frames of plain messages read together as one batch record; a message
with a filter value alone; ids a named publisher stored already confirmed, not stored
again), confirms once durable, query-publisher-sequence. Each command is a function of
(connection, frame fields)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from roarmq.protocol.stream.codec import (
    Code,
    Fields,
    Key,
    encode_publish_confirm,
    encode_publish_error,
    published,
    published_entries,
)

from ..core.stream import CHUNK_RECORDS, Stream
from .errors import Refused

if TYPE_CHECKING:
    from .connection import StreamConnection

#: A publisher's frames of plain messages read together (one read of its socket) are held
#: and go into the stream as one batch record of up to this many bytes, as RabbitMQ's osiris
#: writer makes one chunk of what is pending: a subscription later gets it as stored, and
#: fewer, larger records cost less to write, to read and to send.
HOLD_BYTES = 256 << 10
HOLD_MESSAGES = CHUNK_RECORDS  # (a chunk's entry count is 16 bits on the wire)


class Publisher:
    """A declared publisher: its stream, its reference (deduplication) and the publishes
    waiting for the stream: an internal sequence number each, confirmed in order."""

    __slots__ = (
        "conn", "id", "stream", "reference", "seq", "_ids", "_confirmed", "_failed",
        "published", "confirmed", "errored",
    )  # fmt: skip

    def __init__(self, conn: StreamConnection, pid: int, stream: Stream, reference: str | None):
        self.conn = conn
        self.id = pid
        self.stream = stream
        self.reference = reference
        self.seq = 0
        self._ids: dict[int, list[int]] = {}  # sequence number -> its publishing ids
        self._confirmed: list[int] = []
        self._failed: list[tuple[int, int]] = []
        self.published = self.confirmed = self.errored = 0  # messages, for the API

    def expect(self, publishing_ids: list[int]) -> int:
        """The ids of one append (a batch, or a message alone) wait under one sequence
        number for the stream to have them durably."""
        self.seq += 1
        self._ids[self.seq] = publishing_ids
        return self.seq

    # the stream's confirm waiters call these (as they call a channel's)
    def disk_confirmed(self, seq: int) -> None:
        ids = self._ids.pop(seq, None)
        if ids is not None:
            self._confirmed += ids

    def disk_failed(self, seq: int) -> None:
        ids = self._ids.pop(seq, None)
        if ids is not None:
            self._failed += [(pid, Code.INTERNAL_ERROR) for pid in ids]

    def flush_confirms(self) -> None:
        if self._confirmed:
            ids, self._confirmed = self._confirmed, []
            self.confirmed += len(ids)
            self.conn.broker.totals.stream_confirmed += len(ids)
            self.conn.send(encode_publish_confirm(self.id, ids))
        if self._failed:
            failed, self._failed = self._failed, []
            self.errored += len(failed)
            self.conn.send(encode_publish_error(self.id, failed))


def declare_publisher(conn: StreamConnection, f: Fields) -> None:
    corr = f.u32()
    pid = f.u8()
    reference = f.string() or None
    name = f.text()

    def run() -> None:
        if pid in conn.publishers:
            raise Refused(Code.PRECONDITION_FAILED, f"publisher id {pid} already declared")
        conn.check("write", name)
        stream = conn.stream_named(name)
        if reference is not None and len(reference.encode()) > 255:
            raise Refused(Code.PRECONDITION_FAILED, "publisher reference over 255 bytes")
        if reference is not None and any(
            p.reference == reference and p.stream is stream for p in conn.publishers.values()
        ):
            raise Refused(Code.PRECONDITION_FAILED, f"publisher reference {reference!r} in use")
        conn.publishers[pid] = Publisher(conn, pid, stream, reference)
        stream.watchers.add(conn)

    conn.answer(Key.DECLARE_PUBLISHER, corr, run)


def delete_publisher(conn: StreamConnection, f: Fields) -> None:
    corr = f.u32()
    pid = f.u8()

    def run() -> None:
        pub = conn.publishers.pop(pid, None)
        if pub is None:
            raise Refused(Code.PUBLISHER_DOES_NOT_EXIST)
        conn.unwatch_if_unused(pub.stream)

    conn.answer(Key.DELETE_PUBLISHER, corr, run)


def block_if_alarmed(conn: StreamConnection) -> None:
    """A resource alarm (memory, disk, a cluster node's lost lease) stops reading from
    publishers, as over AMQP: what was sent waits in the socket until it clears."""
    if conn.broker.alarms and not conn.blocked and conn.transport is not None:
        conn.blocked = True
        conn.transport.pause_reading()


def publish(conn: StreamConnection, f: Fields) -> None:
    """A publish frame: its messages without a filter value go into the stream as one
    batch record (stored as they will be delivered), those with one each alone (the
    filter summaries are per message); ids a named publisher stored already are
    confirmed and not stored again. Confirmed together once durable."""
    block_if_alarmed(conn)
    start = f.pos
    plain = published_entries(f)
    if plain is not None and hold_plain(conn, *plain):
        return
    release_held(conn)  # (what the general path checks or appends comes after those)
    f.pos = start  # read again, message by message
    pid, messages = published(f)
    pub = conn.publishers.get(pid)
    if pub is None:
        conn.send(
            encode_publish_error(pid, [(m[0], Code.PUBLISHER_DOES_NOT_EXIST) for m in messages])
        )
        return
    stream = pub.stream
    if stream.deleted:
        conn.send(encode_publish_error(pid, [(m[0], Code.STREAM_DOES_NOT_EXIST) for m in messages]))
        return
    reference = pub.reference
    newest = stream.writers.get(reference, -1) if reference is not None else -1
    first_seq = pub.seq + 1
    duplicates: list[int] = []
    failed: list[tuple[int, int]] = []
    batch: list[bytes] = []
    batch_ids: list[int] = []

    def flush_batch() -> None:
        if batch:
            if stream.publish_batch(batch, reference, max(batch_ids)):
                pub.expect(batch_ids.copy())
            else:
                failed.extend((one, Code.INTERNAL_ERROR) for one in batch_ids)
            batch.clear()
            batch_ids.clear()

    for publishing_id, filter_value, message in messages:
        if reference is not None and publishing_id <= newest:
            duplicates.append(publishing_id)  # confirmed, not stored (as RabbitMQ)
            continue
        newest = max(newest, publishing_id)
        if filter_value is None:
            if isinstance(message, list):
                batch.extend(message)  # a sub-entry batch: one publishing id
            else:
                batch.append(message)
            batch_ids.append(publishing_id)
            continue
        flush_batch()
        bodies = message if isinstance(message, list) else [message]
        ok = all([stream.publish_amqp10(b, filter_value, reference, publishing_id) for b in bodies])
        if ok:
            pub.expect([publishing_id])
        else:
            failed.append((publishing_id, Code.INTERNAL_ERROR))
    flush_batch()
    conn.published += len(messages)
    pub.published += len(messages)
    pub.confirmed += len(duplicates)
    conn.broker.totals.stream_received += len(messages)
    conn.broker.totals.stream_confirmed += len(duplicates)
    if pub.seq >= first_seq:
        stream.confirm_publisher(pub, first_seq, pub.seq)
    if duplicates:
        conn.send(encode_publish_confirm(pid, duplicates))
    if failed:
        conn.send(encode_publish_error(pid, failed))


class Held:
    """A publisher's plain frames read together, not yet in its stream: their entries,
    their publishing ids, and the newest of them."""

    __slots__ = ("entries", "ids", "count", "size", "newest")

    def __init__(self) -> None:
        self.entries: list[bytes] = []
        self.ids: list[int] = []
        self.count = self.size = 0
        self.newest = -1


def hold_plain(conn: StreamConnection, pid: int, ids: list[int], entries: bytes) -> bool:
    """A frame of plain messages, none already stored: held with the publisher's other
    frames of this read, appended by `release_held`. False (nothing done) where `publish`'s
    general path is needed: an unknown publisher, a deleted stream, an id a named publisher
    stored (or holds) already."""
    pub = conn.publishers.get(pid)
    if pub is None or pub.stream.deleted or not ids:
        return False
    held = conn.held.get(pub)
    if pub.reference is not None:
        newest = pub.stream.writers.get(pub.reference, -1)
        if held is not None:
            newest = max(newest, held.newest)
        if min(ids) <= newest:
            return False
    n = len(ids)
    conn.published += n
    pub.published += n
    conn.broker.totals.stream_received += n
    if held is not None and (
        held.size + len(entries) > HOLD_BYTES or held.count + n > HOLD_MESSAGES
    ):
        release_held(conn)
        held = None
    if held is None:
        held = conn.held[pub] = Held()
    held.entries.append(entries)
    held.ids += ids
    held.count += n
    held.size += len(entries)
    held.newest = max(held.newest, max(ids))
    return True


def release_held(conn: StreamConnection) -> None:
    """The held frames into their streams, one batch record per publisher, confirmed
    together once durable. The connection calls it at the end of each read and before any
    other command, so nothing observes a held frame."""
    if not conn.held:
        return
    held_now, conn.held = conn.held, {}
    for pub, held in held_now.items():
        stream = pub.stream
        if stream.deleted:
            code = Code.STREAM_DOES_NOT_EXIST
        elif stream.publish_entries(held.entries, held.count, pub.reference, held.newest):
            seq = pub.expect(held.ids)
            stream.confirm_publisher(pub, seq, seq)
            continue
        else:
            code = Code.INTERNAL_ERROR
        conn.send(encode_publish_error(pub.id, [(one, code) for one in held.ids]))


def query_publisher_sequence(conn: StreamConnection, f: Fields) -> None:
    corr = f.u32()
    reference = f.text()
    name = f.text()

    def run() -> bytes:
        conn.check("read", name)
        stream = conn.stream_named(name)
        return max(stream.writers.get(reference, 0), 0).to_bytes(8, "big")

    conn.answer(Key.QUERY_PUBLISHER_SEQUENCE, corr, run)
