"""A queue's ready messages: a short head of objects, a compact packed tail, a requeue heap.

Why three parts (see docs/architecture.md, "Compact queues"):

* **head** -- the next `HEAD_MAX` entries as Python objects, so a queue that
  keeps up (the common case) never packs or unpacks anything;
* **tail** -- everything behind the head, packed into 256 KiB `bytearray`
  chunks: one fixed 30-byte record per message followed by its routing key,
  raw content header and body. A queued 16-byte message costs ~60 bytes here
  instead of ~700 as objects (Entry + Message + ContentHeader + bytes + str).
  A persistent message of a durable queue is packed as its bare store id
  (the record plus 8 bytes): key, header and body are read back from the
  segment log when it is unpacked, which is also how recovery queues
  messages without reading them. Messages that cannot be packed (bodies
  over `INLINE_MAX`) stay whole entries in `refs` and a record marks their
  place. When the head runs dry, the next `REFILL` records are unpacked
  into it;
* **back** -- requeued entries that do not fit in front of the head, in a heap
  by publish sequence. A requeue of N messages is O(N log N) whatever their
  order (a nack in ascending tag order used to re-sort the queue each time).

Order is by publish sequence: every tail record is newer than every head and
heap entry (the tail only grows while the head is full, and only head or heap
entries are ever delivered and requeued), so `pop` compares just two heads.
"""

from __future__ import annotations

import heapq
import logging
import struct
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

from roarmq.protocol.frames import ContentHeader

from .message import Message

if TYPE_CHECKING:
    from .queue import Entry, Queue

#: Entries kept as objects at the front of a queue before the rest is packed.
HEAD_MAX = 2048
#: Records unpacked into the head at a time.
REFILL = 512
#: Bytes per packed chunk.
CHUNK_BYTES = 256 * 1024
#: Largest body kept inline in a record; bigger messages stay objects (the body dominates).
INLINE_MAX = 4096

# seq, expires_at, bits, priority, delivery_count, exchange index, key, header, body lengths
_RECORD = struct.Struct("<qdBBHHHHI")
_RECORD_SIZE = _RECORD.size
_pack_into = _RECORD.pack_into
_unpack_from = _RECORD.unpack_from

_REDELIVERED = 1
_MARKED = 2
_EXPIRES = 4
_PERSISTENT = 8
_REF = 16  # the Message is in `refs`, not inline
_STORED = 32  # the record holds a msg_id of the queue's message store, nothing else
_MSG_ID = struct.Struct("<Q")

log = logging.getLogger("roarmq.queue")


class Cleared:
    """What `clear` removed: entries to settle, packed transient messages counted, and the
    store ids of packed persistent ones (settled by id, never rebuilt)."""

    __slots__ = ("entries", "packed", "packed_bytes", "stored")

    def __init__(
        self, entries: list[Entry], packed: int, packed_bytes: int, stored: list[int]
    ) -> None:
        self.entries = entries
        self.packed = packed
        self.packed_bytes = packed_bytes
        self.stored = stored

    def __len__(self) -> int:
        return len(self.entries) + self.packed + len(self.stored)


class FifoReady:
    """Ready entries in publish order (see the module docstring for the layout)."""

    __slots__ = (
        "n",
        "_queue",
        "_head",
        "_back",
        "_chunks",
        "_rpos",
        "_packed",
        "_packed_bytes",
        "_stored",
        "_refs",
        "_xnames",
        "_xidx",
        "_entry",
    )

    def __init__(self, entry: type[Entry], queue: Queue | None = None) -> None:
        self.n = 0  # all ready entries; read directly on the hot path
        self._entry = entry  # the class of what is unpacked (queue.py's: it imports us)
        self._queue = queue  # unpacked entries belong to it
        self._head: deque[Entry] = deque()
        self._back: list[tuple[int, Entry]] = []
        self._chunks: deque[bytearray] = deque()
        self._rpos = 0  # read offset in the first chunk
        self._packed = 0  # records in the tail
        self._packed_bytes = 0  # inline bodies in the tail
        self._stored = 0  # records that are bare store ids
        self._refs: deque[Entry] = deque()  # entries kept whole (see _pack)
        self._xnames: list[str] = []  # exchange names by index, shared by records
        self._xidx: dict[str, int] = {}

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    # -- in ---------------------------------------------------------------------------

    def push(self, entry: Entry) -> None:
        self.n += 1
        if self._packed or len(self._head) >= HEAD_MAX:
            self._pack(entry)
        else:
            self._head.append(entry)

    def push_stored(
        self,
        seq: int,
        msg_id: int,
        priority: int,
        expires_at: float | None,
        redelivered: bool,
        delivery_count: int = 0,
    ) -> None:
        """Queue a recovered message by its store id alone (call `fill` when done)."""
        self.n += 1
        bits = _STORED | _PERSISTENT
        if redelivered:
            bits |= _REDELIVERED | _MARKED
        if expires_at is not None:
            bits |= _EXPIRES
        count = min(delivery_count, 65535)
        self._append_record(seq, expires_at or 0.0, bits, priority, count, 0, _MSG_ID.pack(msg_id))

    def fill(self) -> None:
        """Unpack the first records into an empty head (after `push_stored`)."""
        if not self._head and self._packed:
            self._refill()

    def requeue(self, entries: list[Entry]) -> None:
        """Put entries back by publish sequence (they are older than the whole tail)."""
        entries.sort(key=_seq)
        self.n += len(entries)
        head, back = self._head, self._back
        if not back and (not head or entries[-1].seq < head[0].seq):
            head.extendleft(reversed(entries))
            return
        for entry in entries:
            heapq.heappush(back, (entry.seq, entry))

    # -- out --------------------------------------------------------------------------

    def pop(self) -> Entry:
        back, head = self._back, self._head
        if back and (not head or back[0][0] < head[0].seq):
            self.n -= 1
            return heapq.heappop(back)[1]
        entry = head.popleft()  # IndexError when empty, as deque
        self.n -= 1
        if not head and self._packed:
            self._refill()
        return entry

    def peek(self) -> Entry | None:
        back, head = self._back, self._head
        if back and (not head or back[0][0] < head[0].seq):
            return back[0][1]
        return head[0] if head else None

    def clear(self) -> Cleared:
        """Remove everything without rebuilding or even reading packed messages.

        Returns the entries the caller must settle one by one (objects: head, heap and
        refs) and the count and body bytes of the packed transient ones, which need no
        more than counting.
        """
        out = [e for _, e in sorted(self._back, key=_first)]
        out.extend(self._head)
        out.extend(self._refs)
        stored = self._stored_ids() if self._stored else []
        packed = self._packed - len(self._refs) - len(stored)
        packed_bytes = self._packed_bytes
        self._head.clear()
        self._back.clear()
        self._chunks.clear()
        self._refs.clear()
        self._rpos = self._packed = self._packed_bytes = self._stored = self.n = 0
        return Cleared(out, packed, packed_bytes, stored)

    def _stored_ids(self) -> list[int]:
        """The store ids in the tail, read off the records without unpacking anything."""
        ids: list[int] = []
        pos = self._rpos
        for chunk in self._chunks:
            end = len(chunk)
            while pos < end:
                _, _, bits, _, _, _, klen, hlen, blen = _unpack_from(chunk, pos)
                pos += _RECORD_SIZE
                if bits & _STORED:
                    ids.append(_MSG_ID.unpack_from(chunk, pos)[0])
                pos += klen + hlen + blen
            pos = 0
        return ids

    def __iter__(self) -> Iterator[Entry]:
        """Entries in delivery order, without removing them (packed ones are decoded copies)."""
        requeued = [e for _, e in sorted(self._back, key=_first)]
        yield from heapq.merge(requeued, list(self._head), key=_seq)
        yield from self._decode_all()

    # -- packing ----------------------------------------------------------------------

    def _pack(self, entry: Entry) -> None:
        msg = entry.msg
        bits = _REDELIVERED if entry.redelivered else 0
        if entry.marked:
            bits |= _MARKED
        expires = entry.expires_at
        if expires is not None:
            bits |= _EXPIRES
        else:
            expires = 0.0
        if msg.persistent:
            bits |= _PERSISTENT
        count = min(entry.delivery_count, 65535)
        if msg.store_id is not None and self._queue is not None and self._queue.store is not None:
            # The durable queue holds a reference in the store: the id is enough.
            bits |= _STORED
            self._append_record(
                entry.seq, expires, bits, msg.priority, count, 0, _MSG_ID.pack(msg.store_id)
            )
            return
        xi = self._xidx.get(msg.exchange)
        if xi is None:
            xi = self._exchange_index(msg.exchange)
        if msg.body is None or msg.size > INLINE_MAX or xi < 0:
            bits |= _REF
            self._refs.append(entry)
            self._append_record(entry.seq, expires, bits, msg.priority, count, 0, b"")
            return
        self._append_record(
            entry.seq,
            expires,
            bits,
            msg.priority,
            count,
            xi,
            msg.routing_key.encode(),
            msg.header.raw,
            msg.body,
        )

    def _append_record(
        self,
        seq: int,
        expires: float,
        bits: int,
        priority: int,
        count: int,
        xi: int,
        key: bytes,
        header: bytes = b"",
        body: bytes = b"",
    ) -> None:
        chunks = self._chunks
        if not chunks or len(chunks[-1]) >= CHUNK_BYTES:
            chunks.append(bytearray())
        chunk = chunks[-1]
        at = len(chunk)
        chunk.extend(bytes(_RECORD_SIZE))
        _pack_into(
            chunk,
            at,
            seq,
            expires,
            bits,
            min(priority, 255),
            count,
            xi,
            len(key),
            len(header),
            len(body),
        )
        chunk += key
        chunk += header
        chunk += body
        self._packed += 1
        if bits & _STORED:
            self._stored += 1
        self._packed_bytes += len(body)

    def _exchange_index(self, name: str) -> int:
        if len(self._xnames) >= 65535:
            return -1  # absurdly many exchanges: keep such messages as objects
        xi = self._xidx[name] = len(self._xnames)
        self._xnames.append(name)
        return xi

    def _refill(self) -> None:
        self._head.extend(self._unpack(REFILL))

    def _unpack(self, limit: int) -> list[Entry]:
        """Take up to `limit` records from the front of the tail as entries."""
        out: list[Entry] = []
        entry_class = self._entry
        chunks = self._chunks
        xnames = self._xnames
        refs = self._refs
        queue = self._queue
        new_entry = entry_class.__new__
        while len(out) < limit and self._packed:
            chunk = chunks[0]
            pos = self._rpos
            end = len(chunk)
            with memoryview(chunk) as mv:
                while pos < end and len(out) < limit:
                    seq, expires, bits, prio, count, xi, klen, hlen, blen = _unpack_from(chunk, pos)
                    pos += _RECORD_SIZE
                    if bits & _REF:
                        out.append(refs.popleft())
                        self._packed -= 1
                        continue
                    self._packed -= 1
                    if bits & _STORED:
                        msg_id = _MSG_ID.unpack_from(chunk, pos)[0]
                        pos += klen
                        self._stored -= 1
                        msg = self._load(msg_id)
                        if msg is None:
                            self.n -= 1
                            continue
                        msg.priority = prio
                    else:
                        key = str(chunk[pos : pos + klen], "utf-8")
                        pos += klen
                        raw = mv[pos : pos + hlen].tobytes()
                        pos += hlen
                        body = mv[pos : pos + blen].tobytes()
                        pos += blen
                        self._packed_bytes -= blen
                        header = ContentHeader(60, blen, raw)
                        persistent = bool(bits & _PERSISTENT)
                        msg = Message.unpacked(xnames[xi], key, header, body, prio, persistent)
                    entry = new_entry(entry_class)
                    entry.msg = msg
                    entry.seq = seq
                    entry.queue = queue  # type: ignore[assignment]  # (None in unit tests only)
                    entry.redelivered = bool(bits & _REDELIVERED)
                    entry.expires_at = expires if bits & _EXPIRES else None
                    entry.consumer = None
                    entry.delivery_count = count
                    entry.marked = bool(bits & _MARKED)
                    out.append(entry)
            if pos >= end:
                chunks.popleft()
                self._rpos = 0
            else:
                self._rpos = pos
        return out

    def _load(self, msg_id: int) -> Message | None:
        """A stored message read back from the log; None (logged) if it cannot be."""
        store = self._queue.store  # type: ignore[union-attr]  # a queue's own, stored: both set
        try:
            return store.load(msg_id, INLINE_MAX)  # type: ignore[union-attr]  # (as above)
        except Exception as exc:  # a damaged record must not stop the queue
            log.error(
                "stored message %d unreadable, skipped: %s",
                msg_id,
                exc,
                extra={"queue": self._queue.name},  # type: ignore[union-attr]  # a tail that spills belongs to a queue
            )
            return None

    def _decode_all(self) -> Iterator[Entry]:
        """Decode every packed record without consuming it (management listings, tests)."""
        saved = (
            deque(self._chunks),
            self._rpos,
            self._packed,
            self._packed_bytes,
            self._stored,
            deque(self._refs),
            self.n,
        )
        try:
            while self._packed:
                yield from self._unpack(REFILL)
        finally:
            (
                self._chunks,
                self._rpos,
                self._packed,
                self._packed_bytes,
                self._stored,
                self._refs,
                self.n,
            ) = saved

    def packed(self) -> int:
        """How many entries are packed (for tests and the management API)."""
        return self._packed


class PriorityReady:
    """x-max-priority: one FIFO per priority, highest served first."""

    __slots__ = ("_levels", "_max", "n")

    def __init__(self, max_priority: int, entry: type[Entry], queue: Queue | None = None) -> None:
        self._max = max_priority
        self._levels = [FifoReady(entry, queue) for _ in range(max_priority + 1)]
        self.n = 0

    def _level(self, entry: Entry) -> FifoReady:
        return self._levels[min(entry.msg.priority, self._max)]

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    def __iter__(self) -> Iterator[Entry]:
        for level in reversed(self._levels):
            yield from level

    def push(self, entry: Entry) -> None:
        self._level(entry).push(entry)
        self.n += 1

    def pop(self) -> Entry:
        for level in reversed(self._levels):
            if level.n:
                before = level.n
                entry = level.pop()
                self.n -= before - level.n  # more than one if an unreadable record was skipped
                return entry
        raise IndexError("pop from an empty queue")

    def peek(self) -> Entry | None:
        for level in reversed(self._levels):
            if level.n:
                return level.peek()
        return None

    def requeue(self, entries: list[Entry]) -> None:
        by_level: dict[int, list[Entry]] = {}
        for e in entries:
            by_level.setdefault(min(e.msg.priority, self._max), []).append(e)
        for prio, group in by_level.items():
            self._levels[prio].requeue(group)
        self.n += len(entries)

    def clear(self) -> Cleared:
        out = Cleared([], 0, 0, [])
        for level in reversed(self._levels):
            part = level.clear()
            out.entries.extend(part.entries)
            out.packed += part.packed
            out.packed_bytes += part.packed_bytes
            out.stored.extend(part.stored)
        self.n = 0
        return out

    def push_stored(
        self,
        seq: int,
        msg_id: int,
        priority: int,
        expires_at: float | None,
        redelivered: bool,
        delivery_count: int = 0,
    ) -> None:
        self._levels[min(priority, self._max)].push_stored(
            seq, msg_id, priority, expires_at, redelivered, delivery_count
        )
        self.n += 1

    def fill(self) -> None:
        for level in self._levels:
            level.fill()

    def packed(self) -> int:
        return sum(level.packed() for level in self._levels)


def _seq(entry: Entry) -> int:
    return entry.seq


def _first(item: tuple[int, Entry]) -> int:
    return item[0]
