"""The powerloss filesystem (tests/support/powerloss.py) loses exactly what was not durable.

Every write comes from a separate process through real system calls, which then dies
without cleaning up (os._exit), as a process does when the power goes. Each test first
checks that what it expects to lose really reached the filesystem (a kill alone keeps it),
then pulls the plug and checks what is left. Last, the segment log under a power loss:
what it confirmed survives, what it wrote without an fdatasync does not.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest
from machine import missing
from support.powerloss import FuseUnavailable, powerloss_mount

from roarmq.broker.store.segments import MAGIC, SegmentLog

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)

PRELUDE = """
import ctypes, os, sys
def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
def create(path, data=b"", sync=False):
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.write(fd, data)
    if sync:
        os.fsync(fd)
    os.close(fd)
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
def fallocate(fd, mode, offset, length):
    if libc.fallocate(fd, mode, offset, length) != 0:
        raise OSError(ctypes.get_errno(), "fallocate")
KEEP_SIZE, PUNCH_HOLE = 1, 2
"""


def run(script: str, *args: object) -> str:
    """Run `script` (after PRELUDE) in a new Python process; its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("sync", ["fsync", "fdatasync"])
def test_synced_contents_survive_the_rest_is_lost(fs, sync):
    run(
        """
        path, sync = sys.argv[1], getattr(os, sys.argv[2])
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.write(fd, b"A" * 100_000)             # across pages
        sync(fd)
        fsync_path(os.path.dirname(path))
        os.pwrite(fd, b"B" * 10, 50_000)          # an overwrite, never synced
        os.write(fd, b"C" * 70_000)               # an append, never synced
        os._exit(0)
        """,
        fs.path / "f",
        sync,
    )
    f = fs.path / "f"
    written = b"A" * 50_000 + b"B" * 10 + b"A" * 49_990 + b"C" * 70_000
    assert f.read_bytes() == written  # the dead process's writes are all there...
    report = fs.power_loss()
    assert report == {"files_reverted": 1, "dirs_reverted": 0, "nodes_lost": 0}
    assert f.stat().st_size == 100_000
    assert f.read_bytes() == b"A" * 100_000  # ...until the power goes
    stats = fs.stats()
    assert stats[sync] == 1 and stats["fsync" if sync == "fdatasync" else "fdatasync"] == 0
    assert stats["internal_errors"] == 0


def test_directory_entries_are_durable_once_their_directory_is_fsynced(fs):
    """Names need an fsync of their directory; each directory counts alone."""
    run(
        """
        os.chdir(sys.argv[1])
        for name in ("kept", "doomed", "moved"):
            create(name, name.encode(), sync=True)
        os.mkdir("sub")
        fsync_path(".")                            # all durable so far
        create("named", b"never synced")          # its name is made durable, not its data
        fsync_path(".")
        create("orphan", b"synced, name never", sync=True)
        os.unlink("doomed")
        os.rename("moved", "renamed")
        os.mkdir("newdir")
        create("sub/inner", b"synced, sub never", sync=True)
        os.mkdir("sub2")                           # its own entries synced, not its name
        create("sub2/x", b"x", sync=True)
        fsync_path("sub2")
        os._exit(0)
        """,
        fs.path,
    )
    root = fs.path
    before = {"kept", "named", "orphan", "renamed", "newdir", "sub", "sub2"}
    assert set(os.listdir(root)) == before
    assert os.listdir(root / "sub") == ["inner"]
    report = fs.power_loss()
    assert set(os.listdir(root)) == {"kept", "doomed", "moved", "named", "sub"}
    assert os.listdir(root / "sub") == []
    assert (root / "kept").read_bytes() == b"kept"
    assert (root / "doomed").read_bytes() == b"doomed"  # the unlink is undone
    assert (root / "moved").read_bytes() == b"moved"  # the rename too
    assert (root / "named").stat().st_size == 0  # a name alone: the file is empty
    # orphan, newdir, sub/inner, sub2 and sub2/x existed and are gone; "named" lost its data
    assert report == {"files_reverted": 1, "dirs_reverted": 2, "nodes_lost": 5}


@pytest.mark.parametrize("fsync_dir", [True, False])
def test_replace_by_rename_needs_the_directory_fsync(fs, fsync_dir):
    """The store's way to replace a file: write a temporary, fsync it, rename it over."""
    (fs.path / "config").write_bytes(b"v1")
    run(
        """
        os.chdir(sys.argv[1])
        fd = os.open("config", os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        fsync_path(".")
        create("config.tmp", b"v2", sync=True)
        os.replace("config.tmp", "config")
        if sys.argv[2] == "True":
            fsync_path(".")
        os._exit(0)
        """,
        fs.path,
        fsync_dir,
    )
    assert (fs.path / "config").read_bytes() == b"v2"
    report = fs.power_loss()
    assert os.listdir(fs.path) == ["config"]
    assert (fs.path / "config").read_bytes() == (b"v2" if fsync_dir else b"v1")
    assert report["dirs_reverted"] == (0 if fsync_dir else 1)


def test_ftruncate_and_fallocate(fs):
    pattern = bytes(range(256)) * 800  # 204,800 bytes
    (fs.path / "t").write_bytes(b"")
    run(
        """
        path, pattern = sys.argv[1], bytes(range(256)) * 800
        fd = os.open(path, os.O_WRONLY)
        os.write(fd, pattern)
        os.fsync(fd)
        fsync_path(os.path.dirname(path))
        os.ftruncate(fd, 1000)                     # cut, then grown by allocation
        os.posix_fallocate(fd, 0, 300_000)
        os._exit(0)
        """,
        fs.path / "t",
    )
    t = fs.path / "t"
    # Grown again after a cut: zeros, not what the cut removed.
    assert t.read_bytes() == pattern[:1000] + bytes(299_000)
    assert fs.power_loss()["files_reverted"] == 1
    assert t.read_bytes() == pattern

    run(
        """
        fd = os.open(sys.argv[1], os.O_WRONLY)
        os.ftruncate(fd, 5000)
        os.fdatasync(fd)                           # durable: 5000 bytes
        os.posix_fallocate(fd, 0, 100_000)
        os.fdatasync(fd)                           # durable: grown to 100,000 by allocation
        fallocate(fd, KEEP_SIZE, 0, 1 << 20)       # allocates, keeps the size
        assert os.fstat(fd).st_size == 100_000
        fallocate(fd, KEEP_SIZE | PUNCH_HOLE, 0, 4096)
        os.ftruncate(fd, 10)
        os._exit(0)
        """,
        t,
    )
    assert t.read_bytes() == bytes(10)  # the hole, cut to 10 bytes
    assert fs.power_loss()["files_reverted"] == 1
    assert t.read_bytes() == pattern[:5000] + bytes(95_000)
    stats = fs.stats()
    assert stats["fallocate"] == 4 and stats["truncate"] >= 3


def test_descriptors_from_before_the_power_loss_fail(fs):
    """A real power loss kills every process; one that survives ours gets EIO."""
    path = fs.path / "f"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, b"durable")
        os.fsync(fd)
        os.write(fd, b" and not")
        assert os.pread(fd, 100, 0) == b"durable and not"
        fs.power_loss()
        for call in (
            lambda: os.pread(fd, 100, 0),
            lambda: os.write(fd, b"x"),
            lambda: os.fsync(fd),
        ):
            with pytest.raises(OSError) as raised:
                call()
            assert raised.value.errno == errno.EIO
    finally:
        os.close(fd)
    assert not path.exists()  # created, never named durably
    (fs.path / "new").write_bytes(b"fresh")  # the filesystem goes on serving
    assert (fs.path / "new").read_bytes() == b"fresh"


def test_flock_excludes_other_processes(fs):
    """flock is the kernel's (the segment log's LOCK file relies on it)."""
    fd = os.open(fs.path / "LOCK", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        script = """
            import fcntl
            fd = os.open(sys.argv[1], os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                print("acquired")
            except BlockingIOError:
                print("held")
            """
        assert run(script, fs.path / "LOCK").strip() == "held"
        fcntl.flock(fd, fcntl.LOCK_UN)
        assert run(script, fs.path / "LOCK").strip() == "acquired"
    finally:
        os.close(fd)


def framed(payload: bytes) -> bytes:
    """A record as the segment log writes it (the format in segments.py's docstring)."""
    return MAGIC + struct.pack("<II", len(payload), zlib.crc32(payload)) + payload


@pytest.mark.parametrize(
    ("preallocate", "stalled"), [(64 << 10, "_fdatasync"), (0, "_fsync")], ids=["data", "names"]
)
def test_segment_log_keeps_what_it_confirmed(fs, preallocate, stalled):
    """A writer confirms 2,000 records, writes 1,000 more, and dies with a sync that never
    returned (a disk that has not acknowledged). After the power loss, replay finds every
    confirmed record, an exact prefix of what was appended, no damage; the first record
    it lacks had been written, so the power loss, not the kill, took it.

    data: one preallocated segment; the batch's fdatasync never returns, so what it wrote
    and allocated is lost and exactly the confirmed records are left. names: small segments,
    so the batch rotates into new segment files, fdatasynced when the writer moves on, and
    the directory fsync never returns: the files' data was synced, their names were not,
    and they are lost.
    """
    segment_size = 8 << 20 if preallocate else 64 << 10
    directory = fs.path / "log"
    out = run(
        """
        import random, threading
        from roarmq.broker.store import segments
        from roarmq.broker.store.segments import SegmentLog
        directory, preallocate, segment_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
        confirmed = []
        log = SegmentLog.open(directory, segment_size=segment_size, buffer_size=64 << 10,
                              on_synced=confirmed.append, preallocate=preallocate)
        rng = random.Random(5)
        payloads = [i.to_bytes(4, "little") * rng.randrange(1, 200) for i in range(3000)]
        for i in range(2000):
            log.append(payloads[i])
            if i % 50 == 0:
                log.schedule_sync()
        print(log.sync_now(timeout=30), flush=True)
        stalled = threading.Event()
        def never_returns(fd):
            stalled.set()
            threading.Event().wait()
        setattr(segments, sys.argv[4], never_returns)
        for i in range(2000, 3000):
            log.append(payloads[i])
        log.schedule_sync()
        assert stalled.wait(30)
        print(max(confirmed), flush=True)
        os._exit(0)
        """,
        directory,
        preallocate,
        segment_size,
        stalled,
    )
    synced, confirmed = map(int, out.split())
    assert synced == 2000 and confirmed >= 2000
    rng = random.Random(5)
    payloads = [i.to_bytes(4, "little") * rng.randrange(1, 200) for i in range(3000)]
    files_before = sorted(directory.glob("*.seg"))
    before = b"".join(p.read_bytes() for p in files_before)
    report = fs.power_loss()
    assert report["files_reverted"] + report["nodes_lost"] >= 1
    files_after = sorted(directory.glob("*.seg"))

    log = SegmentLog.open(directory, preallocate=preallocate)
    try:
        got = [payload for _, payload in log.replay()]
        assert log.recovery.records_dropped == 0
        assert log.recovery.corrupt_regions == []
    finally:
        log.close()
    assert confirmed <= len(got) < len(payloads)
    assert got == payloads[: len(got)]  # an exact prefix, nothing invented
    assert framed(payloads[len(got)]) in before  # the first record lost had been written
    if stalled == "_fdatasync":
        assert len(got) == confirmed == 2000
    else:
        assert report["nodes_lost"] >= 1
        assert set(files_after) < set(files_before)  # segment files lost with their names
    stats = fs.stats()
    assert stats["fdatasync"] > 0 and stats["fsyncdir"] > 0
    assert stats["fallocate"] > 0 if preallocate else stats["fallocate"] == 0
    assert stats["internal_errors"] == 0


def test_backing_directory_holds_the_tree_after_unmount(tmp_path):
    """The backing directory is the durable state going in and the tree coming out."""
    backing = tmp_path / "backing"
    (backing / "d").mkdir(parents=True)
    (backing / "d" / "old").write_bytes(b"old")
    os.link(backing / "d" / "old", backing / "d" / "second-name")
    try:
        with powerloss_mount(tmp_path, backing=backing) as mounted:
            d = mounted.path / "d"
            assert (d / "old").read_bytes() == b"old"
            assert os.stat(d / "old").st_ino == os.stat(d / "second-name").st_ino
            (d / "new").write_bytes(b"never synced")  # a clean unmount writes it back
            (d / "lost").write_bytes(b"lost")
            mounted.power_loss()
            (d / "new").write_bytes(b"new")
            os.unlink(d / "old")
    except FuseUnavailable as exc:
        missing(f"cannot mount FUSE: {exc}", exc.provided_by)
    assert sorted(os.listdir(backing)) == ["d"]
    assert sorted(os.listdir(backing / "d")) == ["new", "second-name"]
    assert (backing / "d" / "new").read_bytes() == b"new"
    assert (backing / "d" / "second-name").read_bytes() == b"old"
