"""A vhost's replicated log on disk: (offset, payload) records in a SegmentLog directory.

Both ends of replication keep one: the leader appends what its owner produces and streams
from it; a follower appends what it receives. A restart rebuilds everything by replaying
the directory, with no other file to keep consistent. What the SegmentLog holds:

    b"r" u32 gen  u64 offset  payload   a record of the vhost's log
    b"t" u32 gen  u64 last              truncation: records of an older generation above
                                        `last` are void (a diverged tail, KIP-101)
    b"z" u32 gen  u64 start             reset: every record of an older generation is
                                        void; the log starts again at `start` (a snapshot)

Why generations: the markers must mean the same wherever they sit in the files, because
compaction copies live records (markers included) behind newer ones. A truncation or a
reset starts a new generation, and a marker voids only what older generations wrote, so a
replay in any order gives the same log. Markers are never released (they are tiny and few:
one per truncation or reset); compaction carries them along.

Two kinds of payload mean something here, because they shape the log itself (the rest is
opaque; replicated_store.py says what the payloads are):

* ``EPOCH_TAG`` (b"E" u64 epoch): a leader starts its epoch with one, and every checkpoint
  starts with one, so each record's epoch is that of the last epoch record at or below it
  (`epochs`, `last_epoch`, `end_of_epoch`: a follower's diverged tail is found by comparing
  epochs, not lengths).
* ``CHECKPOINT_TAG`` (b"C" u64 base ...): the records from `base` up to this one hold the
  vhost's whole live state, so everything below `base` may go. A follower trims once the
  checkpoint is durable with it (`trim_checkpointed`), the leader once every in-sync member
  has it; a replay trims at once.

Each copy of a log has an identity (``COPY``, a random name beside the segments): made with
the directory and made anew before a reset, so a wiped disk or a copy that was started over
is a *new* copy, which the cluster does not take for one that held the confirmed records
(coordination.py pins each in-sync member's copy). A store opened on an existing directory
syncs what it replayed before it counts it durable: a kill -9 can leave records in the page
cache only, and a follower acks its durable offset as soon as it connects.

`sync()` blocks (one group-commit fsync): callers on the event loop run it in a thread. It
may run while the loop appends: it makes durable what was appended before it started.
"""

from __future__ import annotations

import bisect
import os
import struct
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from ..store.record_tags import (
    CHECKPOINT_TAG,
    EPOCH_TAG,
    RECORD_ENVELOPE,
    RESET_ENVELOPE,
    TRUNCATION_ENVELOPE,
)
from ..store.segments import Location, SegmentLog

_HEAD = struct.Struct(">cIQ")
_EPOCH = struct.Struct(">cQ")
_CHECKPOINT_BASE = struct.Struct(">cQ")
#: The file in a log's directory that names this copy of the log (`copy_id`).
COPY_FILE = "COPY"


def epoch_record(epoch: int) -> bytes:
    return _EPOCH.pack(EPOCH_TAG, epoch)


def checkpoint_record(base: int, rest: bytes = b"") -> bytes:
    """A checkpoint's last record: the state from `base` on is whole (`rest`: the owner's)."""
    return _CHECKPOINT_BASE.pack(CHECKPOINT_TAG, base) + rest


def agreed_offset(
    ours: list[tuple[int, int]], our_last: int, theirs: list[tuple[int, int]], their_last: int
) -> int:
    """The last offset up to which two copies of a log hold the same records, from their
    epoch histories ((first offset, epoch), oldest first): Kafka's OffsetsForLeaderEpoch,
    taken to its end (KIP-279). Each epoch had one leader, so two records at one offset
    are the same record exactly when they were written at the same epoch; the copies part
    at the first offset where their epochs differ, wherever that is: comparing only the
    follower's newest epoch (KIP-101) misses a divergence inside an older one after two
    leader changes in a row. Offsets below either history's start count as agreed (they
    are below a checkpoint both hold, or the caller sends a snapshot)."""
    last = min(our_last, their_last)
    if not ours or not theirs:
        return last
    points = sorted({start for start, _ in ours} | {start for start, _ in theirs})
    floor = max(ours[0][0], theirs[0][0])
    for point in [floor, *points]:
        if point < floor:
            continue
        if point > last:
            break
        if _epoch_at(ours, point) != _epoch_at(theirs, point):
            return point - 1
    return last


def _epoch_at(history: list[tuple[int, int]], offset: int) -> int:
    i = bisect.bisect_right(history, (offset, 1 << 64))
    return history[i - 1][1] if i else 0


class LogFormatError(Exception):
    """The directory holds records this version does not read."""


class RecordStore(Protocol):
    """What a ReplicationFollower writes to and a ReplicationLeader streams from."""

    first_offset: int  # the oldest offset held (last_offset + 1 when empty)
    last_offset: int  # the newest offset appended (0 before any)
    durable_offset: int  # the newest offset known durable
    copy_id: str  # this copy's identity: new when the directory is made or reset

    def append(self, offset: int, payload: bytes) -> None: ...

    def sync(self) -> int: ...

    def sync_soon(self, done: Callable[[int, BaseException | None], object]) -> None: ...

    def reset(self, start: int) -> None: ...

    def truncate(self, last: int) -> None: ...

    def trim_checkpointed(self, upto: int) -> None: ...

    def last_epoch(self) -> int: ...

    def epoch_starts(self) -> list[tuple[int, int]]: ...

    def end_of_epoch(self, epoch: int) -> int: ...

    def read(self, start: int, max_bytes: int) -> list[tuple[int, bytes]]: ...


class SegmentRecordStore:
    """RecordStore on a SegmentLog in `directory` (see module doc); replays on open."""

    def __init__(self, directory: str | os.PathLike[str], **log_options: Any) -> None:
        #: `sync_soon` callers: (the log's token, offset, callback), by token.
        self._sync_waiters: deque[tuple[int, int, Callable[[int, BaseException | None], object]]]
        self._sync_waiters = deque()
        self._sync_lock = threading.Lock()
        # Records leave this log only in runs (a trim below a checkpoint, a truncation, a
        # reset), never one by one as messages are acked: a live count per segment is all
        # it needs, not a per-record map (whose upkeep cost a leader ~1.5 us a message).
        log_options.setdefault("whole_segments", True)
        self._whole_segments = log_options["whole_segments"]
        self.log = SegmentLog.open(
            directory, on_synced=self._log_synced, on_error=self._log_failed, **log_options
        )
        self._locations: list[Location] = []  # index i holds offset first_offset + i
        self.first_offset = 1
        self.last_offset = 0
        self.gen = 0
        #: (start offset, epoch), by offset: where each epoch's records begin.
        self.epochs: list[tuple[int, int]] = []
        #: (offset of a checkpoint record, its base), not yet trimmed below.
        self._checkpoints: list[tuple[int, int]] = []
        #: The offset of the checkpoint record the log was last trimmed by (0: none): the
        #: records below `first_offset` are only redundant while that record stands.
        self.trimmed_by = 0
        try:
            self._replay()
            # What the replay read may be only in the page cache (a kill -9 before the last
            # life's fsync): durable once synced, not before (a follower acks it at once).
            self.log.sync_replayed()
            self.durable_offset = self.last_offset
            self.copy_id = self._read_or_make_copy_id()
        except BaseException:
            # A log that cannot be opened lets go of its directory: the next attempt must
            # meet the same error, not "in use by another log" from a leaked lock.
            self.log.close()
            raise

    # -- the copy's identity -----------------------------------------------------------------

    def _copy_path(self) -> str:
        return os.path.join(self.log.directory, COPY_FILE)

    def _read_or_make_copy_id(self) -> str:
        try:
            with open(self._copy_path(), encoding="ascii") as f:
                copy_id = f.read().strip()
            if copy_id:
                return copy_id
        except FileNotFoundError:
            pass
        return self.renew_copy_id()

    def renew_copy_id(self) -> str:
        """This directory becomes a new copy of the log (made, reset, or found without an
        identity): written durably before the records it stands for change, so that a
        crash in between leaves a new copy holding old records (safe: it must catch up
        again), never an old identity on a copy that lost records."""
        copy_id = uuid.uuid4().hex
        path = self._copy_path()
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="ascii") as f:
            f.write(copy_id + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(self.log.directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self.copy_id = copy_id
        return copy_id

    # -- replay -----------------------------------------------------------------------------

    def _replay(self) -> None:
        records: list[tuple[int, int, Location, bytes]] = []  # gen, offset, location, head
        truncations: list[tuple[int, int]] = []
        resets: list[tuple[int, int]] = []
        for location, payload in self.log.replay():
            tag, gen, number = _HEAD.unpack_from(payload, 0)
            self.gen = max(self.gen, gen)
            if tag == RECORD_ENVELOPE:
                records.append((gen, number, location, bytes(payload[_HEAD.size : _HEAD.size + 9])))
            elif tag == TRUNCATION_ENVELOPE:
                truncations.append((gen, number))
            elif tag == RESET_ENVELOPE:
                resets.append((gen, number))
            else:
                raise LogFormatError(
                    f"{self.log.directory}: record tag {tag!r} is not of this version's log "
                    "(remove the directory: the node copies the log again from its leader)"
                )
        newest_reset = max(resets, default=(0, 1))
        floor = newest_reset[1]

        def valid(gen: int, offset: int) -> bool:
            if gen < newest_reset[0] or offset < floor:
                return False
            return not any(gen < t_gen and offset > last for t_gen, last in truncations)

        chosen: dict[int, tuple[int, Location, bytes]] = {}
        for gen, offset, location, head in records:
            if not valid(gen, offset):
                self.log.release(location)
                continue
            held = chosen.get(offset)
            if held is not None:
                if held[0] > gen:  # an older generation's copy of this offset loses
                    self.log.release(location)
                    continue
                self.log.release(held[1])  # a compaction copy: keep the later
            chosen[offset] = (gen, location, head)
        # The newest checkpoint whose records are all here starts the log: what lies below
        # it was trimmed (some of it may survive in segments that still hold newer records).
        for offset in sorted(
            (o for o, c in chosen.items() if c[2][:1] == CHECKPOINT_TAG), reverse=True
        ):
            base = _CHECKPOINT_BASE.unpack_from(chosen[offset][2], 0)[1]
            if all(o in chosen for o in range(base, offset)):
                if base > floor:
                    floor, self.trimmed_by = base, offset
                break
        for offset in [o for o in chosen if o < floor]:
            self.log.release(chosen.pop(offset)[1])
        offsets = sorted(chosen)
        self.first_offset = offsets[0] if offsets else floor
        self.last_offset = self.first_offset - 1
        for offset in offsets:
            gen, location, head = chosen[offset]
            if offset != self.last_offset + 1:  # a hole (damage): nothing after it is kept
                self.log.release(location)
                continue
            self._locations.append(location)
            self.last_offset = offset
            self._note(offset, head)
        self.trim_checkpointed(self.last_offset)

    def _note(self, offset: int, payload: bytes) -> None:
        """Epoch and checkpoint records shape the log (module doc)."""
        tag = payload[:1]
        if tag == EPOCH_TAG and len(payload) >= _EPOCH.size:
            epoch = _EPOCH.unpack_from(payload, 0)[1]
            if not self.epochs or self.epochs[-1][1] != epoch:
                self.epochs.append((offset, epoch))
        elif tag == CHECKPOINT_TAG and len(payload) >= _CHECKPOINT_BASE.size:
            self._checkpoints.append((offset, _CHECKPOINT_BASE.unpack_from(payload, 0)[1]))

    # -- writing ---------------------------------------------------------------------------

    def append(self, offset: int, payload: bytes) -> None:
        if offset != self.last_offset + 1:
            raise ValueError(f"offset {offset} does not follow {self.last_offset}")
        location, _ = self.log.append(_HEAD.pack(RECORD_ENVELOPE, self.gen, offset) + payload)
        self._locations.append(location)
        self.last_offset = offset  # after the append: sync() relies on this order
        if payload[:1] in (EPOCH_TAG, CHECKPOINT_TAG):
            self._note(offset, payload)

    def sync_soon(self, done: Callable[[int, BaseException | None], object]) -> None:
        """`sync` without blocking: the log's writer fsyncs what was appended so far, then
        calls ``done(durable offset, None)`` on its own thread (``done(offset, error)`` if
        the log failed). No thread of the caller's waits for it."""
        token = self.log.last_token
        self._sync_waiters.append((token, self.last_offset, done))
        self.log.schedule_sync()
        synced = self.log.synced_token
        if synced >= token:  # written by a batch that ended before the waiter was seen
            self._log_synced(synced)

    def _log_synced(self, token: int) -> None:  # the writer's thread (or sync_soon's)
        with self._sync_lock:
            waiters = self._sync_waiters
            while waiters and waiters[0][0] <= token:
                _token, offset, done = waiters.popleft()
                if offset > self.durable_offset:
                    self.durable_offset = offset
                done(offset, None)

    def _log_failed(self, error: BaseException) -> None:  # the writer's thread
        with self._sync_lock:
            waiters = self._sync_waiters
            while waiters:
                _token, offset, done = waiters.popleft()
                done(offset, error)

    def sync(self) -> int:
        """Make everything appended so far durable (one fsync); return the durable offset."""
        target = self.last_offset
        self.log.sync_now()
        self.durable_offset = target
        return target

    def reset(self, start: int) -> None:
        """Void everything held; the next record appended is `start` (durable after sync).
        The directory becomes a new copy first: what it held is gone."""
        self.renew_copy_id()
        self.gen += 1
        self.log.append(_HEAD.pack(RESET_ENVELOPE, self.gen, start))
        self.log.release_many(self._locations)
        self._locations = []
        self.first_offset = start
        self.last_offset = start - 1
        self.durable_offset = min(self.durable_offset, self.last_offset)
        self.epochs = []
        self._checkpoints = []
        self.trimmed_by = 0

    def truncate(self, last: int) -> None:
        """Void the records above `last` (a tail the leader's log does not have).

        If that takes away the checkpoint the log was trimmed by, what is left is not a
        whole state any more: everything goes (the log starts again at 1, and the follower
        asks its leader for a snapshot)."""
        if last >= self.last_offset:
            return
        if last < self.first_offset - 1 or self.trimmed_by > last:
            self.reset(1)
            return
        self.gen += 1
        self.log.append(_HEAD.pack(TRUNCATION_ENVELOPE, self.gen, last))
        keep = last + 1 - self.first_offset
        self.log.release_many(self._locations[keep:])
        del self._locations[keep:]
        self.last_offset = last
        self.durable_offset = min(self.durable_offset, last)
        self.epochs = [e for e in self.epochs if e[0] <= last]
        self._checkpoints = [c for c in self._checkpoints if c[0] <= last]

    def trim_checkpointed(self, upto: int) -> None:
        """Forget what the checkpoints at or below offset `upto` made redundant."""
        base = by = 0
        while self._checkpoints and self._checkpoints[0][0] <= upto:
            by, checkpoint_base = self._checkpoints.pop(0)
            base = max(base, checkpoint_base)
        if base > self.first_offset:
            self.drop_below(base)
            self.trimmed_by = by

    def drop_below(self, base: int) -> None:
        """Retention: forget records below `base` (not persisted as such: the checkpoint
        record that allowed it is, and a replay trims again)."""
        cut = max(0, min(base, self.last_offset + 1) - self.first_offset)
        self.log.release_many(self._locations[:cut])
        del self._locations[:cut]
        self.first_offset += cut
        i = bisect.bisect_right(self.epochs, (self.first_offset, 1 << 64))
        if i > 1:  # keep the epoch in force at the new first offset
            del self.epochs[: i - 1]
        if self.epochs and self.epochs[0][0] < self.first_offset:
            self.epochs[0] = (self.first_offset, self.epochs[0][1])

    def compact(self) -> None:
        """Copy the live records out of mostly-trimmed segments (off the hot path): only
        for a log opened with per-record liveness (``whole_segments=False``). Otherwise the
        checkpoints are the compaction: a segment goes once a trim took all its records."""
        if not self._whole_segments:
            self.log.compact(self._relocated)

    def _relocated(self, old: Location, new: Location, payload: bytes) -> None:
        tag, _, offset = _HEAD.unpack_from(payload, 0)
        if tag == RECORD_ENVELOPE and self.first_offset <= offset <= self.last_offset:
            i = offset - self.first_offset
            if self._locations[i] == old:
                self._locations[i] = new

    # -- epochs ----------------------------------------------------------------------------

    def last_epoch(self) -> int:
        """The epoch of the newest record (0: none known)."""
        return self.epochs[-1][1] if self.epochs else 0

    def epoch_starts(self) -> list[tuple[int, int]]:
        """(first offset, epoch) of each epoch held, oldest first: what a follower's HELLO
        sends so that its leader finds where the two logs part (`agreed_offset`)."""
        return list(self.epochs)

    def end_of_epoch(self, epoch: int) -> int:
        """The last offset of this log written at `epoch` or before (Kafka's
        OffsetsForLeaderEpoch): where a follower whose newest record is of `epoch` stops
        agreeing with this log."""
        for start, e in self.epochs:
            if e > epoch:
                return start - 1
        return self.last_offset

    # -- reading ---------------------------------------------------------------------------

    def read(self, start: int, max_bytes: int) -> list[tuple[int, bytes]]:
        """Records from offset `start` (at least one if any), about `max_bytes` of payload."""
        out: list[tuple[int, bytes]] = []
        size = 0
        offset = max(start, self.first_offset)
        while offset <= self.last_offset and (not out or size < max_bytes):
            payload = self.log.read(self._locations[offset - self.first_offset])
            out.append((offset, payload[_HEAD.size :]))
            size += len(payload)
            offset += 1
        return out

    def payload_at(self, offset: int) -> bytes:
        """One record's payload (from memory if not written yet); KeyError if not held."""
        if not self.first_offset <= offset <= self.last_offset:
            raise KeyError(offset)
        return self.log.read(self._locations[offset - self.first_offset])[_HEAD.size :]

    def scan(self, chunk_bytes: int = 4 << 20) -> Iterator[tuple[int, bytes]]:
        """Every record held, oldest first, read `chunk_bytes` of payload at a time."""
        offset = self.first_offset
        while offset <= self.last_offset:
            batch = self.read(offset, chunk_bytes)
            yield from batch
            offset = batch[-1][0] + 1

    def records(self) -> list[tuple[int, bytes]]:
        """Everything held, oldest first (for tests and checks)."""
        return self.read(self.first_offset, 1 << 62)

    def size_bytes(self) -> int:
        """Bytes the log's segment files take (what a checkpoint would shrink)."""
        return sum(info.size for info in self.log.segments())

    def close(self) -> None:
        self.log.close()
