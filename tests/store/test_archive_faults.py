"""The traffic archive on a full or failing disk, on a real broker.

A disk that refuses the archive's writes (ENOSPC on a small tmpfs, EIO injected by strace
into the broker's own system calls) must cost the archive the batches it cannot write, and
nothing else: every publish is still confirmed, the broker keeps serving, /metrics counts the
drops, the log has one warning per episode, and the archive writes again by itself once the
disk does, leaving only files that read back.
"""

from __future__ import annotations

import errno
import re
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
from support.faultlib import PERSISTENT, BrokerProcess, connect, inject, small_tmpfs
from support.waiting import wait_for

import roarmq.broker.archive as archive_module
from roarmq.broker.archive import Archive, _Faults, live_files, partitions, pending_journals
from roarmq.broker.config import ArchiveConfig
from roarmq.broker.core.message import Message
from roarmq.pipeline.reader import scan_archive
from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import BasicProperties

# slow (injected disk faults): `make check` leaves it out
pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

BATCH_ROWS = 200


def message(key: str) -> Message:
    header = ContentHeader.from_properties(BasicProperties(), body_size=4)
    return Message("ex", key, header, b"body")


def archive_section(directory: Path, roll_minutes: float = 60) -> str:
    return (
        f'[archive]\nenabled = true\ndir = "{directory}"\n'
        f"batch_rows = {BATCH_ROWS}\nroll_minutes = {roll_minutes}\n"
    )


def metric(broker: BrokerProcess, name: str, labels: str = "") -> float:
    """One series of /metrics (``labels`` as written there, e.g. ``reason="write_failed"``)."""
    series = f"{name}{{{labels}}}" if labels else name
    for line in broker.metrics().splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{series} not in /metrics")


def dropped_batches(broker: BrokerProcess) -> float:
    return metric(broker, "roarmq_archive_batches_dropped_total", 'reason="write_failed"')


def dropped_rows(broker: BrokerProcess) -> float:
    return metric(broker, "roarmq_archive_rows_dropped_total", 'reason="write_failed"')


def written_rows(broker: BrokerProcess) -> float:
    return metric(broker, "roarmq_archive_rows_written_total")


def archive_warnings(broker: BrokerProcess) -> list[str]:
    return [
        line
        for line in broker.log_text().splitlines()
        if re.search(r" warning +roarmq\.archive:", line)
    ]


def publish(ch, n: int, tag: str = "m") -> float:  # type: ignore[no-untyped-def]
    """``n`` persistent publishes, each confirmed (pika raises on a nack); the seconds taken."""
    started = time.monotonic()
    for i in range(n):
        ch.basic_publish("", "q", f"{tag}{i}".encode(), PERSISTENT)
    return time.monotonic() - started


def open_channel(broker: BrokerProcess):  # type: ignore[no-untyped-def]
    conn = connect(broker.port)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("q", durable=True)
    return conn, ch


def fill(fs: Path) -> Path:
    """Write a file until the file system is full; the file."""
    filler = fs / "filler"
    chunk = b"\0" * 65536
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    chunk = b"\0" * 512
    with open(filler, "ab", buffering=0) as f:  # the last partial page too
        try:
            while True:
                f.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def only_journal(root: Path) -> Path:
    journals = [j for _, _, d in partitions(root) for j in pending_journals(d)]
    return journals[0] if len(journals) == 1 else None  # type: ignore[return-value]


def assert_archive_reads_back(root: Path) -> int:
    """Every data file reads, by the pipeline's reader and by pyarrow; the rows in them.
    pyarrow reads the files the scan found: while the broker runs, a roll may add a file
    after the scan (listing the directory again once counted a file the scan never saw)."""
    before = {p.resolve() for _, _, d in partitions(root) for p in live_files(d)}
    scan = scan_archive(root)
    assert scan.skipped == []
    assert before <= set(scan.files)  # the scan left out no data file there before it
    rows = sum(pq.read_table(path).num_rows for path in scan.files)
    assert rows == scan.rows
    return rows


def test_a_full_archive_disk_drops_batches_and_the_archive_resumes(tmp_path):
    with small_tmpfs(tmp_path / "archive-fs", "4m") as fs:
        root = fs / "archive"
        broker = BrokerProcess(tmp_path / "data", extra=archive_section(root, 0.05)).start()
        try:
            conn, ch = open_channel(broker)
            baseline = publish(ch, 400, "before")
            wait_for(lambda: written_rows(broker) >= 400, what="rows archived")
            filler = fill(fs)

            # full: every publish is still confirmed, the archive drops and says so once
            during = publish(ch, 1200, "full")
            wait_for(lambda: dropped_batches(broker) >= 3, what="drops counted")
            # three times the baseline's messages: traffic does not wait on the archive
            assert during < 3 * 3 * baseline + 5
            publish(ch, 400, "full2")
            time.sleep(1.5)  # a partial batch goes to the writer after 1 s
            assert broker.running
            assert conn.is_open
            assert ch.queue_declare("q", durable=True, passive=True).method.message_count == 2000
            warnings = archive_warnings(broker)
            assert len(warnings) == 1, warnings
            assert "No space left on device" in warnings[0]
            lost = dropped_rows(broker)
            assert lost >= 3 * BATCH_ROWS

            # the disk has room again: the next batch is written, nothing more is dropped
            filler.unlink()
            written = written_rows(broker)
            publish(ch, 600, "after")
            wait_for(lambda: written_rows(broker) >= written + 600, what="archive resumed")
            wait_for(lambda: "archive writing again" in broker.log_text(), what="notice")
            assert dropped_rows(broker) == lost
            assert len(archive_warnings(broker)) == 1
            assert_archive_reads_back(root)  # while running: rolled files only
            total = written_rows(broker)
            conn.close()
        finally:
            broker.stop()
        assert total + lost == 2600  # every envelope: written or counted as dropped
        assert assert_archive_reads_back(root) == total
        assert not [j for _, _, d in partitions(root) for j in pending_journals(d)]


def test_eio_on_a_journal_write_drops_one_batch_and_a_new_journal_takes_over(tmp_path):
    root = tmp_path / "archive"
    broker = BrokerProcess(tmp_path / "data", extra=archive_section(root)).start()
    try:
        conn, ch = open_channel(broker)
        publish(ch, 500, "before")
        wait_for(lambda: written_rows(broker) >= 500, what="rows archived")
        journal = wait_for(lambda: only_journal(root), what="the open journal")
        # the second write of the next batch fails: a torn record the archive must cut back
        with inject(broker.pid, journal, "write:error=EIO:when=2+"):
            publish(ch, 1000, "eio")
            wait_for(lambda: dropped_batches(broker) >= 1, what="drop counted")
            assert metric(broker, "roarmq_archive_write_errors_total") >= 1
            wait_for(lambda: written_rows(broker) >= 1300, what="a new journal")
        assert broker.running and conn.is_open
        warnings = archive_warnings(broker)
        assert len(warnings) == 1 and "Input/output error" in warnings[0], warnings
        lost = dropped_rows(broker)
        assert 0 < lost <= BATCH_ROWS  # the batch that met the error, and no other
        publish(ch, 500, "after")
        assert ch.queue_declare("q", durable=True, passive=True).method.message_count == 2000
        wait_for(lambda: written_rows(broker) + lost >= 2000, what="all archived")
        # the journal set aside holds whole batches only: its file reads back
        wait_for(lambda: journal.with_name(journal.name[1:-8] + ".parquet").exists(), what="file")
        assert_archive_reads_back(root)
        total = written_rows(broker)
        conn.close()
    finally:
        broker.stop()
    assert total + lost == 2000
    assert assert_archive_reads_back(root) == total


def test_eio_on_a_data_file_fsync_defers_the_file_and_loses_nothing(tmp_path):
    root = tmp_path / "archive"
    broker = BrokerProcess(tmp_path / "data", extra=archive_section(root, 0.1)).start()
    try:
        conn, ch = open_channel(broker)
        publish(ch, 500, "before")
        journal = wait_for(lambda: only_journal(root), what="the open journal")
        data_file = journal.with_name(journal.name[1:-8] + ".parquet")
        tmp = journal.with_name(f".{data_file.name}.tmp")
        # the roll (6 s after the journal opened) fsyncs the data file: it fails, and again
        with inject(broker.pid, tmp, "fsync:error=EIO"):
            wait_for(
                lambda: metric(broker, "roarmq_archive_write_errors_total") >= 2,
                timeout=30,
                what="the conversion and its retry failing",
            )
            publish(ch, 500, "during")
            assert not data_file.exists() and journal.exists()  # the journal keeps every row
        assert broker.running and conn.is_open
        warnings = archive_warnings(broker)
        assert len(warnings) == 1 and "Input/output error" in warnings[0], warnings
        wait_for(data_file.exists, timeout=30, what="the deferred data file")
        wait_for(lambda: "archive writing again" in broker.log_text(), what="notice")
        assert pq.read_table(data_file).num_rows >= 500
        assert dropped_rows(broker) == 0
        conn.close()
    finally:
        broker.stop()
    assert assert_archive_reads_back(root) == 1000


def test_start_up_on_a_full_disk_defers_the_replay_until_there_is_room(tmp_path, caplog):
    """A journal left by a crash, and no room to convert it: the broker starts all the same,
    and the writer thread converts it once the disk has room; that conversion going through
    ends the fault episode with its notice, with no other write after it."""
    caplog.set_level("INFO", logger="roarmq.archive")
    crashed = tmp_path / "crashed"
    archive = Archive(ArchiveConfig(enabled=True, dir=str(crashed), batch_rows=10))
    for i in range(25):
        archive.record("/", message(f"k{i}"), ())
    archive._handoff()
    wait_for(lambda: archive.stats()["written_rows"] == 25, what="journal written")
    with small_tmpfs(tmp_path / "fs", "4m") as fs:
        shutil.copytree(crashed, fs / "archive")  # the disk as a crash would leave it
        archive.close()
        filler = fill(fs)
        started = time.monotonic()
        recovering = Archive(ArchiveConfig(enabled=True, dir=str(fs / "archive")))
        assert time.monotonic() - started < 5
        assert recovering.stats()["write_errors"] == 1
        assert not [p for _, _, d in partitions(fs / "archive") for p in live_files(d)]
        filler.unlink()
        wait_for(
            lambda: recovering.stats()["written_files"] == 1, timeout=20, what="deferred replay"
        )
        wait_for(lambda: "archive writing again" in caplog.text, what="the episode's end")
        recovering.close()
        assert assert_archive_reads_back(fs / "archive") == 25
        assert not [j for _, _, d in partitions(fs / "archive") for j in pending_journals(d)]


def test_the_writer_thread_survives_an_unexpected_error(tmp_path, caplog):
    archive = Archive(ArchiveConfig(enabled=True, dir=str(tmp_path / "archive"), batch_rows=10))
    maintain, calls = archive._maintain, []

    def broken_once(now: float, final: bool) -> None:
        calls.append(final)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        maintain(now, final)

    archive._maintain = broken_once  # type: ignore[method-assign]
    wait_for(lambda: calls, what="the writer's first cycle")
    for i in range(10):
        archive.record("/", message(f"k{i}"), ())
    wait_for(lambda: archive.stats()["written_rows"] == 10, what="the writer carrying on")
    archive.close()
    assert archive._thread.is_alive() is False
    assert "archive writer error; carrying on" in caplog.text
    assert assert_archive_reads_back(tmp_path / "archive") == 10


def test_a_disk_that_keeps_failing_warns_once_a_minute(caplog, monkeypatch):
    faults = _Faults()
    clock = [1000.0]
    monkeypatch.setattr(archive_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    with caplog.at_level("INFO", logger="roarmq.archive"):
        for _ in range(100):  # a batch a second for 100 s
            faults.failure("journal", OSError(errno.ENOSPC, "No space left on device"), 1, 10)
            clock[0] += 1
        faults.recovered()
    records = [
        (r.levelname, r.getMessage(), r.__dict__.get("dropped_batches")) for r in caplog.records
    ]
    assert [r[0] for r in records] == ["WARNING", "WARNING", "NOTICE"]
    assert [r[2] for r in records] == [1, 60, 100]  # the first, then the count since; the episode
