"""One contract, two record stores: SegmentRecordStore (broker/replog/records.py, on disk) and
MemoryRecordStore (tests/support/memory_records.py, in memory, for the replication seam's
tests). The same behaviour tests run on both (the `store` fixture), and a property test
applies one random sequence of operations to both and compares every observable after each
step: the memory store may stand in for the segment store only while it answers the same.

What only the segment store has (a replay after a restart, generations, compaction, the
COPY file) is tested in test_record_store.py."""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.memory_records import ENVELOPE_BYTES, MemoryRecordStore

from roarmq.broker.replog.records import SegmentRecordStore, checkpoint_record, epoch_record

Store = SegmentRecordStore | MemoryRecordStore


@pytest.fixture(params=["segment", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    opened: Store
    if request.param == "segment":
        opened = SegmentRecordStore(tmp_path / "log")
    else:
        opened = MemoryRecordStore()
    yield opened
    opened.close()


def fill(store: Store, upto: int, tag: bytes = b"x") -> None:
    while store.last_offset < upto:
        offset = store.last_offset + 1
        store.append(offset, tag + b"%d" % offset)


def test_an_empty_log_starts_at_1_and_holds_nothing(store):
    assert (store.first_offset, store.last_offset, store.durable_offset) == (1, 0, 0)
    assert store.records() == [] and store.read(1, 1 << 20) == []
    assert store.last_epoch() == 0 and store.epoch_starts() == []
    assert store.end_of_epoch(3) == 0
    assert isinstance(store.copy_id, str) and store.copy_id


def test_records_read_back_in_order_and_a_gap_is_refused(store):
    fill(store, 5)
    for wrong in (7, 5, 0):
        with pytest.raises(ValueError, match="does not follow 5"):
            store.append(wrong, b"x")
    expected = [(offset, b"x%d" % offset) for offset in range(1, 6)]
    assert store.records() == expected
    assert all(type(payload) is bytes for _, payload in store.records())
    assert store.read(3, 1 << 20) == expected[2:]
    assert list(store.scan()) == expected
    assert store.payload_at(4) == b"x4"
    with pytest.raises(KeyError):
        store.payload_at(6)
    assert (store.first_offset, store.last_offset) == (1, 5)


def test_sync_makes_everything_appended_durable(store):
    fill(store, 3)
    assert store.durable_offset == 0
    assert store.sync() == 3 and store.durable_offset == 3
    fill(store, 4)
    assert store.durable_offset == 3
    assert store.sync() == 4 and store.durable_offset == 4


def test_epoch_records_mark_where_each_epoch_starts(store):
    store.append(1, epoch_record(3))
    fill(store, 9)
    store.append(10, epoch_record(3))  # the same epoch again (a checkpoint's): no new start
    fill(store, 19)
    store.append(20, epoch_record(5))
    fill(store, 25)
    store.append(26, b"E?")  # too short for an epoch record: an opaque payload
    assert store.epoch_starts() == [(1, 3), (20, 5)]
    assert store.last_epoch() == 5
    ends = {epoch: store.end_of_epoch(epoch) for epoch in (2, 3, 4, 5, 9)}
    assert ends == {2: 0, 3: 19, 4: 19, 5: 26, 9: 26}


def test_a_checkpoint_trims_below_its_base_once_it_is_reached(store):
    store.append(1, epoch_record(2))
    fill(store, 10)
    store.append(11, epoch_record(4))
    fill(store, 24)
    store.append(25, checkpoint_record(15, b"the owner's"))  # 15..24 hold the whole state
    fill(store, 30, b"n")
    store.trim_checkpointed(24)  # below the checkpoint record: nothing to trim yet
    assert store.first_offset == 1 and store.trimmed_by == 0
    store.trim_checkpointed(25)
    assert store.first_offset == 15 and store.trimmed_by == 25
    assert store.epoch_starts() == [(15, 4)]  # the epoch in force at the new first offset
    assert store.read(1, 1 << 20)[0] == (15, b"x15")
    assert [offset for offset, _ in store.records()] == list(range(15, 31))
    store.append(31, checkpoint_record(10))  # a base below the first offset: nothing goes
    store.trim_checkpointed(31)
    assert store.first_offset == 15 and store.trimmed_by == 25


def test_truncate_drops_the_tail_and_the_epochs_in_it(store):
    store.append(1, epoch_record(3))
    fill(store, 10)
    store.append(11, epoch_record(5))
    fill(store, 20)
    assert store.sync() == 20
    copy = store.copy_id
    store.truncate(30)  # at or above the last offset: nothing to drop
    assert store.last_offset == 20
    store.truncate(15)
    assert (store.last_offset, store.durable_offset) == (15, 15)
    assert store.epoch_starts() == [(1, 3), (11, 5)]
    store.truncate(8)
    assert store.epoch_starts() == [(1, 3)] and store.end_of_epoch(3) == 8
    assert store.records() == [(1, epoch_record(3))] + [(o, b"x%d" % o) for o in range(2, 9)]
    assert store.copy_id == copy  # the same copy, shorter
    store.append(9, b"y9")
    assert store.last_offset == 9


@pytest.mark.parametrize(
    ("last", "starts_over"),
    [(23, False), (22, True), (10, True)],
    ids=["keeps-the-checkpoint", "below-the-checkpoint", "below-the-first-offset"],
)
def test_a_truncation_that_takes_the_trimming_checkpoint_starts_the_log_over(
    store, last, starts_over
):
    store.append(1, epoch_record(5))
    fill(store, 20)
    store.append(21, epoch_record(5))
    store.append(22, b"copy")
    store.append(23, checkpoint_record(21))
    store.append(24, b"after")
    store.sync()
    store.trim_checkpointed(23)
    assert (store.first_offset, store.trimmed_by) == (21, 23)
    copy = store.copy_id
    store.truncate(last)
    if starts_over:  # what is left is not a whole state: everything goes (a snapshot next)
        assert (store.first_offset, store.last_offset, store.durable_offset) == (1, 0, 0)
        assert store.records() == [] and store.epoch_starts() == []
        assert store.trimmed_by == 0 and store.copy_id != copy
        store.append(1, b"again")
    else:
        assert (store.first_offset, store.last_offset) == (21, 23)
        assert store.copy_id == copy


def test_reset_voids_everything_and_makes_a_new_copy(store):
    store.append(1, epoch_record(2))
    fill(store, 10)
    store.append(11, checkpoint_record(5))
    store.sync()
    copy = store.copy_id
    store.reset(8)
    assert (store.first_offset, store.last_offset, store.durable_offset) == (8, 7, 7)
    assert store.records() == [] and store.epoch_starts() == [] and store.last_epoch() == 0
    assert store.copy_id != copy
    store.trim_checkpointed(11)  # the checkpoint went with the rest
    assert store.first_offset == 8
    with pytest.raises(ValueError):
        store.append(1, b"x")
    store.append(8, b"snapshot")
    assert store.sync() == 8
    assert store.records() == [(8, b"snapshot")]


def test_a_read_stops_near_max_bytes_but_returns_at_least_one_record(store):
    for offset in range(1, 21):
        store.append(offset, b"%03d" % offset + b"." * 97)  # 100 bytes each
    assert [o for o, _ in store.read(1, 0)] == [1]
    assert [o for o, _ in store.read(7, 1)] == [7]
    batch = store.read(1, 1000)
    assert [o for o, _ in batch] == list(range(1, len(batch) + 1))
    # It ends with the record that brings it to max_bytes, each counted with its envelope.
    counted = [ENVELOPE_BYTES + len(payload) for _, payload in batch]
    assert sum(counted[:-1]) < 1000 <= sum(counted)
    assert [o for o, _ in store.read(5, 1 << 20)] == list(range(5, 21))
    assert store.read(21, 100) == []


async def test_sync_soon_answers_each_caller_with_what_is_durable(store):
    """As the follower asks (replication.py's `_sync_and_ack`): `done` may come on another
    thread (the segment log's writer), so it is handed to the loop thread-safely."""
    loop = asyncio.get_running_loop()

    async def sync_soon() -> tuple[int, BaseException | None]:
        answered: asyncio.Future[tuple[int, BaseException | None]] = loop.create_future()

        def done(offset: int, error: BaseException | None) -> None:
            loop.call_soon_threadsafe(answered.set_result, (offset, error))

        store.sync_soon(done)
        return await asyncio.wait_for(answered, 5)

    fill(store, 5)
    assert await sync_soon() == (5, None)
    assert store.durable_offset == 5
    fill(store, 7)
    first, second = await asyncio.gather(sync_soon(), sync_soon())
    assert first == second == (7, None) and store.durable_offset == 7
    assert await sync_soon() == (7, None)  # nothing new: answered all the same


def test_sync_soon_without_a_running_loop_answers_too(store):
    answered: list[tuple[int, BaseException | None]] = []
    called = threading.Event()

    def done(offset: int, error: BaseException | None) -> None:
        answered.append((offset, error))
        called.set()

    fill(store, 3)
    store.sync_soon(done)
    assert called.wait(5)
    assert answered == [(3, None)] and store.durable_offset == 3


# -- both stores, one random sequence of operations ------------------------------------------

#: The operations, appends, checkpoints and trims more often than the rest (a log to trim,
#: and trims that reach a checkpoint); each comes with a number from 0 to 100 (`apply`).
KINDS = ["append"] * 3 + ["checkpoint", "trim"] * 2
KINDS += ["epoch", "sync", "truncate", "reset", "misplaced"]
OPERATIONS = st.tuples(st.sampled_from(KINDS), st.integers(0, 100))


def _between(low: int, high: int, percent: int) -> int:
    return low + (max(high, low) - low) * percent // 100


def apply(store: Store, operation: tuple[str, int], step: int) -> object:
    """One operation; what it returned, or the kind of error it raised. Its number says how
    many records, which epoch, where in the offsets held (a percentage of the range the
    operation may touch, so that it stays meaningful), or how far below the newest record
    a trim stops (near it: the checkpoints are mostly the newest records)."""
    kind, number = operation
    first, last = store.first_offset, store.last_offset
    try:
        if kind == "append":
            for offset in range(last + 1, last + 2 + number % 8):
                store.append(offset, b"p%d-%d" % (step, offset))
        elif kind == "epoch":
            store.append(last + 1, epoch_record(1 + number % 5))
        elif kind == "checkpoint":
            base = _between(max(1, first - 1), last + 1, number)
            store.append(last + 1, checkpoint_record(base, b"state"))
        elif kind == "sync":
            return store.sync()
        elif kind == "trim":
            store.trim_checkpointed(last - number % 5)
        elif kind == "truncate":
            store.truncate(_between(max(0, first - 3), last, number))
        elif kind == "reset":
            store.reset(_between(1, last + 5, number))
        else:
            store.append(last + 1 + (-3, -1, 2, 5)[number % 4], b"misplaced")
    except ValueError as exc:
        return type(exc)
    return None


def observe(store: Store) -> dict[str, object]:
    return {
        "offsets": (store.first_offset, store.last_offset, store.durable_offset),
        "records": store.records(),
        "epoch_starts": store.epoch_starts(),
        "last_epoch": store.last_epoch(),
        "ends_of_epochs": [store.end_of_epoch(epoch) for epoch in range(7)],
        "trimmed_by": store.trimmed_by,
        "batches": [store.read(store.first_offset, size) for size in (0, 20, 60, 200)],
    }


@settings(max_examples=100, deadline=None)
@given(operations=st.lists(OPERATIONS, min_size=10, max_size=60))
def test_both_stores_answer_the_same_to_any_sequence_of_operations(operations):
    with tempfile.TemporaryDirectory() as directory:
        # No fsync: what is compared is what each store answers, not what survives a crash.
        segment = SegmentRecordStore(Path(directory) / "log", segment_size=4096, fsync=False)
        memory = MemoryRecordStore()
        try:
            for step, operation in enumerate(operations):
                copies = segment.copy_id, memory.copy_id
                outcomes = apply(segment, operation, step), apply(memory, operation, step)
                assert outcomes[0] == outcomes[1], (step, operation)
                assert observe(memory) == observe(segment), (step, operation)
                renewed = segment.copy_id != copies[0], memory.copy_id != copies[1]
                assert renewed[0] == renewed[1], (step, operation)
        finally:
            segment.close()
