"""A vhost's replicated log on disk: (offset, payload) records in a SegmentLog directory.

Both ends of replication keep one: the leader appends what its owner produces and streams
from it; a follower appends what it receives. Each SegmentLog record is prefixed so that a
restart rebuilds everything by replaying, with no other file to keep consistent:

    b"R" u64 offset  payload   a record of the vhost's log
    b"B" u64 base              retention: every record below `base` is gone (leader compaction)
    b"Z" u64 start             reset: everything held before is void, the next record is
                               `start` (a follower taking a snapshot)

Markers stay live in the SegmentLog (they are tiny), so no replay can resurrect what they
cancelled; the records they cancel are released, and their segments are deleted by the log.
After a replay, the durable offset is the last record found: everything replayed was on disk.

`sync()` blocks (one group-commit fsync): callers on the event loop run it in a thread. It
may run while the loop appends: it makes durable what was appended before it started.
"""

from __future__ import annotations

import os
import struct
from typing import Protocol

from ..store.segments import Location, SegmentLog

_TAG = struct.Struct(">cQ")


class RecordStore(Protocol):
    """What a ReplicationFollower writes to and a ReplicationLeader streams from."""

    first_offset: int  # the oldest offset held (last_offset + 1 when empty)
    last_offset: int  # the newest offset appended (0 before any)
    durable_offset: int  # the newest offset known durable

    def append(self, offset: int, payload: bytes) -> None: ...

    def sync(self) -> int: ...

    def reset(self, start: int) -> None: ...

    def read(self, start: int, max_bytes: int) -> list[tuple[int, bytes]]: ...


class SegmentRecordStore:
    """RecordStore on a SegmentLog in `directory` (see module doc); replays on open."""

    def __init__(self, directory: str | os.PathLike[str], **log_options) -> None:  # type: ignore[no-untyped-def]
        self.log = SegmentLog.open(directory, **log_options)
        self._locations: list[Location] = []  # index i holds offset first_offset + i
        self.first_offset = 1
        self.last_offset = 0
        self._replay()
        self.durable_offset = self.last_offset

    def _replay(self) -> None:
        for location, payload in self.log.replay():
            tag, number = _TAG.unpack_from(payload, 0)
            if tag == b"R":
                self._replayed_record(location, number)
            elif tag == b"B":
                self._drop_below(number)
            elif tag == b"Z":
                self._drop_all(number)

    def _replayed_record(self, location: Location, offset: int) -> None:
        if offset <= self.last_offset and offset >= self.first_offset:
            # A copy made by compaction: keep the newer, release the older.
            i = offset - self.first_offset
            self.log.release(self._locations[i])
            self._locations[i] = location
        elif offset == self.last_offset + 1:
            self._locations.append(location)
            self.last_offset = offset
        else:  # below a base already replayed: it was cancelled
            self.log.release(location)

    # -- writing ---------------------------------------------------------------------------

    def append(self, offset: int, payload: bytes) -> None:
        if offset != self.last_offset + 1:
            raise ValueError(f"offset {offset} does not follow {self.last_offset}")
        location, _ = self.log.append(_TAG.pack(b"R", offset) + payload)
        self._locations.append(location)
        self.last_offset = offset  # after the append: sync() relies on this order

    def sync(self) -> int:
        """Make everything appended so far durable (one fsync); return the durable offset."""
        target = self.last_offset
        self.log.sync_now()
        self.durable_offset = target
        return target

    def reset(self, start: int) -> None:
        """Void everything held; the next record appended is `start` (durable after sync)."""
        self.log.append(_TAG.pack(b"Z", start))
        self._drop_all(start)

    def drop_below(self, base: int) -> None:
        """Retention: forget records below `base` (a leader compacting its log)."""
        base = min(base, self.last_offset + 1)
        if base > self.first_offset:
            self.log.append(_TAG.pack(b"B", base))
            self._drop_below(base)

    def _drop_all(self, start: int) -> None:
        for location in self._locations:
            self.log.release(location)
        self._locations = []
        self.first_offset = start
        self.last_offset = start - 1

    def _drop_below(self, base: int) -> None:
        cut = max(0, min(base, self.last_offset + 1) - self.first_offset)
        for location in self._locations[:cut]:
            self.log.release(location)
        del self._locations[:cut]
        self.first_offset = max(self.first_offset, base)
        self.last_offset = max(self.last_offset, self.first_offset - 1)

    # -- reading ---------------------------------------------------------------------------

    def read(self, start: int, max_bytes: int) -> list[tuple[int, bytes]]:
        """Records from offset `start` (at least one if any), about `max_bytes` of payload."""
        out: list[tuple[int, bytes]] = []
        size = 0
        offset = max(start, self.first_offset)
        while offset <= self.last_offset and (not out or size < max_bytes):
            payload = self.log.read(self._locations[offset - self.first_offset])
            out.append((offset, payload[_TAG.size :]))
            size += len(payload)
            offset += 1
        return out

    def records(self) -> list[tuple[int, bytes]]:
        """Everything held, oldest first (for tests and checks)."""
        return self.read(self.first_offset, 1 << 62)

    def close(self) -> None:
        self.log.close()
