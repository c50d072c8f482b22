"""Message stores of a cluster node: one per clustered vhost it leads, its records replicated.

Shape (docs/cluster.md, "Replicated messages"):

* The vhost's **replicated log** (`SegmentRecordStore` in ``data/vhosts/<vhost>/log``) is
  the durable truth on every member. Its payloads are the MessageStore's publish, ack and
  returned records (P, A, R; messages.py: no D, below), definition snapshots (J;
  replicated_definitions.py) and the streams' records (S, s).
* On the leader, `ReplicatedVhostStore` is the `Durability` of an ordinary `MessageStore`
  whose records live in the vhost's log and nowhere else: each record is written once,
  appended to the vhost's `ReplicationLeader`, and read back from the log (`VhostLogView`,
  the store's `MessageLog`: a message's index entry names its log offset): a working copy
  beside it would write every record twice (a clustered vhost then cost 40% more CPU a
  message than a single node; a start removes one an older version left). A record's
  token is its log offset; a publish is confirmed when the replication's
  `confirmed_offset()` covers it (the leader's fsync of the log and every in-sync member's
  ack: invariant 1).
* When a node becomes leader, the ordinary `MessageStore.recover` reads the log's records
  through the view (`rebuild_from_log` first takes the definitions, the id floors and the
  streams' records out): a failover and a restart are the same recovery, and every message
  it restores is marked redelivered (so no delivered marker is written: nobody would read
  it).
* Space: nothing is released record by record; checkpoints (below) rewrite what is live at
  the log's head and the log is trimmed below them. An ack of a message that stays in
  another queue is remembered (`_acks`) so that a checkpoint can copy it.
* The vhost's `message_store` is that MessageStore while this node leads it: the channel's
  confirms wait on it, deliveries mark through `queue.store`.

* **Checkpoints** keep the replicated log (and so a failover's rebuild) near the size of
  the live data: `checkpoint()` appends an epoch record, the definitions, every live
  publish record with the acks of the queues that already let it go and the latest
  returned record of each queue still holding it, and a checkpoint record naming where
  it began (replog/records.py). Recovery does not care about the order of P, A and R
  records (of R it takes the highest count), so publishes and acks made while the
  checkpoint is being written may interleave with it. Once the checkpoint is confirmed,
  the log is trimmed below its base on the leader, and on each follower once it holds
  it durably.
* **Durable declares wait for the in-sync set** as confirms do: a channel about to answer
  a method that changed the vhost's durable definitions calls `hold_reply`, which appends
  the definitions now and holds the connection's output (and its reading) until that
  record is confirmed.

Bodies page out as on a single node: whoever reads a paged-out body back asks the queue's
store (`queue.store.body`), which is the vhost's own here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import struct
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.stream import DEFAULT_SEGMENT_SIZE, TRACKING_FILE, record_span
from ..replog.records import SegmentRecordStore, checkpoint_record, epoch_record
from ..store.messages import MessageStore, Relocate, decode_returned, encode_mark
from ..store.record_tags import (
    ACK_TAG,
    CHECKPOINT_TAG,
    DEFINITIONS_TAG,
    EPOCH_TAG,
    RETURNED_TAG,
    STREAM_OFFSETS_TAG,
    STREAM_START_TAG,
    STREAM_TAG,
)
from ..store.segments import Location, LogFailed, RecoveryReport, SegmentLog
from . import replicated_definitions as definitions

if TYPE_CHECKING:
    from ..amqp.connection import Connection
    from ..core.stream import Stream
    from ..replog.replication import ReplicationLeader

log = logging.getLogger("roarmq.cluster")

#: What a checkpoint record carries after its base: the ids the next leader must not reuse
#: (records naming older ones may survive below the base on a member that has not trimmed).
_CHECKPOINT_IDS = struct.Struct(">QI")
#: Payload bytes a checkpoint copies per loop turn (it yields between chunks).
CHECKPOINT_CHUNK = 4 << 20
#: A stream's record in the vhost's log: STREAM_TAG, the stream's queue id, the record as
#: the stream stores it (it names its offset). STREAM_START_TAG, the id and the stream's
#: first retained offset begin a checkpoint's copy of that stream.
_STREAM_ID = struct.Struct(">I")
_STREAM_START = struct.Struct(">IQ")


def offsets_record(sid: int, tracked: dict[str, int]) -> bytes:
    """STREAM_OFFSETS_TAG, the stream's queue id, its stored offsets as JSON (what the
    stream's offsets file holds)."""
    return STREAM_OFFSETS_TAG + _STREAM_ID.pack(sid) + json.dumps(tracked).encode()


#: The flow-control reason of a connection waiting for its declare to be confirmed.
DEFINITIONS_BARRIER = "definitions: waiting for the in-sync set"


class ReplicatedVhostStore:
    """What a clustered vhost keeps on its leader (module doc): its `MessageStore`, whose
    `Durability` this is, and the definitions, streams and checkpoints that share the
    vhost's log. It is the vhost's `VhostReplication` while this node leads it."""

    foreign_kinds = frozenset(
        tag[0]
        for tag in (
            DEFINITIONS_TAG,
            STREAM_TAG,
            STREAM_START_TAG,
            STREAM_OFFSETS_TAG,
            EPOCH_TAG,
            CHECKPOINT_TAG,
        )
    )

    #: A durable definition changed and is not in the log yet (`VhostReplication`).
    definitions_dirty: bool

    def __init__(
        self,
        directory: str | Path,
        *,
        replication: ReplicationLeader,
        may_confirm: Callable[[], bool],
        snapshot: Callable[[], dict],
        loop: asyncio.AbstractEventLoop,
        streams: Callable[[], list[Stream]] = list,
    ) -> None:
        if not isinstance(replication.store, SegmentRecordStore):  # read in place
            raise TypeError(
                f"a vhost's message store needs a SegmentRecordStore, not {replication.store!r}"
            )
        self.replication = replication
        self.records: SegmentRecordStore = replication.store
        self.loop = loop
        #: msg_id -> queue ids that acked a message still held by another queue: what a
        #: checkpoint copies besides the publish record.
        self._acks: dict[int, list[int]] = {}
        #: msg_id -> queue id -> the latest returned record (a quorum queue's delivery
        #: count and delayed retry) of a message still held: a checkpoint copies it too.
        self._returns: dict[int, dict[int, bytes]] = {}
        self.streams = streams  # the vhost's streams (a checkpoint copies what they retain)
        self._streams_waiting: set[Stream] = set()
        self.may_confirm = may_confirm
        self.snapshot = snapshot
        self.next_queue_id = 1
        self.definitions_dirty = False
        self._held_replies: deque[tuple[int, Connection]] = deque()
        self._log_sync_requested = False  # the log's writer will call _log_synced
        self._definitions_offset = 0  # the last definitions record appended
        self.checkpointing = False
        self.checkpoints = 0
        #: The vhost's log failed under this leadership (its owner resigns it).
        self.failed: BaseException | None = None
        self.on_log_failed: list[Callable[[], object]] = []
        replication.on_confirmed.append(lambda _offset: self.release_confirmed())
        replication.on_deposed.append(lambda _epoch, _node: self.nack_waiting("deposed"))
        self.store = MessageStore(directory, durability=self, loop=loop)

    # -- the message store's durability -------------------------------------------------

    def open_log(self, store: MessageStore) -> VhostLogView:
        return VhostLogView(self)

    def admit(self) -> None:
        """Refused (LogFailed: the channel nacks) while fewer than `min_in_sync` copies are
        in sync (checked again when the confirm is released: ReplicationLeader.enough_copies)."""
        leader = self.replication
        if not leader.enough_copies():
            raise LogFailed(f"fewer than min_in_sync={leader.min_copies} copies in sync")

    def mark(self, record: bytes, queue_id: int, msg_id: int) -> None:
        """Acks and returned records are records of the log; delivered markers are not
        written: a clustered vhost is only ever recovered from its log after a failover, a
        move or a restart, never from a clean shutdown of this store, so the recovery
        marks every message redelivered and no D record would ever be read (they were a
        third of the log's records: written, fsynced and shipped to every follower for
        nothing). What a checkpoint must copy of a message still held is remembered: the
        acks of the queues that let it go, each queue's latest returned record."""
        kind = record[:1]
        if kind != ACK_TAG and kind != RETURNED_TAG:
            return
        try:
            self.record(record)
        except LogFailed:  # this leadership's log failed: it confirms nothing more, and
            return  # the next leader delivers the message again (as after a crash)
        if kind == ACK_TAG:
            self._acks.setdefault(msg_id, []).append(queue_id)
            returns = self._returns.get(msg_id)
            if returns is not None:
                returns.pop(queue_id, None)
        else:
            self._returns.setdefault(msg_id, {})[queue_id] = record

    def gone(self, msg_id: int) -> None:
        """Its records go with the next checkpoint's trim; nothing of it is copied."""
        if self._acks:
            self._acks.pop(msg_id, None)
        if self._returns:
            self._returns.pop(msg_id, None)

    def recovered(self, msg_id: int, marks: list[tuple[int, int, Location]], live: bool) -> None:
        if not live:
            return
        acks = [qid for kind, qid, _ in marks if kind == ACK_TAG[0]]
        if acks:
            self._acks[msg_id] = acks
        latest: dict[int, tuple[int, bytes]] = {}  # queue id -> (count, record)
        for kind, qid, loc in marks:
            if kind == RETURNED_TAG[0] and qid not in acks:
                record = bytes(self.store.log.read(loc))
                count = decode_returned(record)[2]
                if qid not in latest or count >= latest[qid][0]:
                    latest[qid] = (count, record)
        if latest:
            self._returns[msg_id] = {qid: record for qid, (_, record) in latest.items()}

    def relocated(self, old: Location, new: Location, payload: bytes) -> None:
        """Never called: the view neither compacts nor resumes (checkpoints do)."""

    def resumed(self) -> None:
        """Never called: a leader whose log failed resigns the vhost."""

    def closed(self, store: MessageStore) -> None:
        """Nothing of the store is on disk but the vhost's log, which VhostReplicas owns."""

    # -- writes ---------------------------------------------------------------------------

    def record(self, payload: bytes) -> int:
        """Append a record of the vhost (after the definitions, if they changed); its
        offset in the log."""
        self.append_definitions_if_changed()
        return self._replicate(payload)

    def replicate_stream(self, stream: Stream, payload: bytes) -> int:
        """A stream's record goes into the vhost's log too (before the stream's own files:
        its commit and confirms wait for this offset); refused as a message is."""
        self.admit()
        self._streams_waiting.add(stream)
        return self.record(STREAM_TAG + _STREAM_ID.pack(stream.store_id) + payload)

    def replicate_offsets(self, stream: Stream, tracked: dict[str, int]) -> None:
        """The stream's stored offsets, whole (the newest record wins at a rebuild)."""
        if stream.store_id is not None:
            self.record(offsets_record(stream.store_id, tracked))

    def _replicate(self, payload: bytes) -> int:
        offset = self.replication.append(payload)
        self._request_sync()
        return offset

    def _request_sync(self) -> None:
        """The log's group commit: one fsync at a time, asked for again when it ends if
        more was appended meanwhile (`_log_synced`)."""
        if not self._log_sync_requested:
            self._log_sync_requested = True
            self.records.sync_soon(self._log_synced_from_writer)

    def _log_synced_from_writer(self, durable: int, error: BaseException | None) -> None:
        self.loop.call_soon_threadsafe(self._log_synced, durable, error)

    def _log_synced(self, durable: int, error: BaseException | None) -> None:
        """The writer's fsync covered everything appended before it was asked for."""
        leader = self.replication
        if error is not None:  # the leader's own log failed: nothing more is confirmed
            log.error("vhost %r: replicated log fsync failed: %r", leader.vhost, error)
            self.failed = error
            self.nack_waiting("log failed")
            for callback in self.on_log_failed:
                callback()
            return
        self._log_sync_requested = False
        leader.local_durable(durable)
        if self.records.last_offset > durable:
            self._request_sync()

    def start_epoch(self) -> None:
        """This leadership's records begin here (replog/records.py: epochs)."""
        self._replicate(epoch_record(self.replication.epoch))

    # -- checkpoints ------------------------------------------------------------------------

    async def checkpoint(self) -> bool:
        """Rewrite the vhost's live state at the log's head (module doc); False if it could
        not finish (the leadership ended, or the log failed)."""
        if self.checkpointing or self.failed is not None:
            return False
        self.checkpointing = True
        leader, store = self.replication, self.store
        try:
            base = self.records.last_offset + 1
            self.start_epoch()
            self.definitions_dirty = True
            self.append_definitions_if_changed()
            # Each stream's start, before the first await: a record appended meanwhile must
            # follow it, or a rebuild from this base takes it for the stream's first and
            # skips the copy below it as second copies (`_StreamsRebuild.record`).
            for stream in self.streams():
                if stream.log is not None and not stream.deleted:
                    self._replicate(self._stream_start(stream))
            index, read, acks = store.index, store.log.read, self._acks
            copied = 0
            for msg_id in list(index.ids()):
                if msg_id not in index:  # acked by every queue since the list was made
                    continue
                payload = read(index.location(msg_id))
                # The copy is where the message is read from now: the original goes with
                # the trim below this checkpoint.
                index.move(msg_id, _at(self._replicate(payload), len(payload)))
                copied += len(payload)
                for qid in acks.get(msg_id, ()):
                    self._replicate(encode_mark(ACK_TAG, qid, msg_id))
                for record in self._returns.get(msg_id, {}).values():
                    self._replicate(record)
                if copied >= CHECKPOINT_CHUNK:
                    copied = 0
                    await asyncio.sleep(0)
                    if leader.deposed_by is not None or self.failed is not None:
                        return False
            for stream in self.streams():
                if not await self._copy_stream(stream):
                    return False
            ids = _CHECKPOINT_IDS.pack(store.next_id, self.next_queue_id)
            self._replicate(checkpoint_record(base, ids))
            self.checkpoints += 1
            log.info(
                "vhost %r: checkpoint of %d messages from offset %d",
                leader.vhost,
                len(index),
                base,
            )
            return True
        except (OSError, LogFailed, KeyError) as exc:
            log.warning("vhost %r: checkpoint abandoned: %r", leader.vhost, exc)
            return False
        finally:
            self.checkpointing = False

    async def _copy_stream(self, stream: Stream) -> bool:
        """A checkpoint's copy of one stream: its start again (retention may have dropped
        more since the checkpoint began: a rebuild moves up to it), then every record it
        retains up to its newest (records appended meanwhile are in the log already, in
        between)."""
        log_ = stream.log
        if log_ is None or stream.deleted:
            return True
        end, token = stream.next_offset, stream.last_token
        log_.schedule_sync()
        while log_.synced_token < token:  # the files hold every record below `end`
            await asyncio.sleep(0.002)
            if log_.error is not None or self.replication.deposed_by is not None:
                return False
            if stream.deleted:
                return True
        self._replicate(self._stream_start(stream))
        head = STREAM_TAG + _STREAM_ID.pack(stream.store_id)
        copied = 0
        for payload in stream.stored_records(stream.first_offset, end):
            self._replicate(head + payload)
            copied += len(payload)
            if copied >= CHECKPOINT_CHUNK:
                copied = 0
                await asyncio.sleep(0)
                if self.replication.deposed_by is not None or self.failed is not None:
                    return False
        if stream.tracked and stream.store_id is not None:  # above the base: trims keep them
            self._replicate(offsets_record(stream.store_id, stream.tracked))
        return True

    @staticmethod
    def _stream_start(stream: Stream) -> bytes:
        """A checkpoint's start record of a stream: its id, its first retained offset."""
        return STREAM_START_TAG + _STREAM_START.pack(stream.store_id, stream.first_offset)

    def live_bytes(self) -> int:
        """The live data a checkpoint rewrites: messages and what streams retain."""
        return self.store.index.bytes + sum(stream.retained_bytes for stream in self.streams())

    # -- definitions ----------------------------------------------------------------------

    def new_queue_id(self) -> int:
        """A message-log id for a new durable queue, unique in this vhost's log."""
        qid = self.next_queue_id
        self.next_queue_id += 1
        return qid

    def definitions_changed(self) -> None:
        """A durable definition changes now (the vhost is about to change its memory): the
        snapshot goes into the log before the next record, or on the next loop turn."""
        if not self.definitions_dirty:
            self.definitions_dirty = True
            self.loop.call_soon(self.append_definitions_if_changed)

    def append_definitions_if_changed(self) -> int:
        """Append the definitions if they changed; returns the offset to wait for."""
        if self.definitions_dirty:
            self.definitions_dirty = False
            self._definitions_offset = self._replicate(definitions.encode(self.snapshot()))
        return self._definitions_offset

    def hold_reply(self, conn: Connection) -> None:
        """A reply to a method that changed durable definitions is about to be sent on
        `conn`: it (and what follows it) goes out once the definitions are confirmed."""
        offset = self.append_definitions_if_changed()
        if offset <= self.replication.confirmed_offset() and self.may_confirm():
            return
        conn.hold_output(DEFINITIONS_BARRIER)
        self._held_replies.append((offset, conn))

    # -- confirms -------------------------------------------------------------------------

    def release_confirmed(self) -> None:
        """What the replication has confirmed is durable: the store's publishes, held
        replies and streams waiting for it go on, while we may confirm (fencing)."""
        if not self.may_confirm():
            return
        confirmed = self.replication.confirmed_offset()
        self.store.records_durable(confirmed)
        held = self._held_replies
        while held and held[0][0] <= confirmed:
            held.popleft()[1].release_output(DEFINITIONS_BARRIER)
        streams = self._streams_waiting
        if streams:
            for stream in list(streams):
                if stream.replication_confirmed(confirmed):
                    streams.discard(stream)

    def nack_waiting(self, reason: str) -> None:
        """Nothing waiting will be confirmed by this leadership: nack it."""
        nacked = self.store.nack_waiting()
        if nacked:
            log.warning("%d publishes nacked: %s", nacked, reason)
        held, self._held_replies = self._held_replies, deque()
        for _, conn in held:  # their outcome is unknown: they never hear of it (320 next)
            conn.release_output(DEFINITIONS_BARRIER, send=False)
        streams, self._streams_waiting = self._streams_waiting, set()
        for stream in streams:
            stream.fail_replicated()

    async def close_replicated(self) -> None:
        self.nack_waiting("leadership ended")
        self.store.close()


def _at(offset: int, length: int) -> Location:
    """A record of the vhost's log as a MessageIndex location: the offset split over the
    segment and position fields (an offset outgrows 32 bits), the payload's length."""
    return Location(offset >> 32, offset & 0xFFFFFFFF, length)


class VhostLogView:
    """The vhost's replicated log as the `MessageLog` of its leader's MessageStore, where a
    clustered vhost's records are (module doc). Locations are log offsets (`_at`) and
    tokens the offsets themselves; reads go to the log (from memory while a record is not
    written yet); nothing is released record by record (checkpoints and the trim reclaim
    space), and the log's writer, fsyncs and failures are the replication's business."""

    def __init__(self, owner: ReplicatedVhostStore) -> None:
        self.owner = owner
        self.records = owner.records
        self.recovery = RecoveryReport()  # the log's own replay reported its damage
        self.error: BaseException | None = None
        self.resumes = 0

    def append(self, payload: bytes) -> tuple[Location, int]:
        offset = self.owner.record(payload)
        return _at(offset, len(payload)), offset

    @property
    def last_token(self) -> int:
        return self.records.last_offset

    def read(self, location: Location) -> bytes:
        return self.records.payload_at((location[0] << 32) | location[1])

    def release(self, location: Location) -> None:
        pass

    def schedule_sync(self) -> None:
        """Nothing to ask: every record appended asked for the log's group commit already
        (`ReplicatedVhostStore._replicate`); asking again when the store releases confirms
        only woke the writer for nothing."""

    def compact(self, relocate: Relocate) -> None:
        pass

    def resume(self, relocate: Relocate) -> None:
        raise LogFailed("a vhost's log is not resumed in place: its leader resigns the vhost")

    def replay(self, *, copy: bool = True) -> Iterator[tuple[Location, Any]]:
        """Every record the log holds, in offset order, with its location."""
        for at, payload in self.records.scan():
            yield _at(at, len(payload)), payload

    def segments(self) -> list:
        return []

    @property
    def bytes_written(self) -> int:
        return self.records.log.bytes_written

    def close(self) -> None:
        pass


@dataclass
class Rebuilt:
    """What `rebuild_from_log` found besides the message records."""

    definitions: dict | None = None  # the last definitions snapshot
    next_id: int = 1  # no message id below this may be given again
    next_queue_id: int = 1


def rebuild_from_log(records: SegmentRecordStore, vhost_dir: Path) -> Rebuilt:
    """What a new leader takes from the vhost's log besides its messages (which the store
    reads through `VhostLogView`): the last definitions, the id floors, and each stream's
    records, written into fresh stream directories (``streams/<id>``, opened by the streams
    as they are declared). A working copy left by an older version goes."""
    shutil.rmtree(vhost_dir / "messages", ignore_errors=True)
    found = Rebuilt()
    last_definitions = None
    streams = _StreamsRebuild(vhost_dir / "streams")
    try:
        for _, payload in records.scan():
            tag = payload[:1]
            if tag == DEFINITIONS_TAG:
                last_definitions = payload
                streams.definitions(payload)
            elif tag == STREAM_TAG:
                streams.record(payload)
            elif tag == STREAM_START_TAG:
                streams.start(payload)
            elif tag == STREAM_OFFSETS_TAG:
                streams.offsets(payload)
            elif tag == CHECKPOINT_TAG:
                next_id, next_queue_id = _CHECKPOINT_IDS.unpack_from(payload, 9)
                found.next_id = max(found.next_id, next_id)
                found.next_queue_id = max(found.next_queue_id, next_queue_id)
        if last_definitions is not None:
            found.definitions = definitions.decode(last_definitions)
        streams.finish(found.definitions)
    finally:
        streams.close()
    return found


class _StreamsRebuild:
    """Each stream's records, from the vhost's log, into a fresh directory of its own, in
    offset order and each once.

    A stream's copies in the log are in offset order except where a checkpoint copied its
    history while new records were appended (they interleave), and a record may be there
    twice (an older copy above the log's trim point, and a checkpoint's). So per stream:
    the next offset wanted; a record below it is a second copy (skipped), one above it
    waits until the gap is filled. A checkpoint's start record moves the next offset up to
    the stream's first retained one (retention dropped the rest); the checkpoint writes it
    before any record of the stream can follow its base (a replay trimmed there meets it
    first), and again before the copy. What still waits at the
    end follows in order (a segment dropped while a checkpoint copied it leaves a gap)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        shutil.rmtree(root, ignore_errors=True)
        self.logs: dict[int, SegmentLog] = {}
        self.next: dict[int, int] = {}
        self.waiting: dict[int, dict[int, bytes]] = {}
        self.segment_size: dict[int, int] = {}
        self.tracked: dict[int, bytes] = {}  # a stream's newest stored offsets (JSON)

    def definitions(self, payload: bytes) -> None:
        """Each stream's segment size, from the definitions that precede its records."""
        for q in definitions.decode(payload)["queues"]:
            size = definitions.queue_arguments(q).get("x-stream-max-segment-size-bytes")
            if isinstance(size, int) and size > 0:
                self.segment_size[q["id"]] = size

    def offsets(self, payload: bytes) -> None:
        """A stream's stored offsets (the newest record of each stream is what it has)."""
        (sid,) = _STREAM_ID.unpack_from(payload, 1)
        self.tracked[sid] = bytes(payload[1 + _STREAM_ID.size :])

    def start(self, payload: bytes) -> None:
        sid, first = _STREAM_START.unpack_from(payload, 1)
        if self.next.get(sid, -1) < first:
            self.next[sid] = first
            self._drain(sid)

    def record(self, payload: bytes) -> None:
        (sid,) = _STREAM_ID.unpack_from(payload, 1)
        stored = payload[1 + _STREAM_ID.size :]
        off, count = record_span(stored)  # (a batch record holds several offsets)
        want = self.next.setdefault(sid, off)
        if off == want:
            self._write(sid, stored)
            self.next[sid] = off + count
            self._drain(sid)
        elif off > want:
            self.waiting.setdefault(sid, {})[off] = bytes(stored)

    def _drain(self, sid: int) -> None:
        waiting = self.waiting.get(sid)
        if not waiting:
            return
        want = self.next[sid]
        for off in [o for o in waiting if o < want]:
            del waiting[off]
        while want in waiting:
            stored = waiting.pop(want)
            self._write(sid, stored)
            want += record_span(stored)[1]
        self.next[sid] = want

    def _write(self, sid: int, stored: bytes) -> None:
        log_ = self.logs.get(sid)
        if log_ is None:
            log_ = self.logs[sid] = SegmentLog.open(
                self.root / str(sid),
                segment_size=max(self.segment_size.get(sid, DEFAULT_SEGMENT_SIZE), 4096),
                whole_segments=True,
                fsync=False,  # a working copy of the log's records, rebuilt at each promotion
            )
        log_.append(stored)

    def finish(self, final: dict | None) -> None:
        """What still waits goes in order; streams the final definitions lack go."""
        for sid, waiting in self.waiting.items():
            for off in sorted(waiting):
                if off >= self.next[sid]:
                    self._write(sid, waiting[off])
        self.waiting.clear()
        kept = {q["id"] for q in final["queues"]} if final is not None else set()
        for sid, tracked in self.tracked.items():
            if sid in kept:  # read by the stream when it opens its directory
                (self.root / str(sid)).mkdir(parents=True, exist_ok=True)
                (self.root / str(sid) / TRACKING_FILE).write_bytes(tracked)
        for sid in list(self.logs):
            if sid not in kept:
                self.logs.pop(sid).close()
                shutil.rmtree(self.root / str(sid), ignore_errors=True)

    def close(self) -> None:
        for log_ in self.logs.values():
            log_.close()  # writes what is buffered
        self.logs.clear()
