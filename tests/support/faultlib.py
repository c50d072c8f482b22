"""Real brokers in subprocesses, and real faults injected into their real system calls.

`BrokerProcess` runs `python -m roarmq` on its own loopback ports and data dir, so a test
can kill -9 it and start it again. `inject()` attaches Debian's strace to the running
broker and makes chosen system calls on chosen files fail (`strace -e inject=...`), for
as long as the `with` block lasts: the fault is real (the broker's own call into the
kernel returns the error), and it ends when strace detaches. `small_tmpfs()` mounts a
tmpfs of a few megabytes to fill up, where the machine lets us mount.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from machine import missing

from support import broker_process
from support.waiting import wait_for

PERSISTENT = pika.BasicProperties(delivery_mode=2)
STRACE = shutil.which("strace")


class BrokerProcess(broker_process.BrokerProcess):
    """A broker to crash and fault (tests/support/broker_process.py): 1 MiB message store
    segments unless `storage` says otherwise, 20 s for a clean stop."""

    def __init__(
        self, data_dir: Path, port: int | None = None, *, extra: str = "", storage: str = ""
    ) -> None:
        """`storage`: further lines for the [storage] section; `extra`: further sections."""
        super().__init__(data_dir, port, storage="segment_size = 1048576\n" + storage, extra=extra)


def connect(port: int, **params: object) -> pika.BlockingConnection:
    options: dict[str, object] = {"socket_timeout": 10, "blocked_connection_timeout": 30}
    options.update(params)
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, **options))  # type: ignore[arg-type]


def drain(port: int, queue: str) -> list[tuple[bytes, bool]]:
    """Every message of a queue (auto-ack), with its redelivered flag."""
    conn = connect(port)
    ch = conn.channel()
    out = []
    while True:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        out.append((body, method.redelivered))
    conn.close()
    return out


def _tracers(pid: int) -> set[int]:
    """The TracerPid of every thread of `pid`."""
    out = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                for line in f:
                    if line.startswith("TracerPid:"):
                        out.add(int(line.split()[1]))
        except FileNotFoundError:
            pass
    return out


def require_strace() -> str:
    if STRACE is None:
        pytest.fail("strace is not installed (make test installs Debian's strace)")
    return STRACE


@contextlib.contextmanager
def inject(pid: int, path: str | os.PathLike[str], *rules: str) -> Iterator[subprocess.Popen]:
    """Make system calls of `pid` on `path` fail while the block runs.

    `rules` are strace's: "fdatasync:error=EIO", "pwrite64:error=ENOSPC:when=3+"... Only
    calls whose file argument is `path` are touched (strace -P). The broker is untouched
    before strace has attached to every thread and after it has detached.
    """
    strace = require_strace()
    syscalls = sorted({r.split(":", 1)[0] for r in rules})
    args = [strace, "-f", "-qq", "-o", "/dev/null", "-p", str(pid), "-P", os.fspath(path)]
    args += ["-e", "trace=" + ",".join(syscalls)]
    for rule in rules:
        args += ["-e", f"inject={rule}"]
    tracer = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(
            lambda: _tracers(pid) == {tracer.pid} or tracer.poll() is not None,
            what="strace to attach",
            ignore=(),  # the broker gone: FileNotFoundError
        )
        if tracer.poll() is not None:
            raise AssertionError(f"strace failed: {tracer.stderr.read().decode()}")  # type: ignore[union-attr]
        yield tracer
    finally:
        if tracer.poll() is None:
            tracer.send_signal(signal.SIGINT)  # detaches from every thread and exits
            tracer.wait(10)
        with contextlib.suppress(FileNotFoundError):
            wait_for(lambda: _tracers(pid) == {0}, what="strace to detach", ignore=())


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` (where mounting is not allowed, it needs root:
    the test is skipped saying why, or fails where `make test` runs as root)."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        missing(
            f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}", "ROARMQ_EXPECT_ROOT"
        )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
