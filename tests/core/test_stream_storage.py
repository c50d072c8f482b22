"""Streams' memory and start-up, against real brokers with pika.

- Memory does not grow per message: the segment log counts a stream segment's records
  (no per-record liveness), the index is sparse, the tail and the shared ring are bounded.
- Start-up takes each complete segment from its summary file (``NNNNNNNN.idx``) without
  reading it (a clean stop sums up the active one too); a missing, torn or stale summary
  only means that segment is read.
- Retention drops a segment without reading it, with its summary.
- Consumers reading the same region share the messages built for them (fan-out).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pika
import pytest
from support.faultlib import BrokerProcess

from roarmq.broker.core import stream as stream_module
from roarmq.broker.store import segments
from roarmq.broker.testing import BrokerThread, ephemeral_config

pytestmark = pytest.mark.timeout(90)

ARGS = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 8192}
VALUES = ("emea", "apac", None)


def publish(conn, queue: str, n: int, start: int = 0) -> None:
    """Messages m<start>..; all but the last unconfirmed, the last confirmed on a second
    channel of the same connection: its confirm (an fsync of the stream) covers them all."""
    fast, confirmed = conn.channel(), conn.channel()
    confirmed.confirm_delivery()
    for i in range(start, start + n):
        value = VALUES[i % 3]
        headers = {"x-stream-filter-value": value} if value else None
        props = pika.BasicProperties(delivery_mode=2, headers=headers)
        (confirmed if i == start + n - 1 else fast).basic_publish("", queue, b"m%d" % i, props)
    fast.close()
    confirmed.close()


def read(target, queue: str, args: dict, count: int, timeout: float = 5.0) -> list[tuple]:
    """(offset, body) of up to `count` deliveries, on a connection of its own that it closes
    (closing a channel would nack what pika holds: a stream answers that with 540)."""
    conn = connect(target)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=count)  # no acks: never more than `count` in flight
    got: list[tuple] = []

    def on_message(c, m, props, body) -> None:
        got.append((props.headers["x-stream-offset"], body))

    ch.basic_consume(queue, on_message, arguments=args)
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    conn.close()
    return got[:count]


def stream_dir(data: Path) -> Path:
    (d,) = (data / "streams").iterdir()
    return d


def check_contents(target, n: int) -> None:
    got = read(target, "s", {"x-stream-offset": "first"}, n)
    assert got == [(i, b"m%d" % i) for i in range(n)]
    emea = read(target, "s", {"x-stream-offset": "first", "x-stream-filter": "emea"}, n // 3 + 1)
    assert [o for o, _ in emea] == list(range(0, n, 3))
    mid = read(target, "s", {"x-stream-offset": n // 2}, 5)
    assert mid[0] == (n // 2, b"m%d" % (n // 2))


@pytest.mark.parametrize("crash", [False, True], ids=["restart", "kill-9"])
def test_restart_takes_complete_segments_from_their_summaries(tmp_path, crash):
    n = 3000
    proc = BrokerProcess(tmp_path / "data").start()
    try:
        conn = connect(proc)
        conn.channel().queue_declare("s", durable=True, arguments=ARGS)
        publish(conn, "s", n)
        d = stream_dir(tmp_path / "data")
        segs = sorted(d.glob("*.seg"))
        idx = sorted(d.glob("*.idx"))
        assert len(segs) > 10
        # every segment but the active one has its summary; the active one at most a
        # partial one (written each quarter segment it grows)
        if idx and idx[-1].stem == segs[-1].stem:
            assert json.loads(idx.pop().read_text())["partial"] is True
        assert [p.stem for p in idx] == [p.stem for p in segs[:-1]]
        assert all("partial" not in json.loads(p.read_text()) for p in idx)
        if crash:
            proc.kill9()
        else:
            conn.close()
            proc.stop()
        # a torn summary, a missing one, and one that no longer matches its segment
        idx[0].write_text('{"version": 1, "segm')
        idx[1].unlink()
        stale = idx[2].read_text().replace('"records":', '"records":1', 1)
        idx[2].write_text(stale.replace('"size":', '"size":1', 1))
        proc.start()
        conn = connect(proc)
        ok = conn.channel().queue_declare("s", durable=True, arguments=ARGS)
        assert ok.method.message_count == n
        check_contents(proc, n)
        # the segments read at start-up got their summaries (again), the one active at the
        # stop included: appends go to a fresh segment (no file until its first write)
        assert {p.stem for p in d.glob("*.idx")} == {p.stem for p in d.glob("*.seg")}
        publish(conn, "s", 10, start=n)
        assert read(proc, "s", {"x-stream-offset": n}, 10) == [
            (n + i, b"m%d" % (n + i)) for i in range(10)
        ]
        conn.close()
    finally:
        proc.stop()


def connect(target) -> pika.BlockingConnection:
    url = target.url() if callable(target.url) else target.url
    return pika.BlockingConnection(pika.URLParameters(url))


def test_start_up_reads_only_segments_without_a_summary(tmp_path, monkeypatch):
    data = tmp_path / "d"
    with BrokerThread(ephemeral_config(data_dir=str(data))) as b:
        conn = connect(b)
        conn.channel().queue_declare("s", durable=True, arguments=ARGS)
        publish(conn, "s", 2000)
        conn.close()
    d = stream_dir(data)
    n_segments = len(list(d.glob("*.seg")))
    read_segments: list[int] = []
    original = segments.SegmentLog._replay_segment

    def counting(self, seg_id, *args, **kwargs):
        if Path(self.directory) == d:
            read_segments.append(seg_id)
        return original(self, seg_id, *args, **kwargs)

    monkeypatch.setattr(segments.SegmentLog, "_replay_segment", counting)
    # a clean stop summed up the active segment too
    assert len(list(d.glob("*.idx"))) == n_segments > 5
    last = max(d.glob("*.idx"))
    last.unlink()  # as after a crash: the segment active then has no summary
    with BrokerThread(ephemeral_config(data_dir=str(data))) as b:
        assert read_segments == [int(last.stem)]
        conn = connect(b)
        check_contents(b, 2000)
        q = b.call(lambda: b.broker.vhosts["/"].queues["s"])
        assert q.last_chunk > 0 and len(q.segs) == n_segments
        conn.close()
    read_segments.clear()
    with BrokerThread(ephemeral_config(data_dir=str(data))) as b:
        assert read_segments == []  # every segment summed up now
        conn = connect(b)
        check_contents(b, 2000)
        conn.close()


def test_memory_does_not_grow_per_message(tmp_path):
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d"))) as b:
        conn = connect(b)
        conn.channel().queue_declare("s", durable=True, arguments=ARGS)
        publish(conn, "s", 6000)
        q = b.call(lambda: b.broker.vhosts["/"].queues["s"])
        log = q.log
        # the log counts records per segment; it keeps nothing per record
        assert all(type(s.live) is segments._Count for s in log._segments.values())
        assert len(q._ix_off) <= 6000 // stream_module.INDEX_EVERY + len(q.segs)
        assert len(q._tail) <= stream_module.TAIL_TRIM_AT  # (trimmed to TAIL_RECORDS past it)
        assert q._ring_bytes <= stream_module.RING_BYTES
        conn.close()


def test_retention_drops_segments_and_their_summaries_without_reading(tmp_path, monkeypatch):
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d"))) as b:
        conn = connect(b)
        args = {**ARGS, "x-max-length-bytes": 40_000}
        conn.channel().queue_declare("s", durable=True, arguments=args)
        opened: list[str] = []
        real_open = open

        def watching_open(path, *a, **kw):
            if str(path).endswith(".seg"):
                opened.append(str(path))
            return real_open(path, *a, **kw)

        monkeypatch.setattr("builtins.open", watching_open)
        publish(conn, "s", 3000)
        monkeypatch.setattr("builtins.open", real_open)
        assert opened == []
        q = b.call(lambda: b.broker.vhosts["/"].queues["s"])
        assert q.first_offset > 0 and q.retained_bytes <= 40_000 + 2 * 8192
        d = stream_dir(tmp_path / "d")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the log deletes files after its next sync
            segs = {p.stem for p in d.glob("*.seg")}
            if len(segs) <= len(q.segs) + 1:
                break
            time.sleep(0.05)
        idx = {p.stem for p in d.glob("*.idx")}
        assert idx <= segs and int(min(idx)) >= q.segs[0].id
        got = read(b, "s", {"x-stream-offset": "first"}, 3000 - q.first_offset)
        assert [o for o, _ in got] == list(range(q.first_offset, 3000))
        conn.close()


@pytest.fixture
def built(monkeypatch) -> list[int]:
    """[how many times a stream built a message for delivery] (Stream._build counted)."""
    count = [0]
    original = stream_module.Stream._build

    def counting(self, record):
        count[0] += 1
        return original(self, record)

    monkeypatch.setattr(stream_module.Stream, "_build", counting)
    return count


def test_readers_of_the_same_region_share_what_is_built(tmp_path, built):
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d"))) as b:
        conn = connect(b)
        conn.channel().queue_declare("s", durable=True, arguments=ARGS)
        publish(conn, "s", 3000)
        built[0] = 0
        chs, got = [], [[] for _ in range(4)]
        for i in range(4):
            ch = conn.channel()
            ch.basic_qos(prefetch_count=300)
            ch.basic_consume(
                "s",
                lambda c, m, p, body, i=i: (
                    got[i].append(p.headers["x-stream-offset"]),
                    c.basic_ack(m.delivery_tag),
                ),
                arguments={"x-stream-offset": "first"},
            )
            chs.append(ch)
        deadline = time.monotonic() + 10
        while min(map(len, got)) < 3000 and time.monotonic() < deadline:
            conn.process_data_events(0.05)
        assert all(g == list(range(3000)) for g in got)
        assert built[0] <= 3000 * 1.2  # four readers, each message built about once
        conn.close()


def test_after_a_crash_the_active_segment_is_read_from_its_partial_summary_on(
    tmp_path, monkeypatch
):
    """The active segment's summary is written again as it grows (every quarter segment
    here), once its records are synced; a start-up that finds such a partial summary (a
    kill -9: no clean stop wrote the whole one) takes the bytes it covers from it and reads
    only the rest of the file."""
    data = tmp_path / "d"
    args = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 1 << 20}
    with BrokerThread(ephemeral_config(data_dir=str(data))) as b:
        conn = connect(b)
        conn.channel().queue_declare("s", durable=True, arguments=args)
        publish(conn, "s", 6000)  # ~360 KB: one segment, its partial summary at 256 KiB
        d = stream_dir(data)
        (seg,) = d.glob("*.seg")
        summary = seg.with_suffix(".idx")
        partial = json.loads(summary.read_text())
        assert partial["partial"] is True and 0 < partial["size"] < seg.stat().st_size
        saved = summary.read_bytes()
        publish(conn, "s", 500, start=6000)
        conn.close()
    summary.write_bytes(saved)  # as after a kill -9: the last partial summary stands
    reads: list[tuple] = []
    original = segments.SegmentLog._replay_segment

    def recording(self, seg_id, report, copy=True, prefix=None):
        if Path(self.directory) == d:
            reads.append((seg_id, prefix))
        return original(self, seg_id, report, copy, prefix)

    monkeypatch.setattr(segments.SegmentLog, "_replay_segment", recording)
    with BrokerThread(ephemeral_config(data_dir=str(data))) as b:
        sums = (partial["size"], partial["records"], partial["bytes"] - 12 * partial["records"])
        assert reads == [(int(seg.stem), sums)]
        conn = connect(b)
        ok = conn.channel().queue_declare("s", durable=True, arguments=args)
        assert ok.method.message_count == 6500
        check_contents(b, 6500)
        assert not json.loads(summary.read_text()).get("partial")  # complete now
        publish(conn, "s", 10, start=6500)
        assert read(b, "s", {"x-stream-offset": 6500}, 10) == [
            (6500 + i, b"m%d" % (6500 + i)) for i in range(10)
        ]
        conn.close()


def test_ten_readers_of_one_channel_stay_within_what_the_ring_holds(tmp_path, monkeypatch, built):
    """Ten consumers from `first` on one channel, acked with one multiple ack per batch (as a
    fan-out client does), over a stream far longer than the ring holds (made small here):
    the readers furthest behind are served first, so they stay together and each message is
    built about once; the ring keeps the newest offsets built, oldest evicted first."""
    monkeypatch.setattr(stream_module, "RING", 1 << 10)
    monkeypatch.setattr(stream_module, "RING_BYTES", 300 * (stream_module.RING_SLOT_BYTES + 5))
    n = 4000
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d"))) as b:
        conn = connect(b)
        conn.channel().queue_declare("s", durable=True, arguments=ARGS)
        publish(conn, "s", n)
        built[0] = 0
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)
        got: list[list[int]] = [[] for _ in range(10)]
        tags = [0, 0]  # the last delivery tag, and the last one acked

        def ack_all() -> None:
            if tags[0] > tags[1]:
                ch.basic_ack(tags[0], multiple=True)
                tags[1] = tags[0]

        def on_message(c, m, props, body, i):
            got[i].append(props.headers["x-stream-offset"])
            tags[0] = m.delivery_tag
            if tags[0] - tags[1] >= 150:
                ack_all()

        for i in range(10):
            ch.basic_consume(
                "s",
                lambda c, m, p, body, i=i: on_message(c, m, p, body, i),
                arguments={"x-stream-offset": "first"},
            )
        deadline = time.monotonic() + 30
        while min(map(len, got)) < n and time.monotonic() < deadline:
            conn.process_data_events(0.05)
            ack_all()  # what the last read brought
        assert all(g == list(range(n)) for g in got)
        assert built[0] <= n * 1.5, built[0]  # ten readers: each message built about once
        q = b.call(lambda: b.broker.vhosts["/"].queues["s"])
        assert q._ring_bytes <= stream_module.RING_BYTES
        conn.close()
