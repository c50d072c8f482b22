"""The time-ordered index of a delayed exchange's stored messages, on disk but for what
comes next.

Entries are (due ms, order, msg_id) triples. New ones go into an in-memory heap of at most
`RUN_ENTRIES`; a full heap is sorted into a run file (24 bytes an entry) and emptied. Each
run keeps only a cursor and its next `READ_AHEAD` entries in memory, and a heap of the runs'
heads merges them: the next due entry is the smallest of the in-memory heap's top and the
runs' heads. So memory is a constant (the heap, a buffer per run) however many messages
are scheduled; 10,000,000 of them are 153 runs. A run is written once and read once, in
order.

The files are a cache, never the truth: the message log holds every scheduled message and
its due record (broker/store/messages.py), and recovery rebuilds the index from it, so
nothing here is fsynced, and whatever the directory held at start is removed.
"""

from __future__ import annotations

import heapq
import itertools
import os
import shutil
from array import array
from collections.abc import Iterator
from pathlib import Path

#: Entries the in-memory heap holds before it is written out as a sorted run: sorting and
#: writing 16,384 entries takes a few ms of the loop, once per 16,384 scheduled messages.
RUN_ENTRIES = 16384
#: Entries a run reads ahead (24 bytes each).
READ_AHEAD = 256

Entry = tuple[int, int, int]  # (due ms, order, msg_id)


class _Run:
    """One sorted run file: where its next unread entry is, and a few read ahead."""

    __slots__ = ("path", "offset", "left", "ahead", "at")

    def __init__(self, path: Path, count: int) -> None:
        self.path = path
        self.offset = 0  # in entries
        self.left = count  # entries not yet read from the file
        self.ahead = array("q")
        self.at = 0  # index of the next entry in `ahead`, in ints

    def next(self) -> Entry | None:
        """The run's next entry (its file read READ_AHEAD entries at a time), or None."""
        if self.at >= len(self.ahead):
            if not self.left:
                return None
            n = min(READ_AHEAD, self.left)
            self.ahead = array("q")
            with open(self.path, "rb") as f:
                f.seek(self.offset * 24)
                self.ahead.fromfile(f, 3 * n)
            self.offset += n
            self.left -= n
            self.at = 0
        a, i = self.ahead, self.at
        self.at = i + 3
        return a[i], a[i + 1], a[i + 2]


class DueIndex:
    """Stored messages by due time (module doc)."""

    def __init__(self, directory: Path, run_entries: int = RUN_ENTRIES) -> None:
        self.dir = directory
        self.run_entries = run_entries
        shutil.rmtree(directory, ignore_errors=True)
        self._fresh: list[Entry] = []  # a heap
        self._heads: list[tuple[int, int, int, int]] = []  # (due, order, msg_id, run number)
        self._runs: dict[int, _Run] = {}
        self._numbers = itertools.count()
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def add(self, due: int, order: int, msg_id: int) -> None:
        heapq.heappush(self._fresh, (due, order, msg_id))
        self.count += 1
        if len(self._fresh) >= self.run_entries:
            self._spill()

    def first(self) -> Entry | None:
        """The next entry due (not taken)."""
        fresh, heads = self._fresh, self._heads
        if heads and (not fresh or heads[0][:2] < fresh[0][:2]):
            return heads[0][:3]
        return fresh[0] if fresh else None

    def pop(self) -> Entry:
        """Take the next entry due (IndexError when empty)."""
        fresh, heads = self._fresh, self._heads
        self.count -= 1
        if heads and (not fresh or heads[0][:2] < fresh[0][:2]):
            due, order, msg_id, number = heads[0]
            run = self._runs[number]
            following = run.next()
            if following is None:
                heapq.heappop(heads)
                del self._runs[number]
                os.unlink(run.path)
            else:
                heapq.heapreplace(heads, (*following, number))
            return due, order, msg_id
        return heapq.heappop(fresh)

    def drain(self) -> Iterator[Entry]:
        """Every entry, in due order, taking each (what deleting the exchange settles)."""
        while self.count:
            yield self.pop()

    def clear(self) -> None:
        """Forget every entry and remove the files."""
        self._fresh = []
        self._heads = []
        self._runs = {}
        self.count = 0
        shutil.rmtree(self.dir, ignore_errors=True)

    def _spill(self) -> None:
        """The full heap, sorted, becomes a run file; its first entry joins the heads."""
        entries = sorted(self._fresh)
        self._fresh = []
        self.dir.mkdir(parents=True, exist_ok=True)
        number = next(self._numbers)
        path = self.dir / f"{number}.run"
        flat = array("q", itertools.chain.from_iterable(entries))
        with open(path, "wb") as f:
            flat.tofile(f)
        run = self._runs[number] = _Run(path, len(entries))
        first = run.next()
        assert first is not None
        heapq.heappush(self._heads, (*first, number))
