"""broker/archive.py on its own: what a row holds, files and partitions, flushing, dropping."""

from __future__ import annotations

import asyncio
import datetime
import shutil
import threading
import time
from decimal import Decimal
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from roarmq.broker.archive import (
    SCHEMA,
    Archive,
    is_part_name,
    live_files,
    partitions,
    read_journal,
)
from roarmq.broker.config import ArchiveConfig
from roarmq.broker.core.message import Message
from roarmq.broker.ops.clock import VirtualClock
from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import BasicProperties
from roarmq.protocol.tables import decode_table_typed, encode_table

pytestmark = pytest.mark.timeout(60)


class FakeQueue:
    def __init__(self, name: str) -> None:
        self.name = name


def message(exchange="ex", key="k", props=None, body=b"body") -> Message:
    props = props or BasicProperties()
    return Message(exchange, key, ContentHeader.from_properties(props, body_size=len(body)), body)


def config(tmp_path: Path, **kw) -> ArchiveConfig:
    return ArchiveConfig(enabled=True, dir=str(tmp_path / "archive"), **kw)


def read_all(root: Path) -> list[dict]:
    rows = []
    for _, _, directory in partitions(root):
        for path in live_files(directory):
            rows += pq.read_table(path).to_pylist()
    return rows


def test_a_row_holds_the_envelope_exactly(tmp_path):
    headers = {
        "int": 7,
        "long": 2**40,
        "neg": -3,
        "float": 1.5,
        "str": "text",
        "bytes": b"\xff\x00",
        "bool": True,
        "none": None,
        "decimal": Decimal("12.34"),
        "stamp": datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        "array": [1, "two", [3.0]],
        "table": {"nested": {"deep": False}},
    }
    props = BasicProperties(
        content_type="application/json",
        content_encoding="gzip",
        headers=headers,
        delivery_mode=2,
        priority=9,
        correlation_id="c-1",
        reply_to="replies",
        expiration="60000",
        message_id="m-1",
        timestamp=datetime.datetime(2024, 5, 1, 12, tzinfo=datetime.UTC),
        type="order",
        user_id="guest",
        app_id="shop",
        cluster_id="c",
    )
    clock = VirtualClock(wall_start=1_714_564_800.25)  # 2024-05-01T12:00:00.25Z
    archive = Archive(config(tmp_path), clock=clock)
    archive.record("/", message(props=props), frozenset({FakeQueue("b"), FakeQueue("a")}))
    archive.record("/", message(exchange="", key="nowhere"), ())
    archive.close()
    rows = read_all(tmp_path / "archive")
    assert len(rows) == 2
    full, bare = rows
    assert full["ts"] == datetime.datetime(2024, 5, 1, 12, 0, 0, 250000, tzinfo=datetime.UTC)
    assert (full["vhost"], full["exchange"], full["routing_key"]) == ("/", "ex", "k")
    # the table's bytes as sent: every field type survives, not just its value
    assert full["headers"] == encode_table(headers)
    assert decode_table_typed(full["headers"])[0] == decode_table_typed(encode_table(headers))[0]
    for name in (
        "content_type",
        "content_encoding",
        "correlation_id",
        "reply_to",
        "expiration",
        "message_id",
        "type",
        "user_id",
        "app_id",
        "cluster_id",
        "delivery_mode",
        "priority",
    ):
        assert full[name] == getattr(props, name), name
    assert full["timestamp"] == props.timestamp
    assert full["body_size"] == 4 and full["body"] is None
    assert full["queues"] == ["a", "b"] and full["queue_count"] == 2
    assert not full["unroutable"]
    assert bare["headers"] is None and bare["content_type"] is None
    assert bare["queues"] == [] and bare["queue_count"] == 0 and bare["unroutable"]


def test_body_is_kept_up_to_max_body_bytes(tmp_path):
    archive = Archive(config(tmp_path, max_body_bytes=3))
    archive.record("/", message(body=b"abcdef"), ())
    paged = message(body=b"xyz")
    paged.body = None  # paged out to the message store: only the size is known
    archive.record("/", paged, ())
    archive.close()
    rows = read_all(tmp_path / "archive")
    assert [(r["body"], r["body_size"]) for r in rows] == [(b"abc", 6), (None, 3)]


def test_partitions_by_vhost_and_hour(tmp_path):
    clock = VirtualClock(wall_start=1_714_564_800.0)
    archive = Archive(config(tmp_path, batch_rows=10), clock=clock)
    q = frozenset({FakeQueue("q")})
    for _ in range(2):
        for i in range(35):
            archive.record("/" if i % 2 else "v/2", message(key=f"k{i}"), q)
        clock.advance(3600)
        archive.stamp()  # what the connection does as each read arrives
    archive.close()
    root = tmp_path / "archive"
    found = [(vhost, hour, d.relative_to(root).as_posix()) for vhost, hour, d in partitions(root)]
    assert found == [
        ("/", "2024-05-01T12", "vhost=%2F/hour=2024-05-01T12"),
        ("/", "2024-05-01T13", "vhost=%2F/hour=2024-05-01T13"),
        ("v/2", "2024-05-01T12", "vhost=v%2F2/hour=2024-05-01T12"),
        ("v/2", "2024-05-01T13", "vhost=v%2F2/hour=2024-05-01T13"),
    ]
    for _, _, directory in partitions(root):
        names = sorted(p.name for p in directory.iterdir())
        assert len(names) == 1 and is_part_name(names[0]), names  # no journal, no temporary
    rows = read_all(root)
    assert len(rows) == 70
    assert pq.read_schema(next(root.glob("*/*/*.parquet"))) == SCHEMA
    assert archive.stats()["written_rows"] == 70
    assert archive.stats()["written_files"] == 4


def test_names_of_data_files():
    assert is_part_name("part-20240501T120000-abcdef-00000001.parquet")
    for name in (
        ".part-20240501T120000-abcdef-00000001.journal",
        ".part-20240501T120000-abcdef-00000001.parquet.tmp",
        "part-x.parquet",
        "notes.txt",
    ):
        assert not is_part_name(name)


def test_a_crash_loses_at_most_the_batch_being_filled(tmp_path):
    """Kill the writer mid-partition (no roll): the next start replays the journal."""
    archive = Archive(config(tmp_path, batch_rows=10))
    for i in range(25):
        archive.record("/", message(key=f"k{i}"), ())
    archive._handoff()  # what the 1 s timer does: the partial batch of 5 goes too
    deadline = time.monotonic() + 10
    while archive.stats()["written_rows"] < 25 and time.monotonic() < deadline:
        time.sleep(0.02)
    snapshot = tmp_path / "after-crash"
    shutil.copytree(tmp_path / "archive", snapshot)  # the disk as a crash would leave it
    archive.close()
    journals = list(snapshot.glob("*/*/.part-*.journal"))
    assert len(journals) == 1 and not list(snapshot.glob("*/*/part-*.parquet"))
    # a torn last batch too: cut the journal inside its last message
    data = journals[0].read_bytes()
    journals[0].write_bytes(data[:-40])
    recovered = Archive(ArchiveConfig(enabled=True, dir=str(snapshot)))
    assert recovered.stats()["recovered_rows"] == 20  # the torn batch of 5 is the loss
    recovered.close()
    keys = [r["routing_key"] for r in read_all(snapshot)]
    assert keys == [f"k{i}" for i in range(20)]
    assert not list(snapshot.glob("*/*/.*"))  # journal replayed and removed


def test_start_up_replays_only_unrolled_journals_and_drops_temporaries(tmp_path):
    archive = Archive(config(tmp_path))
    archive.record("/", message(), ())
    archive.close()
    directory = next(iter(partitions(tmp_path / "archive")))[2]
    data_file = live_files(directory)[0]
    # a crash after the rename but before the journal was deleted: the journal is stale
    stale = directory / f".{data_file.stem}.journal"
    stale.write_bytes(b"whatever")
    tmp = directory / ".part-20240501T120000-abcdef-00000009.parquet.tmp"
    tmp.write_bytes(b"x")
    Archive(config(tmp_path)).close()
    assert [p.name for p in directory.iterdir()] == [data_file.name]
    assert len(read_all(tmp_path / "archive")) == 1


async def test_a_partial_batch_reaches_the_journal_within_seconds(tmp_path):
    archive = Archive(config(tmp_path, batch_rows=1000))
    archive.record("/", message(), ())
    deadline = time.monotonic() + 10
    while archive.stats()["written_rows"] < 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert archive.stats()["written_rows"] == 1  # without close(): a crash now loses nothing
    journal = next((tmp_path / "archive").glob("*/*/.part-*.journal"))
    assert sum(b.num_rows for b in read_journal(journal)) == 1
    archive.close()


async def test_roll_minutes_rolls_an_open_partition(tmp_path):
    clock = VirtualClock(wall_start=1_714_564_800.0)
    archive = Archive(config(tmp_path, batch_rows=5, roll_minutes=1), clock=clock)
    for _ in range(10):
        archive.record("/", message(), ())
    root = tmp_path / "archive"
    deadline = time.monotonic() + 10
    while archive.stats()["written_rows"] < 10 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not read_all(root)  # still in the journal
    clock.advance(61)
    while archive.stats()["written_files"] < 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert len(read_all(root)) == 10
    archive.record("/", message(), ())  # the same hour again: a new file
    archive.close()
    assert archive.stats()["written_files"] == 2
    assert len(read_all(root)) == 11


def test_a_writer_that_falls_behind_drops_the_oldest_batch(tmp_path, monkeypatch):
    started, release = threading.Event(), threading.Event()
    original = Archive._write_batch

    def slow(self, rows):
        started.set()
        release.wait(10)
        original(self, rows)

    monkeypatch.setattr(Archive, "_write_batch", slow)
    archive = Archive(config(tmp_path, batch_rows=10, max_pending_batches=2))
    for _ in range(10):
        archive.record("/", message(key="b0"), ())  # batch 0: the writer takes it and stalls
    assert started.wait(10)
    for b in range(1, 6):  # batches 1..5 queue up; only 2 may wait
        for _ in range(10):
            archive.record("/", message(key=f"b{b}"), ())
    assert (archive.dropped_batches, archive.dropped_rows) == (3, 30)
    release.set()
    archive.close()
    assert sorted({r["routing_key"] for r in read_all(tmp_path / "archive")}) == ["b0", "b4", "b5"]
    assert archive.stats()["written_rows"] == 30


def test_record_is_cheap(tmp_path):
    """The loop's share: well under a microsecond a publish (the writer works elsewhere)."""
    archive = Archive(config(tmp_path, batch_rows=1_000_000, max_pending_batches=4))
    msg, queues = message(), frozenset({FakeQueue("q")})
    record = archive.record
    n = 100_000
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            record("/", msg, queues)
        best = min(best, (time.perf_counter() - t0) / n)
    archive.close()
    assert best < 2e-6, f"{best * 1e9:.0f} ns per record"
