"""The worker's side of the pipeline without Spark: how the archive is dealt into units, and
what one worker's pass over its units writes and counts (``pipeline.jobs``)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from roarmq.broker.archive import Archive
from roarmq.broker.config import ArchiveConfig
from roarmq.broker.core.message import Message
from roarmq.broker.ops.clock import VirtualClock
from roarmq.pipeline import jobs
from roarmq.pipeline.definitions import parse_definitions
from roarmq.pipeline.reader import ArchiveScan, scan_archive
from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import BasicProperties

START = 1_714_521_600  # 2024-05-01T00:00:00Z


def test_units_own_whole_partitions_balanced_by_rows():
    scan = ArchiveScan(Path("/a"))
    sizes = {("/", "2024-05-01T00"): [900, 100], ("/", "2024-05-01T01"): [500]}
    sizes |= {("v2", f"2024-05-01T0{h}"): [300, 0] for h in range(4)}
    for (vhost, hour), groups in sizes.items():
        for i, rows in enumerate(groups):
            path = Path(f"/a/vhost={vhost}/hour={hour}/part-{i}.parquet")
            scan.row_groups[path] = [rows, 50] if rows else [0]
            scan.partition[path] = (vhost, hour)
            scan.rows += rows + (50 if rows else 0)
    units = jobs.plan_units(scan, 3)
    assert [u["index"] for u in units] == [0, 1, 2]
    where = Counter((p["vhost"], p["hour"]) for u in units for p in u["partitions"])
    # every partition with rows lands in exactly one unit, with all its files' row groups
    assert set(where) == set(sizes) and set(where.values()) == {1}
    hour0 = next(p for u in units for p in u["partitions"] if p["hour"] == "2024-05-01T00")
    assert [(Path(f).name, g) for f, g in hour0["files"]] == [
        ("part-0.parquet", [0, 1]),
        ("part-1.parquet", [0, 1]),
    ]
    empty = next(p for u in units for p in u["partitions"] if p["vhost"] == "v2")
    assert [g for _, g in empty["files"]] == [[0, 1]]  # the empty file's only row group skipped
    loads = sorted(
        sum(sum(scan.row_groups[Path(f)]) for p in u["partitions"] for f, _ in p["files"])
        for u in units
    )
    assert loads == [900, 1050, 1100]  # largest first onto the lightest unit


def test_big_archives_get_more_units_than_cores(monkeypatch):
    monkeypatch.setattr(jobs, "_UNIT_ROWS", 1000)
    scan = ArchiveScan(Path("/a"))
    for h in range(10):
        path = Path(f"/a/vhost=%2F/hour=2024-05-01T0{h}/part-0.parquet")
        scan.row_groups[path] = [400]
        scan.partition[path] = ("/", f"2024-05-01T0{h}")
        scan.rows += 400
    assert len(jobs.plan_units(scan, 1)) == 4


DEFS = {
    "vhosts": [{"name": "/"}],
    "exchanges": [{"name": "x", "vhost": "/", "type": "direct", "arguments": {}}],
    "queues": [{"name": q, "vhost": "/", "arguments": {}} for q in ("q1", "q2")],
    "bindings": [
        {
            "source": "x",
            "vhost": "/",
            "destination": q,
            "destination_type": "queue",
            "routing_key": key,
            "arguments": {},
        }
        for q, key in (("q1", "a"), ("q2", "b"))
    ],
}


@pytest.fixture
def archive(tmp_path) -> Path:
    """Two hours: 'a' to q1 and 'b' to q2 (and 'b' once, recorded to no queue)."""
    clock = VirtualClock(wall_start=START)
    a = Archive(ArchiveConfig(enabled=True, dir=str(tmp_path / "archive")), clock=clock)
    header = ContentHeader.from_properties(BasicProperties(), body_size=2)
    q1, q2 = _Named("q1"), _Named("q2")
    for hour in range(2):
        for i in range(10 + hour):
            a.record("/", Message("x", "a", header, b"ab"), (q1,))
            if i % 2:
                a.record("/", Message("x", "b", header, b"ab"), (q2,))
        clock.advance(3600)
        a.stamp()  # the broker stamps the archive's clock on a timer
    a.record("/", Message("x", "b", header, b"ab"), ())
    a.close()
    return tmp_path / "archive"


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


def _pass(scan: ArchiveScan, traffic_dir: Path | None) -> Counter:
    defs = parse_definitions(json.dumps(DEFS), "defs.json")
    units = iter(jobs.plan_units(scan, 2))
    batches = list(jobs.analyse_units(units, [defs], [], traffic_dir and str(traffic_dir)))
    table = pa.Table.from_batches(batches)
    counts: Counter = Counter()  # summed over the units, as Spark does
    for r in table.to_pylist():
        if r["metric"] != "microseconds":
            counts[(r["kind"], r["metric"], r["name"], r["id"], r["hour"], r["routing_key"])] += r[
                "n"
            ]
    return counts


def test_one_workers_pass_writes_traffic_and_counts(archive, tmp_path):
    scan = scan_archive(archive)
    assert len(scan.hours) == 3
    out = tmp_path / "traffic"
    out.mkdir()
    counts = _pass(scan, out)
    assert counts[("counter", "rows", "", 0, None, None)] == 10 + 5 + 11 + 5 + 1
    assert counts[("counter", "agree", "", 0, None, None)] == 10 + 5 + 11 + 5  # not the last
    assert counts[("counter", "added", "q2", 0, None, None)] == 1
    assert counts[("key", None, None, None, None, "a")] == 21
    assert counts[("key", None, None, None, None, "b")] == 11
    assert counts[("hour", None, None, None, "2024-05-01T01", None)] == 11 + 5
    traffic = pq.read_table(out).to_pylist()
    assert sorted(
        (r["hour"], r["routing_key"], r["messages"], r["unroutable"]) for r in traffic
    ) == [
        ("2024-05-01T00", "a", 10, 0),
        ("2024-05-01T00", "b", 5, 0),
        ("2024-05-01T01", "a", 11, 0),
        ("2024-05-01T01", "b", 5, 0),
        ("2024-05-01T02", "b", 1, 1),
    ]
    assert all(r["bytes"] == 2 * r["messages"] and r["vhost"] == "/" for r in traffic)
    assert counts[("counter", "traffic_rows", "", 0, None, None)] == 5
    assert not list(out.glob(".*"))  # no temporary part left behind


def test_a_file_gone_before_the_worker_reads_it_is_reported(archive, tmp_path):
    scan = scan_archive(archive)
    victim = next(p for p, (_, hour) in scan.partition.items() if hour == "2024-05-01T01")
    victim.unlink()  # gone between the driver's scan and the worker's read
    counts = _pass(scan, None)
    assert counts[("counter", "rows", "", 0, None, None)] == 10 + 5 + 1
    unreadable = [name for (_, metric, name, *_) in counts if metric == "unreadable"]
    assert len(unreadable) == 1 and str(victim) in unreadable[0]


def test_a_file_that_fails_midway_counts_not_at_all(archive, monkeypatch):
    """Row groups read before a damaged one are not counted: the file is reported instead."""
    scan = scan_archive(archive)
    victim = next(p for p, (_, hour) in scan.partition.items() if hour == "2024-05-01T01")
    pq.write_table(pq.read_table(victim), victim, row_group_size=4, compression="zstd")
    meta = pq.read_metadata(victim)
    last = meta.row_group(meta.num_row_groups - 1)
    data = bytearray(victim.read_bytes())
    for i in range(last.num_columns):  # every column chunk of the last row group
        chunk = last.column(i)
        start = chunk.dictionary_page_offset or chunk.data_page_offset
        data[start : start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    victim.write_bytes(bytes(data))
    scan = scan_archive(archive)  # the footer is intact: the driver still lists the file
    assert victim in scan.files and len(scan.row_groups[victim]) == 4
    monkeypatch.setattr(jobs, "_READ_ROWS", 1)  # one row group per read
    counts = _pass(scan, None)
    assert counts[("counter", "rows", "", 0, None, None)] == 10 + 5 + 1
    unreadable = [name for (_, metric, name, *_) in counts if metric == "unreadable"]
    assert len(unreadable) == 1 and str(victim) in unreadable[0]
