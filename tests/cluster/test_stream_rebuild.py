"""A new leader's streams rebuilt from the vhost's replicated log (replicated_store.py,
`_StreamsRebuild`): each record once, in offset order, whatever order and how many times
the log holds them (a checkpoint's copy interleaved with new appends, an older copy above
the trim point), and only the streams the last definitions still name."""

from __future__ import annotations

import asyncio
import random

from roarmq.broker.cluster import replicated_definitions as definitions
from roarmq.broker.cluster.replicated_store import (
    _STREAM_ID,
    _STREAM_START,
    STREAM_START_TAG,
    STREAM_TAG,
    ReplicatedVhostStore,
    rebuild_from_log,
)
from roarmq.broker.core.stream import _RECORD, record_offset
from roarmq.broker.replog.records import SegmentRecordStore
from roarmq.broker.replog.replication import ReplicationLeader
from roarmq.broker.store.segments import SegmentLog


def stored(off: int) -> bytes:
    """A stream record as a stream stores it (no exchange, key or header), body b'b<off>'."""
    return _RECORD.pack(off, 1000 + off, 0, 0, 0, 0) + b"b%d" % off


def copy(sid: int, off: int) -> bytes:
    return STREAM_TAG + _STREAM_ID.pack(sid) + stored(off)


def start(sid: int, first: int) -> bytes:
    return STREAM_START_TAG + _STREAM_START.pack(sid, first)


def defs(*sids: int) -> bytes:
    queues = [
        {"id": s, "name": f"s{s}", "auto_delete": False, "arguments": definitions._table({})}
        for s in sids
    ]
    return definitions.encode({"exchanges": [], "queues": queues, "bindings": []})


def rebuilt(tmp_path, payloads: list[bytes]) -> dict[int, list[int]]:
    records = SegmentRecordStore(tmp_path / "log")
    for offset, payload in enumerate(payloads, 1):
        records.append(offset, payload)
    rebuild_from_log(records, tmp_path)
    records.close()
    out = {}
    root = tmp_path / "streams"
    for d in sorted(root.iterdir()) if root.exists() else ():
        with SegmentLog.open(d) as log:
            out[int(d.name)] = [record_offset(p) for _, p in log.replay()]
    return out


def test_in_order_once_through_a_checkpoint_copy(tmp_path):
    log = [defs(1, 2)] + [copy(1, o) for o in range(0, 50)] + [copy(2, o) for o in range(0, 5)]
    # a checkpoint from 20 (retention dropped 0..19): its copy of 20..49 interleaved with
    # new appends 50..69, some of them before the copy of the records they follow
    log.append(start(1, 20))
    old = [copy(1, o) for o in range(20, 50)]
    new = [copy(1, o) for o in range(50, 70)]
    rng = random.Random(7)
    while old or new:
        pick = old if old and (not new or rng.random() < 0.6) else new
        log.append(pick.pop(0))
    log += [start(2, 0)] + [copy(2, o) for o in range(0, 5)] + [copy(2, 5)]
    got = rebuilt(tmp_path, log)
    assert got[1] == list(range(0, 70))  # the older copy above the trim point, then on
    assert got[2] == list(range(0, 6))


def test_trimmed_log_starts_at_the_checkpoint_and_dropped_streams_go(tmp_path):
    log = [defs(1, 3), start(1, 500)]
    log += [copy(1, o) for o in (500, 501, 503, 502, 504)]  # one append overtook the copy
    log += [start(3, 0)] + [copy(3, o) for o in range(3)]
    log.append(defs(1))  # stream 3 deleted since
    got = rebuilt(tmp_path, log)
    assert got == {1: [500, 501, 502, 503, 504]}


def test_a_gap_left_by_retention_during_a_copy_is_closed_in_order(tmp_path):
    # the copy started at 10, retention dropped 10..14 before they were copied
    log = [defs(1), start(1, 10)] + [copy(1, o) for o in (20, 15, 16, 17, 18, 19, 21)]
    assert rebuilt(tmp_path, log) == {1: [15, 16, 17, 18, 19, 20, 21]}


class CopiedStream:
    """What a leader's checkpoint reads of a stream (replicated_store.py, `_copy_stream`):
    it retains offsets `first`.. in its files, which its log writes a moment after it is
    asked to; a publisher appends one more record in that moment (the record's copy goes
    into the vhost's log at once, as `Stream` does)."""

    def __init__(self, store, sid: int, first: int, count: int) -> None:
        self.store, self.store_id, self.deleted, self.tracked = store, sid, False, {}
        self.first_offset, self.next_offset = first, first + count
        self.records = [stored(off) for off in range(first, first + count)]
        self.log, self.error, self.last_token, self.synced_token = self, None, count, count - 1

    def schedule_sync(self) -> None:
        self.store.loop.call_soon(self._publish_then_written)

    def _publish_then_written(self) -> None:
        payload = stored(self.next_offset)
        self.store.replicate_stream(self, payload)
        self.records.append(payload)
        self.next_offset += 1
        self.last_token += 1
        self.synced_token = self.last_token

    def stored_records(self, start: int, end: int):
        return [p for p in self.records if start <= record_offset(p) < end]

    def replication_confirmed(self, offset: int) -> bool:
        return True


async def test_a_record_appended_while_a_checkpoint_waits_for_the_files_keeps_the_history(
    tmp_path,
):
    """The copy of a stream waits for its files to hold what it copies; a record published
    meanwhile goes into the log after the checkpoint's base. A new leader whose log was
    trimmed at that base still rebuilds the whole retained history, not just the records
    from that one on (the hunt's test_stream_history_survives_checkpoints_and_trimming
    kept one segment of four)."""
    records = SegmentRecordStore(tmp_path / "log")
    leader = ReplicationLeader("/", 7, records, node="n1", min_copies=1)
    store = ReplicatedVhostStore(
        tmp_path / "messages",
        replication=leader,
        may_confirm=lambda: True,
        snapshot=lambda: definitions.decode(defs(1)),
        loop=asyncio.get_running_loop(),
        streams=lambda: [stream],
    )
    stream = CopiedStream(store, 1, 1000, 300)  # retention dropped 0..999
    try:
        base = records.last_offset + 1
        assert await store.checkpoint()
        assert stream.next_offset == 1301  # one record was published during the copy
        checkpointed = SegmentRecordStore(tmp_path / "trimmed")  # the log from the base on
        for offset, payload in records.read(base, 1 << 30):
            checkpointed.append(offset, payload)
        rebuild_from_log(checkpointed, tmp_path)
        checkpointed.close()
        with SegmentLog.open(tmp_path / "streams" / "1") as log:
            assert [record_offset(p) for _, p in log.replay()] == list(range(1000, 1301))
    finally:
        await leader.stop()
        records.close()
