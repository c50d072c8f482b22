"""SegmentLog: round trips, group commit, crash recovery, release/deletion, compaction."""

from __future__ import annotations

import errno
import logging
import os
import random
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from roarmq.broker.store import segments
from roarmq.broker.store.segments import (
    GATHER_AFTER_RECORDS,
    HEADER_SIZE,
    MAGIC,
    CorruptRecord,
    Location,
    LogClosed,
    LogFailed,
    SegmentLog,
    segment_name,
)

REPO = Path(__file__).resolve().parents[2]
HYP = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

payload_lists = st.lists(st.binary(max_size=300), max_size=40)


def write(directory, payloads, **kw) -> list[Location]:
    kw.setdefault("fsync", False)
    with SegmentLog.open(directory, **kw) as log:
        locs = [log.append(p)[0] for p in payloads]
        log.sync_now(timeout=10)
    return locs


def replay(directory, **kw):
    kw.setdefault("fsync", False)
    log = SegmentLog.open(directory, **kw)
    records = list(log.replay())
    return log, records


def seg_files(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(".seg"))


# ---------------------------------------------------------------- round trips


@HYP
@given(payloads=payload_lists, segment_size=st.integers(64, 2048))
def test_round_trip_across_rotations(payloads, segment_size):
    with tempfile.TemporaryDirectory() as d:
        with SegmentLog.open(d, segment_size=segment_size, fsync=False) as log:
            appended = [log.append(p) for p in payloads]
            locs = [loc for loc, _ in appended]
            assert [tok for _, tok in appended] == list(range(1, len(payloads) + 1))
            assert [log.read(loc) for loc in locs] == payloads  # from the write buffers
            log.sync_now(timeout=10)
            assert [log.read(loc) for loc in locs] == payloads  # from the files
        for name in seg_files(d):  # rotation: only a lone record may exceed segment_size
            size = os.path.getsize(os.path.join(d, name))
            assert size <= segment_size or sum(loc.segment == int(name[:8]) for loc in locs) == 1
        log, records = replay(d)
        try:
            assert records == list(zip(locs, payloads, strict=True))
            assert log.recovery.records_ok == len(payloads)
            assert log.recovery.corrupt_regions == []
            # after reopening, appends go to a fresh segment and reads of old records work
            new_loc, _ = log.append(b"after")
            assert new_loc.segment > max((loc.segment for loc in locs), default=-1)
            assert [log.read(loc) for loc in locs] == payloads
        finally:
            log.close()


def test_read_after_rotation_and_large_records(tmp_path):
    rng = random.Random(7)
    sizes = [0, 1, 100, 5000, 70_000, 300_000, 10] * 5  # some exceed buffer and segment size
    payloads = [rng.randbytes(n) for n in sizes]
    with SegmentLog.open(tmp_path, segment_size=64 << 10, buffer_size=64 << 10) as log:
        locs = []
        for i, p in enumerate(payloads):
            locs.append(log.append(p)[0])
            if i % 4 == 0:
                log.schedule_sync()
            j = rng.randrange(len(locs))
            assert log.read(locs[j]) == payloads[j]
        log.sync_now(timeout=10)
        assert len({loc.segment for loc in locs}) > 5
        assert [log.read(loc) for loc in locs] == payloads
    log, records = replay(tmp_path)
    log.close()
    assert [p for _, p in records] == payloads
    with SegmentLog.open(tmp_path / "small", max_record_size=1000) as log:
        log.append(b"x" * 1000)
        with pytest.raises(ValueError):
            log.append(b"x" * 1001)


def test_concurrent_reads_while_appending(tmp_path):
    rng = random.Random(3)
    written: list[tuple[Location, bytes]] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    log = SegmentLog.open(tmp_path, segment_size=32 << 10, buffer_size=64 << 10, fsync=False)

    def reader():
        r = random.Random(4)
        try:
            while not stop.is_set():
                if written:
                    loc, p = written[r.randrange(len(written))]
                    assert log.read(loc) == p
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(3000):
            p = rng.randbytes(rng.randrange(600))
            written.append((log.append(p)[0], p))
            if i % 50 == 0:
                log.schedule_sync()
    finally:
        stop.set()
        t.join(10)
        log.close()
    assert not errors, errors[0]


# ---------------------------------------------------------------- group commit


def test_tokens_become_synced_only_after_fsync(tmp_path, monkeypatch):
    gate = threading.Event()
    entered = threading.Event()
    calls = []
    real = segments._fdatasync

    def slow_fdatasync(fd):
        calls.append(fd)
        entered.set()
        assert gate.wait(10)
        real(fd)

    monkeypatch.setattr(segments, "_fdatasync", slow_fdatasync)
    synced: list[int] = []
    done = threading.Event()

    def on_synced(token):
        synced.append(token)
        if token >= 200:
            done.set()

    log = SegmentLog.open(tmp_path, on_synced=on_synced)
    try:
        for i in range(100):
            assert log.append(b"m%d" % i)[1] == i + 1
        assert log.synced_token == 0
        log.schedule_sync()
        assert entered.wait(10)  # the writer is inside fdatasync for batch 1
        for i in range(100, 200):
            log.append(b"m%d" % i)
        log.schedule_sync()
        time.sleep(0.05)
        assert log.synced_token == 0 and synced == []  # nothing confirmed before fsync returns
        gate.set()
        assert done.wait(10)
        assert synced == [100, 200]  # two batches, in order
        assert len(calls) == 2  # one fsync per batch, not per record
        assert log.synced_token == 200
        assert log.sync_now(timeout=10) == 200  # nothing new: returns at once
    finally:
        gate.set()
        log.close()


def test_sync_interval_gathers_a_batch(tmp_path):
    synced: list[int] = []
    done = threading.Event()

    def on_synced(token):
        synced.append(token)
        done.set()

    with SegmentLog.open(
        tmp_path, sync_interval_ms=60_000, buffer_size=64 << 10, on_synced=on_synced
    ) as log:
        log.append(b"zero")
        log.schedule_sync()
        assert done.wait(10)  # an idle log syncs at once: no added latency
        done.clear()
        for i in range(GATHER_AFTER_RECORDS + 4):  # a busy log: many records since
            log.append(b"more %d" % i)
        log.schedule_sync()
        assert not done.wait(0.2)  # within the interval of the last batch: gathering
        log.append(b"x" * (64 << 10))  # a full buffer ends the wait early
        assert done.wait(10)
        assert synced == [1, GATHER_AFTER_RECORDS + 6]  # one batch, one fsync, for all


def test_a_few_records_after_a_batch_are_synced_without_the_interval(tmp_path):
    """A publisher that waits for each confirm appends a few records a batch: the log
    syncs them at once instead of waiting out `sync_interval_ms` since the last batch
    (it capped such a publisher at 1 / interval = 200 msg/s)."""
    synced: list[int] = []
    done = threading.Event()

    def on_synced(token):
        synced.append(token)
        done.set()

    with SegmentLog.open(tmp_path, sync_interval_ms=60_000, on_synced=on_synced) as log:
        for round_ in range(5):
            done.clear()
            for kind in (b"publish", b"delivered", b"ack"):
                log.append(kind + b" %d" % round_)
            log.schedule_sync()
            assert done.wait(10), f"round {round_} waited for the 60-s interval"
        assert synced == [3, 6, 9, 12, 15]


def test_full_buffer_starts_a_batch_without_being_asked(tmp_path):
    done = threading.Event()
    with SegmentLog.open(tmp_path, buffer_size=64 << 10, on_synced=lambda tok: done.set()) as log:
        for _ in range(100):
            log.append(b"x" * 1000)  # > 64 KiB in all
        assert done.wait(10)
        assert log.synced_token >= 60


def test_close_flushes_and_refuses_further_appends(tmp_path):
    log = SegmentLog.open(tmp_path)
    locs = [log.append(b"p%d" % i)[0] for i in range(10)]
    log.close()
    log.close()  # idempotent
    with pytest.raises(LogClosed):
        log.append(b"late")
    log2, records = replay(tmp_path)
    log2.close()
    assert records == [(loc, b"p%d" % i) for i, loc in enumerate(locs)]


# ---------------------------------------------------------------- recovery


def _record_bounds(locs):
    return [(loc.offset, loc.offset + HEADER_SIZE + loc.length) for loc in locs]


@pytest.mark.parametrize("last", [b"", b"z", b"0123456789abcdefghij"])
def test_torn_tail_every_cut_point(tmp_path, last):
    payloads = [b"alpha" * 3, b"beta" * 7, last]
    src = tmp_path / "src"
    locs = write(src, payloads)
    data = (src / segment_name(locs[0].segment)).read_bytes()
    start, end = _record_bounds(locs)[-1]
    assert end == len(data)
    for cut in range(start + 1, end):
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        (d / segment_name(0)).write_bytes(data[:cut])
        log, records = replay(d)
        log.close()
        assert [p for _, p in records] == payloads[:-1]
        assert (d / segment_name(0)).stat().st_size == start
        rep = log.recovery
        assert rep.bytes_truncated == cut - start
        assert rep.records_dropped == 1
        assert [(r.segment, r.offset, r.length, r.truncated) for r in rep.corrupt_regions] == [
            (0, start, cut - start, True)
        ]
        # the repaired file replays clean
        log, again = replay(d)
        log.close()
        assert again == records and log.recovery.corrupt_regions == []


@HYP
@given(payloads=st.lists(st.binary(max_size=200), min_size=1, max_size=15), data=st.data())
def test_torn_tail_random(payloads, data):
    with tempfile.TemporaryDirectory() as d:
        locs = write(d, payloads, segment_size=1 << 20)
        path = os.path.join(d, segment_name(0))
        size = os.path.getsize(path)
        cut = data.draw(st.integers(0, size), label="cut")
        os.truncate(path, cut)
        intact = [p for p, (s, e) in zip(payloads, _record_bounds(locs), strict=True) if e <= cut]
        good_end = max([e for s, e in _record_bounds(locs) if e <= cut], default=0)
        log, records = replay(d)
        log.close()
        assert [p for _, p in records] == intact
        assert log.recovery.bytes_truncated == cut - good_end
        assert (os.path.getsize(path) if os.path.exists(path) else 0) == good_end


@HYP
@given(payloads=st.lists(st.binary(max_size=200), min_size=2, max_size=15), data=st.data())
def test_corruption_in_the_middle_resyncs(payloads, data):
    with tempfile.TemporaryDirectory() as d:
        locs = write(d, payloads, segment_size=1 << 20)
        path = os.path.join(d, segment_name(0))
        k = data.draw(st.integers(0, len(payloads) - 2), label="victim")  # not the last one
        start, end = _record_bounds(locs)[k]
        at = data.draw(st.integers(start, end - 1), label="byte")
        flip = data.draw(st.integers(1, 255), label="xor")
        raw = bytearray(Path(path).read_bytes())
        raw[at] ^= flip
        Path(path).write_bytes(raw)
        log, records = replay(d)
        try:
            assert records == [
                (loc, p) for i, (loc, p) in enumerate(zip(locs, payloads, strict=True)) if i != k
            ]
            rep = log.recovery
            assert rep.records_ok == len(payloads) - 1 and rep.records_dropped == 1
            assert [(r.offset, r.length, r.truncated) for r in rep.corrupt_regions] == [
                (start, end - start, False)
            ]
            assert rep.bytes_truncated == 0
            assert os.path.getsize(path) == len(raw)  # damage in the middle is left in place
            assert [s.damaged for s in log.segments() if s.segment == 0] == [True]
            with pytest.raises(CorruptRecord):
                log.read(locs[k])
        finally:
            log.close()


def test_zeroed_hole_and_several_regions(tmp_path, caplog):
    payloads = [bytes([i]) * (50 + i) for i in range(12)]
    locs = write(tmp_path, payloads)
    path = tmp_path / segment_name(0)
    raw = bytearray(path.read_bytes())
    bounds = _record_bounds(locs)
    for k in (2, 3, 7):  # records 2+3 become one zeroed region; 7 another
        s, e = bounds[k]
        raw[s:e] = bytes(e - s)
    raw += b"\x00" * 4096  # zero-filled tail, as after a crash on a preallocated file
    path.write_bytes(raw)
    with caplog.at_level(logging.WARNING, logger="roarmq.store"):
        log, records = replay(tmp_path)
    log.close()
    assert [p for _, p in records] == [p for i, p in enumerate(payloads) if i not in (2, 3, 7)]
    regions = [(r.offset, r.length, r.truncated) for r in log.recovery.corrupt_regions]
    assert regions == [
        (bounds[2][0], bounds[3][1] - bounds[2][0], False),
        (bounds[7][0], bounds[7][1] - bounds[7][0], False),
        (bounds[-1][1], 4096, True),
    ]
    assert log.recovery.bytes_truncated == 4096
    assert path.stat().st_size == bounds[-1][1]
    assert "segment damaged" in caplog.text and "truncating 4096 bytes" in caplog.text


@HYP
@given(
    payloads=st.lists(st.binary(max_size=100), max_size=8),
    garbage=st.binary(min_size=1, max_size=300),
    with_magic=st.booleans(),
)
def test_garbage_at_the_end_is_dropped(payloads, garbage, with_magic):
    if with_magic:  # a plausible header whose record does not verify
        garbage = MAGIC + garbage
    assume(not any(_looks_valid(garbage, i) for i in range(len(garbage))))
    with tempfile.TemporaryDirectory() as d:
        locs = write(d, payloads)
        path = os.path.join(d, segment_name(0))
        good = os.path.getsize(path) if payloads else 0
        with open(path, "ab") as f:
            f.write(garbage)
        log, records = replay(d)
        log.close()
        assert records == list(zip(locs, payloads, strict=True))
        assert log.recovery.bytes_truncated == len(garbage)
        if payloads:
            assert os.path.getsize(path) == good
        else:  # nothing intact: the emptied segment is deleted
            assert seg_files(d) == []


def _looks_valid(buf: bytes, i: int) -> bool:
    view = memoryview(buf)
    return segments._check(buf, view, i, len(buf))[0] >= 0


@pytest.mark.parametrize("preallocate", [0, 64 << 10])
def test_kill_9_mid_stream(tmp_path, preallocate):
    """A writer process dies abruptly (os._exit) mid-stream; what it confirmed survives.

    With `preallocate`, the active segment ends in space allocated past its records (the
    writer allocates before it writes): that is its end, not damage, and recovery cuts it
    off. The allocation stops at the segment's end, so a writer that dies with its segment
    within a page of full has nothing allocated past its records; where the writer dies is
    up to the scheduler, so with `preallocate` the segment is larger than the whole stream
    and its tail is under test on every run. Without, small segments make the writer
    rotate under the kill.

    The kill may tear the record being written (the kernel stops a write between pages
    when the process is killed): at most that one record, at the very end and never a
    confirmed one, is cut off; nothing in the middle is.
    """
    segment_size = 8 << 20 if preallocate else 256 << 10
    script = textwrap.dedent("""
        import os, random, sys, threading
        from roarmq.broker.store.segments import SegmentLog
        confirmed = []
        lock = threading.Lock()
        def on_synced(token):
            with lock:
                sys.stdout.write(f"{token}\\n"); sys.stdout.flush()
        log = SegmentLog.open(sys.argv[1], segment_size=int(sys.argv[3]), buffer_size=64 << 10,
                              on_synced=on_synced, preallocate=int(sys.argv[2]))
        rng = random.Random(11)
        for i in range(6000):
            log.append(i.to_bytes(4, "little") * rng.randrange(1, 200))
            if i % 25 == 0:
                log.schedule_sync()
            if i == 4000:
                log.sync_now()
        os._exit(0)   # no close(): buffered and in-flight records are lost
    """)
    d = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", script, str(d), str(preallocate), str(segment_size)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    ).stdout
    confirmed = max(int(line) for line in out.split())
    assert confirmed >= 4001
    if preallocate:
        assert len(seg_files(d)) == 1  # one segment the stream cannot fill
        last = d / seg_files(d)[-1]
        assert last.read_bytes().endswith(bytes(4096))  # allocated past the records
    else:
        assert len(seg_files(d)) > 1  # the writer rotated before the kill
    log, records = replay(d, preallocate=preallocate)
    log.close()
    rng = random.Random(11)
    expected = [i.to_bytes(4, "little") * rng.randrange(1, 200) for i in range(6000)]
    got = [p for _, p in records]
    assert len(got) >= confirmed
    assert got == expected[: len(got)]  # an exact prefix, nothing invented
    torn = log.recovery.corrupt_regions
    assert log.recovery.records_dropped == len(torn) <= 1, torn
    assert all(region.truncated for region in torn), torn  # a torn tail, never the middle
    on_disk = sum((d / name).stat().st_size for name in seg_files(d))
    assert on_disk == sum(HEADER_SIZE + loc.length for loc, _ in records)


def test_preallocated_segments_grow_by_allocation_and_end_at_their_records(tmp_path):
    """`preallocate`: batches write into space allocated before (a file that keeps its
    size, so an fdatasync need not write the inode); a sealed or closed segment is cut
    back to its records."""
    log = SegmentLog.open(tmp_path, segment_size=64 << 10, preallocate=16 << 10)
    locs = [log.append(b"first")[0]]
    log.sync_now(timeout=10)
    path = tmp_path / segment_name(0)
    allocated = path.stat().st_size
    assert allocated >= 16 << 10
    for i in range(20):  # small batches: the file keeps its size
        locs.append(log.append(b"r%d" % i)[0])
        log.sync_now(timeout=10)
        assert path.stat().st_size == allocated
    for _ in range(200):  # past 64 KiB: rotations
        locs.append(log.append(os.urandom(900))[0])
        log.schedule_sync()
    log.sync_now(timeout=10)
    names = seg_files(tmp_path)
    assert len(names) >= 3
    ends: dict[int, int] = {}
    for loc in locs:
        ends[loc.segment] = loc.offset + HEADER_SIZE + loc.length
    for name in names[:-1]:  # sealed: cut back when the writer moved on
        assert (tmp_path / name).stat().st_size == ends[int(name[:-4])]
    assert (tmp_path / names[-1]).stat().st_size > ends[int(names[-1][:-4])]
    assert [log.read(loc) for loc in locs[:2]] == [b"first", b"r0"]
    log.close()
    for name in names:
        assert (tmp_path / name).stat().st_size == ends[int(name[:-4])]
    log, records = replay(tmp_path, preallocate=16 << 10)
    log.close()
    assert [loc for loc, _ in records] == locs
    assert log.recovery.corrupt_regions == []


# ---------------------------------------------------------------- liveness


def test_release_deletes_dead_segments(tmp_path):
    deleted: list[int] = []
    log = SegmentLog.open(tmp_path, segment_size=1024, on_deleted=deleted.append)
    try:
        locs = [log.append(bytes([i]) * 200)[0] for i in range(20)]  # 4 records per segment
        log.sync_now(timeout=10)
        first = [loc for loc in locs if loc.segment == 0]
        assert len(first) == 4
        for loc in first[:-1]:
            log.release(loc)
        log.sync_now(timeout=10)
        assert segment_name(0) in seg_files(tmp_path)  # one live record left
        log.release(first[-1])
        with pytest.raises(KeyError):
            log.release(first[-1])  # double release is a bug, and is reported
        log.sync_now(timeout=10)
        assert segment_name(0) not in seg_files(tmp_path) and deleted == [0]
        with pytest.raises(KeyError):
            log.read(first[0])
        # the active segment is never deleted, even with nothing live in it
        active = [loc for loc in locs if loc.segment == log.active_segment]
        for loc in active:
            log.release(loc)
        log.sync_now(timeout=10)
        assert segment_name(log.active_segment) in seg_files(tmp_path)
        # ...but it is once it has been rotated out
        log.append(b"y" * 1000)
        log.sync_now(timeout=10)
        assert segment_name(active[0].segment) not in seg_files(tmp_path)
        assert log.read(locs[5]) == bytes([5]) * 200
    finally:
        log.close()


def test_records_released_before_they_are_written(tmp_path):
    with SegmentLog.open(tmp_path, segment_size=1024) as log:
        locs = [log.append(b"q" * 300)[0] for _ in range(9)]
        for loc in locs[:6]:  # segments 0 and 1, never synced yet
            log.release(loc)
        log.sync_now(timeout=10)
        assert seg_files(tmp_path) == [segment_name(2)]
        assert log.read(locs[7]) == b"q" * 300


def test_recovery_liveness_protocol(tmp_path):
    payloads = [b"rec%03d" % i * 20 for i in range(30)]
    locs = write(tmp_path, payloads, segment_size=1024)
    segs = sorted({loc.segment for loc in locs})
    log = SegmentLog.open(tmp_path, fsync=False)
    try:
        with pytest.raises(KeyError):  # old segments are not managed before replay
            log.release(locs[0])
        dead = []
        for loc, p in log.replay():
            if loc.segment == segs[0] or p.startswith(b"rec010"):
                log.release(loc)  # releasing during the replay is allowed
                dead.append(loc)
        log.sync_now(timeout=10)
        assert segment_name(segs[0]) not in seg_files(tmp_path)
        assert all(segment_name(s) in seg_files(tmp_path) for s in segs[1:])
        with pytest.raises(RuntimeError):
            next(log.replay())
    finally:
        log.close()


# ---------------------------------------------------------------- compaction


def test_compaction_relocates_live_records(tmp_path):
    deleted: list[int] = []
    payloads = [b"%04d" % i * 40 for i in range(60)]  # 160-byte payloads, 5 per segment
    log = SegmentLog.open(tmp_path, segment_size=1024, on_deleted=deleted.append)
    try:
        locs = [log.append(p)[0] for p in payloads]
        log.sync_now(timeout=10)
        index = dict(enumerate(locs))  # the owner's index: message id -> location
        by_loc = {loc: i for i, loc in index.items()}
        # keep one record in segments 0-2 (1/5 live: compacted); the others stay full
        for i, loc in list(index.items()):
            if loc.segment in (0, 1, 2) and i % 5 != 0:
                log.release(loc)
                del index[i]
        moved = []

        def relocate(old, new, payload):
            i = by_loc.pop(old)
            assert payloads[i] == payload and index[i] == old
            index[i] = new
            by_loc[new] = i
            moved.append(i)

        rep = log.compact(relocate)
        assert sorted(rep.segments) == [0, 1, 2] and rep.records_moved == 3 == len(moved)
        for i in moved:
            assert index[i].segment >= log.active_segment - 1
            assert log.read(index[i]) == payloads[i]
        log.sync_now(timeout=10)
        assert sorted(deleted) == [0, 1, 2]
        assert not {segment_name(s) for s in (0, 1, 2)} & set(seg_files(tmp_path))
        assert log.compact(relocate).records_moved == 0  # nothing sparse left
    finally:
        log.close()
    log, records = replay(tmp_path)
    log.close()
    got = sorted(p for _, p in records)
    assert got == sorted(payloads[i] for i in index)  # every live record exactly once


def test_compaction_undoes_a_failed_relocate(tmp_path):
    with SegmentLog.open(tmp_path, segment_size=1024) as log:
        locs = [log.append(b"%02d" % i * 80)[0] for i in range(30)]
        log.sync_now(timeout=10)
        keep = [loc for loc in locs if loc.segment == 0][:1]  # 1 of 5 live: compactable
        for loc in locs:
            if loc.segment == 0 and loc not in keep:
                log.release(loc)

        def relocate(old, new, payload):
            raise RuntimeError("index full")

        with pytest.raises(RuntimeError):
            log.compact(relocate)
        log.sync_now(timeout=10)
        assert segment_name(0) in seg_files(tmp_path)
        for loc in keep:
            assert log.read(loc) == b"%02d" % locs.index(loc) * 80
            log.release(loc)  # still live: the owner still owns the old copy
        log.sync_now(timeout=10)
        assert segment_name(0) not in seg_files(tmp_path)


def test_damaged_segment_is_compacted(tmp_path):
    payloads = [b"%02d" % i * 50 for i in range(10)]
    locs = write(tmp_path, payloads)
    path = tmp_path / segment_name(0)
    raw = bytearray(path.read_bytes())
    raw[locs[4].offset + HEADER_SIZE] ^= 0xFF
    path.write_bytes(raw)
    log, records = replay(tmp_path)
    try:
        assert len(records) == 9
        moved = {}
        rep = log.compact(lambda old, new, p: moved.__setitem__(old, new))
        assert rep.segments == [0] and len(moved) == 9
        log.sync_now(timeout=10)
        assert segment_name(0) not in seg_files(tmp_path)
    finally:
        log.close()


# ---------------------------------------------------------------- errors


def test_io_error_is_surfaced_not_swallowed(tmp_path, monkeypatch, caplog):
    def no_space(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    failed = threading.Event()
    errors: list[BaseException] = []

    def on_error(exc):
        errors.append(exc)
        failed.set()

    synced: list[int] = []
    log = SegmentLog.open(tmp_path, on_error=on_error, on_synced=synced.append)
    monkeypatch.setattr(segments, "_pwrite", no_space)
    with caplog.at_level(logging.ERROR, logger="roarmq.store"):
        log.append(b"doomed")
        log.schedule_sync()
        assert failed.wait(10)
    assert isinstance(log.error, OSError) and log.error.errno == errno.ENOSPC
    assert errors == [log.error] and synced == []
    assert "writer failed" in caplog.text
    with pytest.raises(LogFailed):
        log.append(b"more")
    with pytest.raises(LogFailed):
        log.sync_now(timeout=10)
    log.close()  # does not raise


def test_callback_exceptions_do_not_kill_the_writer(tmp_path, caplog):
    def bad(token):
        raise ValueError("owner bug")

    with caplog.at_level(logging.ERROR, logger="roarmq.store"):
        with SegmentLog.open(tmp_path, on_synced=bad) as log:
            log.append(b"a")
            assert log.sync_now(timeout=10) == 1
            log.append(b"b")
            assert log.sync_now(timeout=10) == 2
            assert log.error is None
    assert "on_synced callback failed" in caplog.text


def test_unreadable_segment_is_skipped_not_deleted(tmp_path):
    write(tmp_path, [b"one", b"two"])
    os.rename(tmp_path / segment_name(0), tmp_path / "real")
    os.mkdir(tmp_path / segment_name(0))  # reading it fails with IsADirectoryError
    log, records = replay(tmp_path)
    log.close()
    assert records == [] and log.recovery.records_dropped == 1
    assert (tmp_path / segment_name(0)).is_dir()


def test_one_log_per_directory(tmp_path):
    log = SegmentLog.open(tmp_path)
    try:
        with pytest.raises(segments.SegmentLogError, match="in use"):
            SegmentLog.open(tmp_path)
    finally:
        log.close()
    SegmentLog.open(tmp_path).close()  # the lock is released by close()


def test_blocking_calls_from_callbacks_are_refused(tmp_path, caplog):
    seen: list[BaseException] = []
    box: list[SegmentLog] = []

    def on_synced(token):
        try:
            box[0].sync_now()
        except RuntimeError as exc:
            seen.append(exc)

    with SegmentLog.open(tmp_path, on_synced=on_synced) as log:
        box.append(log)
        log.append(b"a")
        log.sync_now(timeout=10)
    assert len(seen) == 1 and "deadlock" in str(seen[0])


# ---------------------------------------------------------------- model-based


class SegmentLogMachine(RuleBasedStateMachine):
    """Random appends, releases, reads, syncs, compactions and restarts against a dict."""

    def __init__(self):
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.log = SegmentLog.open(self.tmp.name, segment_size=600, fsync=False)
        self.next_key = 0
        self.payload: dict[int, bytes] = {}  # live records
        self.loc: dict[int, Location] = {}

    @rule(size=st.integers(0, 250))
    def append(self, size):
        key = self.next_key
        self.next_key += 1
        p = b"%06d:" % key + bytes([key % 251]) * size
        self.loc[key] = self.log.append(p)[0]
        self.payload[key] = p

    @precondition(lambda self: self.payload)
    @rule(data=st.data())
    def release(self, data):
        key = data.draw(st.sampled_from(sorted(self.payload)))
        self.log.release(self.loc.pop(key))
        del self.payload[key]

    @precondition(lambda self: self.payload)
    @rule(data=st.data())
    def read(self, data):
        key = data.draw(st.sampled_from(sorted(self.payload)))
        assert self.log.read(self.loc[key]) == self.payload[key]

    @rule()
    def sync(self):
        self.log.sync_now(timeout=10)
        on_disk = {int(n[:8]) for n in seg_files(self.tmp.name)}
        needed = {loc.segment for loc in self.loc.values()}
        assert needed <= on_disk | {self.log.active_segment}
        # no dead segment survives a sync (the active one may be empty)
        assert on_disk - needed <= {self.log.active_segment}

    @rule(threshold=st.sampled_from([0.25, 0.5, 1.01]))
    def compact(self, threshold):
        key_of = {loc: k for k, loc in self.loc.items()}

        def relocate(old, new, p):
            k = key_of[old]
            assert self.payload[k] == p
            self.loc[k] = new

        self.log.compact(relocate, threshold=threshold)

    @rule()
    def restart(self):
        self.log.close()
        self.log = SegmentLog.open(self.tmp.name, segment_size=600, fsync=False)
        seen = {}
        for loc, p in self.log.replay():
            k = int(p[:6])
            assert k not in seen  # no duplicates after a clean close
            seen[k] = loc
            if k not in self.payload:
                self.log.release(loc)  # dead: the owner releases it
            else:
                assert p == self.payload[k]
        assert set(self.payload) <= set(seen)
        self.loc = {k: seen[k] for k in self.payload}
        assert self.log.recovery.corrupt_regions == []

    def teardown(self):
        self.log.close()
        self.tmp.cleanup()


SegmentLogMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_segment_log_model = SegmentLogMachine.TestCase


# ---------------------------------------------------------------- failing writes, resume


class _Faults:
    """Makes the log's fdatasync or pwrite fail while `on` (real files, a real errno)."""

    def __init__(self, monkeypatch, what: str, err: int, partial: bool = False) -> None:
        self.on = False
        self.calls = 0
        real = getattr(segments, what)

        def faulty(*args):
            if self.on:
                self.calls += 1
                if partial and what == "_pwrite":  # half the bytes reach the file first
                    fd, data, offset = args
                    real(fd, data[: max(1, len(data) // 2)], offset)
                raise OSError(err, os.strerror(err))
            return real(*args)

        monkeypatch.setattr(segments, what, faulty)


def _fail_next_batch(log, faults, payloads) -> list[Location]:
    """Append, let the writer fail on them, and wait until the log says so."""
    faults.on = True
    locs = [log.append(p)[0] for p in payloads]
    with pytest.raises(LogFailed):
        log.sync_now(timeout=10)
    return locs


@pytest.mark.parametrize(
    "what,err,partial",
    [("_fdatasync", errno.EIO, False), ("_pwrite", errno.ENOSPC, True)],
)
def test_failed_batch_is_cut_off_the_file_and_resumed_elsewhere(
    tmp_path, monkeypatch, what, err, partial
):
    faults = _Faults(monkeypatch, what, err, partial)
    errors: list[BaseException] = []
    log = SegmentLog.open(tmp_path, on_error=errors.append)
    good = [log.append(b"good%d" % i)[0] for i in range(5)]
    log.sync_now(timeout=10)
    durable = os.path.getsize(tmp_path / segment_name(good[0].segment))
    bad = _fail_next_batch(log, faults, [b"bad%d" % i * 50 for i in range(8)])
    assert errors and errors[0].errno == err
    # Nothing of the failed batch is left in the file: no half-written record to cut later.
    assert os.path.getsize(tmp_path / segment_name(good[0].segment)) == durable
    # Still readable from memory while failed; appends refused; a release is fine.
    assert log.read(bad[3]) == b"bad3" * 50
    log.release(bad[0])
    with pytest.raises(LogFailed):
        log.append(b"refused")
    faults.on = False
    moved: dict[Location, Location] = {}
    assert log.resume(lambda old, new, payload: moved.__setitem__(old, new)) == 7
    assert set(moved) == set(bad[1:]) and log.error is None
    assert all(new.segment > good[0].segment for new in moved.values())
    after = log.append(b"after")[0]
    log.sync_now(timeout=10)
    for i, old in enumerate(bad[1:], 1):
        assert log.read(moved[old]) == b"bad%d" % i * 50
    log.close()
    _, records = replay(tmp_path)
    got = [bytes(p) for _, p in records]
    assert got == [b"good%d" % i for i in range(5)] + [b"bad%d" % i * 50 for i in range(1, 8)] + [
        b"after"
    ]
    assert after.segment == moved[bad[1]].segment


def test_resume_while_the_fault_lasts_fails_again_then_succeeds(tmp_path, monkeypatch):
    faults = _Faults(monkeypatch, "_fdatasync", errno.EIO)
    failures = threading.Semaphore(0)
    log = SegmentLog.open(tmp_path, on_error=lambda exc: failures.release())
    locs = _fail_next_batch(log, faults, [b"x%d" % i for i in range(3)])
    assert failures.acquire(timeout=10)
    relocated: dict[Location, Location] = {}

    def relocate(old, new, payload):
        relocated[old] = new

    log.resume(relocate)  # the copies go to a new segment, whose fsync fails again
    assert failures.acquire(timeout=10) and log.error is not None
    faults.on = False
    log.resume(relocate)
    log.sync_now(timeout=10)
    current = {}
    for loc in locs:
        while loc in relocated:
            loc = relocated[loc]
        current[loc] = log.read(loc)
    assert sorted(current.values()) == [b"x0", b"x1", b"x2"]
    log.close()
    _, records = replay(tmp_path)
    assert [bytes(p) for _, p in records] == [b"x0", b"x1", b"x2"]


@pytest.mark.slow  # random faults: not in `make check`
def test_random_faults_and_resumes_keep_exactly_the_live_records(tmp_path, monkeypatch):
    """Appends, releases, rotations and failing fsyncs at random: replay == the live set."""
    rng = random.Random(7)
    faults = _Faults(monkeypatch, "_fdatasync", errno.EIO)
    log = SegmentLog.open(tmp_path, segment_size=4096, buffer_size=64 << 10)
    live: dict[Location, bytes] = {}
    failed = 0

    def relocate(old, new, payload):
        assert live.pop(old) == payload
        live[new] = payload

    for step in range(300):
        for _ in range(rng.randint(1, 20)):
            payload = b"%06d" % len(live) + rng.randbytes(rng.randint(0, 400))
            payload = step.to_bytes(2, "big") + payload
            live[log.append(payload)[0]] = payload
        for loc in rng.sample(sorted(live), k=min(len(live), rng.randint(0, 8))):
            log.release(loc)
            del live[loc]
        faults.on = rng.random() < 0.15
        try:
            log.sync_now(timeout=10)
        except LogFailed:
            failed += 1
            faults.on = rng.random() < 0.3  # sometimes the fault outlasts the first resume
            log.resume(relocate)
            if faults.on:
                with pytest.raises(LogFailed):
                    log.sync_now(timeout=10)
                faults.on = False
                log.resume(relocate)
            log.sync_now(timeout=10)
        if step % 50 == 0:
            log.compact(relocate)
    assert failed >= 10  # the faults fired: the log failed and resumed that often
    for loc, payload in live.items():
        assert log.read(loc) == payload
    log.close()
    _, records = replay(tmp_path, segment_size=4096)
    # Released records stay on disk until their segment goes; each live one is there once
    # (the copy a resume cut off its old file is not).
    found = [bytes(p) for _, p in records]
    assert len(set(found)) == len(found)
    assert set(live.values()) <= set(found)
