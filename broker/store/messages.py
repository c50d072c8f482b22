"""Persistent messages of durable queues, on top of the segment log.

Record types (the payload the SegmentLog stores; big-endian):

    P  publish   msg_id u64, n u16, n x queue_id u32, exchange shortstr,
                 routing key shortstr, header u32 + bytes, body (the rest)
    A  ack       queue_id u32, msg_id u64     the message left that queue
    D  delivered queue_id u32, msg_id u64     first delivery from that queue

One publish record serves every durable queue a message reaches. A message's
record is released when the last of its queues lets go of it; ack and delivered
records are tombstones and stay live until the segment holding (or last
holding, after compaction) the publish they refer to is deleted, so recovery
can never resurrect an acked message. Messages are ordered in each queue by
msg_id, which grows with publish order.
"""

from __future__ import annotations

import gc
import logging
import os
import struct
import threading
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

from protocol.frames import ContentHeader

from .segments import Location, SegmentLog

if TYPE_CHECKING:
    from ..channel import Channel
    from ..message import Message
    from ..queue import Queue

log = logging.getLogger("roarmq.store")

_P_HEAD = struct.Struct(">cQH")
_QID = struct.Struct(">I")
_MARK = struct.Struct(">cIQ")
_U32 = struct.Struct(">I")
CLEAN_SHUTDOWN = "clean-shutdown"


def encode_publish(msg_id: int, queue_ids: list[int], msg: Message, body: bytes) -> bytes:
    ex = msg.exchange.encode("utf-8", "surrogateescape")
    rk = msg.routing_key.encode("utf-8", "surrogateescape")
    raw = msg.header.raw
    return b"".join(
        (
            _P_HEAD.pack(b"P", msg_id, len(queue_ids)),
            b"".join(_QID.pack(q) for q in queue_ids),
            bytes((len(ex),)),
            ex,
            bytes((len(rk),)),
            rk,
            _U32.pack(len(raw)),
            raw,
            body,
        )
    )


def decode_publish(payload: bytes) -> tuple[int, list[int], str, str, bytes, bytes]:
    _, msg_id, n = _P_HEAD.unpack_from(payload, 0)
    pos = _P_HEAD.size
    qids = [_QID.unpack_from(payload, pos + 4 * i)[0] for i in range(n)]
    pos += 4 * n
    ln = payload[pos]
    exchange = payload[pos + 1 : pos + 1 + ln].decode("utf-8", "surrogateescape")
    pos += 1 + ln
    ln = payload[pos]
    routing_key = payload[pos + 1 : pos + 1 + ln].decode("utf-8", "surrogateescape")
    pos += 1 + ln
    hlen = _U32.unpack_from(payload, pos)[0]
    header = payload[pos + 4 : pos + 4 + hlen]
    return msg_id, qids, exchange, routing_key, header, payload[pos + 4 + hlen :]


class MessageStore:
    def __init__(
        self, directory: str | Path, *, segment_size: int, sync_interval_ms: int, loop: Any
    ) -> None:
        self.dir = Path(directory)
        self.loop = loop
        self.clean_start = (self.dir / CLEAN_SHUTDOWN).exists()
        if self.clean_start:
            (self.dir / CLEAN_SHUTDOWN).unlink()
        self.log = SegmentLog(
            self.dir,
            segment_size=segment_size,
            sync_interval_ms=sync_interval_ms,
            on_synced=self._synced_from_writer,
            on_error=self._error_from_writer,
            on_deleted=self._deleted_from_writer,
        )
        self.next_id = 1
        self.by_id: dict[int, Message] = {}
        self._tombs: dict[int, list[Location]] = {}  # msg_id -> ack/delivered records
        self._tomb_seg: dict[int, set[int]] = {}  # segment -> msg_ids with tombstones
        self._seg_of: dict[int, int] = {}  # msg_id -> segment of its publish (tombstoned only)
        self._waiting: deque[tuple[int, Channel, int]] = deque()
        self._sync_requested = False
        self.failed: BaseException | None = None
        self._lock = threading.Lock()

    # -- writes (event loop) ---------------------------------------------------------

    def persist(self, msg: Message, queues: list[Queue], page_out: bool) -> int:
        """Append the publish record; returns the token whose fsync confirms it."""
        msg_id = self.next_id
        self.next_id += 1
        loc, token = self.log.append(
            encode_publish(msg_id, [q.store_id for q in queues], msg, msg.body)
        )
        msg.store_id = msg_id
        msg.store_loc = loc
        msg.store_refs = len(queues)
        self.by_id[msg_id] = msg
        if page_out:
            msg.body = None
        self._want_sync()
        return token

    def _want_sync(self) -> None:
        if not self._sync_requested:
            self._sync_requested = True
            self.log.schedule_sync()

    def confirm_after(self, token: int, channel: Channel, seq: int) -> None:
        channel.confirm_later(seq)
        self._waiting.append((token, channel, seq))

    def _tombstone(self, kind: bytes, queue: Queue, msg: Message) -> None:
        loc, _ = self.log.append(_MARK.pack(kind, queue.store_id, msg.store_id))
        msg_id = msg.store_id
        tombs = self._tombs.get(msg_id)
        if tombs is None:
            tombs = self._tombs[msg_id] = []
            seg = msg.store_loc.segment
            self._seg_of[msg_id] = seg
            self._tomb_seg.setdefault(seg, set()).add(msg_id)
        tombs.append(loc)

    def delivered(self, queue: Queue, msg: Message) -> None:
        self._tombstone(b"D", queue, msg)

    def settled(self, queue: Queue, msg: Message) -> None:
        """The message left a durable queue (ack, expiry, drop, purge, delete)."""
        self._tombstone(b"A", queue, msg)
        msg.store_refs -= 1
        if msg.store_refs <= 0:
            self.by_id.pop(msg.store_id, None)
            self.log.release(msg.store_loc)
        self._want_sync()

    def body(self, msg: Message) -> bytes:
        """The body of a paged-out message, read back from its publish record."""
        body = msg.body
        if body is None:
            body = decode_publish(self.log.read(msg.store_loc))[5]
        return body

    # -- writer-thread callbacks, marshalled to the loop ---------------------------------

    def _synced_from_writer(self, token: int) -> None:
        self.loop.call_soon_threadsafe(self._synced, token)

    def _error_from_writer(self, exc: BaseException) -> None:
        self.loop.call_soon_threadsafe(self._failed, exc)

    def _deleted_from_writer(self, segment: int) -> None:
        self.loop.call_soon_threadsafe(self._segment_deleted, segment)

    def _synced(self, token: int) -> None:
        self._sync_requested = False
        waiting = self._waiting
        flush: dict[Channel, None] = {}
        while waiting and waiting[0][0] <= token:
            _, channel, seq = waiting.popleft()
            channel.disk_confirmed(seq)
            flush[channel] = None
        for channel in flush:
            channel.flush_confirms()
            channel.conn.flush()
        if self.log.last_token > token:
            self._want_sync()

    def _failed(self, exc: BaseException) -> None:
        self.failed = exc
        log.critical("message store failed; persistent messages are no longer confirmed: %s", exc)

    def _segment_deleted(self, segment: int) -> None:
        for msg_id in self._tomb_seg.pop(segment, ()):
            self._seg_of.pop(msg_id, None)
            for loc in self._tombs.pop(msg_id, ()):
                self.log.release(loc)

    # -- compaction -------------------------------------------------------------------

    def compact(self) -> None:
        """Copy live records out of mostly-dead segments (run off the hot path)."""
        self.log.compact(self._relocated)

    def _relocated(self, old: Location, new: Location, payload: bytes) -> None:
        kind = payload[:1]
        if kind == b"P":
            msg_id = _P_HEAD.unpack_from(payload, 0)[1]
            msg = self.by_id.get(msg_id)
            if msg is not None:
                msg.store_loc = new
            seg = self._seg_of.get(msg_id)
            if seg is not None:
                self._tomb_seg[seg].discard(msg_id)
                self._seg_of[msg_id] = new.segment
                self._tomb_seg.setdefault(new.segment, set()).add(msg_id)
        else:
            msg_id = _MARK.unpack_from(payload, 0)[2]
            tombs = self._tombs.get(msg_id)
            if tombs is not None:
                tombs[tombs.index(old)] = new

    # -- recovery ---------------------------------------------------------------------

    def recover(self, queues_by_id: dict[int, Queue]) -> dict[str, int]:
        """Replay the log into the durable queues; returns counts for the start-up log.

        Recovered bodies stay on disk and are read back when delivered, so start-up
        time and memory do not grow with the size of the messages. The collector is
        off meanwhile: millions of new objects, none of them cyclic.
        """
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._recover(queues_by_id)
        finally:
            if gc_was_enabled:
                gc.enable()

    def _recover(self, queues_by_id: dict[int, Queue]) -> dict[str, int]:
        from ..message import Message

        recovered = Message.recovered
        publishes: dict[int, tuple] = {}  # msg_id -> (message, location, queue ids)
        marks: dict[int, list[tuple[int, int, Location]]] = {}
        headers: dict[bytes, ContentHeader] = {}  # shared: most publishers repeat theirs
        names: dict[bytes, str] = {}
        duplicates = 0
        in_order = True
        last_id = 0
        unpack_head, unpack_qid, unpack_u32 = (
            _P_HEAD.unpack_from,
            _QID.unpack_from,
            _U32.unpack_from,
        )
        for loc, payload in self.log.replay(copy=False):  # memoryviews: keep only bytes()
            kind = payload[0]
            if kind == 0x50:  # P
                _, msg_id, n = unpack_head(payload, 0)
                if n == 1:
                    qids = [unpack_qid(payload, 11)[0]]
                else:
                    qids = [unpack_qid(payload, 11 + 4 * i)[0] for i in range(n)]
                pos = 11 + 4 * n
                ln = payload[pos]
                ex = bytes(payload[pos + 1 : pos + 1 + ln])
                pos += 1 + ln
                ln = payload[pos]
                rk = bytes(payload[pos + 1 : pos + 1 + ln])
                pos += 1 + ln
                hlen = unpack_u32(payload, pos)[0]
                raw = bytes(payload[pos + 4 : pos + 4 + hlen])
                header = headers.get(raw)
                if header is None:
                    header = headers[raw] = ContentHeader(60, 0, raw)
                exchange = names.get(ex)
                if exchange is None:
                    exchange = names[ex] = ex.decode("utf-8", "surrogateescape")
                routing_key = names.get(rk)
                if routing_key is None:
                    routing_key = names[rk] = rk.decode("utf-8", "surrogateescape")
                msg = recovered(exchange, routing_key, header, len(payload) - pos - 4 - hlen)
                if msg_id in publishes:  # a compaction copy and its original
                    self.log.release(publishes[msg_id][1])
                    duplicates += 1
                elif msg_id < last_id:
                    in_order = False
                last_id = msg_id
                publishes[msg_id] = (msg, loc, qids)
            elif (kind == 0x41 or kind == 0x44) and len(payload) == _MARK.size:  # A, D
                _, qid, msg_id = _MARK.unpack_from(payload)
                marks.setdefault(msg_id, []).append((kind, qid, loc))
            else:
                self.log.release(loc)
        for msg_id in [m for m in marks if m not in publishes]:
            for _, _, loc in marks.pop(msg_id):
                self.log.release(loc)  # its publish is gone for good
        per_queue: dict[int, list[tuple[Message, bool]]] = {}
        restored = dropped = 0
        # After a crash we cannot know which deliveries reached a client, so every
        # recovered message is marked redelivered; after a clean stop, the markers say.
        unclean = not self.clean_start
        by_id = self.by_id
        ids = publishes if in_order else sorted(publishes)
        for msg_id in ids:
            msg, loc, qids = publishes[msg_id]
            tombs = marks.get(msg_id) if marks else None
            if tombs:
                acked = {qid for kind, qid, _ in tombs if kind == 0x41}
                delivered = {qid for kind, qid, _ in tombs if kind == 0x44}
                self._tombs[msg_id] = [t[2] for t in tombs]
                self._seg_of[msg_id] = loc.segment
                self._tomb_seg.setdefault(loc.segment, set()).add(msg_id)
                live = [q for q in dict.fromkeys(qids) if q not in acked and q in queues_by_id]
            else:
                delivered = ()
                live = [q for q in qids if q in queues_by_id]
            if not live:
                self.log.release(loc)
                dropped += 1
                continue
            msg.store_id = msg_id
            msg.store_loc = loc
            msg.store_refs = len(live)
            by_id[msg_id] = msg
            for qid in live:
                items = per_queue.get(qid)
                if items is None:
                    items = per_queue[qid] = []
                items.append((msg, unclean or qid in delivered))
            restored += 1
        self.next_id = max(publishes, default=0) + 1
        for qid, items in per_queue.items():
            queues_by_id[qid].restore(items)
        report = self.log.recovery
        return {
            "messages": restored,
            "dead": dropped,
            "duplicates": duplicates,
            "records_dropped": report.records_dropped,
            "bytes_truncated": report.bytes_truncated,
        }

    def close(self) -> None:
        try:
            self.log.close()
        finally:
            if self.failed is None and self.log.error is None:
                marker = self.dir / CLEAN_SHUTDOWN
                marker.write_bytes(b"")
                fd = os.open(self.dir, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
