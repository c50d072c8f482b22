"""Persistent messages of durable queues, on top of the segment log.

Record types (the payload the SegmentLog stores; big-endian):

    P  publish   msg_id u64, n u16, n x queue_id u32, exchange shortstr,
                 routing key shortstr, header u32 + bytes, body (the rest)
    A  ack       queue_id u32, msg_id u64     the message left that queue
    D  delivered queue_id u32, msg_id u64     first delivery from that queue
    W  delayed   due u64, then a publish record (P ...) naming one queue id:
       publish   a delayed exchange's schedule (broker/core/delayed.py) holds the
                 message until `due`, milliseconds since the epoch; read, acked and
                 released as a publish record is
    T  expiring  entered u64, then a publish record (P ...): a message with a TTL (its
       publish   own or a queue's) entered its queues at `entered`, milliseconds since the
                 epoch, and expires that long after it, however long the broker was down

One publish record serves every durable queue a message reaches. A message's
record is released when the last of its queues lets go of it. Messages are ordered in
each queue by msg_id, which grows with publish order.

Where the records live and when they are durable is the store's `Durability`, given to it:
the node's own segment log, fsynced in batches, on which ack and delivered records are
tombstones kept until the segment holding (or last holding, after compaction) the publish
they refer to is deleted, so recovery can never resurrect an acked message
(`SegmentDurability`, here); or, for a clustered vhost on its leader, the vhost's
replicated log, durable on a majority of its copies (cluster/replicated_store.py). The
store reads and writes its records through the `MessageLog` the durability opens; a
record's token (an int growing with appends) is what a confirm waits for, either way.
"""

from __future__ import annotations

import gc
import logging
import os
import struct
import threading
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from roarmq.protocol.frames import ContentHeader

from ..errors import StartupError
from ..ops.logs import NOTICE
from .record_tags import (
    ACK_TAG,
    DELAYED_PUBLISH_TAG,
    DELIVERED_TAG,
    EXPIRING_PUBLISH_TAG,
    PUBLISH_TAG,
    RETURNED_TAG,
)
from .segments import Location, LogFailed, RecoveryReport, SegmentLog

if TYPE_CHECKING:
    from ..amqp.channel import Channel
    from ..core.message import Message
    from ..core.queue import Queue
    from ..ops.stalls import JobTimes

log = logging.getLogger("roarmq.store")

_P_HEAD = struct.Struct(">cQH")
_QID = struct.Struct(">I")
_MARK = struct.Struct(">cIQ")
#: A returned record: a mark's fields, then the delivery count and the time (ms since the
#: epoch, 0: none) a delayed retry holds the message until.
_RETURN = struct.Struct(">cIQIQ")
#: The head of a W or T record: its kind and a time (ms since the epoch); the publish
#: record follows.
_TIMED_HEAD = struct.Struct(">cQ")
_U32 = struct.Struct(">I")
#: The kinds' first bytes as replay sees them (an int from a memoryview).
_PUBLISH, _ACK, _DELIVERED = PUBLISH_TAG[0], ACK_TAG[0], DELIVERED_TAG[0]
_DELAYED, _EXPIRING = DELAYED_PUBLISH_TAG[0], EXPIRING_PUBLISH_TAG[0]
_RETURNED = RETURNED_TAG[0]
#: The kinds of record that hold a message: a publish record, or one after a time.
PUBLISH_KINDS = (PUBLISH_TAG, DELAYED_PUBLISH_TAG, EXPIRING_PUBLISH_TAG)
_NONE: frozenset[int] = frozenset()
CLEAN_SHUTDOWN = "clean-shutdown"

#: Seconds an ack (or delivered) record may wait in the log's buffer for a batch someone
#: else asked for (a publish) before it asks for one itself (`[storage] ack_sync_delay_ms`). Nobody waits for an ack to be
#: durable: after a crash before then the message is delivered again, marked redelivered
#: (RabbitMQ does not fsync acks at all). So it goes out with the next publish's fsync.
#: Synced at once, each ack took a turn at the disk of its own that the next confirm
#: waited out: a publisher waiting for each confirm paid two fsyncs a message.
ACK_SYNC_DELAY = 0.01

#: Bytes the segment log keeps allocated past its records (SegmentLog's `preallocate`): an
#: fdatasync that need not write the file's new size is a third cheaper (segments.py).
PREALLOCATE = 1 << 20


def encode_publish(
    msg_id: int, queue_ids: list[int], msg: Message, body: bytes, head: bytes = b""
) -> bytes:
    """A publish record, after `head` (a W or T record's, or nothing)."""
    ex = msg.exchange.encode("utf-8", "surrogateescape")
    rk = msg.routing_key.encode("utf-8", "surrogateescape")
    raw = msg.header.raw
    return b"".join(
        (
            head,
            _P_HEAD.pack(PUBLISH_TAG, msg_id, len(queue_ids)),
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


def encode_mark(kind: bytes, queue_id: int, msg_id: int) -> bytes:
    """An ack (ACK_TAG) or delivered (DELIVERED_TAG) record."""
    return _MARK.pack(kind, queue_id, msg_id)


def encode_returned(queue_id: int, msg_id: int, count: int, ready_at_ms: int) -> bytes:
    """A returned record (RETURNED_TAG): the queue's delivery count of the message, and
    when a delayed retry makes it ready again (0: it is ready now)."""
    return _RETURN.pack(RETURNED_TAG, queue_id, msg_id, count, ready_at_ms)


def decode_returned(payload: Any) -> tuple[int, int, int, int]:
    """queue id, message id, delivery count and ready time of a returned record."""
    _, queue_id, msg_id, count, ready_at_ms = _RETURN.unpack_from(payload, 0)
    return queue_id, msg_id, count, ready_at_ms


class Returned:
    """What a message's returned records say of one queue: its delivery count and the time
    (ms since the epoch) a delayed retry holds it until, 0 if none. A recovery takes the
    record with the highest count (counts only grow; a compaction may reorder records)."""

    __slots__ = ("count", "ready_at_ms")

    def __init__(self, count: int, ready_at_ms: int) -> None:
        self.count = count
        self.ready_at_ms = ready_at_ms


def publish_of(payload: bytes) -> bytes:
    """The publish record of a publish, delayed publish or expiring publish record."""
    if payload[0] == _DELAYED or payload[0] == _EXPIRING:
        return payload[_TIMED_HEAD.size :]
    return payload


def decode_mark(payload: bytes) -> tuple[bytes, int, int]:
    """kind, queue id and message id of an ack or delivered record."""
    kind, queue_id, msg_id = _MARK.unpack(payload)
    return kind, queue_id, msg_id


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


#: Message ids per index block (a power of two).
BLOCK_BITS = 12
_BLOCK = 1 << BLOCK_BITS
_MASK = _BLOCK - 1
_ZEROS = bytes(4 * _BLOCK)


class _Block:
    __slots__ = ("seg", "off", "length", "refs", "used")

    def __init__(self) -> None:
        self.seg = array("I", _ZEROS)
        self.off = array("I", _ZEROS)
        self.length = array("I", _ZEROS)
        self.refs = array("I", _ZEROS)  # 0: no such message
        self.used = 0


class MessageIndex:
    """Where each stored message's publish record is, and how many durable queues hold it.

    Why arrays: queues keep their stored messages as bare msg_ids (broker/core/ready.py), so
    this index is the only per-message state of a persistent message at rest. Parallel
    arrays in blocks of 4,096 ids cost 16 bytes a message, where a dict of Location
    objects cost ~200. Ids are handed out in publish order and mostly settled in it, so
    blocks fill once and are dropped when their last message goes.
    """

    __slots__ = ("_blocks", "count", "bytes")

    def __init__(self) -> None:
        self._blocks: dict[int, _Block] = {}
        self.count = 0
        self.bytes = 0  # the stored messages' publish records, in all

    def __len__(self) -> int:
        return self.count

    def __contains__(self, msg_id: int) -> bool:
        block = self._blocks.get(msg_id >> BLOCK_BITS)
        return block is not None and block.refs[msg_id & _MASK] > 0

    def add(self, msg_id: int, loc: Location, refs: int) -> None:
        block = self._blocks.get(msg_id >> BLOCK_BITS)
        if block is None:
            block = self._blocks[msg_id >> BLOCK_BITS] = _Block()
        i = msg_id & _MASK
        if not block.refs[i]:
            block.used += 1
            self.count += 1
        else:
            self.bytes -= block.length[i]
        self.bytes += loc[2]
        block.seg[i], block.off[i], block.length[i] = loc
        block.refs[i] = refs

    def location(self, msg_id: int) -> Location:
        """KeyError if the message is not stored (any more)."""
        block = self._blocks.get(msg_id >> BLOCK_BITS)
        i = msg_id & _MASK
        if block is None or not block.refs[i]:
            raise KeyError(msg_id)
        return Location(block.seg[i], block.off[i], block.length[i])

    def move(self, msg_id: int, loc: Location) -> None:
        """Compaction copied the record: point at the copy (if the message is still here)."""
        block = self._blocks.get(msg_id >> BLOCK_BITS)
        i = msg_id & _MASK
        if block is not None and block.refs[i]:
            self.bytes += loc[2] - block.length[i]
            block.seg[i], block.off[i], block.length[i] = loc

    def set_refs(self, msg_id: int, refs: int) -> None:
        self._blocks[msg_id >> BLOCK_BITS].refs[msg_id & _MASK] = refs

    def unref(self, msg_id: int) -> Location | None:
        """One queue let go; returns the record's location when it was the last one."""
        block = self._blocks.get(msg_id >> BLOCK_BITS)
        i = msg_id & _MASK
        if block is None or not block.refs[i]:
            return None
        block.refs[i] -= 1
        if block.refs[i]:
            return None
        loc = Location(block.seg[i], block.off[i], block.length[i])
        block.used -= 1
        self.count -= 1
        self.bytes -= loc.length
        if not block.used:
            del self._blocks[msg_id >> BLOCK_BITS]
        return loc

    def remove(self, msg_id: int) -> Location:
        """Forget a message whatever its count (recovery found no queue for it)."""
        self.set_refs(msg_id, 1)
        loc = self.unref(msg_id)
        assert loc is not None
        return loc

    def ids(self) -> Iterator[int]:
        """Stored ids in ascending order (safe to remove the current one meanwhile)."""
        for key in sorted(self._blocks):
            refs = self._blocks[key].refs
            base = key << BLOCK_BITS
            for i in range(_BLOCK):
                if refs[i]:
                    yield base + i


class _Times:
    """A time (ms since the epoch) per message id, for the records that carry one: in
    blocks made for those that hold one (8 bytes a message: a schedule of millions is
    recovered in flat memory)."""

    __slots__ = ("_blocks",)

    def __init__(self) -> None:
        self._blocks: dict[int, array] = {}

    def put(self, msg_id: int, ms: int) -> None:
        block = self._blocks.get(msg_id >> BLOCK_BITS)
        if block is None:
            block = self._blocks[msg_id >> BLOCK_BITS] = array("q", bytes(8 * _BLOCK))
        block[msg_id & _MASK] = ms

    def get(self, msg_id: int) -> int | None:
        """Its time, None for a record that carries none."""
        block = self._blocks.get(msg_id >> BLOCK_BITS) if self._blocks else None
        if block is None:
            return None
        return block[msg_id & _MASK] or None


class _Replayed:
    """What recovery needs per publish record beyond its location: queue, body size, priority.

    Arrays in the index's blocking; records naming more than one queue keep the list aside.
    """

    __slots__ = ("_blocks", "multi", "expiration", "dues", "entered")

    def __init__(self) -> None:
        self._blocks: dict[int, tuple[array, array, array]] = {}
        self.multi: dict[int, list[int]] = {}
        self.expiration: dict[int, int] = {}  # msg_id -> per-message TTL (ms), when set
        #: Due times of delayed publish records (W), and when expiring ones (T) entered
        #: their queues.
        self.dues = _Times()
        self.entered = _Times()

    def put(self, msg_id: int, qids: list[int], size: int, priority: int) -> None:
        block = self._blocks.get(msg_id >> BLOCK_BITS)
        if block is None:
            block = self._blocks[msg_id >> BLOCK_BITS] = (
                array("I", _ZEROS),
                array("I", _ZEROS),
                array("B", bytes(_BLOCK)),
            )
        i = msg_id & _MASK
        if len(qids) == 1:
            block[0][i] = qids[0]
            self.multi.pop(msg_id, None)
        else:
            self.multi[msg_id] = qids
        block[1][i] = size
        block[2][i] = priority

    def get(self, msg_id: int) -> tuple[list[int], int, int]:
        qid, size, priority = self._blocks[msg_id >> BLOCK_BITS]
        i = msg_id & _MASK
        qids = self.multi.get(msg_id)
        return (qids if qids is not None else [qid[i]]), size[i], priority[i]


#: Publishes waiting for durability: (token or offset, channel, publish sequence number).
Waiting = deque[tuple[int, "Channel", int]]


def confirm_waiting(waiting: Waiting, upto: int) -> None:
    """Confirm, in order, every publish waiting for a token (or offset) <= `upto`."""
    flush: dict[Channel, None] = {}
    while waiting and waiting[0][0] <= upto:
        _, channel, seq = waiting.popleft()
        channel.disk_confirmed(seq)
        flush[channel] = None
    for channel in flush:
        channel.flush_confirms()
        channel.conn.flush()


def nack_waiting(waiting: Waiting) -> int:
    """Nack every publish in `waiting` (which the caller has taken over); how many."""
    channels: dict[Channel, None] = {}
    for _, channel, seq in waiting:
        channel.disk_failed(seq)
        channels[channel] = None
    for channel in channels:
        channel.conn.flush()
    return len(waiting)


#: Called with a record that a log's compaction or resume moved: old, new, payload.
Relocate = Callable[[Location, Location, bytes], object]


class MessageLog(Protocol):
    """What a MessageStore asks of the log its records live in (a SegmentLog, or a
    clustered vhost's replicated log seen through cluster/replicated_store.py's view)."""

    recovery: RecoveryReport  # the damage the log's own replay found
    error: BaseException | None  # the writer's failure, until resumed
    resumes: int

    @property
    def bytes_written(self) -> int: ...
    @property
    def last_token(self) -> int: ...
    def append(self, payload: bytes) -> tuple[Location, int]:
        """Where the record is, and the token its durability is reported by."""
        ...

    def read(self, location: Location) -> bytes: ...
    def release(self, location: Location) -> None:
        """Nothing needs the record any more (its space may be reclaimed)."""
        ...

    def schedule_sync(self) -> None:
        """Make what was appended durable soon (the durability reports it)."""
        ...

    def replay(self, *, copy: bool = True) -> Iterator[tuple[Location, Any]]: ...
    def segments(self) -> list: ...
    def compact(self, relocate: Relocate) -> Any: ...
    def resume(self, relocate: Relocate) -> object: ...
    def close(self) -> None: ...


class Durability(Protocol):
    """How a MessageStore's records become durable, and which of its ack and delivered
    records it must keep (module doc). The durability tells the store when records are
    durable (`MessageStore.records_durable`) and when its log failed (`log_failed`)."""

    #: Record kinds of other owners that a shared log holds: skipped at recovery. Any
    #: other unknown kind stops it (a newer version's).
    foreign_kinds: frozenset[int]

    def open_log(self, store: MessageStore) -> MessageLog: ...
    def admit(self) -> None:
        """A message is about to be stored: raise LogFailed if it may not be now."""
        ...

    def mark(self, record: bytes, queue_id: int, msg_id: int) -> None:
        """A durable queue let go of a stored message (an ACK_TAG record), delivered it
        for the first time (DELIVERED_TAG) or took it back counting the delivery
        (RETURNED_TAG); called while the store's index still holds it."""
        ...

    def gone(self, msg_id: int) -> None:
        """The message left its last queue (the store released its publish record)."""
        ...

    def recovered(self, msg_id: int, marks: list[tuple[int, int, Location]], live: bool) -> None:
        """Recovery found these (kind, queue id, location) marks of a stored message;
        `live`: some queue still holds it."""
        ...

    def relocated(self, old: Location, new: Location, payload: bytes) -> None:
        """The log moved a record (compaction, or a resume after a failed write)."""
        ...

    def resumed(self) -> None:
        """The log is back after a failure: write what waited for it."""
        ...

    def closed(self, store: MessageStore) -> None:
        """The store closed cleanly (its log with it)."""
        ...


class SegmentDurability:
    """The node's own message log: records are durable once the writer's fsync covers them
    (a batch at a time), and space comes back by deleting whole segments, so an ack or
    delivered record lives until the segment holding (or last holding, after compaction)
    the publish it names is deleted; a clean stop leaves a marker that lets the next start
    trust the delivered records."""

    foreign_kinds: frozenset[int] = frozenset()

    def __init__(self, *, segment_size: int, sync_interval_ms: int, fsync: bool = True) -> None:
        self.segment_size = segment_size
        self.sync_interval_ms = sync_interval_ms
        self.fsync = fsync
        self._store: MessageStore | None = None
        self._tombs: dict[int, list[Location]] = {}  # msg_id -> ack/delivered records
        self._tomb_seg: dict[int, set[int]] = {}  # segment -> msg_ids with tombstones
        self._seg_of: dict[int, int] = {}  # msg_id -> segment of its publish (tombstoned only)
        #: Marks made while the log was failed: (record, msg id, segment of the message's
        #: publish record), written by `resumed`.
        self._pending: list[tuple[bytes, int, int]] = []

    @property
    def store(self) -> MessageStore:
        assert self._store is not None, "open_log first"
        return self._store

    def open_log(self, store: MessageStore) -> MessageLog:
        self._store = store
        return SegmentLog(
            store.dir,
            segment_size=self.segment_size,
            sync_interval_ms=self.sync_interval_ms,
            fsync=self.fsync,
            preallocate=PREALLOCATE,
            on_synced=lambda token: store.from_writer(store.records_durable, token),
            on_error=lambda exc: store.from_writer(store.log_failed, exc),
            on_deleted=lambda segment: store.from_writer(self._segment_deleted, segment),
        )

    def admit(self) -> None:
        pass

    def mark(self, record: bytes, queue_id: int, msg_id: int) -> None:
        self._tombstone(record, msg_id)

    def _tombstone(self, record: bytes, msg_id: int) -> None:
        store = self.store
        seg = self._seg_of.get(msg_id)
        if seg is None:
            seg = store.index.location(msg_id).segment
        if store.failed is not None:
            self._pending.append((record, msg_id, seg))
            return
        try:
            self._write(record, msg_id, seg)
        except LogFailed:  # the writer failed since; the loop hears of it soon
            self._pending.append((record, msg_id, seg))

    def _write(self, record: bytes, msg_id: int, seg: int) -> None:
        """Append an ack, delivered or returned record, live until the publish's segment
        `seg` is gone."""
        loc, _ = self.store.log.append(record)
        tombs = self._tombs.get(msg_id)
        if tombs is None:
            tombs = self._tombs[msg_id] = []
            self._seg_of[msg_id] = seg
            self._tomb_seg.setdefault(seg, set()).add(msg_id)
        tombs.append(loc)

    def gone(self, msg_id: int) -> None:
        pass  # its tombstones stay until its publish's segment is deleted

    def recovered(self, msg_id: int, marks: list[tuple[int, int, Location]], live: bool) -> None:
        seg = self.store.index.location(msg_id).segment
        self._tombs[msg_id] = [mark[2] for mark in marks]
        self._seg_of[msg_id] = seg
        self._tomb_seg.setdefault(seg, set()).add(msg_id)

    def _segment_deleted(self, segment: int) -> None:
        log_ = self.store.log
        for msg_id in self._tomb_seg.pop(segment, ()):
            self._seg_of.pop(msg_id, None)
            for loc in self._tombs.pop(msg_id, ()):
                log_.release(loc)

    def relocated(self, old: Location, new: Location, payload: bytes) -> None:
        kind = payload[:1]
        if kind in PUBLISH_KINDS:
            msg_id = _P_HEAD.unpack_from(publish_of(payload), 0)[1]
            self.store.index.move(msg_id, new)
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

    def resumed(self) -> None:
        marks, self._pending = self._pending, []
        index = self.store.index
        for record, msg_id, seg in marks:
            if msg_id in index:  # its publish may have just moved to the new segment
                seg = index.location(msg_id).segment
            self._write(record, msg_id, seg)

    def closed(self, store: MessageStore) -> None:
        marker = store.dir / CLEAN_SHUTDOWN
        marker.write_bytes(b"")
        fd = os.open(store.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class MessageStore:
    """Persistent messages: the index of who still needs which record, over the log its
    `Durability` opens (module doc).

    When the log fails (a write or fsync error), nobody is left waiting: every publish
    waiting for its fsync is nacked at once, `persist` raises LogFailed (the channel nacks,
    or keeps the message in memory only for a publisher that asked for no confirms), and
    acks and delivery markers wait in memory. `resume()` brings the log back in place
    (SegmentLog.resume) and writes those markers; the broker calls it again until it works.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        durability: Durability,
        loop: Any,
        ack_sync_delay: float = ACK_SYNC_DELAY,
    ) -> None:
        self.dir = Path(directory)
        self.ack_sync_delay = ack_sync_delay
        self.loop = loop
        self.clean_start = (self.dir / CLEAN_SHUTDOWN).exists()
        if self.clean_start:
            (self.dir / CLEAN_SHUTDOWN).unlink()
        self.durability = durability
        self.next_id = 1
        self.index = MessageIndex()
        self._waiting: deque[tuple[int, Channel, int]] = deque()
        self._sync_requested = False
        self._urgent = 0  # the last token whose record waits to be durable (a publish)
        self._synced_upto = 0  # the last token `records_durable` was told of
        self._ack_timer: Any = None  # ACK_SYNC_DELAY's timer, while one is set
        #: The broker's JobTimes while its loop-lag probe is on: the loop callbacks below
        #: run through it, so a stall can name them (broker/ops/stalls.py).
        self.jobs: JobTimes | None = None
        self.failed: BaseException | None = None
        self.failures = 0  # times the log failed
        self.nacked = 0  # publishes nacked because their fsync failed
        self.refused = 0  # persistent publishes that found the store failed
        #: log.bytes_written at which the broker wants free disk space sampled again
        #: (ResourceMonitor sets it; `on_disk_check` samples).
        self.disk_check_at = 1 << 62
        self.on_disk_check: Any = None
        #: Called on the loop with the error when the log fails (the broker's reaction).
        self.on_failure: Any = None
        self._lock = threading.Lock()
        self.log = durability.open_log(self)

    # -- writes (event loop) ---------------------------------------------------------

    def persist(self, msg: Message, queues: list[Queue], page_out: bool) -> int:
        """Append the publish record; returns the token whose durability confirms it."""
        self.durability.admit()
        msg_id = self.next_id
        self.next_id += 1
        head = b""
        expires = msg.expiration_ms is not None
        if not expires:
            for queue in queues:
                if queue.message_ttl is not None:
                    expires = True
                    break
        if expires:  # its TTL counts from now, across restarts
            entered = round(queues[0].vhost.clock.wall() * 1000)
            head = _TIMED_HEAD.pack(EXPIRING_PUBLISH_TAG, entered)
        loc, token = self.log.append(
            encode_publish(msg_id, [q.store_id for q in queues], msg, msg.body, head)  # type: ignore[misc]  # durable queues, stored: their ids are set
        )
        msg.store_id = msg_id
        self.index.add(msg_id, loc, len(queues))
        if page_out:
            msg.body = None  # type: ignore[assignment]  # paged out: the store has it
        self._urgent = token
        self._want_sync()
        return token

    def persist_delayed(self, msg: Message, queue: Queue, due_ms: int) -> tuple[int, int]:
        """Append a delayed publish record (the message, for the one queue `queue`, a delayed
        exchange's schedule, due at `due_ms`); returns its message id and the token whose
        durability confirms it. Nothing of it stays in memory but the index's entry."""
        self.durability.admit()
        msg_id = self.next_id
        self.next_id += 1
        head = _TIMED_HEAD.pack(DELAYED_PUBLISH_TAG, due_ms)
        record = encode_publish(msg_id, [queue.store_id], msg, msg.body, head)  # type: ignore[list-item]  # a stored schedule's id is set
        loc, token = self.log.append(record)
        self.index.add(msg_id, loc, 1)
        self._urgent = token
        self._want_sync()
        return msg_id, token

    def _want_sync(self) -> None:
        if not self._sync_requested:
            self._sync_requested = True
            self.log.schedule_sync()

    def _want_sync_soon(self) -> None:
        """Records nobody waits for: synced with the next batch, at most `ack_sync_delay` on."""
        if not self._sync_requested and self._ack_timer is None:
            self._ack_timer = self._later(self.ack_sync_delay, self._ack_sync_due)

    def _ack_sync_due(self) -> None:
        self._ack_timer = None
        if self.failed is None and self.log.last_token > self._synced_upto:
            self._want_sync()

    def confirm_after(self, token: int, channel: Channel, seq: int) -> None:
        """Confirm publish `seq` of `channel` once the record of `token` is durable."""
        channel.confirm_later(seq)
        self._waiting.append((token, channel, seq))

    def durable(self, token: int) -> bool:
        """The record of `token` is durable (as far as the loop has been told)."""
        return token <= self._synced_upto

    def delivered(self, queue: Queue, msg_id: int) -> None:
        qid: int = queue.store_id  # type: ignore[assignment]  # a durable queue's
        self.durability.mark(_MARK.pack(DELIVERED_TAG, qid, msg_id), qid, msg_id)

    def returned(self, queue: Queue, msg_id: int, count: int, ready_at_ms: int) -> None:
        """A durable quorum queue took the message back counting the delivery (RETURNED_TAG:
        its count, and `ready_at_ms` if a delayed retry holds it). Nobody waits for it:
        after a crash before it is durable, the count is the one before."""
        qid: int = queue.store_id  # type: ignore[assignment]  # (as above)
        self.durability.mark(encode_returned(qid, msg_id, count, ready_at_ms), qid, msg_id)
        self._want_sync_soon()

    def settled(self, queue: Queue, msg_id: int) -> None:
        """The message left a durable queue (ack, expiry, drop, purge, delete)."""
        qid: int = queue.store_id  # type: ignore[assignment]  # (as above)
        self.durability.mark(_MARK.pack(ACK_TAG, qid, msg_id), qid, msg_id)
        loc = self.index.unref(msg_id)
        if loc is not None:
            self.log.release(loc)
            self.durability.gone(msg_id)
        self._want_sync_soon()

    def body(self, msg: Message) -> bytes:
        """The body of a paged-out message, read back from its publish record."""
        body = msg.body
        if body is None:
            body = decode_publish(publish_of(self.log.read(self.index.location(msg.store_id))))[5]
        return body

    def load(self, msg_id: int, body_max: int) -> Message:
        """A stored message rebuilt from its publish record (a queue unpacking its tail).

        The body comes along when it is at most `body_max` bytes; a bigger one stays on
        disk until it is delivered (see `body`). Raises KeyError or CorruptRecord.
        """
        from ..core.message import Message

        payload = publish_of(self.log.read(self.index.location(msg_id)))
        _, _, exchange, routing_key, raw, body = decode_publish(payload)
        size = len(body)
        msg = Message.recovered(exchange, routing_key, ContentHeader(60, size, raw), size)
        msg.store_id = msg_id
        if size <= body_max:
            msg.body = body
        return msg

    # -- writer-thread callbacks, marshalled to the loop ---------------------------------

    def _later(self, delay: float, callback: Any) -> Any:
        if self.jobs is not None:
            return self.loop.call_later(delay, self.jobs.run, callback)
        return self.loop.call_later(delay, callback)

    def from_writer(self, callback: Callable[[Any], object], arg: Any) -> None:
        """Run `callback(arg)` on the loop (called from the log's writer thread)."""
        if self.jobs is not None:
            self.loop.call_soon_threadsafe(self.jobs.run, callback, arg)
        else:
            self.loop.call_soon_threadsafe(callback, arg)

    def records_durable(self, token: int) -> None:
        """Every record up to `token` is durable (its durability says so): confirm the
        publishes that waited for them."""
        self._sync_requested = False
        self._synced_upto = token
        confirm_waiting(self._waiting, token)
        if self._urgent > token:
            self._want_sync()
        elif self.log.last_token > token:
            self._want_sync_soon()
        if self.log.bytes_written >= self.disk_check_at and self.on_disk_check is not None:
            self.disk_check_at = 1 << 62
            self.on_disk_check()

    def nack_waiting(self) -> int:
        """Nack every publish waiting for its record's durability; how many."""
        waiting, self._waiting = self._waiting, deque()
        nacked = nack_waiting(waiting)
        self.nacked += nacked
        return nacked

    def log_failed(self, exc: BaseException) -> None:
        """The writer failed: nack every publish waiting for an fsync, then tell the broker."""
        self.failed = exc
        self.failures += 1
        self._sync_requested = False
        nacked = self.nack_waiting()
        log.error(
            "message store write failed; %d publishes waiting for it were nacked, and "
            "persistent messages are refused until it resumes: %s",
            nacked,
            exc,
            extra={"directory": str(self.dir), "errno": getattr(exc, "errno", None)},
        )
        if self.on_failure is not None:
            self.on_failure(exc)

    def resume(self) -> bool:
        """Try to bring a failed log back (SegmentLog.resume); True once it is back.

        Raises nothing: a failure is logged and the store stays failed for the next try.
        """
        if self.failed is None:
            return True
        try:
            self.log.resume(self.durability.relocated)
            self.durability.resumed()
        except (OSError, LogFailed) as exc:
            log.warning("message store could not resume yet: %s", exc)
            return False
        self.failed = None
        self._want_sync()
        log.log(NOTICE, "message store resumed", extra={"directory": str(self.dir)})
        return True

    # -- compaction -------------------------------------------------------------------

    def compact(self) -> None:
        """Copy live records out of mostly-dead segments (run off the hot path)."""
        if self.failed is None:
            self.log.compact(self.durability.relocated)

    # -- recovery ---------------------------------------------------------------------

    def recover(self, queues_by_id: dict[int, Queue]) -> dict[str, int]:
        """Replay the log into the durable queues; returns counts for the start-up log.

        Nothing of a message but its id reaches a queue: bodies, headers and keys stay
        on disk until a queue unpacks the message to deliver it, so start-up time and
        memory grow by a few dozen bytes a message (10M messages: see docs/benchmarks.md).
        The collector is off meanwhile: many new objects, none of them cyclic.
        """
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._recover(queues_by_id)
        finally:
            if gc_was_enabled:
                gc.enable()

    def _recover(self, queues_by_id: dict[int, Queue]) -> dict[str, int]:
        index = self.index
        replayed = _Replayed()
        marks: dict[int, list[tuple[int, int, Location]]] = {}
        returns: dict[int, dict[int, Returned]] = {}  # msg id -> queue id -> the latest
        duplicates = 0
        last_id = 0
        unpack_head, unpack_qid, unpack_u32 = (
            _P_HEAD.unpack_from,
            _QID.unpack_from,
            _U32.unpack_from,
        )
        foreign = self.durability.foreign_kinds
        # Pass 1: where every publish record is, whom it was for; tombstones by message.
        for loc, payload in self.log.replay(copy=False):  # memoryviews: keep nothing of them
            kind = payload[0]
            base = 0
            if kind == _DELAYED or kind == _EXPIRING:
                base = _TIMED_HEAD.size
                at_ms = _TIMED_HEAD.unpack_from(payload, 0)[1]
            if kind == _PUBLISH or base:
                _, msg_id, n = unpack_head(payload, base)
                if n == 1:
                    qids = [unpack_qid(payload, base + 11)[0]]
                else:
                    qids = [unpack_qid(payload, base + 11 + 4 * i)[0] for i in range(n)]
                pos = base + 11 + 4 * n
                pos += 1 + payload[pos]  # exchange
                pos += 1 + payload[pos]  # routing key
                hlen = unpack_u32(payload, pos)[0]
                priority = 0
                if hlen >= 2 and payload[pos + 4] & 0x09:  # priority or expiration flag
                    priority = self._replay_properties(msg_id, payload, pos + 4, hlen, replayed)
                if msg_id in index:  # a compaction copy and its original: keep the later
                    self.log.release(index.location(msg_id))
                    duplicates += 1
                index.add(msg_id, loc, max(n, 1))
                replayed.put(msg_id, qids, len(payload) - pos - 4 - hlen, priority)
                if base:
                    times = replayed.dues if kind == _DELAYED else replayed.entered
                    times.put(msg_id, at_ms)
                if msg_id > last_id:
                    last_id = msg_id
            elif (kind == _ACK or kind == _DELIVERED) and len(payload) == _MARK.size:
                _, qid, msg_id = _MARK.unpack_from(payload)
                marks.setdefault(msg_id, []).append((kind, qid, loc))
                if msg_id > last_id:  # never reuse an id a tombstone on disk names
                    last_id = msg_id
            elif kind == _RETURNED and len(payload) == _RETURN.size:
                qid, msg_id, count, ready_at_ms = decode_returned(payload)
                marks.setdefault(msg_id, []).append((kind, qid, loc))
                of_msg = returns.setdefault(msg_id, {})
                known = of_msg.get(qid)
                if known is None or count >= known.count:
                    of_msg[qid] = Returned(count, ready_at_ms)
                if msg_id > last_id:
                    last_id = msg_id
            elif kind in foreign:
                self.log.release(loc)  # another owner's record in a shared log
            else:
                raise StartupError(
                    f"{self.dir}: a record of kind {bytes([kind])!r} ({len(payload)} "
                    "bytes) is not of this version's message store (written by a newer "
                    "RoarMQ?): run that version, or move the directory aside"
                )
        for msg_id in [m for m in marks if m not in index]:
            for _, _, loc in marks.pop(msg_id):
                self.log.release(loc)  # its publish is gone for good
        # Pass 2: in publish order, each message to the queues that have not acked it.
        # After a crash we cannot know which deliveries reached a client, so every
        # recovered message is marked redelivered; after a clean stop, the markers say.
        unclean = not self.clean_start
        restored = dropped = 0
        touched: dict[int, Queue] = {}
        expiration = replayed.expiration
        for msg_id in index.ids():
            qids, size, priority = replayed.get(msg_id)
            tombs = marks.get(msg_id) if marks else None
            if tombs:
                acked = {qid for kind, qid, _ in tombs if kind == _ACK}
                delivered: set[int] | frozenset[int] = {
                    qid for kind, qid, _ in tombs if kind == _DELIVERED
                }
                live = [q for q in dict.fromkeys(qids) if q not in acked and q in queues_by_id]
                self.durability.recovered(msg_id, tombs, bool(live))
            else:
                delivered = _NONE
                live = [q for q in qids if q in queues_by_id]
            if not live:
                self.log.release(index.remove(msg_id))
                self.durability.gone(msg_id)
                dropped += 1
                continue
            index.set_refs(msg_id, len(live))
            ttl = expiration.get(msg_id) if expiration else None
            due = replayed.dues.get(msg_id)
            entered = replayed.entered.get(msg_id)
            for qid in live:
                queue = queues_by_id[qid]
                if due is not None:  # a delayed exchange's schedule
                    queue.restore_due(msg_id, size, due)  # type: ignore[attr-defined]  # (a Schedule)
                else:
                    redelivered = unclean or qid in delivered
                    back = returns.get(msg_id) if returns else None
                    queue.restore_stored(
                        msg_id,
                        size,
                        priority,
                        ttl,
                        redelivered,
                        entered,
                        back.get(qid) if back else None,
                    )
                touched[qid] = queue
            restored += 1
        self.next_id = last_id + 1
        for queue in touched.values():
            queue.restored()
        report = self.log.recovery
        return {
            "messages": restored,
            "released": dropped,  # publish records every queue had acked (or was deleted)
            "duplicates": duplicates,
            "records_dropped": report.records_dropped,
            "bytes_truncated": report.bytes_truncated,
        }

    @staticmethod
    def _replay_properties(
        msg_id: int, payload: Any, at: int, hlen: int, replayed: _Replayed
    ) -> int:
        """Priority (returned) and per-message TTL (noted) of a record that has either."""
        from ..core.message import parse_expiration

        props = ContentHeader(60, 0, bytes(payload[at : at + hlen])).properties
        if props.expiration is not None:
            try:
                replayed.expiration[msg_id] = parse_expiration(props.expiration)
            except ValueError:
                pass  # it was accepted once; an unreadable TTL now means none
        return min(props.priority or 0, 255)

    def close(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()  # close() writes and syncs what is buffered
            self._ack_timer = None
        if self.failed is not None:
            self.resume()  # one last try, so the acks made meanwhile reach the disk
        try:
            self.log.close()
        finally:
            if self.failed is None and self.log.error is None:
                self.durability.closed(self)
