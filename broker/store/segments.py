"""Append-only segment log: the lowest layer of message durability.

The broker encodes its own records (publish, ack/remove, delivered markers) and
hands them to a `SegmentLog` as opaque bytes. The log writes them to segment
files, makes them durable in batches, reads them back by location, recovers
them after a crash and reclaims the space of records the owner no longer needs.

Record format (little-endian), back to back in each segment file::

    magic   4 bytes   b"\\x9eRMQ"  (lets recovery find the next record after damage)
    length  u32       payload length in bytes
    crc     u32       zlib.crc32(payload)
    payload length bytes, opaque to this layer

Segments are files ``NNNNNNNN.seg`` (decimal id, 8 digits or more) in one
directory. The active segment is rotated when the next record would take it past
`segment_size`; a record larger than that gets a segment of its own. Every
record has a `Location` (segment, offset of its header, payload length).

Threads. All public methods may be called from any thread (one lock guards the
state), but the intended use is one *owner* thread (the event loop) calling
`append`, `schedule_sync`, `read`, `release` and `compact`, and the log's own
writer thread doing every write, fsync, unlink and directory fsync:

* `append` copies the framed record into an in-memory buffer and returns at
  once (no syscalls). Its token is a per-record sequence number, increasing by
  one per append.
* `schedule_sync` asks the writer for a batch. The writer (waiting up to
  `sync_interval_ms` since its last batch to gather more, when more than
  `GATHER_AFTER_RECORDS` came since then), takes everything buffered so far, writes
  it, issues one fdatasync per segment touched (normally one), fsyncs the
  directory if it created a file, and then calls ``on_synced(token)`` *from
  the writer thread* with the highest token now on disk (`synced_token`). The
  owner marshals that to its loop (``loop.call_soon_threadsafe``) and confirms
  everything with token <= synced. While a batch is being fsynced, new appends
  collect in the buffer and go out together in the next one (group commit).
  Records are framed straight into recycled write buffers of `buffer_size`
  bytes; a full buffer is handed to the writer at once, which starts a batch.
* Callbacks (``on_synced``, ``on_error``, ``on_deleted``) run on the writer
  thread: they must be quick and must not call `sync_now` or `close` (refused
  with RuntimeError: it would deadlock). Exceptions they raise are logged.
* An I/O error in the writer (ENOSPC, EIO, ...) is logged, stored in `error`,
  reported through ``on_error(exc)`` and stops the writer: later `append`,
  `sync_now` and `compact` calls raise `LogFailed`, and nothing more is
  confirmed. Before reporting, the writer cuts what the failed batch wrote back
  off its files, so no half-written record is left for recovery to find.
* `resume(relocate)` (owner thread) recovers in place, as PostgreSQL learned
  to after "fsyncgate": a failed fsync means the page cache can no longer be
  trusted, so nothing written since the last good fsync is believed, and no
  fsync is retried on the same pages. A batch's buffers are kept until its fsync
  succeeds, so every record since the last good fsync is still intact in
  memory; resume cuts the files back to the last good fsync, starts a new
  segment, appends the live records of that tail to it (telling the owner with
  ``relocate``, as compaction does) and starts a new writer. Those records are
  durable again once the new segment's first fsync succeeds. If the cut or the
  new segment fails, resume raises and the log stays failed; call it again
  later (after ENOSPC: once space is back).
* `buffered_bytes` is what is appended but not yet durable; the owner should
  apply flow control on it (nothing here bounds it).
* The writer is a daemon thread: call `close()` (or use ``with``) at shutdown,
  or what is still buffered is lost, as in a crash.
* A ``LOCK`` file in the directory (flock) keeps a second log, in this process
  or another, from opening the same directory.
* ``fsync=False`` skips every fsync: for tests and benchmarks only.
* ``preallocate=N`` keeps N bytes allocated past the records of the segment being
  written (fallocate, extended by a batch once half is used, made durable by its
  fdatasync), so that the batches in between write into a file that keeps its size and
  their fdatasync has no inode to write. A segment is cut back to its records when the
  writer moves on or closes; after a crash, zeros from the last record to the end of a
  segment are its end, not damage (`replay` cuts them off without reporting them).

Liveness protocol (owner <-> log):

* Every appended record starts *live*. When the owner no longer needs one it
  calls ``release(location)`` exactly once (refcounting across queues is the
  owner's business; the log keeps one bit per record and rejects double
  releases with KeyError).
* A segment that is not the active one and has no live record left is deleted
  by the writer after its next batch is durable, then ``on_deleted(segment)``
  is called (writer thread).
* Tombstones: an ack/remove record must stay live for as long as the record it
  cancels may still be on disk, or recovery resurrects the message. The owner
  can release a tombstone once ``on_deleted`` has reported the target's segment
  (or the target was relocated by compaction and that old segment was deleted).
* `compact(relocate)` copies the live records of mostly-dead segments (live
  bytes under `compact_threshold` of the file, or segments in which recovery
  found damage) to the active segment with `append` and calls
  ``relocate(old_location, new_location, payload)`` so the owner can update its
  index; the old segment is deleted once the copies are durable. A crash in
  between leaves both copies on disk: replay then yields the record twice, and
  the owner keeps one and releases the other.
* Recovery: `SegmentLog.open` starts a fresh active segment after the existing
  ones, so appends can begin at once. `replay()` yields ``(location,
  payload)`` for every intact record of the old segments in append order (a
  relocated record appears where its copy was appended, so the owner's replay
  should be keyed by its own ids, not by order). Every replayed record is live;
  the owner calls `release` for those it finds dead, during or after the
  replay. Replay must be run to exhaustion: only then do old segments take part
  in deletion and compaction (segments left with no live record are deleted
  right away). Without a replay, old segments are left alone.

Damage found by replay never raises. Bytes after the last intact record of a
segment (a torn write, garbage, a record with a bad CRC) are logged and the file
is truncated; damage followed by intact records is logged and skipped by
scanning forward for the next magic whose record verifies, so later records
survive. What was dropped is summed up in `recovery` (a `RecoveryReport`).
"""

from __future__ import annotations

import bisect
import errno
import fcntl
import logging
import os
import re
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pyroaring import BitMap

__all__ = [
    "MAGIC",
    "HEADER_SIZE",
    "GATHER_AFTER_RECORDS",
    "Location",
    "SegmentLog",
    "SegmentLogError",
    "LogFailed",
    "LogClosed",
    "CorruptRecord",
    "CorruptRegion",
    "RecoveryReport",
    "CompactionReport",
    "SegmentInfo",
]

log = logging.getLogger("roarmq.store")

MAGIC = b"\x9eRMQ"
_HEADER = struct.Struct("<4sII")
HEADER_SIZE = _HEADER.size  # 12
_SEGMENT_RE = re.compile(r"^(\d{8,})\.seg$")

# Indirections the tests patch to inject I/O errors and count fsyncs.
_pwrite = os.pwrite
_fdatasync = getattr(os, "fdatasync", os.fsync)
_fsync = os.fsync
_fallocate = os.posix_fallocate

_pack_into = _HEADER.pack_into
_unpack_from = _HEADER.unpack_from
_crc32 = zlib.crc32

_POOL_MAX = 4  # idle write buffers kept for reuse

# Segment states.
_ACTIVE, _SEALED, _RECOVERING, _DOOMED = "active", "sealed", "recovering", "doomed"


class Location(NamedTuple):
    """Where a record lives: segment id, byte offset of its header, payload length."""

    segment: int
    offset: int
    length: int

    @property
    def size(self) -> int:
        """Bytes the record takes in its segment, header included."""
        return HEADER_SIZE + self.length


_new_location = tuple.__new__  # Location(...) without the Python-level __new__


class SegmentLogError(Exception):
    """Base class of the errors raised by this module."""


class LogFailed(SegmentLogError):
    """The writer hit an I/O error; nothing appended since is durable. `__cause__` has it."""


class LogClosed(SegmentLogError):
    """The log was closed."""


class CorruptRecord(SegmentLogError):
    """`read` found a record whose header or CRC does not verify."""


@dataclass
class CorruptRegion:
    segment: int
    offset: int
    length: int
    reason: str
    truncated: bool  # True: tail cut off the file; False: skipped in the middle


#: `preallocate` allocates nothing on a disk with less free than this many times its size.
PREALLOCATE_FREE_MIN = 64

#: `sync_interval_ms` applies only to a log that got more records than this since its last
#: batch: below it a batch starts at once. A publisher waiting for each confirm appends 2-3
#: records (publish, delivered, ack) a batch; a busy log thousands.
GATHER_AFTER_RECORDS = 16


@dataclass
class RecoveryReport:
    segments: int = 0
    records_ok: int = 0
    records_dropped: int = 0  # damaged regions; record boundaries inside one are unknowable
    bytes_truncated: int = 0
    bytes_skipped: int = 0  # damaged bytes left in place in the middle of segments
    corrupt_regions: list[CorruptRegion] = field(default_factory=list)


@dataclass
class CompactionReport:
    segments: list[int] = field(default_factory=list)  # compacted (deleted once copies are synced)
    records_moved: int = 0
    bytes_moved: int = 0
    bytes_reclaimed: int = 0


@dataclass(frozen=True)
class SegmentInfo:
    segment: int
    size: int
    live_records: int
    live_bytes: int
    state: str
    damaged: bool


class _Live:
    """The offsets of a segment's live records, and their payload bytes.

    A roaring bitmap of offsets rather than a dict of offset -> length: a segment holds
    one record per persistent message, and at millions of queued messages the dict
    (~70 bytes an entry) cost more than the queues' own records. A record's length is in
    its header on disk and in the owner's Location; the log only needs the total.
    """

    __slots__ = ("offsets", "nbytes")

    def __init__(self) -> None:
        self.offsets = BitMap()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self.offsets)

    def __bool__(self) -> bool:
        return bool(self.offsets)

    def __contains__(self, offset: int) -> bool:
        return offset in self.offsets

    def add(self, offset: int, length: int) -> None:
        self.offsets.add(offset)
        self.nbytes += length

    def remove(self, offset: int, length: int) -> None:
        self.offsets.remove(offset)  # KeyError if it is not live
        self.nbytes -= length


class _Count:
    """A segment's live records by count alone, for owners that never release a record but
    drop whole segments (`SegmentLog.release_segment`): streams. No per-record memory."""

    __slots__ = ("n", "nbytes")

    def __init__(self) -> None:
        self.n = 0
        self.nbytes = 0

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    def __contains__(self, offset: int) -> bool:
        return self.n > 0  # not known per record: any may be live

    @property
    def offsets(self) -> list[int]:
        return []  # nothing to compact record by record

    def add(self, offset: int, length: int) -> None:
        self.n += 1
        self.nbytes += length

    def remove(self, offset: int, length: int) -> None:
        self.n -= 1
        self.nbytes -= length


class _Segment:
    __slots__ = ("id", "size", "live", "state", "damaged", "skip_compaction")

    def __init__(self, seg_id: int, state: str, live: type = _Live) -> None:
        self.id = seg_id
        self.size = 0
        self.live = live()
        self.state = state
        self.damaged = False
        self.skip_compaction = False

    def live_bytes(self) -> int:
        """Bytes of live records, headers included."""
        return self.live.nbytes + HEADER_SIZE * len(self.live)


def segment_name(seg_id: int) -> str:
    return f"{seg_id:08d}.seg"


#: Upper bounds (seconds) of the fsync latency histogram (Prometheus: roarmq_store_fsync_seconds).
FSYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def make_dirs_durably(path: str | os.PathLike[str]) -> None:
    """`os.makedirs`, each directory it creates named durably: its parent fsynced. A file
    fsynced in a directory whose own name was never made durable is lost with it on a
    power loss (POSIX promises nothing more; ext4 mostly keeps it, others need not)."""
    path = os.path.abspath(path)
    missing = []
    while not os.path.exists(path):  # (a file in the way: makedirs says so below)
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for directory in reversed(missing):
        os.makedirs(directory, exist_ok=True)
        _fsync_dir(os.path.dirname(directory))


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        _fsync(fd)
    finally:
        os.close(fd)


def _pwrite_all(fd: int, data: bytearray, offset: int, total: int) -> None:
    with memoryview(data) as view:
        done = 0
        while done < total:
            n = _pwrite(fd, view[done:total], offset + done)
            if n <= 0:
                raise OSError(errno.EIO, "pwrite wrote nothing")
            done += n


def _check(data: bytes, view: memoryview, pos: int, end: int) -> tuple[int, str]:
    """(payload length, "") if an intact record starts at pos, else (-1, why not)."""
    if pos + HEADER_SIZE > end:
        return -1, "short header"
    magic, n, crc = _unpack_from(data, pos)
    if magic != MAGIC:
        return -1, "bad magic"
    if pos + HEADER_SIZE + n > end:
        return -1, "record runs past end of file"
    if _crc32(view[pos + HEADER_SIZE : pos + HEADER_SIZE + n]) != crc:
        return -1, "crc mismatch"
    return n, ""


def _resync(data: bytes, view: memoryview, start: int, end: int) -> int:
    """Offset of the next intact record at or after start, or -1."""
    i = data.find(MAGIC, start, end)
    while i >= 0:
        if _check(data, view, i, end)[0] >= 0:
            return i
        i = data.find(MAGIC, i + 1, end)
    return -1


class SegmentLog:
    """An append-only log of CRC-checked records in rotated segment files (see module doc)."""

    #: How segments count their live records: per record (`release`), or, with
    #: ``whole_segments=True``, by count only (`release_segment`; no memory per record).
    _live_class: type = _Live

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        segment_size: int = 16 << 20,
        sync_interval_ms: float = 0.0,
        buffer_size: int = 1 << 20,
        compact_threshold: float = 0.25,
        max_record_size: int = 512 << 20,
        max_open_files: int = 256,
        fsync: bool = True,
        on_synced: Callable[[int], object] | None = None,
        on_error: Callable[[BaseException], object] | None = None,
        on_deleted: Callable[[int], object] | None = None,
        whole_segments: bool = False,
        preallocate: int = 0,
    ) -> None:
        if whole_segments:
            self._live_class = _Count
        if segment_size <= HEADER_SIZE:
            raise ValueError("segment_size too small")
        self.directory = os.fspath(directory)
        self._segment_size = segment_size
        self._interval = max(0.0, sync_interval_ms) / 1000.0
        self._bufsize = max(64 << 10, buffer_size)
        self._compact_threshold = compact_threshold
        self._max_record = max_record_size
        self._max_open = max(1, max_open_files)
        self._do_fsync = fsync
        self._prealloc = max(0, preallocate)
        self.fsync_count = 0
        self.fsync_seconds = 0.0
        self.fsync_buckets = [0] * (len(FSYNC_BUCKETS) + 1)  # the last: over the top bound
        self._on_synced = on_synced
        self._on_error = on_error
        self._on_deleted = on_deleted

        self.error: BaseException | None = None
        self.synced_token = 0
        self.recovery = RecoveryReport()

        make_dirs_durably(self.directory)
        # One log per directory: a second process appending to the same files would
        # interleave records and defeat recovery. The lock dies with the process.
        self._lock_fd = os.open(
            os.path.join(self.directory, "LOCK"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644
        )
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            raise SegmentLogError(f"{self.directory} is in use by another log") from exc
        found = []
        for name in os.listdir(self.directory):
            m = _SEGMENT_RE.match(name)
            if m:
                found.append(int(m.group(1)))
        found.sort()
        self._to_replay: list[int] | None = found
        first = found[-1] + 1 if found else 0

        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # wakes the writer
        self._done = threading.Condition(threading.Lock())  # batch completions
        self._segments: dict[int, _Segment] = {}
        self._seg = _Segment(first, _ACTIVE, self._live_class)  # the active segment
        self._segments[first] = self._seg
        self._size = 0  # bytes appended to the active segment
        # Write buffers. Records of the active segment from offset _buf_base up to _size
        # are framed into _buf[:_size - _buf_base]. Full (or taken) buffers become chunks
        # (segment, offset, buffer, used) in _sealed; the writer moves them to _inflight
        # while it writes them, then returns them to _pool. _limit is the segment offset
        # at which the next record needs the slow path (rotation or a new buffer).
        self._buf = bytearray(self._bufsize)
        self._buf_base = 0
        self._limit = min(self._segment_size, self._bufsize)
        self._seg_id = first  # the active segment's id and live map, cached for append
        self._live = self._seg.live
        self._pool: list[bytearray] = []
        self._sealed: list[tuple[int, int, bytearray, int]] = []
        self._inflight: list[tuple[int, int, bytearray, int]] = []
        self._deletions: list[int] = []
        self._token = 0
        self._want = False  # a batch was asked for
        self._closing = False
        self._refusing = False  # error or closing: append refuses
        self._closed = False
        self._swaps = 0  # batches taken by the writer
        self._completed = 0  # batches finished
        self._durable_below = first  # every segment id < this is fully written and synced
        self._rfds: dict[int, int] = {}  # read fds, oldest first
        self._wfd = -1  # writer's fd, -1 when none is open (writer thread only)
        self._wseg = -1
        self._wend = 0  # where the records written to _wseg end (writer thread only)
        self._allocated = 0  # _wseg's file size: allocated, zeros from _wend on (writer)
        #: Where the batch that failed started writing in each segment it touched: the
        #: files are cut back there (everything before it was fsynced by earlier batches).
        self._failed_from: dict[int, int] = {}
        self.bytes_written = 0  # payload and headers written (writer thread; for disk checks)
        self.resumes = 0  # times resume() brought the log back after a failure

        self._thread = self._start_writer()

    def _start_writer(self) -> threading.Thread:
        thread = threading.Thread(target=self._writer_main, name="roarmq-store-writer", daemon=True)
        thread.start()
        return thread

    @classmethod
    def open(cls, directory: str | os.PathLike[str], **options: Any) -> SegmentLog:
        """Open (creating if needed) the log in `directory`; appends go to a fresh segment."""
        return cls(directory, **options)

    def __enter__(self) -> SegmentLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ hot path

    def append(self, payload: bytes) -> tuple[Location, int]:
        """Buffer one record; return its location and token. No I/O; raises LogFailed/LogClosed."""
        n = len(payload)
        if n > self._max_record:
            raise ValueError(f"record of {n} bytes exceeds max_record_size")
        crc = _crc32(payload)
        with self._lock:
            off = self._size
            end = off + 12 + n  # 12 == HEADER_SIZE (a constant is cheaper than a global)
            if end > self._limit:  # full, closed or failed: the slow path sorts it out
                off = self._make_room_locked(12 + n)
                end = off + 12 + n
            pos = off - self._buf_base
            buf = self._buf
            _pack_into(buf, pos, MAGIC, n, crc)
            buf[pos + 12 : pos + 12 + n] = payload
            self._size = end
            self._live.add(off, n)
            seg_id = self._seg_id
            self._token = token = self._token + 1
        return _new_location(Location, (seg_id, off, n)), token

    def schedule_sync(self) -> None:
        """Ask the writer to make everything appended so far durable; returns at once."""
        if self._want:
            return
        with self._lock:
            if not self._want:
                self._want = True
                self._cond.notify()

    def read(self, location: Location) -> bytes:
        """The payload at `location` (from memory if not yet written, else pread + CRC check).

        Raises KeyError if the segment is gone, CorruptRecord if the record does not verify.
        """
        seg_id, off, n = location
        with self._lock:
            data = self._read_memory_locked(seg_id, off, n)
            if data is not None:
                return data
            fd = self._rfds.get(seg_id)
            if fd is None:
                fd = self._open_read_locked(seg_id)
            # pread under the lock: fds are closed only under it, so no fd-reuse race.
            raw = os.pread(fd, HEADER_SIZE + n, off)
        if len(raw) != HEADER_SIZE + n:
            raise CorruptRecord(f"{location}: short read ({len(raw)} bytes)")
        magic, length, crc = _unpack_from(raw, 0)
        if magic != MAGIC or length != n:
            raise CorruptRecord(f"{location}: bad header")
        payload = raw[HEADER_SIZE:]
        if _crc32(payload) != crc:
            raise CorruptRecord(f"{location}: crc mismatch")
        return payload

    def release(self, location: Location) -> None:
        """Mark a record dead. KeyError if it is not a live record of this log."""
        with self._lock:
            self._release_locked(location)

    def release_many(self, locations: list[Location]) -> None:
        """`release` each of `locations`, under one lock (a log trimmed by the thousand)."""
        with self._lock:
            for location in locations:
                self._release_locked(location)

    def _release_locked(self, location: Location) -> None:
        seg_id, off, n = location
        seg = self._segments.get(seg_id)
        if seg is None or off not in seg.live:
            raise KeyError(f"not a live record: {tuple(location)}")
        seg.live.remove(off, n)
        if not seg.live and seg.state == _SEALED:
            self._doom_locked(seg)

    def release_segment(self, seg_id: int) -> bool:
        """Mark every record of a sealed segment dead at once (it is deleted after the next
        batch is durable); False if it is not a sealed segment of this log."""
        with self._lock:
            seg = self._segments.get(seg_id)
            if seg is None or seg.state != _SEALED:
                return False
            seg.live = self._live_class()
            self._doom_locked(seg)
            return True

    # ------------------------------------------------------------------ syncing

    def sync_now(self, timeout: float | None = None) -> int:
        """Block until everything appended (and released) before the call is durable.

        Returns synced_token; raises LogFailed after a writer error, TimeoutError on timeout.
        """
        self._not_from_writer("sync_now")
        with self._lock:
            if self.error is not None:
                self._refuse()
            if self._closed or not self._thread.is_alive():
                return self.synced_token
            target = self._swaps + 1
            self._want = True
            self._cond.notify()
        with self._done:
            ok = self._done.wait_for(
                lambda: self._completed >= target or self.error is not None, timeout
            )
        if self.error is not None:
            self._refuse()
        if not ok:
            raise TimeoutError("segment log sync timed out")
        return self.synced_token

    def close(self) -> None:
        """Write and sync everything buffered, stop the writer, close files. Idempotent.

        Does not raise for a failed writer: check `error`.
        """
        self._not_from_writer("close")
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._closing = True
            self._refusing = True
            self._limit = -1
            self._want = True
            self._cond.notify()
        self._thread.join()
        with self._lock:
            for fd in self._rfds.values():
                os.close(fd)
            self._rfds.clear()
            os.close(self._lock_fd)  # releases the directory lock
            self._sealed.clear()
            self._pool.clear()

    # ------------------------------------------------------------------ recovery in place

    @property
    def failed(self) -> bool:
        return self.error is not None and not self._closed

    def resume(self, relocate: Callable[[Location, Location, bytes], object]) -> int:
        """After a writer failure: cut back, copy the untrusted tail to a new segment, go on.

        See the module doc. Returns how many live records were copied; raises OSError (and
        the log stays failed) if a file cannot be cut back. Owner thread only.
        """
        self._not_from_writer("resume")
        with self._lock:
            if self._closed:
                raise LogClosed("segment log closed")
            if self.error is None:
                return 0
        self._thread.join()
        for seg_id, start in self._failed_from.items():
            path = os.path.join(self.directory, segment_name(seg_id))
            self._truncate(path, start, strict=True)
        with self._lock:
            records = self._restart_locked()
        moved = 0
        for old, payload in records:
            new, _ = self.append(payload)
            try:
                relocate(old, new, payload)
            except Exception:
                log.exception("relocate callback failed during resume")
            moved += 1
        self.schedule_sync()
        self.resumes += 1
        log.warning(
            "segment log resumed after a write failure: %d records since the last good fsync "
            "copied to segment %d",
            moved,
            self._seg.id,
            extra={"directory": self.directory, "records": moved, "segment": self._seg.id},
        )
        return moved

    def _restart_locked(self) -> list[tuple[Location, bytes]]:
        """Take the untrusted tail's live records, seal its segments, start afresh."""
        self._seal_locked()
        chunks, self._inflight, self._sealed = self._inflight + self._sealed, [], []
        starts = dict(self._failed_from)
        for seg_id, base, _, _ in chunks:
            starts[seg_id] = min(base, starts.get(seg_id, base))
        records = []
        for seg_id, base, data, used in chunks:
            seg = self._segments.get(seg_id)
            pos = 0
            while pos < used:
                _, n, _ = _unpack_from(data, pos)
                off = base + pos
                if seg is not None and off in seg.live:
                    seg.live.remove(off, n)
                    loc = _new_location(Location, (seg_id, off, n))
                    records.append((loc, bytes(data[pos + HEADER_SIZE : pos + HEADER_SIZE + n])))
                pos += HEADER_SIZE + n
            if len(data) == self._bufsize and len(self._pool) < _POOL_MAX:
                self._pool.append(data)
        old = self._seg
        old.size = self._size
        for seg_id, start in starts.items():
            seg = self._segments.get(seg_id)
            if seg is not None:
                seg.size = start
        for seg in {old, *(self._segments.get(i) for i in starts)} - {None}:
            seg.state = _SEALED  # type: ignore[union-attr]  # None was taken out of the set
            if not seg.live:  # type: ignore[union-attr]  # (as above)
                self._doom_locked(seg)  # type: ignore[arg-type]  # (as above)
        self._seg = _Segment(old.id + 1, _ACTIVE, self._live_class)
        self._segments[self._seg.id] = self._seg
        self._seg_id, self._live = self._seg.id, self._seg.live
        self._buf_base = self._size = 0
        self._durable_below = self._seg.id
        self._failed_from = {}
        self.error = None
        self._refusing = self._want = False
        self._limit = min(self._segment_size, len(self._buf))
        self._thread = self._start_writer()
        return records

    @property
    def last_token(self) -> int:
        """Token of the latest append (0 before any)."""
        return self._token

    @property
    def active_segment(self) -> int:
        return self._seg.id

    @property
    def buffered_bytes(self) -> int:
        """Bytes appended but not yet durable (for the owner's flow control)."""
        with self._lock:
            return (
                self._size
                - self._buf_base
                + sum(c[3] for c in self._sealed)
                + sum(c[3] for c in self._inflight)
            )

    def segments(self) -> list[SegmentInfo]:
        """Per-segment sizes and liveness, oldest first (only segments the log manages)."""
        with self._lock:
            return [
                SegmentInfo(
                    s.id,
                    self._size if s is self._seg else s.size,
                    len(s.live),
                    s.live_bytes(),
                    s.state,
                    s.damaged,
                )
                for _, s in sorted(self._segments.items())
            ]

    # ------------------------------------------------------------------ recovery

    def sync_replayed(self) -> None:
        """Make what `replay` read durable: fdatasync every segment file and the directory.

        A process killed before its writer's fdatasync leaves records in the page cache
        that a restart reads back as if they were on disk; a power loss then erases them.
        An owner that reports what it replayed as durable (a replica acking it to its
        leader) calls this first. Files the last life synced cost next to nothing."""
        if not self._do_fsync:
            return
        with self._lock:
            ids = sorted(self._segments)
        for seg_id in ids:
            try:
                fd = os.open(os.path.join(self.directory, segment_name(seg_id)), os.O_RDONLY)
            except FileNotFoundError:  # released and deleted since
                continue
            try:
                _fdatasync(fd)
            finally:
                os.close(fd)
        _fsync_dir(self.directory)

    @property
    def segments_to_replay(self) -> list[int]:
        """The pre-existing segments `replay` will read (before it has run)."""
        return list(self._to_replay or ())

    def replay(
        self,
        *,
        copy: bool = True,
        known: dict[int, tuple[int, int, int]] | None = None,
        prefixes: dict[int, tuple[int, int, int]] | None = None,
    ) -> Iterator[tuple[Location, bytes | memoryview]]:
        """Yield (location, payload) of every intact record of the pre-existing segments.

        Repairs as it goes (see module doc); never raises for damage. Run it once, to the end.
        With copy=False the payloads are read-only memoryviews into the segment just read,
        for owners that parse a record and keep nothing of the view (no copy per record).
        `known`: segments the owner has checked and summed up itself, as id -> (file size,
        records, payload bytes): taken as they are (all records live), not read.
        `prefixes`: the same for the first bytes of a segment that grew after its owner
        summed it up (a stream's active segment after a kill -9): only the rest is read.
        Both need whole_segments=True.
        """
        if self._to_replay is None:
            raise RuntimeError("replay() can only run once")
        ids, self._to_replay = self._to_replay, None
        report = self.recovery
        known = known or {}
        for seg_id in ids:
            if seg_id in known:
                size, records, nbytes = known[seg_id]
                seg = _Segment(seg_id, _RECOVERING, self._live_class)
                seg.size = size
                if self._live_class is _Count:
                    seg.live.n, seg.live.nbytes = records, nbytes
                else:
                    raise ValueError("known segments need whole_segments=True")
                with self._lock:
                    self._segments[seg_id] = seg
                report.segments += 1
                report.records_ok += records
                continue
            prefix = prefixes.get(seg_id) if prefixes else None
            yield from self._replay_segment(seg_id, report, copy, prefix)
        with self._lock:
            for seg_id in ids:
                replayed = self._segments.get(seg_id)
                if replayed is not None and replayed.state == _RECOVERING:
                    replayed.state = _SEALED
                    if not replayed.live:
                        self._doom_locked(replayed)
            if self._deletions:
                self._want = True
                self._cond.notify()
        level = logging.WARNING if report.corrupt_regions else logging.INFO
        log.log(
            level,
            "segment log recovered: %d segments, %d records, %d damaged regions, "
            "%d bytes truncated",
            report.segments,
            report.records_ok,
            report.records_dropped,
            report.bytes_truncated,
            extra={
                "directory": self.directory,
                "records": report.records_ok,
                "dropped": report.records_dropped,
                "truncated": report.bytes_truncated,
            },
        )

    def _replay_segment(
        self,
        seg_id: int,
        report: RecoveryReport,
        copy: bool = True,
        prefix: tuple[int, int, int] | None = None,
    ) -> Iterator[tuple[Location, bytes | memoryview]]:
        """Replay one segment file; with `prefix` (its first bytes, records, payload bytes,
        known to the owner), from the end of that prefix: positions stay the file's."""
        path = os.path.join(self.directory, segment_name(seg_id))
        base = 0
        try:
            with open(path, "rb") as f:
                if prefix is not None:
                    if self._live_class is not _Count:
                        raise ValueError("known prefixes need whole_segments=True")
                    base = min(prefix[0], os.fstat(f.fileno()).st_size)
                    f.seek(base)
                data = f.read()
        except OSError as exc:
            # Left alone (not managed, never deleted) so nothing is lost that a person could save.
            log.error(
                "segment unreadable, skipped: %s", exc, extra={"segment": seg_id, "path": path}
            )
            report.corrupt_regions.append(CorruptRegion(seg_id, 0, 0, f"unreadable: {exc}", False))
            report.records_dropped += 1
            return
        report.segments += 1
        seg = _Segment(seg_id, _RECOVERING, self._live_class)
        seg.size = base + len(data)
        live = seg.live
        if base:
            assert prefix is not None  # (base is the prefix's length)
            live.n, live.nbytes = prefix[1], prefix[2]
            report.records_ok += prefix[1]
        with self._lock:
            self._segments[seg_id] = seg
        end = len(data)
        view = memoryview(data)
        pos = 0
        lock = self._lock
        ok = 0
        try:
            while pos < end:
                # The intact-record check of _check(), inlined: this loop runs once per
                # record at start-up (about 1 us saved per record, a second per million).
                if pos + 12 <= end:
                    magic, n, crc = _unpack_from(data, pos)
                    start = pos + 12
                    stop = start + n
                    if magic == MAGIC and stop <= end and _crc32(view[start:stop]) == crc:
                        with lock:
                            live.add(base + pos, n)
                        ok += 1
                        yield (
                            _new_location(Location, (seg_id, base + pos, n)),
                            data[start:stop] if copy else view[start:stop],
                        )
                        pos = stop
                        continue
                if self._prealloc and data.count(0, pos, end) == end - pos:
                    # Allocated ahead of the records (`preallocate`), never written: the
                    # segment's end, not damage. Cut back as the writer would have.
                    self._truncate(path, base + pos)
                    seg.size = base + pos
                    break
                n, why = _check(data, view, pos, end)
                nxt = _resync(data, view, pos + 1, end)
                report.records_dropped += 1
                at = base + pos  # in the file
                if nxt < 0:
                    dropped = end - pos
                    log.warning(
                        "segment tail damaged (%s): truncating %d bytes at offset %d",
                        why,
                        dropped,
                        at,
                        extra={"segment": seg_id, "offset": at, "nbytes": dropped},
                    )
                    report.corrupt_regions.append(CorruptRegion(seg_id, at, dropped, why, True))
                    report.bytes_truncated += dropped
                    self._truncate(path, at)
                    seg.size = at
                    break
                log.warning(
                    "segment damaged (%s): skipping %d bytes at offset %d, "
                    "next intact record at %d",
                    why,
                    nxt - pos,
                    at,
                    base + nxt,
                    extra={"segment": seg_id, "offset": at, "nbytes": nxt - pos},
                )
                report.corrupt_regions.append(CorruptRegion(seg_id, at, nxt - pos, why, False))
                report.bytes_skipped += nxt - pos
                seg.damaged = True
                pos = nxt
        finally:
            report.records_ok += ok
            try:
                view.release()
            except BufferError:
                pass  # the owner still holds a payload view; the view goes when that does

    def _truncate(self, path: str, size: int, *, sync: bool = True, strict: bool = False) -> None:
        """Cut a segment file to `size` bytes (a missing file is already cut).

        Errors are logged (recovery skips the damage again at the next start) unless
        `strict`, which raises them: resume() must not go on over a tail it could not cut.
        """
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        except OSError as exc:
            if strict:
                raise
            log.error("could not truncate segment tail: %s", exc, extra={"path": path})
            return
        try:
            if os.fstat(fd).st_size > size:
                os.ftruncate(fd, size)
            if sync and self._do_fsync:
                _fsync(fd)
        except OSError as exc:
            if strict:
                raise
            log.error("could not truncate segment tail: %s", exc, extra={"path": path})
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ compaction

    def compact(
        self,
        relocate: Callable[[Location, Location, bytes], object],
        *,
        threshold: float | None = None,
        max_bytes: int | None = None,
    ) -> CompactionReport:
        """Copy the live records of sparse segments to the active one; delete the old ones.

        Candidates: durable, non-active segments whose live bytes are under `threshold` of
        their size (default compact_threshold), and segments recovery found damaged; sparsest
        first. For each live record: append a copy, then relocate(old, new, payload). Stops
        after a segment once `max_bytes` of payload were moved. Old segments are deleted by
        the writer after the copies are synced (a sync is scheduled).
        """
        limit = self._compact_threshold if threshold is None else threshold
        report = CompactionReport()
        with self._lock:
            if self._refusing:
                self._refuse()
            candidates = []
            for s in self._segments.values():
                if (
                    s.state == _SEALED
                    and s.id < self._durable_below
                    and s.live
                    and not s.skip_compaction
                    and s.size > 0
                ):
                    ratio = s.live_bytes() / s.size
                    if s.damaged or ratio < limit:
                        candidates.append((ratio, s.id, s))
        candidates.sort(key=lambda c: c[:2])
        for _, _, seg in candidates:
            if max_bytes is not None and report.bytes_moved >= max_bytes:
                break
            if seg.state != _SEALED or not seg.live:
                continue
            self._compact_segment(seg, relocate, report)
        if report.segments:
            self.schedule_sync()
            log.info(
                "compacted %d segments, moved %d records (%d bytes)",
                len(report.segments),
                report.records_moved,
                report.bytes_moved,
                extra={"segments": len(report.segments), "records": report.records_moved},
            )
        return report

    def _compact_segment(
        self,
        seg: _Segment,
        relocate: Callable[[Location, Location, bytes], object],
        report: CompactionReport,
    ) -> None:
        with self._lock:
            fd = self._rfds.get(seg.id)
            if fd is None:
                fd = self._open_read_locked(seg.id)
            data = os.pread(fd, seg.size, 0)
            offsets = list(seg.live.offsets)  # ascending
        live = []
        view = memoryview(data)
        try:
            for off in offsets:
                n = _check(data, view, off, len(data))[0]
                live.append((off, n))
                if n < 0:
                    seg.skip_compaction = True
                    log.error(
                        "live record unreadable, segment not compacted",
                        extra={"segment": seg.id, "offset": off, "nbytes": n},
                    )
                    return
        finally:
            view.release()
        for off, n in live:
            with self._lock:
                if off not in seg.live:  # released meanwhile
                    continue
                seg.live.remove(off, n)
            old = _new_location(Location, (seg.id, off, n))
            payload = data[off + HEADER_SIZE : off + HEADER_SIZE + n]
            try:
                new, _ = self.append(payload)
            except BaseException:
                self._revive(seg, off, n)
                raise
            try:
                relocate(old, new, payload)
            except BaseException:
                self._revive(seg, off, n)  # the owner still points at the old copy
                self.release(new)
                raise
            report.records_moved += 1
            report.bytes_moved += n
        with self._lock:
            if seg.state == _SEALED:
                if seg.live:  # appended meanwhile? cannot happen to a sealed segment
                    return
                self._doom_locked(seg)
                report.segments.append(seg.id)
                report.bytes_reclaimed += seg.size

    def _revive(self, seg: _Segment, off: int, n: int) -> None:
        with self._lock:
            seg.live.add(off, n)

    # ------------------------------------------------------------------ internals (lock held)

    def _not_from_writer(self, what: str) -> None:
        if threading.current_thread() is self._thread:
            raise RuntimeError(f"{what}() called from a SegmentLog callback would deadlock")

    def _refuse(self) -> None:
        if self.error is not None:
            raise LogFailed(f"segment log failed: {self.error}") from self.error
        raise LogClosed("segment log closed")

    def _rotate_locked(self) -> None:
        old = self._seg
        self._seal_locked()
        old.size = self._size
        old.state = _SEALED
        self._seg = _Segment(old.id + 1, _ACTIVE, self._live_class)
        self._segments[self._seg.id] = self._seg
        self._seg_id = self._seg.id
        self._live = self._seg.live
        self._buf_base = 0
        self._size = 0
        if not old.live:
            self._doom_locked(old)
        self._want = True  # hand the finished segment to the writer
        self._cond.notify()

    def _seal_locked(self) -> None:
        """Hand the current buffer's records to the writer; continue in a fresh buffer."""
        used = self._size - self._buf_base
        if used:
            self._sealed.append((self._seg.id, self._buf_base, self._buf, used))
            self._buf = self._pool.pop() if self._pool else bytearray(self._bufsize)
            self._buf_base = self._size
        self._limit = (
            -1 if self._refusing else min(self._segment_size, self._buf_base + len(self._buf))
        )

    def _make_room_locked(self, need: int) -> int:
        """Rotate and/or start a new buffer so that `need` bytes fit; return the offset."""
        if self._refusing:
            self._refuse()
        if self._size + need > self._segment_size and self._size:
            self._rotate_locked()
        if self._size + need > self._buf_base + len(self._buf):
            self._seal_locked()
            if need > len(self._buf):  # an oversized record gets a buffer of its own
                if len(self._buf) == self._bufsize and len(self._pool) < _POOL_MAX:
                    self._pool.append(self._buf)
                self._buf = bytearray(need)
            self._want = True  # a full buffer starts a batch (or ends a gathering wait)
            self._cond.notify()
        # An oversized record may pass the segment limit; it is alone in its segment.
        self._limit = max(
            min(self._segment_size, self._buf_base + len(self._buf)), self._size + need
        )
        return self._size

    def _doom_locked(self, seg: _Segment) -> None:
        seg.state = _DOOMED
        del self._segments[seg.id]
        self._deletions.append(seg.id)

    def _read_memory_locked(self, seg_id: int, off: int, n: int) -> bytes | None:
        start = off + HEADER_SIZE
        if seg_id == self._seg.id and off >= self._buf_base:
            i = start - self._buf_base
            return bytes(self._buf[i : i + n])
        for chunks in (self._sealed, self._inflight):
            for cseg, base, data, used in chunks:
                if cseg == seg_id and base <= off < base + used:
                    i = start - base
                    return bytes(data[i : i + n])
        return None

    def _open_read_locked(self, seg_id: int) -> int:
        try:
            fd = os.open(
                os.path.join(self.directory, segment_name(seg_id)), os.O_RDONLY | os.O_CLOEXEC
            )
        except FileNotFoundError:
            raise KeyError(f"segment {seg_id} does not exist") from None
        if len(self._rfds) >= self._max_open:
            oldest = next(iter(self._rfds))
            os.close(self._rfds.pop(oldest))
        self._rfds[seg_id] = fd
        return fd

    # ------------------------------------------------------------------ writer thread

    def _writer_main(self) -> None:
        last_start = float("-inf")
        last_token = 0  # the token when the last batch was taken
        try:
            while True:
                with self._lock:
                    while not self._want and not self._closing:
                        self._cond.wait()
                    if (
                        self._interval
                        and not self._closing
                        and self._token - last_token > GATHER_AFTER_RECORDS
                    ):
                        # Batches start at least `interval` apart when records keep
                        # coming (a busy log gathers what arrives meanwhile into one
                        # fsync). A log that got only a few since its last batch (a
                        # publisher waiting for each confirm, light load) syncs at once:
                        # waiting would only add latency, and fsyncs are few anyway.
                        deadline = last_start + self._interval
                        while not self._closing and not self._sealed:
                            left = deadline - time.monotonic()
                            if left <= 0:
                                break
                            self._cond.wait(left)
                    self._want = False
                    last_start = time.monotonic()
                    last_token = self._token
                    self._seal_locked()
                    chunks = self._inflight = self._sealed
                    self._sealed = []
                    deletions, self._deletions = self._deletions, []
                    token = self._token
                    self._swaps += 1
                    batch = self._swaps
                    closing = self._closing
                self._write_batch(chunks, deletions, token)
                with self._done:
                    self._completed = batch
                    self._done.notify_all()
                if closing:
                    if self._wfd >= 0 and self._allocated > self._wend:
                        self._finish_file()
                    break
        except BaseException as exc:  # noqa: BLE001 - must never die silently
            self._fail(exc)
        finally:
            if self._wfd >= 0:
                try:
                    os.close(self._wfd)
                except OSError:
                    pass
                self._wfd = -1

    def _note_fsync(self, seconds: float) -> None:
        """Writer thread only; read at scrape time (ints and a float: a torn read is harmless)."""
        self.fsync_count += 1
        self.fsync_seconds += seconds
        self.fsync_buckets[bisect.bisect_left(FSYNC_BUCKETS, seconds)] += 1

    def _write_batch(
        self, chunks: list[tuple[int, int, bytearray, int]], deletions: list[int], token: int
    ) -> None:
        try:
            self._write_chunks(chunks)
        except BaseException:
            self._cut_back(chunks)
            with self._lock:  # not deleted yet: after resume()
                self._deletions[:0] = deletions
            raise
        if token > self.synced_token:
            self.synced_token = token
            if self._on_synced is not None:
                try:
                    self._on_synced(token)
                except Exception:
                    log.exception("on_synced callback failed")
        if deletions:
            self._delete(deletions)

    def _write_chunks(self, chunks: list[tuple[int, int, bytearray, int]]) -> None:
        """Write a batch and make it durable; only then free its buffers."""
        new_files = False
        for seg_id, base, data, used in chunks:
            if seg_id != self._wseg:
                if self._wfd >= 0:
                    self._finish_file()
                self._wfd = os.open(
                    os.path.join(self.directory, segment_name(seg_id)),
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                    0o644,
                )
                self._wseg = seg_id
                self._wend = self._allocated = 0
                new_files = True
            if self._prealloc and base + used + (self._prealloc >> 1) > self._allocated:
                # Half of it would be used: allocate as much again past this chunk, before
                # writing it, so the file ends in allocated space at every instant (a
                # writer killed mid-batch leaves its records, then zeros).
                self._allocate_ahead(base + used)
            _pwrite_all(self._wfd, data, base, used)
            self._wend = base + used
            self.bytes_written += used
        if chunks:
            if self._do_fsync:
                started = time.perf_counter()
                _fdatasync(self._wfd)
                self._note_fsync(time.perf_counter() - started)
                if new_files:
                    _fsync_dir(self.directory)
            # Durable now: reads go to the file and the buffers are free. Not before: if the
            # fsync fails, these buffers are the only copy of the batch we can trust.
            with self._lock:
                self._inflight = []
                for _, _, data, _ in chunks:
                    if len(data) == self._bufsize and len(self._pool) < _POOL_MAX:
                        self._pool.append(data)
                self._durable_below = self._wseg

    def _allocate_ahead(self, end: int) -> None:
        """Allocate `preallocate` bytes past `end`, where the records about to be written
        stop (writer thread, before they are written and before the batch's fdatasync,
        which makes the allocation durable too).

        An fdatasync after an append that grew the file must write the inode too: measured
        on ext4 here, 123 us (64 us of system CPU) against 82 us (42) for one that writes
        into blocks allocated before (zero-filled or fallocated alike).
        Recovery takes the zeros after the last record for the segment's end
        (`_replay_segment`), and the writer cuts a segment back to its records when it moves
        on (`_finish_file`). Best effort: where the allocation fails (a full disk) the
        records are appended as they were before, and so they are on a disk with less than
        PREALLOCATE_FREE_MIN times the allocation free: near a full disk the log behaves as
        it did without (else a failed batch's cut would give the space allocated past it
        back, and a resume would succeed on that).
        """
        start = max(self._allocated, self._wend)
        stop = min(-(-(end + self._prealloc) // 4096) * 4096, self._segment_size)
        if stop <= start:
            return
        try:
            disk = os.statvfs(self.directory)
            roomy = disk.f_bavail * disk.f_frsize >= PREALLOCATE_FREE_MIN * self._prealloc
            if roomy:
                _fallocate(self._wfd, start, stop - start)
        except OSError as exc:
            log.debug("segment not allocated ahead: %s", exc)
            roomy = False
        # Else no more tries in this segment; a failed fallocate may have left part of the
        # range allocated, which _finish_file cuts off with the rest.
        self._allocated = stop if roomy else self._segment_size

    def _finish_file(self) -> None:
        """The writer moves to another segment or stops: cut this one back to its records
        (what `preallocate` allocated past them is no use now), make it durable, close it."""
        fd = self._wfd
        if self._allocated > self._wend:
            os.ftruncate(fd, self._wend)
        if self._do_fsync:
            _fdatasync(fd)
        os.close(fd)
        self._wfd = -1

    def _delete(self, seg_ids: list[int]) -> None:
        deleted = []
        for seg_id in seg_ids:
            with self._lock:
                fd = self._rfds.pop(seg_id, None)
            if fd is not None:
                os.close(fd)
            if seg_id == self._wseg and self._wfd >= 0:
                os.close(self._wfd)
                self._wfd = -1
                self._wseg = -1
            try:
                os.unlink(os.path.join(self.directory, segment_name(seg_id)))
            except FileNotFoundError:
                pass
            except OSError as exc:
                # Not fatal: the file is replayed at the next start and its records come
                # back (the owner's tombstones stay live, as on_deleted is not called).
                log.error("could not delete segment: %s", exc, extra={"segment": seg_id})
                continue
            deleted.append(seg_id)
        if deleted and self._do_fsync:
            _fsync_dir(self.directory)
        for seg_id in deleted:
            log.debug("segment deleted", extra={"segment": seg_id})
            if self._on_deleted is not None:
                try:
                    self._on_deleted(seg_id)
                except Exception:
                    log.exception("on_deleted callback failed")

    def _cut_back(self, chunks: list[tuple[int, int, bytearray, int]]) -> None:
        """Writer thread, on failure: cut each file back to where this batch began in it.

        What the batch wrote is not trusted (a write may have stopped half-way on ENOSPC,
        a failed fsync leaves pages we cannot vouch for); its records are still in the
        chunks, kept for resume(). If a cut fails it is tried again by resume().
        """
        starts: dict[int, int] = {}
        for seg_id, base, _, _ in chunks:
            starts[seg_id] = min(base, starts.get(seg_id, base))
        self._failed_from = starts
        if self._wfd >= 0:
            try:
                os.close(self._wfd)
            except OSError:
                pass
            self._wfd, self._wseg = -1, -1
        for seg_id, start in starts.items():
            self._truncate(os.path.join(self.directory, segment_name(seg_id)), start, sync=False)

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            self.error = exc
            self._refusing = True
            self._limit = -1  # append takes the slow path, which refuses
        log.error(
            "segment log writer failed; nothing more is confirmed until it resumes: %s",
            exc,
            exc_info=None if isinstance(exc, OSError) else exc,  # a disk's error, not a bug
            extra={"directory": self.directory, "errno": getattr(exc, "errno", None)},
        )
        with self._done:
            self._done.notify_all()
        if self._on_error is not None:
            try:
                self._on_error(exc)
            except Exception:
                log.exception("on_error callback failed")
