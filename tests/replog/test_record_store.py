"""The replicated log on disk (broker/replog/records.py): generations, truncation, checkpoints,
epochs — each checked by what a restart (a replay of the directory) finds."""

from __future__ import annotations

import os
import random
import struct

import pytest

from roarmq.broker.replog.records import (
    LogFormatError,
    SegmentRecordStore,
    checkpoint_record,
    epoch_record,
)
from roarmq.broker.store.segments import SegmentLog


def reopen(store: SegmentRecordStore) -> SegmentRecordStore:
    store.sync()
    store.close()
    return SegmentRecordStore(
        store.log.directory,
        segment_size=store.log._segment_size,
        whole_segments=store._whole_segments,
    )


def fill(store: SegmentRecordStore, upto: int, tag: bytes = b"x") -> None:
    while store.last_offset < upto:
        offset = store.last_offset + 1
        store.append(offset, tag + b"%d" % offset)


def test_truncated_tail_stays_truncated_after_a_restart(tmp_path):
    store = SegmentRecordStore(tmp_path / "log")
    store.append(1, epoch_record(5))
    fill(store, 50)
    store.sync()
    store.truncate(30)  # a new leader's log agrees up to 30
    store.append(31, epoch_record(9))
    fill(store, 40, b"y")
    store = reopen(store)
    records = store.records()
    assert [o for o, _ in records] == list(range(1, 41))
    assert records[29][1] == b"x30" and records[31][1] == b"y32"
    assert store.epochs == [(1, 5), (31, 9)]
    store.close()


#: Both ways a log counts its live records: per segment (the default: trims free whole
#: segments) and per record (compaction copies the live records of sparse segments).
BOTH_LIVENESS = pytest.mark.parametrize("whole", [True, False], ids=["whole", "per-record"])


def segment_files(store: SegmentRecordStore) -> int:
    return sum(1 for name in os.listdir(store.log.directory) if name.endswith(".seg"))


@BOTH_LIVENESS
def test_reset_voids_everything_before_in_any_order(tmp_path, whole):
    """Markers mean the same wherever compaction moved them (module doc: generations)."""
    store = SegmentRecordStore(tmp_path / "log", segment_size=4096, whole_segments=whole)
    fill(store, 200)
    store.sync()
    store.reset(500)
    fill(store, 520, b"n")
    store.sync()
    for _ in range(3):
        store.compact()
        store.sync()
    store = reopen(store)
    assert store.first_offset == 500 and store.last_offset == 520
    assert all(p.startswith(b"n") for _, p in store.records())
    store.close()


@BOTH_LIVENESS
def test_checkpoint_trims_below_its_base_and_a_replay_agrees(tmp_path, whole):
    store = SegmentRecordStore(tmp_path / "log", segment_size=8192, whole_segments=whole)
    store.append(1, epoch_record(3))
    fill(store, 400)
    store.append(401, epoch_record(3))  # a checkpoint starts with its epoch
    fill(store, 450, b"c")
    store.append(451, checkpoint_record(401))
    fill(store, 470, b"n")
    store.sync()
    assert store.first_offset == 1  # not yet: only once the checkpoint is durable/confirmed
    files = segment_files(store)
    store.trim_checkpointed(451)
    assert store.first_offset == 401
    assert store.epochs == [(401, 3)]
    before = store.records()
    store.sync()  # the trimmed segments are deleted after the next batch
    assert segment_files(store) < files
    for _ in range(3):
        store.compact()
        store.sync()
    # Trimmed segments are gone; some records below 401 may survive in mixed segments.
    store = reopen(store)
    assert store.records() == before
    assert store.end_of_epoch(3) == 470
    store.close()


def test_end_of_epoch_is_where_a_follower_stops_agreeing():
    store = SegmentRecordStore.__new__(SegmentRecordStore)
    store.epochs = [(1, 2), (41, 5), (90, 8)]
    store.last_offset = 120
    assert store.end_of_epoch(1) == 0
    assert store.end_of_epoch(2) == 40
    assert store.end_of_epoch(4) == 40  # an epoch we never saw: the one before it
    assert store.end_of_epoch(5) == 89
    assert store.end_of_epoch(8) == 120


@BOTH_LIVENESS
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_random_truncations_resets_checkpoints_and_compactions_replay_exactly(
    tmp_path, seed, whole
):
    """A model of what the log must hold, checked after every restart."""
    rng = random.Random(seed)
    store = SegmentRecordStore(tmp_path / "log", segment_size=4096, whole_segments=whole)
    model: dict[int, bytes] = {}
    first = 1
    trimmed_by = 0  # the checkpoint record the log was last trimmed by
    for step in range(2000):
        action = rng.random()
        last = store.last_offset
        if action < 0.6:
            for _ in range(rng.randint(1, 30)):
                offset = store.last_offset + 1
                payload = b"p%d-%d" % (step, offset)
                store.append(offset, payload)
                model[offset] = payload
        elif action < 0.7 and last > first:
            cut = rng.randint(first - 1, last - 1)
            store.truncate(cut)
            if trimmed_by > cut:  # its checkpoint is gone: the log starts over
                model, first, trimmed_by = {}, 1, 0
            else:
                model = {o: p for o, p in model.items() if o <= cut}
        elif action < 0.75:
            start = last + rng.randint(1, 5)
            store.reset(start)
            model, first, trimmed_by = {}, start, 0
        elif action < 0.85 and last >= first:
            base = rng.randint(first, last)
            offset = last + 1
            payload = checkpoint_record(base)
            store.append(offset, payload)
            model[offset] = payload
            store.sync()
            store.trim_checkpointed(offset)
            if base > first:
                model = {o: p for o, p in model.items() if o >= base}
                first, trimmed_by = base, offset
        elif action < 0.95:
            store.sync()
            store.compact()
        else:
            store = reopen(store)
        assert store.records() == sorted(model.items())
    store = reopen(store)
    assert store.records() == sorted(model.items())
    store.close()


def test_sync_soon_answers_every_caller_once_even_when_already_synced(tmp_path):
    """`sync_soon` without blocking (the leader's group commit): every call is answered once
    with an offset at least its own, also when a batch that ended before it was asked (a
    blocking `sync`, another caller's batch) already made its records durable."""
    import asyncio

    async def run() -> list[int]:
        store = SegmentRecordStore(tmp_path / "log")
        loop = asyncio.get_running_loop()
        answered: list[int] = []

        def done(offset: int, error: BaseException | None) -> None:
            assert error is None
            loop.call_soon_threadsafe(answered.append, offset)

        asked = []
        for offset in range(1, 1001):
            store.append(offset, b"x%d" % offset)
            if offset % 7 == 0:
                await asyncio.to_thread(store.sync)
            store.sync_soon(done)
            asked.append(offset)
            if offset % 3 == 0:
                await asyncio.sleep(0)
        for _ in range(200):
            if len(answered) == len(asked):
                break
            await asyncio.sleep(0.01)
        store.close()
        return answered

    answered = asyncio.run(run())
    assert len(answered) == 1000
    assert answered == sorted(answered) and answered[-1] == 1000


def test_a_log_that_cannot_be_opened_lets_go_of_its_directory(tmp_path):
    """A record of a kind this version does not know stops the opening; the next attempt
    (a follower's retry) meets the same error, not a lock the failed one kept."""
    log = SegmentLog.open(tmp_path / "log", segment_size=1 << 16, sync_interval_ms=0)
    log.append(struct.pack(">cIQ", b"q", 0, 1) + b"from a newer version")
    log.sync_now()
    log.close()
    for _attempt in range(2):
        with pytest.raises(LogFormatError, match="not of this version's log"):
            SegmentRecordStore(tmp_path / "log")
