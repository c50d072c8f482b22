"""MemoryRecordStore: a vhost's replicated log in memory, for the replication seam's tests.

A `ReplicationLeader` streams from, and a `ReplicationFollower` writes to, a `RecordStore`
(broker/replog/records.py); what they do with it (the confirm rule, epochs, truncation,
resets, copies) is not about files. With this store such a test runs without a directory,
an fsync or the segment log's writer thread: an append is a list append, in microseconds.

It keeps `SegmentRecordStore`'s contract for everything the leader and follower use (the
`RecordStore` methods) and for the extras tests read (`records`, `payload_at`, `scan`,
`epochs`, `trimmed_by`, `renew_copy_id`, `drop_below`, `close`): the same offsets, the
epochs noted from EPOCH_TAG records, the trims by CHECKPOINT_TAG records, a truncation that
takes away the trimming checkpoint starting the log over at 1, a new `copy_id` on each
reset. tests/replog/test_record_store_contract.py runs the same tests, and random sequences
of operations, on both stores and holds this one to `SegmentRecordStore`'s answers.

It is written as a model of what the log holds, not as a copy of SegmentRecordStore's
bookkeeping: the epochs and the checkpoints not yet trimmed by are read from the records
held when asked, and only what the records cannot tell is kept beside them (the epoch in
force where a trim cut, how far the trims have looked, the checkpoint trimmed by). Two
ways of working the log out, one answer: the contract test then checks both.

What it has not: a restart (nothing is replayed: a test that restarts a node hands the new
follower the same store, as a disk would keep it), compaction, a size on disk, failures.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import uuid
from collections.abc import Callable, Iterator

from roarmq.broker.replog.records import RecordStore
from roarmq.broker.store.record_tags import CHECKPOINT_TAG, EPOCH_TAG

_TAG_U64 = struct.Struct(">cQ")  # the head of records.py's epoch_record and checkpoint_record
#: What SegmentRecordStore.read counts for each record beyond its payload (its envelope:
#: tag, generation, offset), so that a batch ends at the same record in both stores.
ENVELOPE_BYTES = struct.calcsize(">cIQ")


def _number_after(tag: bytes, payload: bytes) -> int | None:
    """An epoch record's epoch or a checkpoint record's base (None: not such a record)."""
    if payload[:1] != tag or len(payload) < _TAG_U64.size:
        return None
    return int(_TAG_U64.unpack_from(payload)[1])


class MemoryRecordStore:
    """A RecordStore in a list (see module doc); everything appended stays until trimmed,
    truncated or reset, and is durable once `sync` or `sync_soon` says so."""

    first_offset: int  # the oldest offset held (last_offset + 1 when empty)
    last_offset: int  # the newest offset appended (0 before any)
    durable_offset: int  # the newest offset sync or sync_soon made durable
    copy_id: str  # this copy's identity: new when made or reset
    #: The checkpoint record the log was last trimmed by (0: none): below it, what is left
    #: is not a whole state.
    trimmed_by: int
    #: The epoch in force at `first_offset`, its record trimmed away (0: none).
    _epoch_below: int
    #: Where the next trim starts looking for checkpoint records (it need not look again
    #: below: a checkpoint seen once has its base at or below the first offset from then
    #: on, so it would trim nothing more).
    _looked_upto: int

    def __init__(self) -> None:
        self._payloads: list[bytes] = []  # offset first_offset + i at index i
        self.durable_offset = 0
        self.reset(1)  # empty, its first record to come at 1, a copy of its own

    def renew_copy_id(self) -> str:
        """This store becomes a new copy of the log (made, or reset)."""
        self.copy_id = uuid.uuid4().hex
        return self.copy_id

    def _held(self, start: int = 0) -> Iterator[tuple[int, bytes]]:
        """(offset, payload) of the records held from `start` on."""
        skip = max(0, start - self.first_offset)
        return enumerate(itertools.islice(self._payloads, skip, None), self.first_offset + skip)

    # -- writing ---------------------------------------------------------------------------

    def append(self, offset: int, payload: bytes) -> None:
        if offset != self.last_offset + 1:
            raise ValueError(f"offset {offset} does not follow {self.last_offset}")
        self._payloads.append(bytes(payload))
        self.last_offset = offset

    def sync(self) -> int:
        """Everything appended so far is durable; return the durable offset."""
        self.durable_offset = self.last_offset
        return self.durable_offset

    def sync_soon(self, done: Callable[[int, BaseException | None], object]) -> None:
        """What was appended so far becomes durable, and ``done(offset, None)`` is called:
        from the running loop's next turn (as SegmentRecordStore answers from its writer's
        thread, never within the call that asked), or at once without a running loop."""
        target = self.last_offset

        def synced() -> None:
            self.durable_offset = max(self.durable_offset, target)
            done(target, None)

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            synced()
        else:
            loop.call_soon(synced)

    def reset(self, start: int) -> None:
        """Void everything held, as a new copy; the next record appended is `start`."""
        self.renew_copy_id()
        self._payloads.clear()
        self.first_offset, self.last_offset = start, start - 1
        self.durable_offset = min(self.durable_offset, start - 1)
        self.trimmed_by = self._epoch_below = 0
        self._looked_upto = start - 1

    def truncate(self, last: int) -> None:
        """Void the records above `last`; below the checkpoint the log was trimmed by (or
        below what it holds), everything goes and the log starts again at 1."""
        if last >= self.last_offset:
            return
        whole = self.first_offset - 1 <= last and last >= self.trimmed_by
        if not whole:
            self.reset(1)
            return
        self._payloads = self._payloads[: last + 1 - self.first_offset]
        self.last_offset = last
        self.durable_offset = min(self.durable_offset, last)
        self._looked_upto = min(self._looked_upto, last)
        if last < self.first_offset:  # the epoch in force there started at first_offset
            self._epoch_below = 0

    def trim_checkpointed(self, upto: int) -> None:
        """Forget what the checkpoints at or below offset `upto` made redundant (each
        checkpoint is looked at once: by the first trim that reaches it)."""
        reached = min(upto, self.last_offset)
        found: list[tuple[int, int]] = []  # (offset, base) of the checkpoints reached
        for offset, payload in self._held(self._looked_upto + 1):
            if offset > reached:
                break
            base = _number_after(CHECKPOINT_TAG, payload)
            if base is not None:
                found.append((offset, base))
        self._looked_upto = max(self._looked_upto, reached)
        if found and max(base for _, base in found) > self.first_offset:
            self.drop_below(max(base for _, base in found))
            self.trimmed_by = found[-1][0]

    def drop_below(self, base: int) -> None:
        """Forget the records below `base` (none beyond the last); the epoch in force at
        the new first offset stays known."""
        new_first = max(self.first_offset, min(base, self.last_offset + 1))
        in_force = [epoch for start, epoch in self.epochs if start <= new_first]
        self._epoch_below = in_force[-1] if in_force else 0
        del self._payloads[: new_first - self.first_offset]
        self.first_offset = new_first

    # -- epochs ----------------------------------------------------------------------------

    @property
    def epochs(self) -> list[tuple[int, int]]:
        """(start offset, epoch) of each epoch held, read from the epoch records."""
        current = self._epoch_below
        starts = [(self.first_offset, current)] if current else []
        for offset, payload in self._held():
            epoch = _number_after(EPOCH_TAG, payload)
            if epoch is not None and epoch != current:
                starts.append((offset, epoch))
                current = epoch
        return starts

    def last_epoch(self) -> int:
        return ([0] + [epoch for _, epoch in self.epochs])[-1]

    def epoch_starts(self) -> list[tuple[int, int]]:
        return self.epochs

    def end_of_epoch(self, epoch: int) -> int:
        later = [start for start, e in self.epochs if e > epoch]
        return later[0] - 1 if later else self.last_offset

    # -- reading ---------------------------------------------------------------------------

    def read(self, start: int, max_bytes: int) -> list[tuple[int, bytes]]:
        """Records from offset `start` (at least one if any), about `max_bytes` of them
        counted as SegmentRecordStore counts them (`ENVELOPE_BYTES` each beyond its payload)."""
        batch: list[tuple[int, bytes]] = []
        room = max_bytes
        for record in self._held(start):
            if batch and room <= 0:
                break
            batch.append(record)
            room -= ENVELOPE_BYTES + len(record[1])
        return batch

    def payload_at(self, offset: int) -> bytes:
        """One record's payload; KeyError if not held."""
        if offset < self.first_offset or offset > self.last_offset:
            raise KeyError(offset)
        return self._payloads[offset - self.first_offset]

    def scan(self, chunk_bytes: int = 4 << 20) -> Iterator[tuple[int, bytes]]:
        """Every record held, oldest first."""
        return iter(self.records())

    def records(self) -> list[tuple[int, bytes]]:
        """Everything held, oldest first."""
        return list(self._held())

    def close(self) -> None:
        """Nothing to let go of: the store keeps what it holds for a follower started on
        it again (a restarted node finding its log)."""


#: mypy checks here that MemoryRecordStore is a RecordStore (every attribute and method
#: of the Protocol, with compatible types).
_IS_A_RECORD_STORE: type[RecordStore] = MemoryRecordStore
